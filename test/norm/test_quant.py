"""The quantised RMSNorm ops (npu_add_rms_norm_quant, npu_add_rms_norm_dynamic_quant, npu_rms_norm_quant) against
float64 references (tolerance rule on the quantised values and scales: max|ours - ref64| <= 2 * max|torch_same_dtype
- ref64| + 1e-5), the optional outputs, and every bad-input rule."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.norm.test_rms_norm import added, rms_reference

F16, BF16 = torch.float16, torch.bfloat16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _normalised(x, gamma, beta, dtype, eps=1e-6):
    y = rms_reference(x, gamma, eps, dtype=dtype)[0]
    return y if beta is None else y + beta.to(dtype)


def static_q(y, scale, zero, divide, dtype):
    t = y / scale.to(dtype) if divide else y * scale.to(dtype)
    if zero is not None:
        t = t + zero.to(dtype)
    return t.round().clamp(-128, 127)


# ---- npu_add_rms_norm_quant ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("div_mode", [True, False], ids=["div", "mul"])
@pytest.mark.parametrize("beta,second", [(False, False), (True, True)], ids=["plain", "beta_second"])
@pytest.mark.parametrize("shape,k", [((4, 7, 64), 1), ((3, 5, 16), 2)], ids=["rows", "two_dims"])
@pytest.mark.parametrize("dtype", [F16, BF16, torch.float32])
def test_add_rms_norm_quant(dtype, shape, k, beta, second, div_mode):
    g = _gen(0)
    x1, x2 = (torch.randn(shape, generator=g) * 2).to(dtype), (torch.randn(shape, generator=g) * 2).to(dtype)
    w = shape[len(shape) - k:]
    gamma = torch.randn(w, generator=g).to(dtype)
    b = torch.randn(w, generator=g).to(dtype) if beta else None
    s1 = (torch.rand(w, generator=g) * 0.05 + 0.01) if div_mode else (torch.rand(w, generator=g) * 40 + 20)
    z1 = torch.randint(-10, 10, w, dtype=torch.int32, generator=g)
    s2 = s1 * 0.5 if second else None
    y1, y2, x = tot.npu_add_rms_norm_quant(x1, x2, gamma, s1, z1, b, s2, div_mode=div_mode)
    assert y1.dtype == y2.dtype == torch.int8 and y1.shape == y2.shape == x.shape == shape
    assert torch.equal(x, added(x1, x2))
    ref = {dt: _normalised(x, gamma, b, dt) for dt in (torch.float64, dtype)}
    check_tolerance("y1", y1, static_q(ref[torch.float64], s1, z1, div_mode, torch.float64),
                    static_q(ref[dtype], s1, z1, div_mode, dtype))
    if second:
        check_tolerance("y2", y2, static_q(ref[torch.float64], s2, None, div_mode, torch.float64),
                        static_q(ref[dtype], s2, None, div_mode, dtype))
    else:
        assert torch.equal(y2, torch.zeros_like(y2))


def test_add_rms_norm_quant_fp32_formula_is_exact():
    """fp32 inputs: the quantised values are those of the same formula evaluated in fp32 (up to the summation order
    of mean(x^2), which moves a value across a rounding boundary rarely)."""
    g = _gen(1)
    x1, x2, gamma = torch.randn(64, 256, generator=g), torch.randn(64, 256, generator=g), torch.randn(256, generator=g)
    s1 = torch.rand(256, generator=g) * 0.02 + 0.01
    y1, _, x = tot.npu_add_rms_norm_quant(x1, x2, gamma, s1, None)
    ref = static_q(_normalised(x, gamma, None, torch.float32), s1, None, True, torch.float32)
    diff = (y1.float() - ref).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() < 1e-3


def test_add_rms_norm_quant_saturates():
    x1 = torch.tensor([[100.0, -100.0, 1.0, 0.0]], dtype=F16)
    y1, _, _ = tot.npu_add_rms_norm_quant(x1, torch.zeros_like(x1), torch.ones(4, dtype=F16),
                                          torch.full((4,), 1e-3), None)
    assert y1[0, 0] == 127 and y1[0, 1] == -128 and y1[0, 3] == 0


# ---- npu_add_rms_norm_dynamic_quant --------------------------------------------------------------------------------
def dynamic_q(y, smooth, dtype):
    v = y.to(dtype) if smooth is None else y.to(dtype) * smooth.to(dtype)
    scale = v.abs().amax(-1) / 127
    q = torch.where(scale[..., None] > 0, v / scale[..., None], torch.zeros((), dtype=dtype))
    return q.round().clamp(-128, 127), scale


@pytest.mark.parametrize("smooth,mask", [(0, None), (1, None), (2, None), (2, [False, True]), (0, [True, True])],
                         ids=["plain", "smooth1", "both_smooth", "y2_only", "mask_both"])
@pytest.mark.parametrize("beta", [False, True], ids=["no_beta", "beta"])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_add_rms_norm_dynamic_quant(dtype, beta, smooth, mask):
    g = _gen(2)
    shape = (3, 5, 96)
    x1, x2 = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    gamma = torch.randn(96, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype) if beta else None
    s1 = (torch.rand(96, generator=g) + 0.5).to(dtype) if smooth >= 1 and (mask is None or mask[0]) else None
    s2 = (torch.rand(96, generator=g) + 0.5).to(dtype) if smooth >= 2 else None
    y1, y2, x, scale1, scale2 = tot.npu_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1=s1, smooth_scale2=s2,
                                                                   beta=b, output_mask=mask)
    assert torch.equal(x, added(x1, x2))
    want = (mask[0], mask[1]) if mask else (True, s1 is not None and s2 is not None)
    ref = {dt: _normalised(x, gamma, b, dt) for dt in (torch.float64, dtype)}
    for k, (yk, sk, smooth_k) in enumerate([(y1, scale1, s1), (y2, scale2, s2)]):
        if not want[k]:
            assert yk.shape == () and sk.shape == () and yk.dtype == torch.int8 and sk.dtype == torch.float32
            continue
        assert yk.dtype == torch.int8 and yk.shape == shape and sk.dtype == torch.float32 and sk.shape == shape[:-1]
        q64, sc64 = dynamic_q(ref[torch.float64], smooth_k, torch.float64)
        q_same, sc_same = dynamic_q(ref[dtype], smooth_k, dtype)
        check_tolerance(f"scale{k + 1}", sk, sc64, sc_same)
        check_tolerance(f"y{k + 1}", yk, q64, q_same)


def test_dynamic_quant_zero_row():
    x = torch.zeros(2, 16, dtype=F16)
    y1, _, _, scale1, _ = tot.npu_add_rms_norm_dynamic_quant(x, x, torch.ones(16, dtype=F16))
    assert torch.equal(y1, torch.zeros_like(y1)) and torch.equal(scale1, torch.zeros(2))


def test_dynamic_quant_row_max_is_127():
    g = _gen(3)
    x1 = torch.randn(8, 64, generator=g).to(BF16)
    y1, _, _, scale1, _ = tot.npu_add_rms_norm_dynamic_quant(x1, torch.zeros_like(x1), torch.ones(64, dtype=BF16))
    assert torch.equal(y1.abs().amax(-1), torch.full((8,), 127, dtype=torch.int8))


# ---- npu_rms_norm_quant --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gamma_2d", [False, True], ids=["gamma_1d", "gamma_2d"])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_rms_norm_quant(dtype, gamma_2d):
    g = _gen(4)
    x = torch.randn(6, 4, 80, generator=g).to(dtype)
    shape = (1, 80) if gamma_2d else (80,)
    gamma, beta = torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)
    scale, offset = torch.tensor([25.0], dtype=dtype), torch.tensor([3], dtype=torch.int8)
    y = tot.npu_rms_norm_quant(x, gamma, beta, scale, offset)
    assert y.dtype == torch.int8 and y.shape == x.shape

    def ref(dt):
        v = rms_reference(x, gamma.view(80), dtype=dt)[0] + beta.view(80).to(dt)
        return static_q(v, scale, offset, False, dt)

    check_tolerance("y", y, ref(torch.float64), ref(dtype))


# ---- bad input -----------------------------------------------------------------------------------------------------
def _aq(**kw):
    x = torch.ones(2, 8, dtype=F16)
    args = dict(x1=x, x2=x, gamma=torch.ones(8, dtype=F16), scales1=torch.ones(8), zero_points1=None)
    args.update(kw)
    return tot.npu_add_rms_norm_quant(**args)


def _dq(**kw):
    x = torch.ones(2, 8, dtype=BF16)
    args = dict(x1=x, x2=x, gamma=torch.ones(8, dtype=BF16))
    args.update(kw)
    return tot.npu_add_rms_norm_dynamic_quant(**args)


def _rq(**kw):
    args = dict(x=torch.ones(2, 8, dtype=F16), gamma=torch.ones(8, dtype=F16), beta=torch.zeros(8, dtype=F16),
                scale=torch.ones(1, dtype=F16), offset=torch.zeros(1, dtype=torch.int8))
    args.update(kw)
    return tot.npu_rms_norm_quant(**args)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: _aq(axis=0), ValueError, "add_rms_norm_quant: argument 'axis' must be -1.*got 0"),
    (lambda: _aq(scales1=torch.ones(4)), ValueError, r"'scales1' must have gamma's shape \[8\]; got \[4\]"),
    (lambda: _aq(scales1=torch.ones(8, dtype=torch.int32)), TypeError, "'scales1' must be float32, bfloat16 or float16"),
    (lambda: _aq(zero_points1=torch.ones(3, dtype=torch.int32)), ValueError, "'zero_points1' must have gamma's shape"),
    (lambda: _aq(zero_points2=torch.ones(8, dtype=torch.int32)), ValueError, "'zero_points2' needs 'scales2'"),
    (lambda: _aq(beta=torch.ones(4, dtype=F16)), ValueError, "'beta' must have the shape of the trailing"),
    (lambda: _aq(x2=torch.ones(3, 8, dtype=F16)), ValueError, "'x2' must have x1's shape"),
    (lambda: _aq(x1=torch.ones(2, 8, dtype=torch.float64), x2=torch.ones(2, 8, dtype=torch.float64),
                 gamma=torch.ones(8, dtype=torch.float64)), TypeError, "'x1' must be float16, bfloat16 or float32"),
    (lambda: _aq(epsilon=0.0), ValueError, "'epsilon' must be"),
    (lambda: _aq(dst_type=291), NotImplementedError, "'dst_type'"),
    (lambda: _aq(dst_type="int8"), TypeError, "'dst_type'"),
    (lambda: _dq(output_mask=[False, False]), ValueError, "at least one of the outputs y1, y2"),
    (lambda: _dq(output_mask=[False, True], smooth_scale1=torch.ones(8, dtype=BF16)), ValueError,
     r"'smooth_scale1' is given but output y1 is not asked for"),
    (lambda: _dq(output_mask=[True, False], smooth_scale2=torch.ones(8, dtype=BF16)), ValueError,
     r"'smooth_scale2' is given but output y2 is not asked for"),
    (lambda: _dq(output_mask=[True]), TypeError, "'output_mask' must be None or two bools"),
    (lambda: _dq(smooth_scale1=torch.ones(4, dtype=BF16)), ValueError, "'smooth_scale1' must have the shape"),
    (lambda: _dq(smooth_scale1=torch.ones(8, dtype=F16)), TypeError, "'smooth_scale1' must have x1's dtype"),
    (lambda: _dq(x1=torch.ones(2, 3, 8, dtype=BF16), x2=torch.ones(2, 3, 8, dtype=BF16),
                 gamma=torch.ones(3, 8, dtype=BF16)), ValueError, r"'gamma' must be 1-D \[H\]"),
    (lambda: _dq(y_dtype=torch.quint4x2), NotImplementedError, "'y_dtype'"),
    (lambda: _rq(scale=torch.ones(8, dtype=F16)), ValueError, r"'scale' must hold one value \(shape \[1\]\)"),
    (lambda: _rq(offset=torch.zeros(1, dtype=torch.int64)), TypeError, "'offset' must be float32"),
    (lambda: _rq(gamma=torch.ones(2, 8, dtype=F16)), ValueError, r"'gamma' must have shape \[H\] or \[1, H\]"),
    (lambda: _rq(beta=torch.ones(8, dtype=BF16)), TypeError, "'beta' must have x's dtype"),
    (lambda: _rq(epsilon=-1.0), ValueError, "'epsilon' must be"),
    (lambda: _rq(dst_dtype=torch.quint4x2), NotImplementedError, "'dst_dtype'"),
])
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
