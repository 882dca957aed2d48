"""Validates the independent reference itself (no project kernel involved): against PyTorch's SDPA math for the
cases SDPA can express, and for internal consistency (layouts, varlen, dropout, broadcasting)."""
import pytest
import torch
import torch.nn.functional as F

from test.attention.attention_cases import Case, make_inputs
from test.common.reference import MAX_TOKENS, attention_reference, check_tolerance, reference_with_grads, split_heads

B, N1, SQ, SKV, D = 2, 4, 7, 11, 8


def _bnsd(n2=N1, sq=SQ, skv=SKV, vd=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N1, sq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, n2, skv, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, n2, skv, vd, generator=g, dtype=torch.float64)
    return q, k, v


def _sdpa(q, k, v, keep=None, bias=None, scale=1.0, is_causal=False):
    """SDPA with CANN conventions translated: `keep` True = attend; bias additive after scaling."""
    mask = bias
    if keep is not None:
        mask = torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, float("-inf")) + (0 if bias is None else bias)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=is_causal,
                                          enable_gqa=k.shape[1] != q.shape[1])


def _tril(sq, skv, diagonal):
    return torch.ones(sq, skv, dtype=torch.bool).tril(diagonal)


def _ref(q, k, v, **kw):
    return attention_reference(q, k, v, q.shape[1], "BNSD", **kw)[0]


@pytest.mark.parametrize("n2", [4, 2, 1])
def test_plain_matches_sdpa(n2):
    q, k, v = _bnsd(n2)
    torch.testing.assert_close(_ref(q, k, v, scale=0.3), _sdpa(q, k, v, scale=0.3))


@pytest.mark.parametrize("sq,skv", [(7, 11), (11, 7), (9, 9)])
def test_causal_modes_match_sdpa(sq, skv):
    q, k, v = _bnsd(sq=sq, skv=skv)
    # mode 2: top-left, SDPA's is_causal convention; mode 3: bottom-right
    torch.testing.assert_close(_ref(q, k, v, sparse_mode=2), _sdpa(q, k, v, is_causal=True))
    want3 = _sdpa(q, k, v, keep=_tril(sq, skv, skv - sq))
    got3 = _ref(q, k, v, sparse_mode=3)
    visible_rows = slice(max(0, sq - skv), None)  # rows above the bottom-right diagonal see nothing
    torch.testing.assert_close(got3[:, :, visible_rows], want3[:, :, visible_rows])
    assert torch.count_nonzero(got3[:, :, :max(0, sq - skv)]) == 0


def test_band_modes_match_sdpa():
    q, k, v = _bnsd()
    pre, nxt = 3, 1
    band0 = _tril(SQ, SKV, nxt) & ~_tril(SQ, SKV, -pre - 1)
    torch.testing.assert_close(_ref(q, k, v, pre_tokens=pre, next_tokens=nxt), _sdpa(q, k, v, keep=band0))
    d = SKV - SQ
    band4 = _tril(SQ, SKV, d + nxt) & ~_tril(SQ, SKV, d - pre - 1)
    torch.testing.assert_close(_ref(q, k, v, sparse_mode=4, pre_tokens=pre, next_tokens=nxt),
                               _sdpa(q, k, v, keep=band4))
    # mode 1 ignores pre/next; modes 2-4 ignore a (compressed) mask
    torch.testing.assert_close(_ref(q, k, v, sparse_mode=1, pre_tokens=0, next_tokens=0), _sdpa(q, k, v))
    torch.testing.assert_close(_ref(q, k, v, sparse_mode=3, atten_mask=torch.ones(SQ, SKV, dtype=torch.bool)),
                               _ref(q, k, v, sparse_mode=3))


@pytest.mark.parametrize("shape", [(B, N1, SQ, SKV), (B, 1, SQ, SKV), (1, 1, SQ, SKV), (SQ, SKV)])
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8])
def test_masks_match_sdpa(shape, dtype):
    q, k, v = _bnsd()
    m = torch.rand(shape, generator=torch.Generator().manual_seed(3)) < 0.4
    m[..., :, 0] = False  # keep every row non-empty for SDPA
    torch.testing.assert_close(_ref(q, k, v, atten_mask=m.to(dtype)), _sdpa(q, k, v, keep=~m))


