"""npu_fusion_attention_v2 / npu_fusion_attention_grad_v2: the v2 arguments against float64 references in plain
PyTorch — query_rope/key_rope (scores (q·k + q_rope·k_rope)·scale, forward and gradients, every layout family), in-kernel
ALiBi (pse_type 2/3) placed by q_start_idx/kv_start_idx — and their bad inputs."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance

B, N, SQ, SKV, D, DR = 2, 4, 5, 7, 16, 8


def _reference(q, k, v, qr, kr, scale, bias=None, dtype=torch.float64):
    """[B, N, S, D] inputs: softmax((q·kᵀ + qr·krᵀ)·scale + bias)·v in `dtype`."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    s = q @ k.transpose(-1, -2)
    if qr is not None:
        s = s + qr.to(dtype) @ kr.to(dtype).transpose(-1, -2)
    s = s * scale
    if bias is not None:
        s = s + bias.to(dtype)
    return torch.softmax(s, -1) @ v


def _to_layout(t, layout):
    """[B, N, S, D] -> the layout's tensor (TND: one sequence per batch entry, packed)."""
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        return t.transpose(1, 2).flatten(2)
    if layout == "SBH":
        return t.permute(2, 0, 1, 3).flatten(2)
    return t.transpose(1, 2).flatten(0, 1)  # TND


def _from_layout(t, layout, b, n, s):
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        return t.unflatten(2, (n, -1)).transpose(1, 2)
    if layout == "SBH":
        return t.unflatten(2, (n, -1)).permute(1, 2, 0, 3)
    return t.unflatten(0, (b, s)).transpose(1, 2)


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return r(B, N, SQ, D), r(B, N, SKV, D), r(B, N, SKV, D), r(B, N, SQ, DR), r(B, N, SKV, DR)


def _lens(layout):
    if layout != "TND":
        return {}
    return dict(actual_seq_qlen=[SQ * (b + 1) for b in range(B)], actual_seq_kvlen=[SKV * (b + 1) for b in range(B)])


LAYOUTS = ["BNSD", "BSND", "BSH", "SBH", "TND"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rope_forward_and_gradients(layout, dtype):
    q, k, v, qr, kr = _inputs(dtype)
    scale = 1 / math.sqrt(D + DR)
    leaves = [_to_layout(t, layout).detach().requires_grad_() for t in (q, k, v, qr, kr)]
    out = tot.npu_fusion_attention_v2(leaves[0], leaves[1], leaves[2], N, layout, query_rope=leaves[3],
                                      key_rope=leaves[4], scale=scale, **_lens(layout))[0]
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out.backward(dy)
    ours = _from_layout(out, layout, B, N, SQ)
    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v, qr, kr)]
    ref = _reference(*ref_leaves, scale)
    same = _reference(q, k, v, qr, kr, scale, dtype=dtype)
    check_tolerance(f"{layout} out", ours, ref, same)
    ref.backward(_from_layout(dy, layout, B, N, SQ).double())
    same_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, qr, kr)]
    _reference(*same_leaves, scale, dtype=dtype).backward(_from_layout(dy, layout, B, N, SQ))
    for name, ours_leaf, r, s in zip(("dq", "dk", "dv", "dq_rope", "dk_rope"), leaves, ref_leaves, same_leaves):
        s_q = SQ if name in ("dq", "dq_rope") else SKV
        check_tolerance(f"{layout} {name}", _from_layout(ours_leaf.grad, layout, B, N, s_q), r.grad, s.grad)


@pytest.mark.parametrize("layout", ["BSND", "BSH"])
def test_grad_v2_equals_autograd(layout):
    q, k, v, qr, kr = (_to_layout(t, layout) for t in _inputs(torch.float32, seed=2))
    scale = 0.3
    leaves = [t.clone().requires_grad_() for t in (q, k, v, qr, kr)]
    out, smax, ssum = tot.npu_fusion_attention_v2(leaves[0], leaves[1], leaves[2], N, layout, query_rope=leaves[3],
                                                  key_rope=leaves[4], scale=scale)[:3]
    dy = torch.randn_like(out)
    out.backward(dy)
    dq, dk, dv, dpse, dq_rope, dk_rope, dsink = tot.npu_fusion_attention_grad_v2(
        q, k, v, dy, N, layout, softmax_max=smax, softmax_sum=ssum, attention_in=out.detach(), query_rope=qr,
        key_rope=kr, scale_value=scale)
    for name, got, leaf in zip(("dq", "dk", "dv", "dq_rope", "dk_rope"), (dq, dk, dv, dq_rope, dk_rope), leaves):
        assert got.shape == leaf.shape, name
        torch.testing.assert_close(got, leaf.grad, atol=1e-5, rtol=1e-5, msg=name)
    assert dpse is None and dsink.numel() == 0


