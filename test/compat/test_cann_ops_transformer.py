"""The cann_ops_transformer stand-in (torch_ops_transformer.compat.cann_ops_transformer): every documented function
has upstream's signature (functions.yaml, compared with inspect.signature), each call equals the corresponding
torch_ops_transformer op on small inputs (the ops themselves are tested against float64 references in
test/sparse_attention), bad input raises errors naming the argument, and a MindSpeed-style script runs with
`import cann_ops_transformer`. Installing touches the process (the simulated npu), so installs run in a child."""
import ast
import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_ops_transformer as tot
from test.common.checkout import ROOT, pythonpath
from torch_ops_transformer import compat
from torch_ops_transformer.compat import cann_ops_transformer as cann

OPS = cann.module().ops
SIGNATURES = cann.upstream_functions()["implemented"]


def _documented(line: str):
    """(name, [(parameter, keyword_only, default or inspect.Parameter.empty)], result count) of a yaml line."""
    head, results = line.split(" -> ")
    fn = ast.parse(f"def {head}: pass").body[0]
    a = fn.args
    defaults = [inspect.Parameter.empty] * (len(a.args) - len(a.defaults)) + [ast.literal_eval(d) for d in
                                                                               a.defaults]
    params = [(p.arg, False, d) for p, d in zip(a.args, defaults)]
    params += [(p.arg, True, inspect.Parameter.empty if d is None else ast.literal_eval(d))
               for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    return fn.name, params, results.count("Tensor")


@pytest.mark.parametrize("line", SIGNATURES, ids=lambda s: s.split("(")[0])
def test_signature_is_upstreams(line):
    name, params, _ = _documented(line)
    fn = getattr(OPS, name)
    assert getattr(cann.module(), name) is fn
    ours = [(p.name, p.kind == p.KEYWORD_ONLY, p.default) for p in inspect.signature(fn).parameters.values()]
    assert ours == params


def test_other_upstream_names_raise_naming_themselves():
    for name in cann.upstream_functions()["not_implemented"]:
        with pytest.raises(NotImplementedError, match=f"cann_ops_transformer.{name} is not implemented"):
            getattr(OPS, name)()


# ---------------------------------------------------------------------------------------------- lightning indexer

def _indexer_inputs(layout="BSND", B=2, S1=5, S2=12, N1=4, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    lead_q = (B * S1,) if layout == "TND" else (B, S1)
    lead_k = (B * S2,) if layout == "TND" else (B, S2)
    return (torch.randn(*lead_q, N1, D, generator=g).to(dtype), torch.randn(*lead_k, 1, D, generator=g).to(dtype),
            torch.randn(*lead_q, N1, generator=g))


def _cu(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)


@pytest.mark.parametrize("mask_mode", [0, 3])
def test_lightning_indexer_bsnd_equals_ours(mask_mode):
    q, k, w = _indexer_inputs(dtype=torch.bfloat16)
    idx, val = OPS.lightning_indexer(q, k, w, 4, mask_mode=mask_mode, return_value=1)
    ref_idx, ref_val = tot.npu_lightning_indexer(q, k, w, sparse_count=4, sparse_mode=mask_mode, return_value=True)
    # upstream's values are float32: ours (rounded to q's dtype) widened
    assert torch.equal(idx, ref_idx) and val.dtype == torch.float32 and torch.equal(val, ref_val.float())
    idx0, val0 = OPS.lightning_indexer(q, k, w, 4, mask_mode=mask_mode)
    assert torch.equal(idx0, ref_idx) and val0.shape == (0,) and val0.dtype == torch.float32


def test_lightning_indexer_tnd_and_paged_equal_ours():
    q, k, w = _indexer_inputs("TND")
    cu_q, cu_k = _cu([5, 5]), _cu([12, 12])
    idx, _ = OPS.lightning_indexer(q, k, w, 6, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, layout_q="TND", layout_k="TND",
                                   mask_mode=3)
    ref, _ = tot.npu_lightning_indexer(q, k, w, actual_seq_lengths_query=[5, 10], actual_seq_lengths_key=[12, 24],
                                       layout_query="TND", layout_key="TND", sparse_count=6)
    assert torch.equal(idx, ref)
    qb, kb, wb = _indexer_inputs(S2=16)
    cache = kb.reshape(8, 4, 1, 16)[torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])]  # shuffled blocks of 4 tokens
    table = torch.tensor([[1, 3, 5, 7], [0, 2, 4, 6]], dtype=torch.int32)
    lens = torch.tensor([16, 11], dtype=torch.int32)
    idx, _ = OPS.lightning_indexer(qb, cache, wb, 6, seqused_k=lens, block_table=table, layout_k="PA_BBND",
                                   mask_mode=3)
    ref, _ = tot.npu_lightning_indexer(qb, cache, wb, actual_seq_lengths_key=lens, block_table=table,
                                       layout_key="PA_BSND", sparse_count=6)
    assert torch.equal(idx, ref)


