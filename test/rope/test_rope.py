"""Rotary position embedding: float64 references (HF rotate_half, GPT-J interleave, CANN quarter and
interleave-half written plainly) over layouts x modes x dtypes x broadcast shapes, gradients incl. dcos/dsin,
in-place semantics, the vLLM cos/sin-cache op, bad inputs and torch.compile."""
import itertools

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import DTYPES, check_tolerance
from test.common.tiers import pairwise

OPS = torch.ops.npu_fa
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


# ---- references (float64, plain PyTorch) ------------------------------------------------------------------------
def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleave(x):
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def rotate_quarter(x):
    x1, x2, x3, x4 = x.chunk(4, dim=-1)
    return torch.cat((-x2, x1, -x4, x3), dim=-1)


def ref_rope(x, cos, sin, mode):
    if mode == 0:
        return x * cos + rotate_half(x) * sin
    if mode == 1:
        return x * cos + rotate_interleave(x) * sin
    if mode == 2:
        return x * cos + rotate_quarter(x) * sin
    y = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)  # interleave-half: reorder, then half
    return y * cos + rotate_half(y) * sin


def ref_cache_rope(positions, x, cache, head_size, neox, dtype=torch.float64):
    t = positions.shape[0]
    x = x.to(dtype).reshape(t, -1, head_size)
    rot = cache.shape[1]
    cos, sin = cache.to(dtype)[positions].chunk(2, dim=-1)  # [T, rot/2]
    cos, sin = cos[:, None], sin[:, None]
    xr, rest = x[..., :rot], x[..., rot:]
    if neox:
        x1, x2 = xr.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((out, rest), dim=-1)


def tables(shape, dtype, freq_mode=0):
    """Realistic cos/sin of a table shape (angles per position), plus noise so every element matters."""
    ang = torch.randn(shape, dtype=torch.float64)
    return ang.cos().to(dtype), ang.sin().to(dtype)


# layout -> (x shape, cos/sin shapes that broadcast to it)
B, N, S, D = 2, 3, 5, 16
LAYOUTS = {
    "BNSD": ((B, N, S, D), [(1, 1, S, D), (B, 1, S, D), (B, N, S, D), (S, D)]),
    "BSND": ((B, S, N, D), [(1, S, 1, D), (B, S, 1, D), (B, S, N, D)]),
    "SBND": ((S, B, N, D), [(S, 1, 1, D), (S, B, 1, D)]),
    "TND": ((7, N, D), [(7, 1, D), (7, N, D), (D,)]),
}
# Pairwise over (layout and its cos/sin shape) x mode x dtype; the full tier runs the whole product.
GRID = pairwise(shape={f"{lay}-{'x'.join(map(str, cs))}": (lay, cs) for lay, (_, shapes) in LAYOUTS.items()
                       for cs in shapes}, mode=range(4), dtype=list(DTYPES))


@pytest.mark.asan
@pytest.mark.parametrize("shape,mode,dtype", GRID)
def test_forward_vs_reference(shape, mode, dtype):
    layout, cshape = shape
    dt = DTYPES[dtype]
    x = torch.randn(LAYOUTS[layout][0]).to(dt)
    cos, sin = tables(cshape, dt)
    out = OPS.rotary_position_embedding(x, cos, sin, mode)
    ref = ref_rope(x.double(), cos.double(), sin.double(), mode)
    assert out.dtype == dt and out.shape == x.shape and out.is_contiguous()
    torch.testing.assert_close(out.double(), ref, atol=TOL[dt] * 4, rtol=TOL[dt])


# Head sizes whose halves / quarters / pairs fill whole vectors and leave tails at every ISA's width (AVX2 8 floats,
# AVX-512 16; 4 and 8 doubles): 40 (halves of 20, quarters of 10), 136 (68 / 34) and 8 (no full vector).
@pytest.mark.parametrize("dtype,mode,D", list(itertools.product(("fp32", "bf16", "fp16", "fp64"), range(4),
                                                                (8, 40, 136))))
