"""Non-finite values through the SDPA override give PyTorch's answer: a NaN (or inf) in query, key or value, or a
NaN / +inf in a float mask, produces bitwise the same NaN pattern (and values) as F.scaled_dot_product_attention, in
the prefill and the decode shapes and with gradients; -inf in a float mask (the usual "masked") still runs our ops."""
import pytest
import torch
import torch.nn.functional as F

from torch_ops_transformer import sdpa_override, try_scaled_dot_product_attention
from torch_ops_transformer import sdpa as sdpa_module

NAN, INF = float("nan"), float("inf")
BUILTIN_SDPA = torch._C._nn.scaled_dot_product_attention


def _qkv(sq, dtype):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 3, s, 8, generator=g).to(dtype) for s in (sq, 6, 6))


def _poison(case, q, k, v):
    mask = torch.randn(q.shape[-2], 6, generator=torch.Generator().manual_seed(1)).to(q.dtype)
    if case == "query":
        q[0, 1, -1, 3] = NAN
    elif case == "key":
        k[1, 0, 4, 0] = NAN
    elif case == "value":
        v[0, 2, 3, 5] = NAN
    elif case == "query_inf":
        q[1, 1, 0, 2] = INF
    elif case == "key_neg_inf":
        k[0, 0, 2, 1] = -INF
    elif case == "mask":
        mask[-1, 3] = NAN
    elif case == "mask_pos_inf":
        mask[0, 2] = INF
    return q, k, v, (mask if case.startswith("mask") else None)


CASES = ["query", "key", "value", "query_inf", "key_neg_inf", "mask", "mask_pos_inf"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sq", [5, 1])                                   # prefill and the decode route
@pytest.mark.parametrize("case", CASES)
def test_nonfinite_inputs_match_pytorch_bitwise(case, sq, dtype):
    q, k, v, mask = _poison(case, *_qkv(sq, dtype))
    want = BUILTIN_SDPA(q, k, v, attn_mask=mask)
    if case != "query":  # PyTorch's CPU kernel turns a NaN in a query row into finite values; any answer is matched
        assert not torch.isfinite(want).all(), "the case must produce non-finite values in PyTorch"
    with sdpa_override():
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))
    assert try_scaled_dot_product_attention(q, k, v, attn_mask=mask) is None


@pytest.mark.parametrize("case", ["query", "key", "value", "mask"])
def test_nonfinite_gradients_match_pytorch(case):
    q, k, v, mask = _poison(case, *_qkv(5, torch.float32))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = BUILTIN_SDPA(*leaves, attn_mask=mask)
    want_grads = torch.autograd.grad(want.sum(), leaves)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with sdpa_override():
        got = F.scaled_dot_product_attention(*leaves, attn_mask=mask)
    got_grads = torch.autograd.grad(got.sum(), leaves)
    assert torch.equal(got.isnan(), want.isnan())
    for g, w in zip(got_grads, want_grads):
        assert torch.equal(g.isnan(), w.isnan())


def test_nonfinite_fallback_is_counted_and_neg_inf_mask_still_runs_our_ops():
    q, k, v = _qkv(5, torch.float32)
    mask = torch.zeros(5, 6).masked_fill(torch.eye(5, 6, dtype=torch.bool), -INF)
    mask[2, :] = -INF                                                    # a fully masked row: 0, like PyTorch
    before = dict(sdpa_module.route_counts)
    with sdpa_override():
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert sdpa_module.route_counts["prefill"] == before.get("prefill", 0) + 1
    torch.testing.assert_close(got, BUILTIN_SDPA(q, k, v, attn_mask=mask), atol=2e-6, rtol=1e-5)
    q[0, 0, 0, 0] = NAN
    with sdpa_override():
        F.scaled_dot_product_attention(q, k, v)
    assert sdpa_module.route_counts["prefill"] == before.get("prefill", 0) + 1
    assert any(r.startswith("fallback: non-finite values in query") for r in sdpa_module.route_counts)


def test_float16_sum_overflow_without_nonfinite_values_still_runs_our_ops():
    """A float16 value tensor whose sum overflows (but holds no inf) is not mistaken for a non-finite one."""
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 3, 5, 8, generator=g).half() for _ in range(2))
    v = (torch.randn(2, 3, 64, 8, generator=g) + 300).half()
    k = torch.randn(2, 3, 64, 8, generator=g).half()
    assert not torch.isfinite(v.sum()) and torch.isfinite(v).all()
    before = sdpa_module.route_counts["prefill"]
    with sdpa_override():
        got = F.scaled_dot_product_attention(q, k, v)
    assert sdpa_module.route_counts["prefill"] == before + 1
    torch.testing.assert_close(got.float(), BUILTIN_SDPA(q.float(), k.float(), v.float()), atol=0.5, rtol=2e-3)