def _compressed_seen(k_len, q_len, i, ratio, residual):
    return min(max((k_len * ratio + residual - q_len + i + 1) // ratio, 0), k_len)


def test_lightning_indexer_compressed_causal_equals_ours_row_by_row():
    """mask_mode 3 with cmp_ratio 4: each row equals our indexer over exactly the keys that row sees."""
    q, k, w = _indexer_inputs(S1=6, S2=5)
    res = torch.tensor([2, 3], dtype=torch.int32)
    idx, val = OPS.lightning_indexer(q, k, w, 3, cmp_residual_k=res, mask_mode=3, cmp_ratio=4, return_value=1)
    for b in range(2):
        for i in range(6):
            seen = _compressed_seen(5, 6, i, 4, int(res[b]))
            want_i = torch.full((1, 3), -1, dtype=torch.int32)
            want_v = torch.full((1, 3), float("-inf"))
            if seen:
                ri, rv = tot.npu_lightning_indexer(q[b:b + 1, i:i + 1], k[b:b + 1], w[b:b + 1, i:i + 1],
                                                   actual_seq_lengths_key=[seen], sparse_count=3, sparse_mode=0,
                                                   return_value=True)
                want_i, want_v = ri[0, 0], rv[0, 0].float()
            assert torch.equal(idx[b, i], want_i), (b, i)
            assert torch.equal(val[b, i], want_v), (b, i)


def test_lightning_indexer_padding_rows_and_offsets():
    q, k, w = _indexer_inputs("TND")
    cu = _cu([5, 5])
    used = torch.tensor([3, 5], dtype=torch.int32)
    idx, _ = OPS.lightning_indexer(q, k, w, 4, cu_seqlens_q=cu, cu_seqlens_k=_cu([12, 12]), seqused_q=used,
                                   output_idx_offset=torch.tensor([100, 0], dtype=torch.int32), layout_q="TND",
                                   layout_k="TND")
    ref, _ = tot.npu_lightning_indexer(q, k, w, actual_seq_lengths_query=[5, 10], actual_seq_lengths_key=[12, 24],
                                       layout_query="TND", layout_key="TND", sparse_count=4, sparse_mode=0)
    assert torch.equal(idx[:3], ref[:3] + 100)
    assert (idx[3:5] == -1).all()  # TND padding: tokens past seqused_q
    assert torch.equal(idx[5:], ref[5:])


def test_quant_lightning_indexer_equals_ours():
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-8, 8, (2, 4, 4, 16), dtype=torch.int8, generator=g)
    k = torch.randint(-8, 8, (2, 10, 1, 16), dtype=torch.int8, generator=g)
    w = torch.randn(2, 4, 4, generator=g).half()
    qs, ks = torch.rand(2, 4, 4, generator=g).half(), torch.rand(2, 10, 1, generator=g).half()
    idx, empty = OPS.quant_lightning_indexer(q, k, w, qs, ks, 5, 2, mask_mode=3)
    ref = tot.npu_quant_lightning_indexer(q, k, w, qs.float(), ks.float(), 0, 0, sparse_count=5, sparse_mode=3)
    assert torch.equal(idx, ref) and empty.shape == (0,)


# ---------------------------------------------------------------------------------------------- sparse_flash_mla

def _mla_inputs(B=2, S1=3, S2=10, S3=4, N1=4, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, S1, N1, D, generator=g).to(dtype), torch.randn(B, S2, 1, D, generator=g).to(dtype),
            torch.randn(B, S3, 1, D, generator=g).to(dtype), torch.randn(N1, generator=g))


def _rows_reference(q, kv_seqs, entries, scale, sinks):
    """Our sparse flash attention (BSND, one sequence per call) over the gathered KV `kv_seqs[b]` with the
    entries[b][i] picked per token: the call the stand-in must equal."""
    outs, lses = [], []
    for b, kv in enumerate(kv_seqs):
        k_max = max(1, max(len(e) for e in entries[b]))
        idx = torch.full((1, q.shape[1], 1, k_max), -1, dtype=torch.int32)
        for i, e in enumerate(entries[b]):
            idx[0, i, 0, :len(e)] = torch.tensor(e, dtype=torch.int32)
        out, m, s = tot.npu_sparse_flash_attention(q[b:b + 1], kv[None], kv[None], idx, scale, sparse_mode=0,
                                                   return_softmax_lse=True, sinks=sinks)
        outs.append(out)
        lses.append(m + s.log())
    return torch.cat(outs), torch.cat(lses)