def test_forward_vector_widths_and_tails(dtype, mode, D):
    dt = {**DTYPES, "fp64": torch.float64}[dtype]
    x = torch.randn(3, 5, 2, D).to(dt)
    cos, sin = tables((3, 5, 1, D), dt)
    out = OPS.rotary_position_embedding(x, cos, sin, mode)
    ref = ref_rope(x.double(), cos.double(), sin.double(), mode)
    same = ref_rope(x.float(), cos.float(), sin.float(), mode).to(dt) if dt != torch.float64 else ref
    check_tolerance(f"rope mode {mode} D {D}", out, ref, same)


@pytest.mark.parametrize("layout,mode", list(itertools.product(LAYOUTS, range(4))))
def test_gradcheck_float64(layout, mode):
    xs, shapes = LAYOUTS[layout]
    x = torch.randn(xs, dtype=torch.float64, requires_grad=True)
    cs = shapes[0]
    cos = torch.randn(cs, dtype=torch.float64, requires_grad=True)
    sin = torch.randn(cs, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: OPS.rotary_position_embedding(a, b, c, mode), (x, cos, sin),
                                    fast_mode=True)


@pytest.mark.parametrize("dtype,mode", list(itertools.product(DTYPES, range(4))))
def test_gradients_vs_reference_low_precision(dtype, mode):
    dt = DTYPES[dtype]
    x = torch.randn(B, S, N, D).to(dt).requires_grad_()
    cos, sin = (t.requires_grad_() for t in tables((B, S, 1, D), dt))
    dy = torch.randn(B, S, N, D).to(dt)
    OPS.rotary_position_embedding(x, cos, sin, mode).backward(dy)
    xr, cr, sr = (t.detach().double().requires_grad_() for t in (x, cos, sin))
    ref_rope(xr, cr, sr, mode).backward(dy.double())
    for ours, ref in ((x.grad, xr.grad), (cos.grad, cr.grad), (sin.grad, sr.grad)):
        assert ours.dtype == dt and ours.shape == ref.shape
        torch.testing.assert_close(ours.double(), ref, atol=TOL[dt] * 8, rtol=TOL[dt] * 2)


def test_only_x_requires_grad():
    x = torch.randn(B, S, N, D, requires_grad=True)
    cos, sin = tables((S, 1, D), torch.float32)
    OPS.rotary_position_embedding(x, cos, sin, 1).sum().backward()
    assert x.grad is not None and cos.grad is None


def test_mixed_table_dtype():
    x = torch.randn(B, S, N, D, dtype=torch.bfloat16)
    cos, sin = tables((1, S, 1, D), torch.float32)
    out = tot.npu_rotary_mul(x, cos, sin)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref_rope(x.double(), cos.double(), sin.double(), 0), atol=3e-2, rtol=2e-2)


@pytest.mark.asan
def test_non_contiguous_input():
    x = torch.randn(B, N, S, D).transpose(1, 2)  # BSND view of BNSD memory
    cos, sin = tables((1, S, 1, D), torch.float32)
    torch.testing.assert_close(OPS.rotary_position_embedding(x, cos, sin, 0), ref_rope(x, cos, sin, 0))


def test_npu_rotary_mul_modes():
    x = torch.randn(B, S, N, D)
    cos, sin = tables((1, S, 1, D), torch.float32)
    for name, mode in (("half", 0), ("interleave", 1)):
        torch.testing.assert_close(tot.npu_rotary_mul(x, cos, sin, rotary_mode=name), ref_rope(x, cos, sin, mode))
    torch.testing.assert_close(tot.npu_rotary_position_embedding(x, cos, sin, 2), ref_rope(x, cos, sin, 2))


# ---- apply_rotary_pos_emb (in place) ------------------------------------------------------------------------------
APPLY = {"BSND": ((B, S, 4, D), (B, S, 2, D), (B, S, 1, D), (1, S, 1, D)),
         "BNSD": ((B, 4, S, D), (B, 2, S, D), (B, 1, S, D), (1, 1, S, D)),
         "SBND": ((S, B, 4, D), (S, B, 2, D), (S, B, 1, D), (S, 1, 1, D)),
         "TND": ((7, 4, D), (7, 2, D), (7, 1, D), (7, 1, D))}


@pytest.mark.asan
@pytest.mark.parametrize("layout,mode,two_d", [(lay, m, t) for lay in APPLY
                                                 for m in ("half", "interleave", "quarter", "interleave-half")
                                                 for t in (False, True)])
