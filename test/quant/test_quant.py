"""npu_dynamic_quant(_asymmetric) and npu_swiglu(_backward) against independent float64 references (tolerance rule:
max|ours - ref64| <= 2 * max|torch_same_dtype - ref64| + 1e-5), the int4 packing, autograd and every bad-input rule."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance

OPS = torch.ops.npu_fa
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


# ---- references --------------------------------------------------------------------------------------------------
def _smoothed(x, smooth, group_index, dtype):
    """x * smooth in `dtype` (rows of the last dimension; smooth row g for group g's rows)."""
    v = x.to(dtype)
    if smooth is None:
        return v
    if group_index is None:
        return v * smooth.to(dtype)
    rows = v.reshape(-1, v.shape[-1]).clone()
    start = 0
    for g, end in enumerate(group_index.tolist()):
        rows[start:end] = rows[start:end] * smooth[g].to(dtype)
        start = end
    return rows.view(v.shape)


def dq_reference(x, smooth=None, group_index=None, qmax=127, asymmetric=False, dtype=torch.float64):
    """(y, scale, offset) computed in `dtype`; y unclamped-before-round, then rounded half to even and clamped."""
    v = _smoothed(x, smooth, group_index, dtype)
    if not asymmetric:
        scale = v.abs().amax(-1) / qmax
        y = torch.where(scale[..., None] > 0, v / scale[..., None], torch.zeros((), dtype=dtype))
        return y.round().clamp(-qmax - 1, qmax), scale, None
    hi, lo = v.amax(-1), v.amin(-1)
    scale = (hi - lo) / (2 * qmax + 1)
    offset = torch.where(scale > 0, qmax - hi / scale, torch.zeros((), dtype=dtype))
    y = torch.where(scale[..., None] > 0, v / scale[..., None] + offset[..., None], torch.zeros((), dtype=dtype))
    return y.round().clamp(-qmax - 1, qmax), scale, offset


def unpack_int4(y, h):
    """int32 [..., H/8] -> int64 [..., H]: element j of each word in bits 4j..4j+3 (sign-extended)."""
    shifts = torch.arange(8, dtype=torch.int64) * 4
    nib = (y.long()[..., None] >> shifts) & 0xF
    nib = torch.where(nib >= 8, nib - 16, nib)
    return nib.reshape(*y.shape[:-1], h)


def _inputs(shape, dtype, smooth, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    rows = x.numel() // shape[-1]
    s = gi = None
    if smooth == "row":
        s = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
    elif smooth == "groups":
        s = (torch.rand(5, shape[-1], generator=g) + 0.5).to(dtype)
        ends = sorted(torch.randint(0, rows + 1, (5,), generator=g).tolist())
        ends[-1] = rows
        gi = torch.tensor(ends, dtype=torch.int32)
    return x, s, gi


# ---- npu_dynamic_quant ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("smooth", [None, "row", "groups"])
@pytest.mark.parametrize("shape", [(2, 32, 256), (7, 5)])
def test_dynamic_quant_int8(dtype, smooth, shape):
    x, s, gi = _inputs(shape, dtype, smooth)
    y, scale = tot.npu_dynamic_quant(x, smooth_scales=s, group_index=gi)
    assert y.dtype == torch.int8 and y.shape == x.shape and scale.dtype == torch.float32 and scale.shape == shape[:-1]
    y64, s64, _ = dq_reference(x, s, gi)
    y32, s32, _ = dq_reference(x, s, gi, dtype=torch.float32)
    check_tolerance("scale", scale, s64, s32)
    check_tolerance("y", y, y64, y32)
    # The same fp32 formula as upstream's golden function: bit-identical.
    assert torch.equal(y, y32.to(torch.int8)) and torch.equal(scale, s32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("smooth", [None, "groups"])
def test_dynamic_quant_int4(dtype, smooth):
    x, s, gi = _inputs((2, 4, 64), dtype, smooth, seed=3)
    y, scale = tot.npu_dynamic_quant(x, smooth_scales=s, group_index=gi, dst_type=torch.quint4x2)
    assert y.dtype == torch.int32 and y.shape == (2, 4, 8)
    y64, s64, _ = dq_reference(x, s, gi, qmax=7)
    y32, s32, _ = dq_reference(x, s, gi, qmax=7, dtype=torch.float32)
    check_tolerance("scale", scale, s64, s32)
    check_tolerance("y", unpack_int4(y, 64), y64, y32)
    # The torch_npu code of quint4x2 selects the same output.
    assert torch.equal(tot.npu_dynamic_quant(x, smooth_scales=s, group_index=gi, dst_type=16)[0], y)


def test_int4_packing_is_low_nibble_first():
    values = [7, -7, 1, -1, 0, 2, -7, 3]  # max |v| = 7: scale 1, y = v
    y, scale = tot.npu_dynamic_quant(torch.tensor([values * 2], dtype=torch.float32), dst_type=torch.quint4x2)
    assert scale.item() == 1.0 and y.shape == (1, 2)
    expected = sum((v & 0xF) << (4 * j) for j, v in enumerate(values))
    assert [w & 0xFFFFFFFF for w in y[0].tolist()] == [expected, expected]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("smooth", [None, "row", "groups"])
@pytest.mark.parametrize("int4", [False, True])
def test_dynamic_quant_asymmetric(dtype, smooth, int4):
    x, s, gi = _inputs((3, 6, 32), dtype, smooth, seed=5)
    qmax = 7 if int4 else 127
    y, scale, offset = tot.npu_dynamic_quant_asymmetric(x, smooth_scales=s, group_index=gi,
                                                        dst_type=torch.quint4x2 if int4 else None)
    y64, s64, o64 = dq_reference(x, s, gi, qmax, asymmetric=True)
    y32, s32, o32 = dq_reference(x, s, gi, qmax, asymmetric=True, dtype=torch.float32)
    check_tolerance("scale", scale, s64, s32)
    check_tolerance("offset", offset, o64, o32)
    check_tolerance("y", unpack_int4(y, 32) if int4 else y, y64, y32)
    # Dequantisation recovers x within half a step per element.
    yy = (unpack_int4(y, 32) if int4 else y).double()
    rec = (yy - offset.double()[..., None]) * scale.double()[..., None]
    assert ((rec - _smoothed(x, s, gi, torch.float64)).abs() <= scale.double()[..., None] * 0.5 + 1e-4).all()


def test_dynamic_quant_zero_rows_and_empty_groups():
    x = torch.randn(6, 16, dtype=torch.bfloat16)
    x[2] = 0
    y, scale = tot.npu_dynamic_quant(x)
    assert scale[2] == 0 and (y[2] == 0).all()
    y, scale, offset = tot.npu_dynamic_quant_asymmetric(torch.full((2, 8), 3.0))
    assert (scale == 0).all() and (offset == 0).all() and (y == 0).all()
    s = torch.rand(4, 16, dtype=torch.bfloat16) + 0.5
    gi = torch.tensor([0, 3, 3, 6], dtype=torch.int32)  # groups 0 and 2 are empty
    y, scale = tot.npu_dynamic_quant(x, smooth_scales=s, group_index=gi)
    ref = dq_reference(x, s, gi, dtype=torch.float32)
    assert torch.equal(y, ref[0].to(torch.int8)) and torch.equal(scale, ref[1])
    y, scale = tot.npu_dynamic_quant(torch.empty(0, 16, dtype=torch.float16))
    assert y.shape == (0, 16) and scale.shape == (0,)


def test_dynamic_quant_noncontiguous_input():
    x = torch.randn(16, 10, dtype=torch.float16).t()
    y, scale = tot.npu_dynamic_quant(x)
    assert torch.equal(y, tot.npu_dynamic_quant(x.contiguous())[0])


@pytest.mark.parametrize("call,exc,match", [
    (lambda: tot.npu_dynamic_quant(torch.ones(4, 8, dtype=torch.int32)), TypeError, "'x' must be float16"),
    (lambda: tot.npu_dynamic_quant(torch.ones(8)), ValueError, "'x' must have at least 2 dimensions"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 12), dst_type=torch.quint4x2), ValueError, "multiple of 8"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), group_index=torch.tensor([2], dtype=torch.int32)), ValueError,
     "'group_index' needs 'smooth_scales'"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), smooth_scales=torch.ones(1, 8), group_index=torch.tensor([2.])),
     TypeError, "'group_index' must be int32 or int64"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), smooth_scales=torch.ones(1, 8),
                                   group_index=torch.tensor([[2]], dtype=torch.int32)), ValueError, "must be 1-D"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), smooth_scales=torch.ones(2, 8),
                                   group_index=torch.tensor([2], dtype=torch.int32)), ValueError,
     r"'smooth_scales' of shape \[2, 8\] must be \[G, H\]"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), smooth_scales=torch.ones(1, 8),
                                   group_index=torch.tensor([1], dtype=torch.int32)), ValueError,
     "must end at the row count"),
    (lambda: tot.npu_dynamic_quant(torch.ones(4, 8), smooth_scales=torch.ones(3, 8),
                                   group_index=torch.tensor([3, 2, 4], dtype=torch.int32)), ValueError, "nondecreasing"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), smooth_scales=torch.ones(7)), ValueError,
     r"'smooth_scales' of shape \[7\] must be \[H\]"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), smooth_scales=torch.ones(8, dtype=torch.int32)), TypeError,
     "'smooth_scales' must be float16"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), dst_type=torch.float8_e4m3fn), NotImplementedError,
     "'dst_type'"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), dst_type=291), NotImplementedError, "'dst_type'"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), dst_type="int8"), TypeError, "'dst_type'"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), quant_mode="perchannel"), NotImplementedError, "'quant_mode'"),
    (lambda: tot.npu_dynamic_quant_asymmetric(torch.ones(2, 8), quant_mode="pertensor"), NotImplementedError,
     "'quant_mode'"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), quant_mode="per_token"), ValueError, "'quant_mode' must be"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), quant_mode=0), TypeError, "'quant_mode' must be a str"),
    (lambda: tot.npu_dynamic_quant(torch.ones(2, 8), dst_type_max=448.0), NotImplementedError, "'dst_type_max'"),
    (lambda: OPS.dynamic_quant(torch.ones(2, 8), None, None, False, 2), ValueError, "'bits' must be 8"),
])
def test_dynamic_quant_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_dynamic_quant_errors_are_also_runtime_errors():
    """torch_npu raises RuntimeError for bad values: the wrappers' ValueErrors are both."""
    with pytest.raises(RuntimeError):
        tot.npu_dynamic_quant(torch.ones(8))