def test_sparse_flash_mla_swa_equals_ours():
    q, ori, _, sinks = _mla_inputs()
    out, lse = OPS.sparse_flash_mla(q, ori_kv=ori, sinks=sinks, softmax_scale=0.25, ori_mask_mode=4, ori_win_left=3,
                                    ori_win_right=0, return_softmax_lse=True)
    # token i of 3 sits at position 10 - 3 + i and sees the window [p - 3, p]
    entries = [[list(range(7 + i - 3, 7 + i + 1)) for i in range(3)]] * 2
    ref_out, ref_lse = _rows_reference(q, [ori[0], ori[1]], entries, 0.25, sinks)
    torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-6, atol=1e-6)
    _, placeholder = OPS.sparse_flash_mla(q, ori_kv=ori, ori_mask_mode=4, ori_win_left=3, ori_win_right=0)
    assert placeholder.shape == () and placeholder.dtype == torch.float32


def test_sparse_flash_mla_hca_and_csa_equal_ours():
    """HCA (every visible compressed entry) and CSA (the picked ones) next to the window, cmp_ratio 2."""
    q, ori, cmp, sinks = _mla_inputs(S3=5)
    res = torch.tensor([0, 1], dtype=torch.int32)
    picks = torch.tensor([[[[4, 0, -1]], [[1, 3, 2]], [[2, -1, 4]]]] * 2, dtype=torch.int32)  # [B, S1, 1, 3]
    common = dict(ori_kv=ori, cmp_kv=cmp, cmp_residual_kv=res, sinks=sinks, softmax_scale=0.25, cmp_ratio=2,
                  ori_mask_mode=4, cmp_mask_mode=3, ori_win_left=2, ori_win_right=0, return_softmax_lse=True)
    for indices in (None, picks):
        out, lse = OPS.sparse_flash_mla(q, cmp_sparse_indices=indices, **common)
        entries = []
        for b in range(2):
            rows = []
            for i in range(3):
                p = 10 - 3 + i
                seen = _compressed_seen(5, 3, i, 2, int(res[b]))
                picked = range(5) if indices is None else [int(v) for v in indices[b, i, 0] if v >= 0]
                rows.append(list(range(p - 2, p + 1)) + [10 + c for c in picked if c < seen])
            entries.append(rows)
        ref_out, ref_lse = _rows_reference(q, [torch.cat([ori[b], cmp[b]]) for b in range(2)], entries, 0.25, sinks)
        torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lse, ref_lse, rtol=1e-6, atol=1e-6)


def test_sparse_flash_mla_tnd_and_paged_equal_bsnd():
    q, ori, cmp, sinks = _mla_inputs(S3=5)
    res = torch.tensor([1, 0], dtype=torch.int32)
    kw = dict(sinks=sinks, cmp_residual_kv=res, cmp_ratio=2, ori_mask_mode=4, cmp_mask_mode=3, ori_win_left=4,
              ori_win_right=0, return_softmax_lse=True)
    out, lse = OPS.sparse_flash_mla(q, ori_kv=ori, cmp_kv=cmp, **kw)
    t_out, t_lse = OPS.sparse_flash_mla(q.reshape(6, 4, 16), ori_kv=ori.reshape(20, 1, 16),
                                        cmp_kv=cmp.reshape(10, 1, 16), cu_seqlens_q=_cu([3, 3]),
                                        cu_seqlens_ori_kv=_cu([10, 10]), cu_seqlens_cmp_kv=_cu([5, 5]),
                                        layout_q="TND", layout_kv="TND", **kw)
    torch.testing.assert_close(t_out, out.reshape(6, 4, 16), rtol=0, atol=0)
    torch.testing.assert_close(t_lse, lse.permute(1, 0, 2, 3).reshape(1, 6, 4), rtol=0, atol=0)
    # paged: blocks of 2 tokens stored in reverse order, the block tables listing them
    ori_cache = ori.reshape(10, 2, 1, 16).flip(0)
    ori_table = torch.arange(9, -1, -1, dtype=torch.int32).view(2, 5)
    cmp_blocks = torch.cat([cmp, torch.zeros(2, 1, 1, 16)], 1).reshape(6, 2, 1, 16)  # 5 tokens in 3 blocks each
    cmp_cache = cmp_blocks.flip(0)
    cmp_table = torch.tensor([[5, 4, 3], [2, 1, 0]], dtype=torch.int32)
    p_out, p_lse = OPS.sparse_flash_mla(q, ori_kv=ori_cache, cmp_kv=cmp_cache, ori_block_table=ori_table,
                                        cmp_block_table=cmp_table, seqused_ori_kv=torch.tensor([10, 10]),
                                        seqused_cmp_kv=torch.tensor([5, 5]), layout_kv="PA_BBND", **kw)
    torch.testing.assert_close(p_out, out, rtol=0, atol=0)
    torch.testing.assert_close(p_lse, lse, rtol=0, atol=0)