def test_apply_rotary_pos_emb_in_place(layout, mode, two_d):
    qs, ks, cs, aligned = APPLY[layout]
    q, k = torch.randn(qs), torch.randn(ks)
    if two_d:  # [S, D] placed on the layout's sequence axis
        cos, sin = tables((aligned[0] if layout in ("SBND", "TND") else S, D), torch.float32)
        c4, s4 = cos.reshape(aligned), sin.reshape(aligned)
    else:
        cos, sin = tables(cs, torch.float32)
        c4, s4 = cos, sin
    m = tot.rope.ROTARY_MODES[mode]
    rq, rk = ref_rope(q.double(), c4.double(), s4.double(), m), ref_rope(k.double(), c4.double(), s4.double(), m)
    q_ptr = q.data_ptr()
    ret = OPS.apply_rotary_pos_emb(q, k, cos, sin, layout, mode)
    assert ret is None and q.data_ptr() == q_ptr
    torch.testing.assert_close(q.double(), rq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k.double(), rk, atol=1e-5, rtol=1e-5)


@pytest.mark.asan
def test_npu_apply_rotary_pos_emb_wrapper_and_strided():
    base = torch.randn(B, 4, S, D)
    q = base.transpose(1, 2)  # non-contiguous BSND view: the op must write through it
    k = torch.randn(B, S, 2, D)
    cos, sin = tables((B, S, 1, D), torch.float32)
    rq = ref_rope(q.double(), cos.double(), sin.double(), 0)
    rk = ref_rope(k.double(), cos.double(), sin.double(), 0)
    q2, k2 = tot.npu_apply_rotary_pos_emb(q, k, cos, sin, layout="BSND")
    assert q2 is q and k2 is k
    torch.testing.assert_close(base.transpose(1, 2).double(), rq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k.double(), rk, atol=1e-5, rtol=1e-5)


def test_apply_rotary_pos_emb_mixed_dtypes_op_only():
    """torch_npu requires one dtype for query, key, cos and sin; the op itself takes fp32 tables next to fp16 keys."""
    q, k = torch.randn(B, S, 4, D), torch.randn(B, S, 2, D, dtype=torch.float16)
    cos, sin = tables((B, S, 1, D), torch.float32)
    with pytest.raises(TypeError, match="npu_apply_rotary_pos_emb.*'key'"):
        tot.npu_apply_rotary_pos_emb(q, k, cos, sin)
    rk = ref_rope(k.double(), cos.double(), sin.double(), 0)
    OPS.apply_rotary_pos_emb(q, k, cos, sin, "BSND", "half")
    torch.testing.assert_close(k.double(), rk, atol=4e-3, rtol=2e-3)


def test_npu_apply_rotary_pos_emb_modes():
    q, k = torch.randn(B, S, 4, D), torch.randn(B, S, 2, D)
    cos, sin = tables((1, S, 1, D), torch.float32)
    for name in ("half", "interleave", "quarter"):
        q1, k1 = q.clone(), k.clone()
        tot.npu_apply_rotary_pos_emb(q1, k1, cos, sin, "BSND", name)
        mode = tot.rope.ROTARY_MODES[name]
        torch.testing.assert_close(q1.double(), ref_rope(q.double(), cos.double(), sin.double(), mode),
                                   atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="'rotary_mode'"):  # torch_npu has no interleave-half here
        tot.npu_apply_rotary_pos_emb(q.clone(), k.clone(), cos, sin, "BSND", "interleave-half")


# ---- rope_with_sin_cos_cache --------------------------------------------------------------------------------------
@pytest.mark.asan
@pytest.mark.parametrize("neox,rot,three_d,dtype", list(itertools.product((True, False), (32, 16), (False, True),
                                                                          ("fp32", "bf16"))))
