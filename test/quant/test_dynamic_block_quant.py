"""npu_dynamic_block_quant: block scales and quantised values against a float64 plain-PyTorch reference (int8 and
both float8 formats, 2-D and 3-D, partial blocks, min_scale, dst_type_max, all-zero blocks), the dequantisation
error bound, upstream's own golden for its default call, and a clear error per argument rule."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.common.tiers import pairwise

QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def reference(x, dst, rows, cols, min_scale=0.0, qmax=None):
    """(y as float64 before the cast, scale float64) per block, from the documented formula in float64."""
    q = qmax or QMAX[dst]
    x3 = x.double().reshape(-1, *x.shape[-2:])
    B, M, N = x3.shape
    Mb, Nb = math.ceil(M / rows), math.ceil(N / cols)
    padded = torch.zeros(B, Mb * rows, Nb * cols, dtype=torch.float64)
    padded[:, :M, :N] = x3
    amax = padded.abs().reshape(B, Mb, rows, Nb, cols).amax(dim=(2, 4))
    scale = torch.maximum(amax / q, torch.full_like(amax, min_scale))
    factor = torch.where(scale == 0, torch.zeros_like(scale), 1 / scale)
    per_value = factor.repeat_interleave(rows, 1).repeat_interleave(cols, 2)[:, :M, :N]
    y = x3 * per_value
    return y.reshape(x.shape), scale.reshape(*x.shape[:-2], Mb, Nb)


def cast(y, dst):
    if dst == torch.int8:
        return torch.round(y).clamp(-127, 127).to(torch.int8)
    return y.to(dst)


@pytest.mark.parametrize("dst,dtype,shape,blocks", pairwise(
    dst={"int8": torch.int8, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2},
    dtype={"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32},
    shape={"2d": (6, 300), "3d": (2, 5, 130)}, blocks={"1x128": (1, 128), "2x64": (2, 64), "3x7": (3, 7)}))
def test_matches_reference(dst, dtype, shape, blocks):
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(3)) * 3).to(dtype)
    x[..., :2, :5] = 0  # an all-zero corner (a whole block for the 1 x ... blocks)
    y, scale = tot.npu_dynamic_block_quant(x, dst_type=dst, row_block_size=blocks[0], col_block_size=blocks[1])
    y64, scale64 = reference(x, dst, *blocks)
    assert y.dtype == dst and y.shape == x.shape and scale.dtype == torch.float32 and scale.shape == scale64.shape
    torch.testing.assert_close(scale.double(), scale64, rtol=2e-7, atol=0)
    expected = cast(y64, dst).double()
    got = y.double()
    # fp32 arithmetic may land on the other side of a rounding tie than float64: one quantisation step at most
    step = 1.0 if dst == torch.int8 else expected.abs().clamp(min=2.0 ** -6) * (2.0 ** -3 if dst == torch.float8_e4m3fn
                                                                               else 2.0 ** -2)
    assert ((got - expected).abs() <= step).all()
    assert (got != expected).double().mean() < 0.01
    # dequantised, every value is within one quantisation step of x
    from_scale = scale.double().repeat_interleave(blocks[0], -2).repeat_interleave(blocks[1], -1)
    from_scale = from_scale[..., :shape[-2], :shape[-1]]
    assert ((got * from_scale - x.double()).abs() <= step * from_scale + 1e-12).all()


def test_all_zero_block_gives_zero_scale_and_values():
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    x[1, 200] = 1.0
    y, scale = tot.npu_dynamic_block_quant(x)
    assert torch.equal(scale, torch.tensor([[0.0, 0.0], [0.0, 1 / 127]]))
    assert y[1, 200] == 127 and y.count_nonzero() == 1


def test_nan_propagates_to_its_block_scale():
    x = torch.ones(2, 8)
    x[0, 3] = math.nan
    y, scale = tot.npu_dynamic_block_quant(x, col_block_size=4)
    assert scale[0, 0].isnan() and not scale[0, 1].isnan() and not scale[1].isnan().any()
    assert (y[0, :4] == 0).all() and (y[0, 4:] == 127).all()  # int8 has no NaN: the block's values are 0
    y8, _ = tot.npu_dynamic_block_quant(x, dst_type=torch.float8_e4m3fn, col_block_size=4)
    assert y8[0, :4].float().isnan().all() and (y8[0, 4:].float() == 448).all()


def test_min_scale_is_a_floor():
    x = torch.tensor([[0.01, -0.02, 3.0, 0.5]], dtype=torch.float16)
    y, scale = tot.npu_dynamic_block_quant(x, min_scale=0.01, col_block_size=2)
    torch.testing.assert_close(scale, torch.tensor([[0.01, 3.0 / 127]]))  # the first block's 0.02 / 127 is floored
    assert y.tolist() == [[1, -2, 127, 21]]


def test_dst_type_max_narrows_the_range():
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    y, scale = tot.npu_dynamic_block_quant(x, dst_type=torch.float8_e4m3fn, dst_type_max=240.0)
    torch.testing.assert_close(scale, x.float().abs().amax(1, keepdim=True) / 240)
    assert y.float().abs().max() == 240


def test_upstream_golden_of_the_default_call():
    """op-plugin's CPU golden for npu_dynamic_block_quant(x, dst_type=1): int8, 1 x 128 blocks, zero padding."""
    x = torch.empty(4, 3).uniform_(-2, 2, generator=torch.Generator().manual_seed(5)).to(torch.float16)
    amax = x.float().abs().amax(1, keepdim=True)
    golden = torch.clamp(torch.round(x.float() * (127.0 / amax)), -127, 127).to(torch.int8)
    y, scale = tot.npu_dynamic_block_quant(x, dst_type=1)
    assert torch.equal(y, golden)
    torch.testing.assert_close(scale, amax / 127.0)