def test_fully_masked_rows_are_zero_with_zero_grad():
    q, k, v = _bnsd()
    m = torch.zeros(SQ, SKV, dtype=torch.bool)
    m[2] = True
    inputs = {"query": q, "key": k, "value": v}
    out, lse, grads = reference_with_grads(inputs, torch.ones(B, N1, SQ, D, dtype=torch.float64), torch.float64,
                                           head_num=N1, input_layout="BNSD", atten_mask=m)
    assert out[:, :, 2].abs().max() == 0 and torch.isinf(lse[:, :, 2]).all()
    assert torch.isfinite(out).all() and torch.isfinite(grads["query"]).all()
    assert grads["query"][:, :, 2].abs().max() == 0


@pytest.mark.parametrize("pse_shape", [(B, N1, SQ, SKV), (B, N1, 1, SKV), (1, N1, SQ, SKV)])
def test_pse_types_match_sdpa(pse_shape):
    q, k, v = _bnsd()
    pse = torch.randn(pse_shape, dtype=torch.float64)
    scale = 0.4
    torch.testing.assert_close(_ref(q, k, v, pse=pse, scale=scale, pse_type=0), _sdpa(q, k, v, bias=pse, scale=scale))
    torch.testing.assert_close(_ref(q, k, v, pse=pse, scale=scale, pse_type=1),
                               _sdpa(q, k, v, bias=pse * scale, scale=scale))


def test_lse_matches_logsumexp():
    q, k, v = _bnsd()
    _, lse = attention_reference(q, k, v, N1, "BNSD", scale=0.5)
    torch.testing.assert_close(lse, torch.logsumexp(0.5 * q @ k.transpose(-1, -2), -1))


def test_gradients_match_sdpa():
    q, k, v = _bnsd(n2=2, vd=5)
    pse = torch.randn(B, N1, 1, SKV, dtype=torch.float64)
    dy = torch.randn(B, N1, SQ, 5, dtype=torch.float64)
    inputs = {"query": q, "key": k, "value": v, "pse": pse}
    _, _, got = reference_with_grads(inputs, dy, torch.float64, head_num=N1, input_layout="BNSD", scale=0.3,
                                     pse_type=0, sparse_mode=3)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, pse)]
    out = _sdpa(*leaves[:3], keep=_tril(SQ, SKV, SKV - SQ), bias=leaves[3], scale=0.3)
    want = torch.autograd.grad(out, leaves, dy)
    for name, w in zip(("query", "key", "value", "pse"), want):
        torch.testing.assert_close(got[name], w, msg=name)


@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND"])
def test_layouts_agree_with_bnsd(layout):
    q, k, v = _bnsd(n2=2, vd=5)

    def to(t):
        if layout == "BSND":
            return t.transpose(1, 2)
        bsh = t.transpose(1, 2).flatten(2)
        return bsh.transpose(0, 1) if layout == "SBH" else bsh

    out, lse = attention_reference(to(q), to(k), to(v), N1, layout, sparse_mode=3)
    out_bnsd, lse_bnsd = attention_reference(q, k, v, N1, "BNSD", sparse_mode=3)
    torch.testing.assert_close(out, to(out_bnsd))
    torch.testing.assert_close(lse, lse_bnsd)