def test_sparse_flash_mla_tnd_varlen_equals_ours():
    """TND with sequences of different lengths (cu_seqlens), causal ori_kv (mode 3), compressed HCA entries."""
    g = torch.Generator().manual_seed(7)
    q_lens, ori_lens, cmp_lens, res = [3, 2], [10, 6], [3, 2], [1, 0]
    q = torch.randn(sum(q_lens), 4, 16, generator=g)
    ori = torch.randn(sum(ori_lens), 1, 16, generator=g)
    cmp = torch.randn(sum(cmp_lens), 1, 16, generator=g)
    out, lse = OPS.sparse_flash_mla(q, ori_kv=ori, cmp_kv=cmp, cu_seqlens_q=_cu(q_lens),
                                    cu_seqlens_ori_kv=_cu(ori_lens), cu_seqlens_cmp_kv=_cu(cmp_lens),
                                    cmp_residual_kv=torch.tensor(res), softmax_scale=0.3, cmp_ratio=3,
                                    ori_mask_mode=3, cmp_mask_mode=3, layout_q="TND", layout_kv="TND",
                                    return_softmax_lse=True)
    qs, os_, cs = (torch.split(t, n) for t, n in ((q, q_lens), (ori, ori_lens), (cmp, cmp_lens)))
    for b in range(2):
        entries = [[list(range(ori_lens[b] - q_lens[b] + i + 1))
                    + [ori_lens[b] + c for c in range(_compressed_seen(cmp_lens[b], q_lens[b], i, 3, res[b]))]
                    for i in range(q_lens[b])]]
        ref_out, ref_lse = _rows_reference(qs[b][None], [torch.cat([os_[b], cs[b]])], entries, 0.3, None)
        start = sum(q_lens[:b])
        torch.testing.assert_close(out[start:start + q_lens[b]], ref_out[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lse[:, start:start + q_lens[b]], ref_lse[0], rtol=1e-6, atol=1e-6)


def test_sparse_flash_mla_grad_equals_autograd_of_the_forward():
    q, ori, cmp, sinks = _mla_inputs(S3=5, dtype=torch.float64)
    res = torch.tensor([0, 1], dtype=torch.int32)
    picks = torch.tensor([[[[4, 0, -1]], [[1, 3, 2]], [[2, -1, 4]]]] * 2, dtype=torch.int32)
    sinks = sinks.double()
    kw = dict(cmp_sparse_indices=picks, cmp_residual_kv=res, softmax_scale=0.25, cmp_ratio=2, ori_mask_mode=4,
              cmp_mask_mode=3, ori_win_left=2, ori_win_right=0)
    leaves = [t.clone().requires_grad_() for t in (q, ori, cmp, sinks)]
    out, lse = OPS.sparse_flash_mla(leaves[0], ori_kv=leaves[1], cmp_kv=leaves[2], sinks=leaves[3],
                                    return_softmax_lse=True, **kw)
    dout = torch.randn_like(out)
    out.backward(dout)
    dq, dori, dcmp, dsinks, ori_l1, cmp_l1 = OPS.sparse_flash_mla_grad(q, dout, out.detach(), lse.detach(), ori_kv=ori,
                                                                       cmp_kv=cmp, sinks=sinks, **kw)
    for got, leaf in zip((dq, dori, dcmp, dsinks), leaves):
        torch.testing.assert_close(got, leaf.grad, rtol=1e-10, atol=1e-12)
    assert ori_l1 is None and cmp_l1.shape == picks.shape
    # the picked entries' probabilities, averaged over the heads, from the forward's lse (float64)
    for b, i, j in [(0, 0, 0), (0, 1, 2), (1, 2, 2)]:
        c = int(picks[b, i, 0, j])
        seen = _compressed_seen(5, 3, i, 2, int(res[b]))
        s = 0.25 * (q[b, i] @ cmp[b, c, 0])
        want = (s - lse[b, 0, i]).exp().mean() if c < seen else torch.tensor(0.0, dtype=torch.float64)
        torch.testing.assert_close(cmp_l1[b, i, 0, j], want.to(cmp_l1.dtype), rtol=1e-9, atol=1e-12)
    assert cmp_l1[0, 0, 0, 2] == 0  # a -1 slot


# ---------------------------------------------------------------------------------------------- KL loss

def _kl_case(layout, mask_mode=3):
    """Indexer and main-attention inputs (float64), the main attention's target distribution over the selected
    keys computed from our sparse flash attention's statistics (as MindSpeed's caller would pass it)."""
    g = torch.Generator().manual_seed(3)
    B, S1, S2, N1, D, Ni, Di, K = 2, 4, 9, 4, 8, 3, 6, 5
    q, kk = torch.randn(B, S1, N1, D, generator=g, dtype=torch.float64), torch.randn(B, S2, 1, D, generator=g,
                                                                                    dtype=torch.float64)
    qi, ki = torch.randn(B, S1, Ni, Di, generator=g, dtype=torch.float64), torch.randn(B, S2, 1, Di, generator=g,
                                                                                      dtype=torch.float64)
    w = torch.randn(B, S1, Ni, generator=g, dtype=torch.float64) / Ni
    idx = torch.full((B, S1, 1, K), -1, dtype=torch.int32)
    for b in range(B):
        for i in range(S1):
            seen = S2 - S1 + i + 1 if mask_mode == 3 else S2
            idx[b, i, 0, :min(K, seen)] = torch.randperm(seen, generator=g)[:K].to(torch.int32)
    scale = D ** -0.5
    _, smax, ssum = tot.npu_sparse_flash_attention(q, kk, kk, idx, scale, sparse_mode=mask_mode,
                                                   return_softmax_lse=True)
    p = torch.zeros(B, S1, 1, K, dtype=torch.float64)
    for b in range(B):
        for i in range(S1):
            for j in range(K):
                if idx[b, i, 0, j] >= 0:
                    s = scale * (q[b, i] @ kk[b, int(idx[b, i, 0, j]), 0])
                    p[b, i, 0, j] = ((s - smax[b, 0, i]).exp() / ssum[b, 0, i]).sum()
    p = p / p.sum(-1, keepdim=True).clamp(min=1e-300)
    return q, kk, qi, ki, w, idx, smax, ssum, scale, p


@pytest.mark.parametrize("layout", ["BSND", "TND"])
def test_kl_loss_grad_equals_ours(layout):
    q, kk, qi, ki, w, idx, smax, ssum, scale, p = _kl_case("BSND")
    ref = tot.npu_sparse_lightning_indexer_grad_kl_loss(q, kk, qi, ki, w, idx, smax, ssum, scale)
    if layout == "TND":
        flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
        got = OPS.sparse_lightning_indexer_kl_loss_grad(flat(qi), flat(ki), flat(w), flat(idx), flat(p),
                                                        cu_seqlens_q=_cu([4, 4]), cu_seqlens_k=_cu([9, 9]))
        got = tuple(t.reshape(r.shape) for t, r in zip(got[:3], ref[:3])) + (got[3].reshape(p.shape),)
    else:
        got = OPS.sparse_lightning_indexer_kl_loss_grad(qi, ki, w, idx, p, layout_q="BSND", layout_k="BSND")
    for a, b in zip(got[:3], ref[:3]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    y = got[3]
    used = p > 0
    loss = (p[used] * (p[used].log() - y[used].log())).sum()
    torch.testing.assert_close(loss.reshape(1), ref[3], rtol=1e-9, atol=1e-12)


def test_kl_loss_grad_compressed_causal_against_float64_autograd():
    """cmp_ratio 2 with mask_mode 3: keys a row does not see are skipped; gradients equal autograd of the plain
    float64 loss sum_t KL(p || softmax(I)) over the seen keys."""
    g = torch.Generator().manual_seed(5)
    S1, S2, N1, D, K, ratio, res = 4, 3, 2, 4, 3, 2, 1
    q = torch.randn(S1, N1, D, generator=g, dtype=torch.float64)
    k = torch.randn(S2, 1, D, generator=g, dtype=torch.float64)
    w = torch.randn(S1, N1, generator=g, dtype=torch.float64)
    idx = torch.tensor([[[2, 0, 1]], [[0, 1, 2]], [[1, 2, 0]], [[2, 1, -1]]], dtype=torch.int32)
    p = torch.rand(S1, 1, K, generator=g, dtype=torch.float64)
    got = OPS.sparse_lightning_indexer_kl_loss_grad(q, k, w, idx, p, cu_seqlens_q=_cu([S1]), cu_seqlens_k=_cu([S2]),
                                                    cmp_residual_k=torch.tensor([res], dtype=torch.int32),
                                                    cmp_ratio=ratio)
    leaves = [t.clone().requires_grad_() for t in (q, k, w)]
    loss = 0
    for i in range(S1):
        seen = _compressed_seen(S2, S1, i, ratio, res)
        js = [j for j in range(K) if 0 <= int(idx[i, 0, j]) < seen]
        if not js:
            continue
        keys = leaves[1][[int(idx[i, 0, j]) for j in js], 0]
        scores = (leaves[2][i, :, None] * (leaves[0][i] @ keys.T).relu()).sum(0)
        target = p[i, 0, js]
        loss = loss - (target * scores.log_softmax(-1)).sum()
    loss.backward()
    for a, leaf in zip(got[:3], leaves):
        torch.testing.assert_close(a, leaf.grad, rtol=1e-9, atol=1e-12)
    # token 0 sees keys 0 and 1 (7 keys before compression, 4 queries): its slot of key 2 is skipped
    assert _compressed_seen(S2, S1, 0, ratio, res) == 2 and got[3][0, 0, 0] == 0
    torch.testing.assert_close(got[3][0, 0, 1:].sum(), torch.tensor(1.0, dtype=got[3].dtype))


def test_metadata_shapes():
    assert OPS.lightning_indexer_metadata(4, 1, 16, 8).shape == (1024,)
    assert OPS.quant_lightning_indexer_metadata(4, 1, 16, 8, 2).dtype == torch.int32
    assert OPS.sparse_flash_mla_metadata(4, 1, 16, has_cmp_kv=False).shape == (1024,)
    assert OPS.sparse_flash_mla_grad_metadata(4, 1, 16).shape == (1024,)
    assert OPS.sparse_lightning_indexer_kl_loss_grad_metadata(4, 1, 16).shape == (64,)


# ---------------------------------------------------------------------------------------------- errors

def _q():
    return _indexer_inputs()


ERRORS = [
    ("lightning_indexer layout_q", lambda: OPS.lightning_indexer(*_q(), 4, layout_q="BNSD"), ValueError, "layout_q"),
    ("lightning_indexer mask_mode", lambda: OPS.lightning_indexer(*_q(), 4, mask_mode=2), ValueError, "mask_mode"),
    ("lightning_indexer cmp_ratio", lambda: OPS.lightning_indexer(*_q(), 4, cmp_ratio=0), ValueError, "cmp_ratio"),
    ("lightning_indexer return_value", lambda: OPS.lightning_indexer(*_q(), 4, return_value=2), ValueError,
     "return_value"),
    ("lightning_indexer cu_seqlens_q", lambda: OPS.lightning_indexer(*_indexer_inputs("TND"), 4, layout_q="TND",
                                                                     layout_k="TND"), ValueError, "cu_seqlens_q"),
    ("lightning_indexer cu_seqlens_q start", lambda: OPS.lightning_indexer(
        *_indexer_inputs("TND"), 4, cu_seqlens_q=torch.tensor([1, 5, 10]), layout_q="TND", layout_k="TND"),
     ValueError, "cu_seqlens_q"),
    ("lightning_indexer cmp_residual_k", lambda: OPS.lightning_indexer(*_q(), 4, mask_mode=3, cmp_ratio=4),
     ValueError, "cmp_residual_k"),
    ("lightning_indexer cmp_residual_k range", lambda: OPS.lightning_indexer(
        *_q(), 4, mask_mode=3, cmp_ratio=4, cmp_residual_k=torch.tensor([4, 0])), ValueError, "cmp_residual_k"),
    ("lightning_indexer seqused_k paged", lambda: OPS.lightning_indexer(*_q(), 4, layout_k="PA_BBND"), ValueError,
     "seqused_k"),
    ("lightning_indexer output_idx_offset", lambda: OPS.lightning_indexer(
        *_q(), 4, output_idx_offset=torch.tensor([-1, 0])), ValueError, "output_idx_offset"),
    ("lightning_indexer q type", lambda: OPS.lightning_indexer(None, *_q()[1:], 4), TypeError, "'q'"),
    ("quant quant_mode fp8", lambda: OPS.quant_lightning_indexer(*_q(), _q()[2], _q()[2], 4, 1), NotImplementedError,
     "quant_mode"),
    ("quant quant_mode", lambda: OPS.quant_lightning_indexer(*_q(), _q()[2], _q()[2], 4, 3), ValueError,
     "quant_mode"),
    ("quant return_value", lambda: OPS.quant_lightning_indexer(*_q(), _q()[2], _q()[2], 4, 2, return_value=1),
     NotImplementedError, "return_value"),
    ("mla no kv", lambda: OPS.sparse_flash_mla(_mla_inputs()[0]), ValueError, "ori_kv"),
    ("mla layout_kv", lambda: OPS.sparse_flash_mla(_mla_inputs()[0], ori_kv=_mla_inputs()[1], layout_kv="TND"),
     ValueError, "layout_kv"),
    ("mla ori_mask_mode", lambda: OPS.sparse_flash_mla(_mla_inputs()[0], ori_kv=_mla_inputs()[1], ori_mask_mode=1),
     ValueError, "ori_mask_mode"),
    ("mla cmp_mask_mode", lambda: OPS.sparse_flash_mla(_mla_inputs()[0], ori_kv=_mla_inputs()[1], cmp_mask_mode=4),
     ValueError, "cmp_mask_mode"),
    ("mla topk_value_mode", lambda: OPS.sparse_flash_mla(_mla_inputs()[0], ori_kv=_mla_inputs()[1],
                                                         topk_value_mode=0), ValueError, "topk_value_mode"),
    ("mla ori_sparse_indices", lambda: OPS.sparse_flash_mla(
        _mla_inputs()[0], ori_kv=_mla_inputs()[1], ori_sparse_indices=torch.zeros(2, 3, 1, 1, dtype=torch.int32)),
     NotImplementedError, "ori_sparse_indices"),
    ("mla cmp_topk_length", lambda: OPS.sparse_flash_mla(
        _mla_inputs()[0], ori_kv=_mla_inputs()[1], cmp_topk_length=torch.zeros(2, 3, 1, dtype=torch.int32)),
     NotImplementedError, "cmp_topk_length"),
    ("mla cmp_residual_kv", lambda: OPS.sparse_flash_mla(_mla_inputs()[0], ori_kv=_mla_inputs()[1],
                                                         cmp_kv=_mla_inputs()[2], cmp_ratio=2, cmp_mask_mode=3),
     ValueError, "cmp_residual_kv"),
    ("mla ori_block_table", lambda: OPS.sparse_flash_mla(_mla_inputs()[0], ori_kv=_mla_inputs()[1],
                                                         seqused_ori_kv=torch.tensor([4, 4]), layout_kv="PA_BBND"),
     ValueError, "ori_block_table"),
    ("mla q rank", lambda: OPS.sparse_flash_mla(_mla_inputs()[0][0], ori_kv=_mla_inputs()[1]), ValueError, "'q'"),
    ("mla cmp_sparse_indices dtype", lambda: OPS.sparse_flash_mla(
        _mla_inputs()[0], ori_kv=_mla_inputs()[1], cmp_kv=_mla_inputs()[2],
        cmp_sparse_indices=torch.zeros(2, 3, 1, 2, dtype=torch.int64)), TypeError, "cmp_sparse_indices"),
    ("mla grad layout_kv", lambda: OPS.sparse_flash_mla_grad(*([_mla_inputs()[0]] * 3), torch.zeros(2, 1, 3, 4),
                                                             ori_kv=_mla_inputs()[1], layout_kv="PA_BBND"),
     ValueError, "layout_kv"),
    ("kl seqused_q", lambda: OPS.sparse_lightning_indexer_kl_loss_grad(
        *_q(), torch.zeros(2, 5, 1, 2, dtype=torch.int32), torch.zeros(2, 5, 1, 2), seqused_q=torch.tensor([5, 5]),
        layout_q="BSND", layout_k="BSND"), NotImplementedError, "seqused_q"),
    ("kl layout_k", lambda: OPS.sparse_lightning_indexer_kl_loss_grad(
        *_q(), torch.zeros(2, 5, 1, 2, dtype=torch.int32), torch.zeros(2, 5, 1, 2), layout_q="BSND"),
     NotImplementedError, "layout_k"),
    ("kl attn_softmax_l1_norm", lambda: OPS.sparse_lightning_indexer_kl_loss_grad(
        *_q(), torch.zeros(2, 5, 1, 2, dtype=torch.int32), torch.zeros(2, 5, 1, 3), layout_q="BSND",
        layout_k="BSND"), ValueError, "attn_softmax_l1_norm"),
    ("kl sparse_indices", lambda: OPS.sparse_lightning_indexer_kl_loss_grad(
        *_q(), torch.zeros(2, 5, 1, 2), torch.zeros(2, 5, 1, 2), layout_q="BSND", layout_k="BSND"), TypeError,
     "sparse_indices"),
    ("metadata heads", lambda: OPS.sparse_flash_mla_metadata(6, 4, 512), ValueError, "num_heads_q"),
    ("metadata topk", lambda: OPS.lightning_indexer_metadata(6, 1, 128, 0), ValueError, "topk"),
    ("metadata layout_kv", lambda: OPS.sparse_flash_mla_grad_metadata(6, 1, 512, layout_kv="BNSD"), ValueError,
     "layout_kv"),
]


@pytest.mark.parametrize("call,error,name", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_input_names_the_argument(call, error, name):
    with pytest.raises(error, match=name):
        call()


# ---------------------------------------------------------------------------------------------- installing

def _run(code: str, path=()):
    env = {k: v for k, v in os.environ.items() if k != "TOT_NPU_SIM"}
    env["PYTHONPATH"] = os.pathsep.join(list(path) + [pythonpath()])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


MINDSPEED_STYLE = """
    import math
    import torch
    import torch_npu
    import cann_ops_transformer
    from cann_ops_transformer.ops import lightning_indexer, lightning_indexer_metadata

    B, S1, S2, N1, D, cmp_ratio = 1, 8, 16, 4, 32, 4
    q = torch.randn(B, S1, N1, D).npu()
    kv = torch.randn(B, S2, 1, D).npu().requires_grad_()
    cmp_kv = torch.randn(B, S2 // cmp_ratio, 1, D).npu().requires_grad_()
    qi, w = torch.randn(B, S1, 2, 16).npu(), torch.randn(B, S1, 2).npu()
    ki = torch.randn(B, S2 // cmp_ratio, 1, 16).npu()
    residual = torch.zeros(B, dtype=torch.int32).npu()
    meta = lightning_indexer_metadata(2, 1, 16, 2, cmp_residual_k=residual, batch_size=B, max_seqlen_q=S1,
                                      max_seqlen_k=S2 // cmp_ratio, mask_mode=3, cmp_ratio=cmp_ratio)
    idx, _ = lightning_indexer(qi, ki, w, 2, cmp_residual_k=residual, metadata=meta, mask_mode=3, cmp_ratio=cmp_ratio)
    smeta = cann_ops_transformer.sparse_flash_mla_metadata(N1, 1, D, batch_size=B, max_seqlen_q=S1,
        max_seqlen_ori_kv=S2, cmp_topk=2, cmp_ratio=cmp_ratio, ori_mask_mode=4, cmp_mask_mode=3, ori_win_left=3,
        ori_win_right=0)
    sinks = torch.zeros(N1).npu().requires_grad_()
    out, lse = cann_ops_transformer.ops.sparse_flash_mla(q, ori_kv=kv, cmp_kv=cmp_kv, cmp_sparse_indices=idx,
        cmp_residual_kv=residual, sinks=sinks, metadata=smeta, softmax_scale=1 / math.sqrt(D), cmp_ratio=cmp_ratio,
        ori_mask_mode=4, cmp_mask_mode=3, ori_win_left=3, ori_win_right=0, return_softmax_lse=True)
    out.sum().backward()
    assert out.device.type == "npu" and out.shape == q.shape and lse.shape == (B, 1, S1, N1)
    assert torch.isfinite(out.cpu()).all() and kv.grad is not None and cmp_kv.grad is not None
    # the explicit backward gives the indexer's KL target, which trains the indexer
    grads = cann_ops_transformer.sparse_flash_mla_grad(q, torch.ones_like(out), out.detach(), lse.detach(),
        ori_kv=kv.detach(), cmp_kv=cmp_kv.detach(), cmp_sparse_indices=idx, cmp_residual_kv=residual,
        sinks=sinks.detach(), softmax_scale=1 / math.sqrt(D), cmp_ratio=cmp_ratio, ori_mask_mode=4, cmp_mask_mode=3,
        ori_win_left=3, ori_win_right=0)
    assert torch.allclose(grads[1].cpu(), kv.grad.cpu(), atol=1e-5) and grads[5].shape == idx.shape
    dq, dk, dw, y = cann_ops_transformer.ops.sparse_lightning_indexer_kl_loss_grad(qi, ki, w, idx, grads[5],
        cmp_residual_k=residual, layout_q="BSND", layout_k="BSND", cmp_ratio=cmp_ratio)
    assert dq.shape == qi.shape and dk.shape == ki.shape and dw.shape == w.shape and y.device.type == "npu"
    print("ok", tuple(idx.shape))
"""


def test_mindspeed_style_script_runs_through_the_pythonpath():
    proc = _run(MINDSPEED_STYLE, path=[str(compat.PYTHONPATH_DIR)])
    assert "ok (1, 8, 1, 2)" in proc.stdout


def test_install_in_process_and_without_the_directory():
    proc = _run("""
        import sys
        from torch_ops_transformer.compat import cann_ops_transformer as stand_in
        assert "cann_ops_transformer" not in sys.modules
        pkg = stand_in.install()
        import cann_ops_transformer, cann_ops_transformer.ops, torch_npu
        assert cann_ops_transformer is pkg and stand_in.installed()
        assert cann_ops_transformer.ops.sparse_flash_mla is cann_ops_transformer.sparse_flash_mla
        assert stand_in.install() is pkg
        print("ok")
    """)
    assert "ok" in proc.stdout


def test_a_real_cann_ops_transformer_wins(tmp_path):
    real = tmp_path / "cann_ops_transformer"
    real.mkdir()
    (real / "__init__.py").write_text("REAL = True\n")
    proc = _run("""
        import cann_ops_transformer
        assert getattr(cann_ops_transformer, "REAL", False), cann_ops_transformer
        print("ok")
    """, path=[str(compat.PYTHONPATH_DIR), str(tmp_path)])
    assert "ok" in proc.stdout