@pytest.mark.parametrize("pse_type", [2, 3])
@pytest.mark.parametrize("starts", [(None, None), ([3], [0]), ([0, 4], [2, 9])], ids=["none", "one", "per-seq"])
def test_alibi_with_start_indices(pse_type, starts):
    q, k, v = _inputs(torch.float32, seed=3)[:3]
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    q0 = torch.tensor(starts[0] or [0]).expand(B)
    k0 = torch.tensor(starts[1] or [0]).expand(B)
    i = torch.arange(SQ).view(1, SQ, 1) + q0.view(B, 1, 1)
    j = torch.arange(SKV).view(1, 1, SKV) + k0.view(B, 1, 1)
    dist = (j - i).abs().double()
    dist = dist if pse_type == 2 else dist.sqrt()
    bias = -slopes.double().view(1, N, 1, 1) * dist[:, None]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = tot.npu_fusion_attention_v2(*leaves, N, "BNSD", pse=slopes, pse_type=pse_type, scale=0.25,
                                      q_start_idx=starts[0], kv_start_idx=starts[1])[0]
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = _reference(*ref_leaves, None, None, 0.25, bias)
    check_tolerance(f"alibi {pse_type}", out, ref, _reference(q, k, v, None, None, 0.25, bias, torch.float32))
    dy = torch.randn_like(out)
    out.backward(dy)
    ref.backward(dy.double())
    same_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    _reference(*same_leaves, None, None, 0.25, bias, torch.float32).backward(dy)
    for name, a, r, s in zip(("dq", "dk", "dv"), leaves, ref_leaves, same_leaves):
        check_tolerance(f"alibi {pse_type} {name}", a.grad, r.grad, s.grad)


def test_alibi_slopes_are_float32_whatever_the_query_dtype():
    # pse_type 2/3 take float32 slopes with bf16 inputs (pse_type 0/1 need pse in the inputs' dtype)
    q, k, v = (t.bfloat16() for t in _inputs(torch.float32)[:3])
    out = tot.npu_fusion_attention_v2(q, k, v, N, "BNSD", pse=torch.full((N,), 0.5), pse_type=2, scale=0.25)[0]
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def _call(**kw):
    q, k, v, qr, kr = _inputs(torch.float32)
    args = dict(query_rope=qr, key_rope=kr)
    args.update(kw)
    return tot.npu_fusion_attention_v2(q, k, v, N, "BNSD", **args)


@pytest.mark.parametrize("kw, err, words", [
    (dict(key_rope=None), ValueError, ("'query_rope' and 'key_rope'", "together")),
    (dict(query_rope=torch.randn(B, N, SQ + 1, DR)), ValueError, ("'query_rope'", "shape")),
    (dict(key_rope=torch.randn(B, N, SKV, DR).double()), TypeError, ("'key_rope'", "torch.float32")),
    (dict(q_start_idx=[0.5]), TypeError, ("'q_start_idx'", "list of ints")),
    (dict(kv_start_idx=3), TypeError, ("'kv_start_idx'", "list of ints")),
], ids=["one-rope", "rope-shape", "rope-dtype", "start-float", "start-int"])
def test_bad_inputs(kw, err, words):
    with pytest.raises(err) as info:
        _call(**kw)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_bad_packed_rope_width():
    q, k, v, qr, kr = (_to_layout(t, "BSH") for t in _inputs(torch.float32))
    with pytest.raises(ValueError, match="multiple of the 4 heads"):
        tot.npu_fusion_attention_v2(q, k, v, N, "BSH", query_rope=qr[..., :-1], key_rope=kr)
