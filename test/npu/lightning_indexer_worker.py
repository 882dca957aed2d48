"""lightning_indexer on the simulated npu device (the Ascend C lightning indexer kernel), run by
test_lightning_indexer.py through runner_worker (sim enabled; tensors `.to("npu")`).

Each case builds a call with the CPU indexer tests' input builder (ragged sequences: a sequence without keys, rows
past the query lengths, sparse_count larger than some rows' visible keys), runs the op on npu with the CPU fallback
forbidden (TOT_NPU_SIM_NO_FALLBACK=1: the kernel ran) and on CPU, and checks: the -1 padding equal to the float64
reference's and the CPU op's; per row the selected set equal to the CPU op's, or, where scores tie within rounding,
the reference scores of the two selections equal to a few units of the dtype (check_selection, as the CPU tests);
the returned values against the float64 scores by the project rule, against plain PyTorch in the same dtype and
against the CPU backend. The default tier covers BSND / TND queries, BSND / TND / paged keys, sparse_mode 0 / 3 and
the three dtypes pairwise; the full tier runs the whole product and a larger DeepSeek-like decode.
"""
import itertools

import torch

from test.common.reference import check_tolerance
from test.npu.runner import assert_same_error, full_case, no_fallback
from test.sparse_attention.indexer_reference import gather_keys, indexer_scores, split_query
from test.sparse_attention.test_lightning_indexer import _ref, check_selection, make_inputs

OPS = torch.ops.npu_fa
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _npu_kwargs(kw):
    # lengths are host tensors (read on the host); the block table moves with the other tensors
    return {n: (v.to("npu") if n == "block_table" and v is not None else v) for n, v in kw.items()}


def _run(q, k, w, kw, K, sparse_mode, values):
    cpu = OPS.lightning_indexer(q, k, w, sparse_count=K, sparse_mode=sparse_mode, return_value=values, **kw)
    with no_fallback(True):
        npu = OPS.lightning_indexer(q.to("npu"), k.to("npu"), w.to("npu"), sparse_count=K, sparse_mode=sparse_mode,
                                    return_value=values, **_npu_kwargs(kw))
    assert all(t.device.type == "npu" for t in npu)
    return tuple(t.cpu() for t in npu), cpu