def test_tnd_equals_per_sequence_bnsd():
    qlens, kvlens = [3, 0, 1, 6], [4, 2, 1, 0]
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(qlens), N1, D, generator=g, dtype=torch.float64)
    k = torch.randn(sum(kvlens), 2, D, generator=g, dtype=torch.float64)
    v = torch.randn(sum(kvlens), 2, 3, generator=g, dtype=torch.float64)
    mask = torch.rand(8, 8, generator=g) < 0.3
    cq, ck = torch.tensor(qlens).cumsum(0), torch.tensor(kvlens).cumsum(0)
    out, lse = attention_reference(q, k, v, N1, "TND", actual_seq_qlen=cq, actual_seq_kvlen=ck.tolist(),
                                   atten_mask=mask, pre_tokens=2, next_tokens=0)
    heads = split_heads(q, k, v, N1, "TND", cq, ck)
    for b, (s, n) in enumerate(zip(heads.q_starts, heads.q_lens)):
        if n == 0:
            continue
        qb, kb, vb = (t.unsqueeze(0) for t in (heads.q[b], heads.k[b], heads.v[b]))
        want, want_lse = attention_reference(qb, kb, vb, N1, "BNSD", atten_mask=mask[:n, :kvlens[b]],
                                             pre_tokens=2, next_tokens=0)
        torch.testing.assert_close(out[s:s + n], want[0].transpose(0, 1))
        torch.testing.assert_close(lse[s:s + n], want_lse[0].transpose(0, 1))
    assert out[3:4].abs().max() == 0  # the sequence with no keys


def test_dropout_scales_kept_probabilities():
    q, k, v = _bnsd()
    keep = torch.rand(B * N1 * SQ * SKV, generator=torch.Generator().manual_seed(1)) < 0.6
    out, lse = attention_reference(q, k, v, N1, "BNSD", keep_prob=0.6, dropout_keep=keep)
    p = torch.softmax(q @ k.transpose(-1, -2), -1)
    kept = keep.view(B, N1, SQ, SKV)  # the flattened [B, N1, Sq, Skv] mask
    torch.testing.assert_close(out, (p * kept / 0.6) @ v)
    torch.testing.assert_close(lse, attention_reference(q, k, v, N1, "BNSD")[1])  # stats ignore dropout


def test_dropout_mask_of_tnd_is_sequence_by_sequence_head_major():
    q = torch.randn(5, N1, D, dtype=torch.float64)
    k = torch.randn(6, N1, D, dtype=torch.float64)
    v = torch.randn(6, N1, D, dtype=torch.float64)
    cq, ck = [2, 5], [2, 6]
    keep = torch.rand(N1 * (2 * 2 + 3 * 4)) < 0.5
    out, _ = attention_reference(q, k, v, N1, "TND", actual_seq_qlen=cq, actual_seq_kvlen=ck, keep_prob=0.5,
                                 dropout_keep=keep)
    # token t = 3 (second sequence, local row 1), head n = 2: the second sequence's [N1, 3, 4] block starts after the
    # first's N1*2*2 elements; its row (n, 1) holds keys 0..3 of sequence 1
    t, n = 3, 2
    s = q[t, n] @ k[2:6, n].T
    block = keep[N1 * 4:].view(N1, 3, 4)
    p = torch.softmax(s, -1) * block[n, 1] / 0.5
    torch.testing.assert_close(out[t, n], p @ v[2:6, n])


def test_same_dtype_run_is_less_accurate_but_close():
    case = Case(layout="BSND", dtype="bf16", sparse_mode=3)
    args = make_inputs(case)
    dy = torch.randn(args["query"].shape[:-1] + (case.vd,)).to(torch.bfloat16)
    kw = {k: v for k, v in args.items() if k not in ("query", "key", "value", "pse", "seed", "offset")}
    ref = reference_with_grads(args, dy, torch.float64, **kw)
    same = reference_with_grads(args, dy, None, **kw)
    assert same[0].dtype == torch.bfloat16 and ref[0].dtype == torch.float64
    err = (same[0].double() - ref[0]).abs().max()
    assert 0 < err < 0.1
    check_tolerance("same vs itself", same[0], ref[0], same[0])
    with pytest.raises(AssertionError, match="exceeds"):
        check_tolerance("perturbed", ref[0] + 3 * err + 1e-3, ref[0], same[0])


def test_empty_batch_and_empty_keys():
    q, k, v = _bnsd()
    out, lse = attention_reference(q[:0], k[:0], v[:0], N1, "BNSD")
    assert out.shape == (0, N1, SQ, D) and lse.shape == (0, N1, SQ)
    out, lse = attention_reference(q, k[:, :, :0], v[:, :, :0], N1, "BNSD")
    assert out.shape == (B, N1, SQ, D) and out.abs().max() == 0 and torch.isinf(lse).all()
    assert MAX_TOKENS == 2**31 - 1