# ---- npu_swiglu ----------------------------------------------------------------------------------------------------
def swiglu_reference(x, dim, dtype=torch.float64):
    a, b = x.to(dtype).chunk(2, dim=dim)
    return torch.nn.functional.silu(a) * b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((4, 64), -1), ((2, 6, 3), 1), ((8, 3), 0), ((3, 5000), -1), ((1, 2), -1)])
def test_swiglu_forward(dtype, shape, dim):
    x = torch.randn(shape).mul(4).to(dtype)
    out = tot.npu_swiglu(x, dim=dim)
    assert out.dtype == dtype
    check_tolerance("swiglu", out, swiglu_reference(x, dim), swiglu_reference(x, dim, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((4, 64), -1), ((2, 6, 3), -2), ((3, 5000), 1)])
def test_swiglu_backward(dtype, shape, dim):
    x = torch.randn(shape).mul(4).to(dtype)
    out_shape = list(shape)
    out_shape[dim] //= 2
    g = torch.randn(out_shape).to(dtype)
    x64 = x.double().requires_grad_()
    swiglu_reference(x64, dim).backward(g.double())
    xs = x.clone().requires_grad_()
    swiglu_reference(xs, dim, dtype).backward(g)
    ours = tot.npu_swiglu_backward(g, x, dim=dim)
    check_tolerance("dx", ours, x64.grad, xs.grad)
    # Through autograd: npu_swiglu's backward is npu_swiglu_backward.
    xa = x.clone().requires_grad_()
    tot.npu_swiglu(xa, dim=dim).backward(g)
    assert torch.equal(xa.grad, ours)