def _same_sets_or_ties(name, ours, cpu, rows_scores, K, dtype):
    """Per (row, key head): the CPU op's set, or (scores a rounding apart) selections of equal reference scores."""
    N2 = ours.shape[-2]
    o, c = ours.reshape(-1, N2, K).long(), cpu.reshape(-1, N2, K).long()
    assert torch.equal(o < 0, c < 0), f"{name}: the -1 padding differs from the CPU op"
    differing = 0
    for row, n2, s in rows_scores:
        a, b = o[row, n2][o[row, n2] >= 0], c[row, n2][c[row, n2] >= 0]
        if set(a.tolist()) == set(b.tolist()):
            continue
        differing += 1
        got, want = s[a].sort(descending=True).values, s[b].sort(descending=True).values
        tol = 8 * torch.finfo(dtype).eps * float(want.abs().max())
        assert torch.allclose(got, want, atol=tol, rtol=0), (name, row, n2, got, want)
    assert differing <= max(1, len(rows_scores) // 4), f"{name}: {differing} rows select other keys than the CPU op"


def _check_values(name, q, k, w, kw, idx, val, cpu_idx, cpu_val, rows_scores, dtype):
    K = idx.shape[-1]
    assert val.dtype == dtype and val.shape == idx.shape and torch.isneginf(val[idx < 0]).all(), name
    flat, vals = idx.reshape(-1, idx.shape[-2], K).long(), val.reshape(-1, idx.shape[-2], K)
    lq, lk = kw["layout_query"], kw["layout_key"]
    qd, seqs = split_query(q, lq, kw.get("actual_seq_lengths_query"))
    wd = split_query(w.to(dtype), lq, kw.get("actual_seq_lengths_query"))[0]
    keys = gather_keys(k, lk, kw.get("actual_seq_lengths_key"), kw.get("block_table"), len(seqs))
    same = {}
    for b, (start, q_len) in enumerate(seqs):
        if q_len:
            sc = indexer_scores(qd[start:start + q_len], keys[b], wd[start:start + q_len])
            for i in range(q_len):
                same[start + i] = sc[i]
    ours, want, torch_same = [], [], []
    for row, n2, s in rows_scores:
        sel = flat[row, n2][flat[row, n2] >= 0]
        ours.append(vals[row, n2, :sel.numel()])
        want.append(s[sel])
        torch_same.append(same[row][n2, sel])
    ours, want = torch.cat(ours), torch.cat(want)
    check_tolerance(f"{name} values vs torch", ours, want, torch.cat(torch_same))
    if torch.equal(idx, cpu_idx):  # the CPU backend's values at the same positions
        check_tolerance(f"{name} values vs CPU backend", val[idx >= 0], _scores_at(rows_scores, idx),
                        cpu_val[cpu_idx >= 0])


def _scores_at(rows_scores, idx):
    flat = idx.reshape(-1, idx.shape[-2], idx.shape[-1]).long()
    out = []
    for row, n2, s in sorted(rows_scores, key=lambda r: (r[0], r[1])):
        sel = flat[row, n2][flat[row, n2] >= 0]
        out.append(s[sel])
    return torch.cat(out)


def _case(layouts, sparse_mode, dtype="fp32", K=8, N1=4, N2=2, seed=0):
    lq, lk = layouts
    dt = DTYPES[dtype]
    q, k, w, kw = make_inputs(lq, lk, dt, B=3, S1=5, S2=37, N1=N1, N2=N2, q_lens=[5, 1, 3], k_lens=[37, 9, 0],
                              block_size=16, weights_dtype=torch.float32 if dtype == "bf16" else None, seed=seed)
    values = lk != "PA_BSND"
    name = f"{lq}/{lk} mode={sparse_mode} K={K} {dtype}"
    (idx, val), (cpu_idx, cpu_val) = _run(q, k, w, kw, K, sparse_mode, values)
    assert idx.dtype == torch.int32 and idx.shape == cpu_idx.shape, name
    ref_idx, rows = _ref(q, k, w, kw, K, sparse_mode)
    check_selection(idx, ref_idx, rows, K, exact=False, dtype=dt)
    _same_sets_or_ties(name, idx, cpu_idx, rows, K, dt)
    if values:
        _check_values(name, q, k, w, kw, idx, val, cpu_idx, cpu_val, rows, dt)
    else:
        assert val.shape == (0,), name


# ---- default tier: every layout pair, both sparse modes, the three dtypes (pairwise) ----

def case_bsnd_bsnd_causal_fp32():
    _case(("BSND", "BSND"), 3, "fp32")


def case_bsnd_paged_full_fp16():
    _case(("BSND", "PA_BSND"), 0, "fp16", K=16)


def case_tnd_tnd_full_bf16():
    _case(("TND", "TND"), 0, "bf16", K=64)  # K beyond every row's visible keys: -1 padding everywhere


def case_tnd_paged_causal_fp32():
    _case(("TND", "PA_BSND"), 3, "fp32", N1=6, N2=1)


def case_ties_go_to_the_lower_position():
    # identical keys: every visible key ties; the kernel keeps the lower positions, in order, as the CPU op
    q, k, w, kw = make_inputs("BSND", "BSND", torch.float32, B=1, S1=2, S2=40, N1=4, N2=1)
    k = k[:, :1].expand_as(k).contiguous()
    (idx, val), (cpu_idx, _) = _run(q, k, w, kw, 16, 0, True)
    assert torch.equal(idx, cpu_idx), (idx, cpu_idx)
    assert torch.equal(idx[0, 0, 0], torch.arange(16, dtype=torch.int32))


def case_deepseek_like_paged_decode():
    # one query token per sequence, 64 heads of 128 on one key head, paged keys, top-64 of a few hundred keys
    g = torch.Generator().manual_seed(3)
    B, N1, D, bs, lens = 2, 64, 128, 64, [300, 75]
    blocks = 12
    key = torch.randn(blocks, bs, 1, D, generator=g).to(torch.bfloat16)
    table = torch.randperm(blocks, generator=g)[:10].view(2, 5).to(torch.int32)
    query = torch.randn(B, 1, N1, D, generator=g).to(torch.bfloat16)
    weights = (torch.randn(B, 1, N1, generator=g) / N1).to(torch.bfloat16)
    kw = dict(layout_query="BSND", layout_key="PA_BSND", block_table=table,
              actual_seq_lengths_key=torch.tensor(lens, dtype=torch.int32))
    (idx, _), (cpu_idx, _) = _run(query, key, weights, kw, 64, 3, False)
    ref_idx, rows = _ref(query, key, weights, kw, 64, 3)
    check_selection(idx, ref_idx, rows, 64, exact=False, dtype=torch.bfloat16)
    _same_sets_or_ties("deepseek-like decode", idx, cpu_idx, rows, 64, torch.bfloat16)


def case_empty_query_and_errors_match_cpu():
    q, k, w, kw = make_inputs("BSND", "PA_BSND", torch.float32, B=2, S1=3, S2=20)
    with no_fallback(True):  # no query positions: empty outputs, nothing launched
        idx, val = OPS.lightning_indexer(q[:, :0].to("npu"), k.to("npu"), w[:, :0].to("npu"), sparse_count=8,
                                         **_npu_kwargs(kw))
    assert idx.shape == (2, 0, 1, 8) and idx.device.type == "npu" and val.shape == (0,)
    bad = [dict(sparse_mode=1), dict(sparse_count=0), dict(return_value=True), dict(block_table=None),
           dict(layout_key="TND"), dict(weights=w.double())]

    def call(device, change):
        args = dict(dict(kw, sparse_count=8), **change)
        ww = args.pop("weights", w)
        args = _npu_kwargs(args) if device == "npu" else args
        OPS.lightning_indexer(q.to(device), k.to(device), ww.to(device), **args)

    for change in bad:
        assert_same_error(lambda device: call(device, change), str(change))


# ---- full tier: the whole product, and a larger decode ----

_LAYOUTS = [("BSND", "BSND"), ("BSND", "PA_BSND"), ("TND", "TND"), ("TND", "PA_BSND")]


@full_case
def case_full_product():
    for i, ((lq, lk), mode, dtype, K) in enumerate(itertools.product(_LAYOUTS, [0, 3], list(DTYPES), [1, 8, 48])):
        _case((lq, lk), mode, dtype, K=K, N1=4 if i % 2 else 6, N2=2 if i % 2 else 1, seed=i)


@full_case
def case_full_long_keys_multi_tile():
    # 600 keys per sequence, top-256: each row's keys split over the cores, their scores merged
    q, k, w, kw = make_inputs("TND", "TND", torch.bfloat16, B=2, S1=4, S2=600, N1=8, N2=1, q_lens=[4, 2],
                              k_lens=[600, 333], seed=9)
    (idx, val), (cpu_idx, _) = _run(q, k, w, kw, 256, 3, True)
    ref_idx, rows = _ref(q, k, w, kw, 256, 3)
    check_selection(idx, ref_idx, rows, 256, exact=False, dtype=torch.bfloat16)
    _same_sets_or_ties("long keys", idx, cpu_idx, rows, 256, torch.bfloat16)
