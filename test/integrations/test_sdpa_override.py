"""The F.scaled_dot_product_attention drop-in (torch_ops_transformer.integrations.sdpa): PyTorch's semantics on our ops, checked
against an independent float64 reference with the project's tolerance rule (torch_same_dtype = PyTorch's own SDPA);
dropout statistics; the decode route; every fallback returns PyTorch's answer and logs once; the TorchFunctionMode
in eager and under torch.compile(fullgraph=True)."""
import logging
import math

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from test.common.reference import check_tolerance
from torch_ops_transformer import (
    disable_sdpa_override,
    enable_sdpa_override,
    scaled_dot_product_attention,
    sdpa_override,
    sdpa_supported,
    try_scaled_dot_product_attention,
)
from torch_ops_transformer.integrations import sdpa as sdpa_module

B, N, E = 2, 4, 16


def sdpa_ref64(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """softmax(scale·QKᵀ + mask)·V in float64 with PyTorch's conventions: bool mask True = keep, float mask added,
    is_causal top-left (j <= i), rows that see no key give 0."""
    q, k, v = (t.double() for t in (q, k, v))
    if enable_gqa and q.dim() == 4 and k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-2, -1) * scale
    sq, skv = s.shape[-2:]
    keep = torch.ones(sq, skv, dtype=torch.bool)
    if is_causal:
        keep = torch.ones(sq, skv, dtype=torch.bool).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = keep & attn_mask
    elif attn_mask is not None:
        s = s + attn_mask.double()
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.where(torch.isinf(s).all(-1, keepdim=True), torch.zeros_like(p), p)
    return p @ v


def qkv(sq=5, skv=7, dtype=torch.float32, n_kv=N, ev=E, batch=(B, N), seed=0):
    g = torch.Generator().manual_seed(seed)
    kv_batch = batch[:-1] + (n_kv,) if len(batch) == 2 else batch
    q = torch.randn(*batch, sq, E, generator=g).to(dtype)
    k = torch.randn(*kv_batch, skv, E, generator=g).to(dtype)
    v = torch.randn(*kv_batch, skv, ev, generator=g).to(dtype)
    return q, k, v


def bool_mask(shape, seed=1):
    m = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.3
    m[..., 0] = True  # most rows see a key; fully masked rows are tested separately
    return m


def float_mask(shape, dtype, seed=2):
    m = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    m = m.masked_fill(torch.rand(shape, generator=torch.Generator().manual_seed(seed + 1)) > 0.7, float("-inf"))
    m[..., 0] = 0.5
    return m.to(dtype)


def check_forward(name, q, k, v, **kw):
    ours = scaled_dot_product_attention(q, k, v, **kw)
    same = F.scaled_dot_product_attention(q, k, v, **kw)
    assert ours.shape == same.shape and ours.dtype == same.dtype
    check_tolerance(name, ours, sdpa_ref64(q, k, v, **{a: b for a, b in kw.items() if a != "dropout_p"}), same)


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sq,skv", [(6, 6), (4, 9), (9, 4), (1, 7)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_lengths_and_causal(dtype, sq, skv, is_causal):
    before = sdpa_module.route_counts["prefill"] + sdpa_module.route_counts["decode"]
    check_forward(f"{sq}x{skv} causal={is_causal}", *qkv(sq, skv, dtype), is_causal=is_causal)
    assert sdpa_module.route_counts["prefill"] + sdpa_module.route_counts["decode"] == before + 1