def test_rope_with_sin_cos_cache(neox, rot, three_d, dtype):
    dt, T, hs, max_pos = DTYPES[dtype], 9, 32, 64
    positions = torch.randint(0, max_pos, (T,))
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None]
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).float()
    q = torch.randn((T, 4, hs) if three_d else (T, 4 * hs)).to(dt)
    k = torch.randn((T, 2, hs) if three_d else (T, 2 * hs)).to(dt)
    q0, k0 = q.clone(), k.clone()
    qo, ko = tot.rope_with_sin_cos_cache(positions, q, k, cache, hs, neox)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == dt
    assert torch.equal(q, q0) and torch.equal(k, k0)  # inputs untouched
    tol = dict(atol=TOL[dt] * 8, rtol=TOL[dt] * 2)
    torch.testing.assert_close(qo.double().reshape(T, -1, hs), ref_cache_rope(positions, q, cache, hs, neox), **tol)
    torch.testing.assert_close(ko.double().reshape(T, -1, hs), ref_cache_rope(positions, k, cache, hs, neox), **tol)
    if rot < hs:  # the pass-through part is bit-exact
        assert torch.equal(qo.reshape(T, -1, hs)[..., rot:], q.reshape(T, -1, hs)[..., rot:])


@pytest.mark.parametrize("neox,rot,dtype", list(itertools.product((True, False), (40, 48, 8), ("fp32", "bf16", "fp64"))))
def test_rope_cache_vector_tails(neox, rot, dtype):
    """Rotary halves of 20 / 24 / 4 values: whole vectors plus tails at every ISA's width; head size 48."""
    dt, T, hs, max_pos = {**DTYPES, "fp64": torch.float64}[dtype], 5, 48, 30
    positions = torch.randint(0, max_pos, (T,))
    cache = torch.randn(max_pos, rot, dtype=torch.float64).to(dt if dt == torch.float64 else torch.float32)
    q, k = torch.randn(T, 3 * hs).to(dt), torch.randn(T, hs).to(dt)
    qo, ko = tot.rope_with_sin_cos_cache(positions, q, k, cache, hs, neox)
    for x, out in ((q, qo), (k, ko)):
        ref = ref_cache_rope(positions, x, cache, hs, neox)
        same = ref_cache_rope(positions, x, cache, hs, neox, dtype=torch.float32).to(dt) if dt != torch.float64 \
            else ref
        check_tolerance(f"rope cache neox={neox} rot={rot}", out.reshape(ref.shape), ref, same)


def test_rope_cache_matches_rotary_position_embedding():
    """The cache op with full rotary equals rotary_position_embedding with per-token cos/sin tables."""
    T, hs, max_pos = 6, 16, 20
    positions = torch.randint(0, max_pos, (T,))
    ang = torch.randn(max_pos, hs // 2)
    cache = torch.cat((ang.cos(), ang.sin()), -1)
    q, k = torch.randn(T, 3, hs), torch.randn(T, 1, hs)
    qo, _ = OPS.rope_with_sin_cos_cache(positions, q, k, cache, hs, True)
    a = ang[positions]
    cos, sin = torch.cat((a, a), -1).cos()[:, None], torch.cat((a, a), -1).sin()[:, None]
    torch.testing.assert_close(qo, OPS.rotary_position_embedding(q, cos, sin, 0), atol=1e-5, rtol=1e-5)
    qi, _ = OPS.rope_with_sin_cos_cache(positions, q, k, cache, hs, False)
    cos, sin = a.repeat_interleave(2, -1).cos()[:, None], a.repeat_interleave(2, -1).sin()[:, None]
    torch.testing.assert_close(qi, OPS.rotary_position_embedding(q, cos, sin, 1), atol=1e-5, rtol=1e-5)


# ---- bad inputs: one test per rule --------------------------------------------------------------------------------
def test_bad_odd_head_dim():
    with pytest.raises(RuntimeError, match="must be even"):
        OPS.rotary_position_embedding(torch.randn(2, 3, 7), torch.randn(7), torch.randn(7), 0)


def test_bad_quarter_needs_multiple_of_4():
    with pytest.raises(RuntimeError, match="quarter mode needs D divisible by 4"):
        OPS.rotary_position_embedding(torch.randn(2, 3, 6), torch.randn(6), torch.randn(6), 2)


@pytest.mark.asan
def test_bad_not_broadcastable():
    with pytest.raises(RuntimeError, match="not broadcastable"):
        OPS.rotary_position_embedding(torch.randn(2, 5, 3, 8), torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8), 0)


@pytest.mark.asan
def test_bad_table_head_dim():
    with pytest.raises(RuntimeError, match="must end in the head dimension"):
        OPS.rotary_position_embedding(torch.randn(2, 5, 3, 8), torch.randn(1, 5, 1, 4), torch.randn(1, 5, 1, 4), 0)