def test_swiglu_gradcheck_float64():
    x = torch.randn(3, 2, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: tot.npu_swiglu(t, dim=-1), (x,))
    assert torch.autograd.gradcheck(lambda t: tot.npu_swiglu(t, dim=1), (x,))


def test_swiglu_extremes():
    x = torch.tensor([[-200., 50., 3., 2.], [float("inf"), 0., 1., 0.]])
    out = tot.npu_swiglu(x)
    assert out[0, 0].item() == 0.0 and out[0, 1].item() == 100.0
    assert not torch.isnan(out[0]).any()


def test_swiglu_compile():
    f = torch.compile(lambda t: tot.npu_swiglu(t) * 2, backend="aot_eager", fullgraph=True)
    x = torch.randn(4, 16)
    assert torch.equal(f(x), tot.npu_swiglu(x) * 2)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: tot.npu_swiglu(torch.ones(3, 5)), ValueError, "even size along dim"),
    (lambda: tot.npu_swiglu(torch.ones(3, 4), dim=2), ValueError, r"'dim' must be in \[-2, 1\]"),
    (lambda: tot.npu_swiglu(torch.ones(3, 4), dim=-3), ValueError, r"'dim' must be in \[-2, 1\]"),
    (lambda: tot.npu_swiglu(torch.ones(3, 4, dtype=torch.int32)), TypeError, "'x' must be float16"),
    (lambda: tot.npu_swiglu(torch.tensor(1.0)), ValueError, "at least 1 dimension"),
    (lambda: tot.npu_swiglu_backward(torch.ones(3, 3), torch.ones(3, 4)), ValueError,
     r"'grad_output' of shape \[3, 3\] must be swiglu's output shape \[3, 2\]"),
    (lambda: tot.npu_swiglu_backward(torch.ones(3, 2, dtype=torch.int64), torch.ones(3, 4)), TypeError,
     "'grad_output' must be float16"),
])
def test_swiglu_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
