"""F.scaled_dot_product_attention on npu tensors through PyTorch's overrideable SDPA hook (torch_ops_transformer.
npu_sdpa), on the simulated device. Run in a child process by test_sdpa.py (see runner.py).

Each case compares the npu result with PyTorch's own CPU F.scaled_dot_product_attention (torch_same_dtype) against a
float64 reference under the tolerance rule, and checks with npu_sdpa.route_counts and the profiler that our kernel
(not PyTorch's math fallback) ran."""
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from test.common.reference import check_tolerance
from torch_ops_transformer.npu_sim import sdpa as npu_sdpa

B, N, E = 2, 4, 16


def ref64(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """softmax(scale·QKᵀ + mask)·V in float64, PyTorch's conventions: bool True = keep, float added, is_causal
    top-left, GQA repeats kv heads, rows that see no key give 0."""
    q, k, v = (t.cpu().double() for t in (q, k, v))
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k, v = (t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3) for t in (k, v))
    s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    keep = torch.ones(s.shape[-2:], dtype=torch.bool)
    if is_causal:
        keep = keep.tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        keep = keep & attn_mask.cpu()
    elif attn_mask is not None:
        s = s + attn_mask.cpu().double()
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.where(torch.isinf(s).all(-1, keepdim=True), torch.zeros_like(p), p)
    return p @ v


def qkv(sq=5, skv=7, dtype=torch.float32, n_kv=N, ev=E, lead=(B, N), seed=0):
    g = torch.Generator().manual_seed(seed)
    kv_lead = lead[:-1] + (n_kv,) if len(lead) == 2 else lead
    q = torch.randn(*lead, sq, E, generator=g).to(dtype)
    k = torch.randn(*kv_lead, skv, E, generator=g).to(dtype)
    v = torch.randn(*kv_lead, skv, ev, generator=g).to(dtype)
    return q, k, v


def bool_mask(shape, seed=1):
    m = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.3
    m[..., 0] = True
    return m


def float_mask(shape, dtype, seed=2):
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(shape, generator=g).masked_fill(torch.rand(shape, generator=g) > 0.7, float("-inf"))
    m[..., 0] = 0.5
    return m.to(dtype)


def npu(*ts):
    return [None if t is None else t.to("npu") for t in ts]


def ran_ours(before):
    return npu_sdpa.route_counts["overrideable"] - before


def check_forward(name, q, k, v, attn_mask=None, **kw):
    before = npu_sdpa.route_counts["overrideable"]
    qn, kn, vn, mn = npu(q, k, v, attn_mask)
    ours = F.scaled_dot_product_attention(qn, kn, vn, attn_mask=mn, **kw)
    assert ran_ours(before) == 1, f"{name}: the overrideable kernel did not run ({dict(npu_sdpa.route_counts)})"
    assert ours.device.type == "npu" and ours.dtype == q.dtype
    same = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)
    assert ours.shape == same.shape, (name, ours.shape, same.shape)
    check_tolerance(name, ours.cpu(), ref64(q, k, v, attn_mask, **kw), same)


def case_lengths_causal_dtypes():
    for dtype in (torch.float32, torch.bfloat16):
        for sq, skv in ((6, 6), (4, 9), (9, 4), (1, 7), (17, 33)):
            for is_causal in (False, True):
                check_forward(f"{dtype} {sq}x{skv} causal={is_causal}", *qkv(sq, skv, dtype), is_causal=is_causal)


def case_masks_bool_and_float():
    for dtype in (torch.float32, torch.bfloat16):
        for shape in ((5, 7), (B, 1, 5, 7), (1, N, 5, 7), (B, N, 5, 7), (B, 1, 1, 7), (N, 1, 7), (1, 7)):
            check_forward(f"bool mask {shape} {dtype}", *qkv(dtype=dtype), attn_mask=bool_mask(shape))
            check_forward(f"float mask {shape} {dtype}", *qkv(dtype=dtype), attn_mask=float_mask(shape, dtype))


def case_fully_masked_row_is_zero_like_pytorch():
    q, k, v = qkv()
    keep = bool_mask((B, 1, 5, 7))
    keep[:, :, 2] = False
    ours = F.scaled_dot_product_attention(*npu(q, k, v), attn_mask=keep.to("npu")).cpu()
    assert torch.equal(ours[:, :, 2], torch.zeros_like(ours[:, :, 2])), ours[:, :, 2]
    check_tolerance("fully masked row", ours, ref64(q, k, v, keep), F.scaled_dot_product_attention(
        q, k, v, attn_mask=keep))