def test_bad_unknown_mode():
    with pytest.raises(RuntimeError, match="unknown rotary mode 4"):
        OPS.rotary_position_embedding(torch.randn(2, 3, 8), torch.randn(8), torch.randn(8), 4)
    with pytest.raises(ValueError, match="should be half or interleave.*'rotary_mode'"):
        tot.npu_rotary_mul(torch.randn(2, 3, 8), torch.randn(8), torch.randn(8), rotary_mode="spiral")
    with pytest.raises(RuntimeError, match="'rotary_mode'.*'quarter'"):  # torch_npu rejects it too
        tot.npu_rotary_mul(torch.randn(2, 3, 8), torch.randn(8), torch.randn(8), rotary_mode="quarter")


def test_npu_rotary_mul_rotate_matrix():
    x = torch.randn(B, S, N, D, requires_grad=True)
    cos, sin = tables((1, S, 1, D), torch.float32)
    half = torch.zeros(D, D)
    half[:D // 2, D // 2:] = torch.eye(D // 2)
    half[D // 2:, :D // 2] = -torch.eye(D // 2)
    out = tot.npu_rotary_mul(x, cos, sin, rotate=half)
    torch.testing.assert_close(out, ref_rope(x.detach(), cos, sin, 0))
    out.sum().backward()  # differentiable through PyTorch's ops
    x2 = x.detach().requires_grad_()
    OPS.rotary_position_embedding(x2, cos, sin, 0).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    with pytest.raises(ValueError, match="'rotate'.*\\[D, D\\]"):
        tot.npu_rotary_mul(x, cos, sin, rotate=torch.zeros(D, D + 1))


def test_npu_rotary_mul_backward_matches_autograd():
    x = torch.randn(B, S, N, D, requires_grad=True)
    cos, sin = (t.requires_grad_() for t in tables((1, S, 1, D), torch.float32))
    g = torch.randn(B, S, N, D)
    tot.npu_rotary_mul(x, cos, sin, "interleave").backward(g)
    dx, dcos, dsin = tot.npu_rotary_mul_backward(g, x.detach(), cos.detach(), sin.detach(), "interleave")
    for a, b in ((dx, x.grad), (dcos, cos.grad), (dsin, sin.grad)):
        torch.testing.assert_close(a, b)


def test_bad_unknown_rotary_mode_string():
    with pytest.raises(RuntimeError, match="unknown rotary_mode 'spiral'"):
        OPS.apply_rotary_pos_emb(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8), torch.randn(8), torch.randn(8),
                                 "BSND", "spiral")


def test_bad_unknown_layout():
    with pytest.raises(RuntimeError, match="unknown layout 'BHSD'"):
        OPS.apply_rotary_pos_emb(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8), torch.randn(8), torch.randn(8),
                                 "BHSD", "half")


@pytest.mark.asan
def test_bad_layout_rank():
    with pytest.raises(RuntimeError, match="layout TND expects 3-D"):
        OPS.apply_rotary_pos_emb(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8), torch.randn(8), torch.randn(8),
                                 "TND", "half")


@pytest.mark.asan
def test_bad_positions_out_of_range():
    cache = torch.randn(16, 8)
    with pytest.raises(RuntimeError, match=r"positions must lie in \[0, 16\)"):
        OPS.rope_with_sin_cos_cache(torch.tensor([0, 16]), torch.randn(2, 16), torch.randn(2, 16), cache, 8, True)
    with pytest.raises(RuntimeError, match="positions must lie"):
        OPS.rope_with_sin_cos_cache(torch.tensor([-1, 3]), torch.randn(2, 16), torch.randn(2, 16), cache, 8, True)


@pytest.mark.asan
def test_bad_rot_dim():
    with pytest.raises(RuntimeError, match="rot_dim"):
        OPS.rope_with_sin_cos_cache(torch.tensor([0, 1]), torch.randn(2, 16), torch.randn(2, 16),
                                    torch.randn(16, 10), 8, True)


@pytest.mark.asan
def test_bad_head_size_multiple():
    with pytest.raises(RuntimeError, match="not a multiple of head_size"):
        OPS.rope_with_sin_cos_cache(torch.tensor([0, 1]), torch.randn(2, 20), torch.randn(2, 16),
                                    torch.randn(16, 8), 8, True)