MASK_SHAPES = [(5, 7), (B, 1, 5, 7), (1, N, 5, 7), (B, N, 5, 7), (B, 1, 1, 7), (N, 1, 7), (5, 1), (1, 7)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", MASK_SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_mask_shapes(dtype, shape, kind):
    mask = bool_mask(shape) if kind == "bool" else float_mask(shape, dtype)
    assert sdpa_supported(*qkv(dtype=dtype), attn_mask=mask)
    check_forward(f"{kind} mask {shape}", *qkv(dtype=dtype), attn_mask=mask)


def test_float32_mask_with_bf16_query():
    """PyTorch accepts a float32 mask for a bf16 query; so do we (pse is used in fp32)."""
    check_forward("fp32 mask, bf16 q", *qkv(dtype=torch.bfloat16), attn_mask=float_mask((5, 7), torch.float32))


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_are_zero_like_pytorch(kind):
    q, k, v = qkv()
    keep = bool_mask((B, 1, 5, 7))
    keep[:, :, 2] = False
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    ours = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    same = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(same[:, :, 2], torch.zeros_like(same[:, :, 2]))  # PyTorch 2.13 CPU returns 0, not NaN
    assert torch.equal(ours[:, :, 2], torch.zeros_like(ours[:, :, 2]))
    check_tolerance("fully masked", ours, sdpa_ref64(q, k, v, attn_mask=mask), same)


@pytest.mark.parametrize("dtype", DTYPES + [torch.float16])
def test_scale_gqa_value_dim_and_3d(dtype):
    check_forward("scale", *qkv(dtype=dtype), scale=0.3)
    check_forward("gqa", *qkv(dtype=dtype, n_kv=2), enable_gqa=True, is_causal=True)
    check_forward("Ev<E", *qkv(dtype=dtype, ev=8), attn_mask=bool_mask((5, 7)))
    check_forward("3-D", *qkv(dtype=dtype, batch=(3,)), attn_mask=float_mask((3, 5, 7), dtype))
    check_forward("3-D causal", *qkv(9, 4, dtype=dtype, batch=(3,)), is_causal=True)


GRAD_CASES = {
    "causal Sq<Skv": dict(sq=4, skv=9, kw=dict(is_causal=True)),
    "causal Sq>Skv": dict(sq=9, skv=4, kw=dict(is_causal=True)),
    "bool mask": dict(kw=dict(attn_mask=bool_mask((B, 1, 5, 7)))),
    "float mask": dict(kw=dict(attn_mask=float_mask((1, N, 5, 7), torch.float32)), mask_grad=True),
    "gqa + scale": dict(n_kv=2, kw=dict(enable_gqa=True, scale=0.2)),
    "Ev<E": dict(ev=8, kw=dict()),
    "decode with grad": dict(sq=1, kw=dict()),
}


@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_gradients(case):
    c = GRAD_CASES[case]
    q, k, v = qkv(c.get("sq", 5), c.get("skv", 7), n_kv=c.get("n_kv", N), ev=c.get("ev", E))
    kw = dict(c["kw"])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if c.get("mask_grad"):
        kw["attn_mask"] = kw["attn_mask"].masked_fill(torch.isinf(kw["attn_mask"]), -3.0)
    w = torch.randn(scaled_dot_product_attention(q, k, v, **kw).shape, generator=torch.Generator().manual_seed(5))

    def grads(fn, dtype):
        xs = [t.detach().to(dtype).requires_grad_() for t in leaves]
        mk = dict(kw)
        if c.get("mask_grad"):
            mk["attn_mask"] = kw["attn_mask"].to(dtype).requires_grad_()
            xs.append(mk["attn_mask"])
        out = fn(*xs[:3], **mk)
        return torch.autograd.grad((out * w.to(dtype)).sum(), xs)

    before = sdpa_module.route_counts["prefill"]
    ours = grads(scaled_dot_product_attention, torch.float32)
    assert sdpa_module.route_counts["prefill"] == before + 1  # with autograd even Sq == 1 takes the training op
    same = grads(F.scaled_dot_product_attention, torch.float32)
    ref = grads(sdpa_ref64, torch.float64)
    for name, o, s, r in zip(("dq", "dk", "dv", "dmask"), ours, same, ref):
        check_tolerance(f"{case} {name}", o, r, s)


# ---- dropout --------------------------------------------------------------------------------------------------
def test_dropout_statistics_and_backward_uses_the_same_mask():
    """q = 0 gives uniform probabilities 1/Skv; with v = I the output *is* the dropped probability matrix."""
    p, skv, draws = 0.25, 16, 25
    q = torch.zeros(2, 2, 8, skv)
    k = torch.randn(2, 2, skv, skv)
    v = torch.eye(skv).expand(2, 2, skv, skv).contiguous().requires_grad_()
    outs = []
    for _ in range(draws):
        out = scaled_dot_product_attention(q, k, v, dropout_p=p)
        w = torch.randn(out.shape)
        (dv,) = torch.autograd.grad((out * w).sum(), [v])
        # dV = dropout(P)ᵀ·dY: exactly the forward's dropped matrix, so the backward regenerated the same mask
        torch.testing.assert_close(dv, out.detach().transpose(-2, -1) @ w)
        outs.append(out.detach())
    outs = torch.stack(outs)
    kept = (outs != 0).double().mean().item()
    assert torch.allclose(outs[outs != 0], torch.tensor(1.0 / (skv * (1 - p))))
    theirs = torch.stack([F.scaled_dot_product_attention(q, k, v.detach(), dropout_p=p) for _ in range(draws)])
    sigma = math.sqrt(p * (1 - p) / outs.numel())
    assert abs(kept - (1 - p)) < 5 * sigma
    assert abs(kept - (theirs != 0).double().mean().item()) < 8 * sigma
    # E[dropout(P)·V] = P·V = 1/Skv everywhere
    assert abs(outs.mean().item() - 1.0 / skv) < 5 * sigma / skv / (1 - p)
    # draws differ
    assert not torch.equal(outs[0], outs[1])


def test_dropout_mean_matches_undropped_output():
    q, k, v = qkv(4, 6)
    mean = torch.stack([scaled_dot_product_attention(q, k, v, dropout_p=0.2) for _ in range(400)]).mean(0)
    full = F.scaled_dot_product_attention(q, k, v)
    assert (mean - full).abs().max() < 0.25  # ~5 standard errors of the 400-draw mean for these magnitudes
    assert (mean - full).abs().mean() < 0.05


# ---- decode ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mask", ["none", "bool", "float", "bool per head"])
def test_decode_route(mask):
    q, k, v = qkv(1, 11, n_kv=2)
    masks = {"none": None, "bool": bool_mask((B, 1, 1, 11)), "float": float_mask((B, N, 1, 11), torch.float32),
             "bool per head": bool_mask((1, N, 1, 11))}
    kw = dict(attn_mask=masks[mask], enable_gqa=True)
    before = dict(sdpa_module.route_counts)
    with torch.no_grad():
        check_forward(f"decode {mask}", q, k, v, **kw)
    route = "prefill" if mask == "bool per head" else "decode"  # IFA masks are per batch, not per head
    assert sdpa_module.route_counts[route] == before.get(route, 0) + 1


def test_decode_calls_the_decode_op():
    q, k, v = qkv(1, 11)
    with torch.no_grad(), torch.profiler.profile() as prof:
        scaled_dot_product_attention(q, k, v)
    names = {e.name for e in prof.events()}
    assert "npu_fa::incre_flash_attention" in names and "npu_fa::flash_attention_score" not in names


# ---- fallbacks ------------------------------------------------------------------------------------------------
def _fallback_cases():
    q, k, v = qkv()
    return {
        "float64": ((q.double(), k.double(), v.double()), {}),
        "5-D": ((q[None], k[None], v[None]), {}),
        "batch broadcast": ((q, k[:1], v[:1]), {}),
        "Ev > E": ((q, k, torch.randn(B, N, 7, 24)), {}),
        "empty key sequence": ((q, k[:, :, :0], v[:, :, :0]), {}),
        "meta device": ((q.to("meta"), k.to("meta"), v.to("meta")), {}),
        # PyTorch 2.13's CPU flash kernel combines both, its math kernel raises: PyTorch decides
        "mask and is_causal": ((q, k, v), dict(attn_mask=bool_mask((5, 7)), is_causal=True)),
    }


FALLBACK_CASES = list(_fallback_cases())


@pytest.mark.parametrize("case", FALLBACK_CASES)
def test_fallback_returns_pytorch_answer_and_logs_once(case, caplog):
    args, kw = _fallback_cases()[case]
    reason = sdpa_module.unsupported_reason(*args, **kw)
    assert reason is not None and not sdpa_supported(*args, **kw)
    assert try_scaled_dot_product_attention(*args, **kw) is None
    sdpa_module._logged_reasons.discard(reason)
    with caplog.at_level(logging.DEBUG, logger="torch_ops_transformer.integrations.sdpa"):
        outs = [scaled_dot_product_attention(*args, **kw) for _ in range(2)]
    want = F.scaled_dot_product_attention(*args, **kw)
    for out in outs:
        assert out.shape == want.shape and out.dtype == want.dtype
        if out.device.type != "meta":
            assert torch.equal(out, want)
    messages = [r.getMessage() for r in caplog.records if r.name == "torch_ops_transformer.integrations.sdpa"]
    assert messages == [f"scaled_dot_product_attention falls back to PyTorch: {reason}"]


@pytest.mark.parametrize("case", ["1-D mask", "float64 mask", "heads differ without gqa"])
def test_calls_pytorch_rejects_raise_like_pytorch(case):
    q, k, v = qkv()
    args, kw = {
        "1-D mask": ((q, k, v), dict(attn_mask=torch.ones(7, dtype=torch.bool))),
        "float64 mask": ((q, k, v), dict(attn_mask=torch.zeros(5, 7, dtype=torch.float64))),
        "heads differ without gqa": ((q, k[:, :2], v[:, :2]), {}),
    }[case]
    assert not sdpa_supported(*args, **kw)
    with pytest.raises(Exception) as theirs:
        F.scaled_dot_product_attention(*args, **kw)
    with pytest.raises(type(theirs.value)):
        scaled_dot_product_attention(*args, **kw)


# ---- the override mode ----------------------------------------------------------------------------------------
def test_override_mode_eager_forward_backward_and_fallback():
    from torch.nn.functional import scaled_dot_product_attention as imported_early

    q, k, v = (t.requires_grad_() for t in qkv())
    before = sdpa_module.route_counts["prefill"]
    with sdpa_override():
        out = imported_early(q, k, v, is_causal=True)
        out.sum().backward()
        fallback = F.scaled_dot_product_attention(q.double(), k.double(), v.double())  # no recursion
    assert sdpa_module.route_counts["prefill"] == before + 1
    assert "FlashAttentionScore" in type(out.grad_fn).__name__ or out.grad_fn is not None
    torch.testing.assert_close(fallback, F.scaled_dot_product_attention(q.double(), k.double(), v.double()))
    F.scaled_dot_product_attention(q, k, v)  # outside: PyTorch again
    assert sdpa_module.route_counts["prefill"] == before + 1


def test_global_enable_disable():
    q, k, v = qkv()
    before = sdpa_module.route_counts["prefill"]
    enable_sdpa_override()
    enable_sdpa_override()  # idempotent
    try:
        assert sdpa_module.sdpa_override_enabled()
        F.scaled_dot_product_attention(q, k, v)
    finally:
        disable_sdpa_override()
    assert not sdpa_module.sdpa_override_enabled()
    F.scaled_dot_product_attention(q, k, v)
    assert sdpa_module.route_counts["prefill"] == before + 1


@pytest.mark.usefixtures("dynamo_reset")
def test_override_under_compile_fullgraph_dynamic_lengths():
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm

    counter = CompileCounterWithBackend(capture)

    def f(q, k, v, mask):
        return F.scaled_dot_product_attention(q * 2, k, v, attn_mask=mask).sin()

    compiled = torch.compile(f, backend=counter, fullgraph=True, dynamic=True)
    for sq, skv in ((5, 7), (9, 12)):
        q, k, v = (t.requires_grad_() for t in qkv(sq, skv))
        mask = bool_mask((sq, skv))
        with sdpa_override():
            got = compiled(q, k, v, mask)
            got_grads = torch.autograd.grad(got.sum(), [q, k, v])
        want = f(q, k, v, mask)
        want_grads = torch.autograd.grad(want.sum(), [q, k, v])
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
        for g, w in zip(got_grads, want_grads):
            torch.testing.assert_close(g, w, atol=2e-6, rtol=1e-5)
    assert counter.frame_count == 1, "a new sequence length recompiled"
    assert "torch.ops.npu_fa.flash_attention_score" in graphs[0].code


@pytest.mark.usefixtures("dynamo_reset")
def test_compiled_graph_follows_the_mode_and_mode_may_be_entered_inside():
    """Dynamo guards on the function-mode stack: a function compiled under the override runs PyTorch's SDPA when
    called without it; entering the mode inside the compiled function works too."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm.code)
        return gm

    def plain(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def entering(q, k, v):
        with sdpa_override():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = qkv()
    compiled = torch.compile(plain, backend=capture, fullgraph=True)
    with sdpa_override():
        compiled(q, k, v)
    compiled(q, k, v)
    assert len(graphs) == 2 and "npu_fa.flash_attention_score" in graphs[0]
    assert "npu_fa" not in graphs[1]
    out = torch.compile(entering, backend=capture, fullgraph=True)(q, k, v)
    assert "npu_fa.flash_attention_score" in graphs[2]
    torch.testing.assert_close(out, plain(q, k, v), atol=2e-6, rtol=1e-5)