def test_codes_and_dtypes_agree():
    x = torch.randn(3, 40, dtype=torch.bfloat16)
    for dtype, code in ((torch.int8, 1), (torch.float8_e4m3fn, 24), (torch.float8_e5m2, 23)):
        a = tot.npu_dynamic_block_quant(x, dst_type=dtype, col_block_size=16)
        b = tot.npu_dynamic_block_quant(x, dst_type=code, col_block_size=16)
        assert torch.equal(a[0].view(torch.int8), b[0].view(torch.int8)) and torch.equal(a[1], b[1])


def test_compile_fullgraph():
    torch._dynamo.reset()
    x = torch.randn(5, 260, dtype=torch.bfloat16)
    f = torch.compile(lambda t: tot.npu_dynamic_block_quant(t, dst_type=torch.float8_e4m3fn), fullgraph=True,
                      backend="aot_eager")
    y, scale = f(x)
    ey, escale = tot.npu_dynamic_block_quant(x, dst_type=torch.float8_e4m3fn)
    assert torch.equal(y.view(torch.int8), ey.view(torch.int8)) and torch.equal(scale, escale)


BAD = {
    "x_1d": (dict(x=torch.randn(8)), ValueError, "'x' must be 2-D \\[M, N\\] or 3-D \\[B, M, N\\]; got shape \\[8\\]"),
    "x_4d": (dict(x=torch.randn(1, 2, 3, 4)), ValueError, "'x' must be 2-D"),
    "x_int": (dict(x=torch.ones(2, 4, dtype=torch.int32)), TypeError, "'x' must be float16, bfloat16, float32; got Int"),
    "dst_code": (dict(dst_type=3), ValueError, "'dst_type' must be a torch dtype code of int8 \\(1\\).*got 3"),
    "dst_dtype": (dict(dst_type=torch.float16), ValueError, "'dst_type' must be torch.int8.*got torch.float16"),
    "dst_hifloat8": (dict(dst_type=256 + 34), NotImplementedError, "'dst_type' 290 \\(hifloat8\\) is not implemented"),
    "dst_bool": (dict(dst_type=True), TypeError, "'dst_type' must be a torch.dtype"),
    "round_mode": (dict(round_mode="floor"), ValueError, "'round_mode' must be \"rint\".*got \"floor\""),
    "round_mode_hif8": (dict(round_mode="round"), NotImplementedError, "round_mode 'round' belongs to hifloat8"),
    "row_block": (dict(row_block_size=0), ValueError, "'row_block_size' and 'col_block_size' must be >= 1; got 0 and"),
    "col_block": (dict(col_block_size=-1), ValueError, "must be >= 1; got 1 and -1"),
    "min_scale": (dict(min_scale=-1.0), ValueError, "'min_scale' must be a finite value >= 0; got -1"),
    "min_scale_inf": (dict(min_scale=math.inf), ValueError, "'min_scale' must be a finite value >= 0; got inf"),
    "dst_type_max": (dict(dst_type_max=200.0), ValueError, "'dst_type_max' must be 0 .* or in \\(0, 127\\]; got 200"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case):
    kwargs, error, message = BAD[case]
    kwargs = dict(kwargs)
    x = kwargs.pop("x", torch.randn(2, 8))
    with pytest.raises(error, match=message):
        tot.npu_dynamic_block_quant(x, **kwargs)