# ---- torch.compile ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_compile_fullgraph_forward_backward(dynamo_reset):
    def f(x, cos, sin):
        return tot.npu_rotary_mul(x, cos, sin, "interleave") * 2

    x = torch.randn(B, S, N, D, requires_grad=True)
    cos, sin = (t.requires_grad_() for t in tables((1, S, 1, D), torch.float32))
    out = torch.compile(f, fullgraph=True)(x, cos, sin)
    out.sum().backward()
    grads = [t.grad.clone() for t in (x, cos, sin)]
    for t in (x, cos, sin):
        t.grad = None
    f(x, cos, sin).sum().backward()
    torch.testing.assert_close(out, f(x, cos, sin))
    for g, t in zip(grads, (x, cos, sin)):
        torch.testing.assert_close(g, t.grad)


@pytest.mark.slow
def test_compile_fullgraph_in_place(dynamo_reset):
    def f(q, k, cos, sin):
        tot.npu_apply_rotary_pos_emb(q, k, cos, sin, layout="BSND")
        return q + 1, k

    q, k = torch.randn(B, S, 4, D), torch.randn(B, S, 2, D)
    cos, sin = tables((1, S, 1, D), torch.float32)
    q_e, k_e = q.clone(), k.clone()
    OPS.apply_rotary_pos_emb(q_e, k_e, cos, sin, "BSND", "half")
    qo, ko = torch.compile(f, fullgraph=True)(q, k, cos, sin)
    torch.testing.assert_close(q, q_e)  # the mutation is visible on the caller's tensors
    torch.testing.assert_close(k, k_e)
    torch.testing.assert_close(qo, q_e + 1)


@pytest.mark.slow
def test_compile_fullgraph_cache_rope(dynamo_reset):
    cache = torch.randn(32, 16)
    f = torch.compile(lambda p, q, k: tot.rope_with_sin_cos_cache(p, q, k, cache, 16, True), fullgraph=True)
    p = torch.randint(0, 32, (5,))
    q, k = torch.randn(5, 64), torch.randn(5, 32)
    for a, b in zip(f(p, q, k), OPS.rope_with_sin_cos_cache(p, q, k, cache, 16, True)):
        torch.testing.assert_close(a, b)


def test_layout_aliases_and_codes():
    q, k = torch.randn(B, S, 4, D), torch.randn(B, S, 2, D)
    cos, sin = tables((S, D), torch.float32)
    q1, k1 = q.clone(), k.clone()
    tot.npu_apply_rotary_pos_emb(q1, k1, cos, sin, layout="BSH")
    q2, k2 = tot.npu_apply_rotary_pos_emb(q.clone(), k.clone(), cos, sin, layout=1)
    torch.testing.assert_close(q1, q2)
    torch.testing.assert_close(q1.double(), ref_rope(q.double(), cos[None, :, None].double(),
                                                     sin[None, :, None].double(), 0))


@pytest.mark.parametrize("layout,cshape", [(lay, cs) for lay, (_, shapes) in LAYOUTS.items() for cs in shapes])
def test_gradcheck_every_broadcast_shape(layout, cshape):
    """Covers both dcos/dsin reduction paths (per-thread partial buffers and full-size products + sum_to)."""
    x = torch.randn(LAYOUTS[layout][0], dtype=torch.float64, requires_grad=True)
    cos = torch.randn(cshape, dtype=torch.float64, requires_grad=True)
    sin = torch.randn(cshape, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: OPS.rotary_position_embedding(a, b, c, 3), (x, cos, sin),
                                    fast_mode=True)


def test_grad_with_differently_shaped_cos_and_sin():
    x = torch.randn(B, S, N, D, dtype=torch.float64, requires_grad=True)
    cos = torch.randn(1, S, 1, D, dtype=torch.float64, requires_grad=True)
    sin = torch.randn(B, S, N, D, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: OPS.rotary_position_embedding(a, b, c, 0), (x, cos, sin),
                                    fast_mode=True)


@pytest.mark.parametrize("mode", range(4))
def test_gradcheck_full_jacobian_small(mode):
    x = torch.randn(2, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    cos = torch.randn(1, 3, 1, 8, dtype=torch.float64, requires_grad=True)
    sin = torch.randn(1, 3, 1, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: OPS.rotary_position_embedding(a, b, c, mode), (x, cos, sin))