def case_scale_gqa_value_dim_3d_fp16():
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        check_forward(f"scale {dtype}", *qkv(dtype=dtype), scale=0.3)
        check_forward(f"gqa causal {dtype}", *qkv(dtype=dtype, n_kv=2), enable_gqa=True, is_causal=True)
        check_forward(f"Ev<E {dtype}", *qkv(dtype=dtype, ev=8), attn_mask=bool_mask((5, 7)))
        check_forward(f"3-D {dtype}", *qkv(dtype=dtype, lead=(3,)), attn_mask=float_mask((3, 5, 7), dtype))
        check_forward(f"3-D causal {dtype}", *qkv(9, 4, dtype=dtype, lead=(3,)), is_causal=True)


def case_non_contiguous_inputs_keep_pytorch_layout():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, 5, N, E, generator=g).transpose(1, 2) for _ in range(3))  # BSND storage viewed BNSD
    ours = F.scaled_dot_product_attention(*npu(q, k, v), is_causal=True)
    same = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert ours.stride() == q.stride(), (ours.stride(), q.stride())  # what PyTorch's meta kernel promises
    check_tolerance("BSND views", ours.cpu(), ref64(q, k, v, is_causal=True), same)


GRAD_CASES = {
    "causal Sq<Skv": dict(sq=4, skv=9, kw=dict(is_causal=True)),
    "causal Sq>Skv bf16": dict(sq=9, skv=4, dtype=torch.bfloat16, kw=dict(is_causal=True)),
    "bool mask": dict(kw=dict(attn_mask=bool_mask((B, 1, 5, 7)))),
    "float mask with grad": dict(kw=dict(attn_mask=float_mask((1, N, 5, 7), torch.float32)), mask_grad=True),
    "gqa + scale": dict(n_kv=2, kw=dict(enable_gqa=True, scale=0.2)),
    "Ev<E": dict(ev=8, kw=dict()),
    "3-D": dict(lead=(3,), kw=dict(is_causal=True)),
}


def _grads(fn, leaves, kw, w, dtype, device, mask_grad):
    xs = [t.detach().to(dtype).to(device).requires_grad_() for t in leaves]
    mk = dict(kw)
    if "attn_mask" in mk:
        mk["attn_mask"] = mk["attn_mask"].to(device)
        if mask_grad:
            mk["attn_mask"] = mk["attn_mask"].detach().to(dtype).requires_grad_()
            xs.append(mk["attn_mask"])
    out = fn(*xs[:3], **mk)
    return [g.cpu() for g in torch.autograd.grad((out * w.to(dtype).to(device)).sum(), xs)]


def case_backward_grads_equal_pytorch():
    for name, c in GRAD_CASES.items():
        dtype = c.get("dtype", torch.float32)
        q, k, v = qkv(c.get("sq", 5), c.get("skv", 7), n_kv=c.get("n_kv", N), ev=c.get("ev", E),
                      lead=c.get("lead", (B, N)))
        kw, mask_grad = dict(c["kw"]), c.get("mask_grad", False)
        if mask_grad:  # finite entries: a -inf mask entry has no meaningful gradient
            kw["attn_mask"] = kw["attn_mask"].masked_fill(torch.isinf(kw["attn_mask"]), -3.0)
        w = torch.randn(F.scaled_dot_product_attention(q, k, v, **kw).shape,
                        generator=torch.Generator().manual_seed(5))
        before = npu_sdpa.route_counts["backward"]
        ours = _grads(F.scaled_dot_product_attention, (q, k, v), kw, w, dtype, "npu", mask_grad)
        assert npu_sdpa.route_counts["backward"] == before + 1, f"{name}: our backward did not run"
        same = _grads(F.scaled_dot_product_attention, (q, k, v), kw, w, dtype, "cpu", mask_grad)
        ref = _grads(ref64, (q, k, v), kw, w, torch.float64, "cpu", mask_grad)
        for gname, o, s, r in zip(("dq", "dk", "dv", "dmask"), ours, same, ref):
            assert o.shape == s.shape and o.dtype == s.dtype, (name, gname, o.shape, s.shape)
            check_tolerance(f"{name} {gname}", o, r, s)


def case_profiler_shows_our_kernels():
    q, k, v = (t.requires_grad_() for t in npu(*qkv()))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    names = {e.key for e in prof.key_averages()}
    for op in ("aten::_scaled_dot_product_fused_attention_overrideable", "npu_fa::flash_attention_score",
               "aten::_scaled_dot_product_fused_attention_overrideable_backward",
               "npu_fa::flash_attention_score_grad"):
        assert op in names, f"{op} not in the profile: {sorted(n for n in names if 'attention' in n)}"
    assert "aten::_scaled_dot_product_attention_math" not in names


