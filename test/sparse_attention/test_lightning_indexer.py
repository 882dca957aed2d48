"""npu_lightning_indexer, npu_quant_lightning_indexer and npu_lightning_indexer_grad against plain-PyTorch float64
references (indexer_reference.py): the selected positions (descending scores, ties to the lower position, -1 past
the visible keys) over BSND / TND queries and BSND / TND / paged keys, causal and full; the returned scores and
their gradients under the tolerance rule; gradcheck in float64; torch.compile; the simulated npu; every bad-input
rule."""
import subprocess
import sys

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.tiers import pairwise
from test.sparse_attention.indexer_reference import (gather_keys, indexer_scores, lightning_indexer_ref,
                                                     split_query)

OPS = torch.ops.npu_fa


def make_inputs(layout_query="BSND", layout_key="BSND", dtype=torch.float32, B=2, S1=5, S2=37, N1=4, N2=1, D=16,
                q_lens=None, k_lens=None, block_size=16, weights_dtype=None, seed=0):
    """Random indexer inputs and the keyword arguments of the call. q_lens / k_lens: per-sequence lengths (TND:
    the tokens of each sequence; BSND: actual lengths). Paged keys are scattered over shuffled blocks."""
    g = torch.Generator().manual_seed(seed)
    q_lens = q_lens or [S1] * B
    k_lens = k_lens or [S2] * B
    kw = dict(layout_query=layout_query, layout_key=layout_key)
    if layout_query == "TND":
        q = torch.randn(sum(q_lens), N1, D, generator=g)
        w = torch.randn(sum(q_lens), N1, generator=g)
        kw["actual_seq_lengths_query"] = torch.tensor(q_lens).cumsum(0).to(torch.int32)
    else:
        q = torch.randn(B, S1, N1, D, generator=g)
        w = torch.randn(B, S1, N1, generator=g)
        if q_lens != [S1] * B:
            kw["actual_seq_lengths_query"] = torch.tensor(q_lens, dtype=torch.int32)
    if layout_key == "TND":
        k = torch.randn(sum(k_lens), N2, D, generator=g)
        kw["actual_seq_lengths_key"] = torch.tensor(k_lens).cumsum(0).to(torch.int32)
    elif layout_key == "BSND":
        k = torch.randn(B, S2, N2, D, generator=g)
        if k_lens != [S2] * B:
            kw["actual_seq_lengths_key"] = torch.tensor(k_lens, dtype=torch.int32)
    else:
        per = [(n + block_size - 1) // block_size for n in k_lens]
        nblocks = sum(per) + 2
        k = torch.randn(nblocks, block_size, N2, D, generator=g)
        perm = torch.randperm(nblocks, generator=g)
        table = torch.full((B, max(per) + 1), -1, dtype=torch.int32)
        used = 0
        for b in range(B):
            table[b, :per[b]] = perm[used:used + per[b]]
            used += per[b]
        kw["actual_seq_lengths_key"] = torch.tensor(k_lens, dtype=torch.int32)
        kw["block_table"] = table
    # scores of typical magnitude: q . k ~ sqrt(D)
    q, k = q.to(dtype), k.to(dtype)
    w = (w / N1).to(weights_dtype or dtype)
    return q, k, w, kw


def _ref(q, k, w, kw, sparse_count, sparse_mode, round_dtype=None):
    return lightning_indexer_ref(q, k, w, asq=kw.get("actual_seq_lengths_query"),
                                 ask=kw.get("actual_seq_lengths_key"), block_table=kw.get("block_table"),
                                 layout_query=kw["layout_query"], layout_key=kw["layout_key"],
                                 sparse_count=sparse_count, sparse_mode=sparse_mode, round_dtype=round_dtype)


def check_selection(ours, ref_idx, rows_scores, sparse_count, exact, dtype=torch.float32):
    """Same -1 pattern as the reference; our positions distinct and visible, their reference scores equal to the
    reference's top scores to eight units of `dtype` at the row's largest score (scores a rounding apart may swap
    places); `exact`: the same positions."""
    N2 = ours.shape[-2]
    o = ours.reshape(-1, N2, sparse_count).long()
    r = ref_idx.reshape(-1, N2, sparse_count)
    assert torch.equal(o < 0, r < 0), "the -1 padding differs from the reference"
    for row, n2, s in rows_scores:
        sel = o[row, n2][o[row, n2] >= 0]
        assert sel.unique().numel() == sel.numel() and (sel < s.numel()).all()
        got, want = s[sel], s[r[row, n2][r[row, n2] >= 0]]
        tol = 8 * torch.finfo(dtype).eps * float(want.abs().max()) if want.numel() else 0
        assert torch.allclose(got, want, atol=tol, rtol=0), (row, n2, got, want)
    if exact:
        assert torch.equal(o, r)


LAYOUTS = {"bsnd": ("BSND", "BSND"), "tnd": ("TND", "TND"), "bsnd_pa": ("BSND", "PA_BSND"), "tnd_pa": ("TND", "PA_BSND")}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


@pytest.mark.asan
@pytest.mark.parametrize("layouts,dtype,sparse_mode,sparse_count", pairwise(
    layouts=LAYOUTS, dtype=DTYPES, sparse_mode=[3, 0], sparse_count={"k8": 8, "k64": 64}))
def test_indices_and_values_match_the_reference(layouts, dtype, sparse_mode, sparse_count):
    lq, lk = layouts
    q, k, w, kw = make_inputs(lq, lk, dtype, B=3, q_lens=[5, 1, 3], k_lens=[37, 9, 0], S1=5, S2=37)
    idx, val = tot.npu_lightning_indexer(q, k, w, sparse_count=sparse_count, sparse_mode=sparse_mode,
                                         return_value=lk != "PA_BSND", **kw)
    assert idx.dtype == torch.int32 and idx.shape == (*q.shape[:-2], 1, sparse_count)
    ref_idx, rows = _ref(q, k, w, kw, sparse_count, sparse_mode)
    check_selection(idx, ref_idx, rows, sparse_count, exact=dtype == torch.float64, dtype=dtype)
    if lk == "PA_BSND":
        assert val.shape == (0,)
        return
    # values: the scores at our positions, -inf at -1
    assert val.dtype == dtype and val.shape == idx.shape
    assert torch.isneginf(val[idx < 0]).all()
    flat_idx = idx.reshape(-1, 1, sparse_count).long()
    ours, want, same = [], [], []
    for row, n2, s in rows:
        sel = flat_idx[row, n2][flat_idx[row, n2] >= 0]
        ours.append(val.reshape(-1, 1, sparse_count)[row, n2, :sel.numel()])
        want.append(s[sel])
    # the same formula in the input dtype (PyTorch's own arithmetic) for the tolerance rule
    qd, seqs = split_query(q, lq, kw.get("actual_seq_lengths_query"))
    wd = split_query(w.to(dtype), lq, kw.get("actual_seq_lengths_query"))[0]
    keys = gather_keys(k, lk, kw.get("actual_seq_lengths_key"), kw.get("block_table"), len(seqs))
    for b, (start, q_len) in enumerate(seqs):
        if q_len == 0:
            continue
        sc = indexer_scores(qd[start:start + q_len], keys[b], wd[start:start + q_len])
        for i in range(q_len):
            sel = flat_idx[start + i, 0][flat_idx[start + i, 0] >= 0]
            same.append(sc[i, 0, sel])
    check_tolerance("sparse_values", torch.cat(ours), torch.cat(want), torch.cat(same))


def test_gqa_key_heads_select_per_head():
    q, k, w, kw = make_inputs(N1=6, N2=2, dtype=torch.float64)
    idx, _ = tot.npu_lightning_indexer(q, k, w, sparse_count=10, **kw)
    assert idx.shape == (2, 5, 2, 10)
    ref_idx, rows = _ref(q, k, w, kw, 10, 3)
    check_selection(idx, ref_idx, rows, 10, exact=True)


def test_causal_rows_see_keys_up_to_their_aligned_position():
    # 4 queries over 6 keys: query i sees 6 - 4 + i + 1 keys; every visible key is selected (sparse_count 8)
    q, k, w, kw = make_inputs(B=1, S1=4, S2=6)
    idx, _ = tot.npu_lightning_indexer(q, k, w, sparse_count=8)
    for i in range(4):
        row = idx[0, i, 0]
        assert (row >= 0).sum() == 3 + i and (row[3 + i:] == -1).all()
        assert sorted(row[:3 + i].tolist()) == list(range(3 + i))
    # more queries than keys: the first queries see nothing
    q, k, w, kw = make_inputs(B=1, S1=4, S2=2)
    idx, _ = tot.npu_lightning_indexer(q, k, w, sparse_count=4)
    assert (idx[0, :2] == -1).all() and (idx[0, 2, 0] >= 0).sum() == 1 and (idx[0, 3, 0] >= 0).sum() == 2


def test_ties_go_to_the_lower_position():
    q = torch.ones(1, 1, 1, 4)
    k = torch.ones(1, 6, 1, 4)
    w = torch.ones(1, 1, 1)
    idx, val = tot.npu_lightning_indexer(q, k, w, sparse_count=4, sparse_mode=0, return_value=True)
    assert idx.flatten().tolist() == [0, 1, 2, 3] and (val == 4).all()


def test_rows_beyond_the_actual_query_length_are_minus_one():
    q, k, w, kw = make_inputs(B=2, S1=4, q_lens=[2, 4])
    idx, val = tot.npu_lightning_indexer(q, k, w, sparse_count=8, return_value=True, **kw)
    assert (idx[0, 2:] == -1).all() and torch.isneginf(val[0, 2:]).all() and (idx[0, :2] >= 0).any()


def test_quant_indexer_matches_the_dequantised_reference():
    g = torch.Generator().manual_seed(3)
    for lq, lk in (("BSND", "BSND"), ("TND", "PA_BSND")):
        q, k, w, kw = make_inputs(lq, lk, B=2, q_lens=[3, 2], k_lens=[40, 17], S1=3, S2=40)
        q8 = torch.randint(-127, 128, q.shape, generator=g, dtype=torch.int8)
        k8 = torch.randint(-127, 128, k.shape, generator=g, dtype=torch.int8)
        qs = (torch.rand(q.shape[:-1], generator=g) * 0.02).half()
        ks = (torch.rand(k.shape[:-1], generator=g) * 0.02).half()
        w16 = w.half()
        idx = tot.npu_quant_lightning_indexer(q8, k8, w16, qs, ks, 0, 0, sparse_count=12, **kw)
        ref_idx, rows = lightning_indexer_ref(
            q8, k8, w16, asq=kw.get("actual_seq_lengths_query"), ask=kw.get("actual_seq_lengths_key"),
            block_table=kw.get("block_table"), layout_query=lq, layout_key=lk, sparse_count=12, qscale=qs,
            kscale=ks)
        check_selection(idx, ref_idx, rows, 12, exact=False)


# ---- training: the scores' gradients ------------------------------------------------------------------------------

@pytest.mark.parametrize("layout,dtype", pairwise(layout=["BSND", "TND"], dtype=DTYPES))
def test_values_backward_matches_autograd_of_the_reference(layout, dtype):
    q, k, w, kw = make_inputs(layout, layout, dtype, B=2, q_lens=[4, 3], k_lens=[20, 11], S1=4, S2=20)
    wdt = w.dtype
    qq, kk, ww = (t.detach().requires_grad_() for t in (q, k, w))
    idx, val = tot.npu_lightning_indexer(qq, kk, ww, sparse_count=6, return_value=True, **kw)
    dy = torch.randn(val.shape).to(dtype)
    dy[idx < 0] = 0
    val.masked_fill(idx < 0, 0).backward(dy)
    grads = [qq.grad, kk.grad, ww.grad]

    def ref_grads(cdt):
        leaves = [t.detach().to(cdt).requires_grad_() for t in (q, k, w)]
        qd, seqs = split_query(leaves[0], layout, kw.get("actual_seq_lengths_query"))
        wd = split_query(leaves[2], layout, kw.get("actual_seq_lengths_query"))[0]
        keys = gather_keys(leaves[1], layout, kw.get("actual_seq_lengths_key"), None, len(seqs))
        fi = idx.reshape(-1, 1, 6).long()
        fdy = dy.reshape(-1, 1, 6).to(cdt)
        total = 0
        for b, (start, q_len) in enumerate(seqs):
            sc = indexer_scores(qd[start:start + q_len], keys[b], wd[start:start + q_len])
            for i in range(q_len):
                sel = fi[start + i, 0]
                m = sel >= 0
                total = total + (sc[i, 0, sel[m]] * fdy[start + i, 0, m]).sum()
        return torch.autograd.grad(total, leaves)

    ref = ref_grads(torch.float64)
    same = ref_grads(dtype)
    for name, ours, r, s in zip(("d_query", "d_key", "d_weights"), grads, ref, same):
        assert ours.dtype == (wdt if name == "d_weights" else dtype)
        check_tolerance(name, ours, r, s)


def test_gradcheck_float64():
    q, k, w, kw = make_inputs("BSND", "BSND", torch.float64, B=1, S1=3, S2=5, N1=2, D=4)
    q, k, w = (t.requires_grad_() for t in (q, k, w))

    def f(q, k, w):
        idx, val = OPS.lightning_indexer(q, k, w, None, None, None, "BSND", "BSND", 8, 3, 2**63 - 1, 2**63 - 1, True)
        return val.masked_fill(idx < 0, 0)

    assert torch.autograd.gradcheck(f, (q, k, w))


@pytest.mark.asan
def test_grad_op_skips_padding_and_invisible_entries():
    q, k, w, kw = make_inputs("BSND", "BSND", torch.float64, B=1, S1=2, S2=4, N1=2, D=4)
    idx = torch.tensor([[[[0, -1, 3]], [[2, 1, -1]]]], dtype=torch.int32)  # query 0 sees keys 0..2: 3 is skipped
    dy = torch.ones(idx.shape, dtype=torch.float64)
    dq, dk, dw = tot.npu_lightning_indexer_grad(q, k, dy, idx, w)
    qq, kk, ww = (t.detach().requires_grad_() for t in (q, k, w))
    sc = indexer_scores(qq[0], kk[0], ww[0])  # [2, 1, 4]
    total = sc[0, 0, 0] + sc[1, 0, 2] + sc[1, 0, 1]
    rq, rk, rw = torch.autograd.grad(total, (qq, kk, ww))
    torch.testing.assert_close(dq, rq)
    torch.testing.assert_close(dk, rk)
    torch.testing.assert_close(dw, rw)
    # an empty dy: zero gradients
    z = tot.npu_lightning_indexer_grad(q, k, torch.empty(0, dtype=torch.float64), idx, w)
    assert all((t == 0).all() for t in z)


# ---- compile, devices ---------------------------------------------------------------------------------------------

def test_compile_fullgraph(dynamo_reset):
    q, k, w, kw = make_inputs("TND", "PA_BSND", q_lens=[3, 2], k_lens=[30, 7])
    q8 = torch.randint(-5, 6, q.shape, dtype=torch.int8)
    k8 = torch.randint(-5, 6, k.shape, dtype=torch.int8)
    qs, ks = torch.rand(q.shape[:-1]), torch.rand(k.shape[:-1])

    def f(q, k, w, q8, k8, qs, ks):
        idx, _ = tot.npu_lightning_indexer(q, k, w, sparse_count=8, **kw)
        qidx = tot.npu_quant_lightning_indexer(q8, k8, w, qs, ks, 0, 0, sparse_count=8, **kw)
        return idx, qidx

    eager = f(q, k, w, q8, k8, qs, ks)
    compiled = torch.compile(f, fullgraph=True)(q, k, w, q8, k8, qs, ks)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


def test_compile_fullgraph_backward(dynamo_reset):
    q, k, w, kw = make_inputs(B=1, S1=3, S2=9)

    def f(q, k, w):
        idx, val = tot.npu_lightning_indexer(q, k, w, sparse_count=4, return_value=True)
        return val.masked_fill(idx < 0, 0).sum()

    leaves = [t.clone().requires_grad_() for t in (q, k, w)]
    f(*leaves).backward()
    cleaves = [t.clone().requires_grad_() for t in (q, k, w)]
    torch.compile(f, backend="aot_eager", fullgraph=True)(*cleaves).backward()
    for a, b in zip(leaves, cleaves):
        torch.testing.assert_close(a.grad, b.grad)


_NPU_SCRIPT = """
import torch, torch_ops_transformer as tot
from test.sparse_attention.test_lightning_indexer import make_inputs
tot.npu_sim.enable()
q, k, w, kw = make_inputs("BSND", "PA_BSND", torch.bfloat16, k_lens=[37, 20])
cpu, _ = tot.npu_lightning_indexer(q, k, w, sparse_count=16, **kw)
npu_kw = {n: (v.npu() if n == "block_table" else v) for n, v in kw.items()}
dev, _ = tot.npu_lightning_indexer(q.npu(), k.npu(), w.npu(), sparse_count=16, **npu_kw)
assert dev.device.type == "npu" and torch.equal(dev.cpu(), cpu)
print("ok")
"""


def test_simulated_npu_selects_as_the_cpu_op():
    # npu tensors run the Ascend C kernel (test/npu/test_lightning_indexer.py covers it); on this data (no scores
    # within rounding of each other) its selection is the CPU op's exactly
    r = subprocess.run([sys.executable, "-c", _NPU_SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip().endswith("ok"), r.stderr[-3000:]


# ---- bad inputs: one test per rule --------------------------------------------------------------------------------

def _call(**over):
    q, k, w, kw = make_inputs(over.pop("layout_query", "BSND"), over.pop("layout_key", "BSND"))
    args = dict(query=q, key=k, weights=w, **kw)
    args.update(over)
    return tot.npu_lightning_indexer(args.pop("query"), args.pop("key"), args.pop("weights"), **args)


def test_bad_layout_query():
    with pytest.raises(ValueError, match="'layout_query' must be \"BSND\" or \"TND\"; got \"BNSD\""):
        _call(layout_query="BNSD")


def test_bad_layout_key():
    with pytest.raises(ValueError, match="'layout_key' must be \"BSND\", \"TND\" or \"PA_BSND\"; got \"PA_NZ\""):
        _call(layout_key="PA_NZ")


def test_layout_key_must_match_layout_query_unless_paged():
    q, k, w, kw = make_inputs("TND", "TND")
    with pytest.raises(ValueError, match="'layout_key' must equal 'layout_query'"):
        tot.npu_lightning_indexer(q, k, w, actual_seq_lengths_query=kw["actual_seq_lengths_query"],
                                  actual_seq_lengths_key=[37, 74], layout_query="TND", layout_key="BSND")


def test_query_rank():
    with pytest.raises(ValueError, match="'query' must be 4-D \\[B, S1, N1, D\\] \\(BSND\\); got shape"):
        _call(query=torch.randn(2, 5, 64))


def test_key_head_dim():
    with pytest.raises(ValueError, match="'key' must have the head dim of 'query' \\(16\\); got 8"):
        _call(key=torch.randn(2, 37, 1, 8))


def test_query_heads_multiple_of_key_heads():
    with pytest.raises(ValueError, match="query heads \\(4\\) must be a multiple of the key heads \\(3\\)"):
        _call(key=torch.randn(2, 37, 3, 16))


def test_weights_shape():
    with pytest.raises(ValueError, match="'weights' must have the shape of 'query' without its head dim"):
        _call(weights=torch.randn(2, 5, 3))


def test_dtypes():
    with pytest.raises(TypeError, match="'key' must have the dtype of 'query'"):
        _call(key=torch.randn(2, 37, 1, 16, dtype=torch.float64))
    with pytest.raises(TypeError, match="'weights' must have the dtype of 'query'"):
        _call(weights=torch.randn(2, 5, 4, dtype=torch.float16))


@pytest.mark.parametrize("count", [0, 2049, 3000, 9216])
def test_sparse_count_range(count):
    with pytest.raises(ValueError, match=f"'sparse_count' must lie in \\[1, 2048\\] or be one of .*got {count}"):
        _call(sparse_count=count)


def test_sparse_mode():
    with pytest.raises(ValueError, match="'sparse_mode' must be 0 \\(all keys\\) or 3 .*got 1"):
        _call(sparse_mode=1)


def test_pre_next_tokens_reserved():
    with pytest.raises(ValueError, match="'pre_tokens' and 'next_tokens' must keep their default"):
        _call(pre_tokens=128)


def test_tnd_needs_query_lengths():
    q, k, w, kw = make_inputs("TND", "TND")
    with pytest.raises(ValueError, match="'actual_seq_lengths_query' is required with layout TND"):
        tot.npu_lightning_indexer(q, k, w, actual_seq_lengths_key=kw["actual_seq_lengths_key"], layout_query="TND",
                                  layout_key="TND")


def test_tnd_lengths_are_cumulative():
    q, k, w, kw = make_inputs("TND", "TND")
    with pytest.raises(ValueError, match="must be non-decreasing and non-negative; got 3 after 5 at index 1"):
        tot.npu_lightning_indexer(q, k, w, actual_seq_lengths_query=[5, 3],
                                  actual_seq_lengths_key=kw["actual_seq_lengths_key"], layout_query="TND",
                                  layout_key="TND")
    with pytest.raises(ValueError, match="'actual_seq_lengths_query' ends at 11 tokens but query's T1 holds 10"):
        tot.npu_lightning_indexer(q, k, w, actual_seq_lengths_query=[5, 11],
                                  actual_seq_lengths_key=kw["actual_seq_lengths_key"], layout_query="TND",
                                  layout_key="TND")


def test_bsnd_lengths_in_range():
    with pytest.raises(ValueError, match="'actual_seq_lengths_key' must lie in \\[0, S2=37\\]; got 38 for sequence 1"):
        _call(actual_seq_lengths_key=[3, 38])
    with pytest.raises(ValueError, match="'actual_seq_lengths_query' must hold one length per sequence \\(2\\); got 3"):
        _call(actual_seq_lengths_query=[1, 2, 3])


def test_paged_needs_block_table_and_key_lengths():
    q, k, w, kw = make_inputs("BSND", "PA_BSND")
    with pytest.raises(ValueError, match="'block_table' is required with layout_key PA_BSND"):
        tot.npu_lightning_indexer(q, k, w, actual_seq_lengths_key=kw["actual_seq_lengths_key"], layout_key="PA_BSND")
    with pytest.raises(ValueError, match="'actual_seq_lengths_key' is required with layout_key PA_BSND"):
        tot.npu_lightning_indexer(q, k, w, block_table=kw["block_table"], layout_key="PA_BSND")


def test_block_table_shape_and_entries():
    q, k, w, kw = make_inputs("BSND", "PA_BSND")
    bad = dict(kw)
    bad["block_table"] = kw["block_table"][:, :1]
    with pytest.raises(ValueError, match="'block_table' has 1 blocks per sequence, but sequence 0 needs 3"):
        tot.npu_lightning_indexer(q, k, w, **bad)
    bad["block_table"] = kw["block_table"].clone()
    bad["block_table"][1, 0] = 99
    with pytest.raises(ValueError, match="'block_table' entry \\[1, 0\\] = 99 is not a block of the cache"):
        tot.npu_lightning_indexer(q, k, w, **bad)
    bad["block_table"] = kw["block_table"][0]
    with pytest.raises(ValueError, match="'block_table' must be 2-D \\[B=2, max blocks per sequence\\]"):
        tot.npu_lightning_indexer(q, k, w, **bad)


def test_return_value_with_a_paged_cache():
    with pytest.raises(ValueError, match="'return_value' must be False with layout_key \"PA_BSND\""):
        q, k, w, kw = make_inputs("BSND", "PA_BSND")
        tot.npu_lightning_indexer(q, k, w, return_value=True, **kw)


def test_quant_dtypes_and_modes():
    q, k, w, kw = make_inputs()
    q8, k8 = q.to(torch.int8), k.to(torch.int8)
    qs, ks = torch.rand(q.shape[:-1]), torch.rand(k.shape[:-1])
    with pytest.raises(TypeError, match="'query' must be int8; got Float"):
        tot.npu_quant_lightning_indexer(q, k8, w, qs, ks, 0, 0)
    with pytest.raises(ValueError, match="'key_quant_mode' must be 0"):
        tot.npu_quant_lightning_indexer(q8, k8, w, qs, ks, 0, 1)
    with pytest.raises(ValueError, match="'key_dequant_scale' must have the shape of 'key' without its head dim"):
        tot.npu_quant_lightning_indexer(q8, k8, w, qs, ks[:, :3], 0, 0)
    with pytest.raises(NotImplementedError, match="'query_dtype' must be None or torch.int8"):
        tot.npu_quant_lightning_indexer(q8, k8, w, qs, ks, 0, 0, query_dtype=290)


def test_grad_dy_and_indices_rules():
    q, k, w, kw = make_inputs()
    idx, _ = tot.npu_lightning_indexer(q, k, w, sparse_count=4)
    with pytest.raises(ValueError, match="'dy' must have the shape of 'sparse_indices'"):
        tot.npu_lightning_indexer_grad(q, k, torch.ones(2, 5, 1, 3), idx, w)
    bad = idx.clone()
    bad[0, 0, 0, 0] = 37
    with pytest.raises(ValueError, match="'sparse_indices' entry 37 of query token 0 of sequence 0 is neither -1"):
        tot.npu_lightning_indexer_grad(q, k, torch.ones(idx.shape), bad, w)


def test_grad_takes_indices_without_the_n2_axis():
    q, k, w, kw = make_inputs(dtype=torch.float64)
    idx, _ = tot.npu_lightning_indexer(q, k, w, sparse_count=6)
    dy = torch.randn(idx.shape, dtype=torch.float64)
    full = tot.npu_lightning_indexer_grad(q, k, dy, idx, w)
    squeezed = tot.npu_lightning_indexer_grad(q, k, dy.squeeze(2), idx.squeeze(2), w)
    for a, b in zip(full, squeezed):
        assert torch.equal(a, b)