def _ran_math(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    names = {e.key for e in prof.key_averages()}
    return out, "aten::_scaled_dot_product_attention_math" in names and "npu_fa::flash_attention_score" not in names


def case_unsupported_inputs_fall_back_to_math_and_stay_right():
    # float64: our kernels take fp32/fp16/bf16; Ev > E: not in the op's contract.
    for name, (q, k, v) in {"float64": qkv(dtype=torch.float64), "Ev>E": qkv(ev=24)}.items():
        before = sum(n for r, n in npu_sdpa.route_counts.items() if r.startswith("math: "))
        ours, math_ran = _ran_math(lambda: F.scaled_dot_product_attention(*npu(q, k, v), is_causal=True))
        assert math_ran, f"{name}: PyTorch's math path did not run"
        assert sum(n for r, n in npu_sdpa.route_counts.items() if r.startswith("math: ")) == before + 1
        torch.testing.assert_close(ours.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                   rtol=1e-5, atol=1e-5)
    # mask together with is_causal: declined (PyTorch's math path then raises, as it does on CPU's math backend)
    q, k, v = npu(*qkv())
    assert npu_sdpa.choose_backend(q, k, v, bool_mask((5, 7)).to("npu"), 0.0, True) == npu_sdpa.MATH
    # the user can switch the backend off with PyTorch's own context manager
    q, k, v = qkv()
    with sdpa_kernel([SDPBackend.MATH]):
        ours, math_ran = _ran_math(lambda: F.scaled_dot_product_attention(*npu(q, k, v)))
    assert math_ran
    check_tolerance("math backend", ours.cpu(), ref64(q, k, v), F.scaled_dot_product_attention(q, k, v))
    assert npu_sdpa.choose_backend(*npu(q, k, v)) == npu_sdpa.OVERRIDEABLE


def case_dropout_uses_our_philox_stream_in_forward_and_backward():
    """Same default-generator state -> same seed -> the npu result equals npu_fa.flash_attention_score on CPU with
    that seed, forward and gradients (the backward regenerates the forward's mask from philox_seed/offset)."""
    q, k, v = qkv(6, 9)
    w = torch.randn(B, N, 6, E, generator=torch.Generator().manual_seed(8))
    torch.manual_seed(11)
    xs = [t.to("npu").requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*xs, dropout_p=0.3)
    ours = [out.detach().cpu()] + [g.cpu() for g in torch.autograd.grad((out * w.to("npu")).sum(), xs)]
    torch.manual_seed(11)
    seed = torch.randint(0, 2**62, (), dtype=torch.int64)  # what the kernel draws (attention._draw_seed)
    ys = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = torch.ops.npu_fa.flash_attention_score(*ys, N, "BNSD", scale=1 / math.sqrt(E), keep_prob=0.7, pse_type=0,
                                                 seed=seed, offset=torch.zeros((), dtype=torch.int64))[0]
    theirs = [ref.detach()] + list(torch.autograd.grad((ref * w).sum(), ys))
    assert torch.equal(ours[0], theirs[0]), f"dropout out: differs by {(ours[0] - theirs[0]).abs().max().item()}"
    # The backward gets the statistics as logsumexp (max = lse, sum = 1) instead of the op's max/sum: rounding-level
    # differences only; another dropout mask would differ by O(1).
    for name, a, b in zip(("dq", "dk", "dv"), ours[1:], theirs[1:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"dropout {name}")


def case_torch_compile_fullgraph():
    """Dynamo + AOTAutograd trace SDPA on npu tensors into the overrideable ops (the choice runs on fake tensors);
    backend aot_eager (Inductor on the device: inductor_worker.py)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def fn(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).relu()

    q, k, v = qkv(dtype=torch.float32)
    mask = float_mask((B, 1, 5, 7), torch.float32)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, fullgraph=True, backend=counter)
    xs = [t.to("npu").requires_grad_() for t in (q, k, v)]
    before, before_bwd = npu_sdpa.route_counts["overrideable"], npu_sdpa.route_counts["backward"]
    out = compiled(*xs, mask.to("npu"))
    assert counter.frame_count == 1 and ran_ours(before) == 1  # the compiled graph called our kernel
    out.sum().backward()
    assert npu_sdpa.route_counts["backward"] == before_bwd + 1
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = fn(*eager, mask)
    ref.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=2e-5, atol=2e-5)
    for a, b in zip(xs, eager):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=2e-5, atol=2e-5)
