"""RMSNorm with torch_npu's Python signatures, on top of `torch.ops.npu_fa` (docs/norm.md):

    y, rstd = npu_rms_norm(x, gamma)                 # y = x / sqrt(mean(x^2) + eps) * gamma; differentiable
    y, rstd = npu_gemma_rms_norm(x, gamma)           # ... * (1 + gamma)
    dx, dgamma = npu_rms_norm_backward(dy, x, gamma, rstd)

gamma covers the trailing dimensions of x (usually the last one); rstd has x's shape with those dimensions set to 1.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa


@_args.torch_npu_api
def npu_rms_norm(input: Tensor, gamma: Tensor, epsilon: float = 1e-06) -> Tuple[Tensor, Tensor]:  # noqa: A002
    """torch_npu.npu_rms_norm: (y, rstd), y = input * rstd * gamma with rstd = 1 / sqrt(mean(input^2) + epsilon)
    over gamma's (trailing) dimensions. Differentiable in input and gamma."""
    return _OPS.rms_norm(input, gamma, epsilon)


@_args.torch_npu_api
def npu_gemma_rms_norm(input: Tensor, gamma: Tensor,  # noqa: A002 (upstream's name)
                       epsilon: float = 1e-06) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_gemma_rms_norm: npu_rms_norm with the weight (1 + gamma), as Gemma stores it."""
    return _OPS.rms_norm(input, gamma, epsilon, True)


@_args.torch_npu_api
def npu_rms_norm_backward(dy: Tensor, input: Tensor, gamma: Tensor,  # noqa: A002 (upstream's name)
                          rstd: Tensor) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_rms_norm_backward: (dx, dgamma) of npu_rms_norm from its rstd; dgamma is float32."""
    return _OPS.rms_norm_grad(dy, input, gamma, rstd)


@_args.torch_npu_api
def npu_add_rms_norm(x1: Tensor, x2: Tensor, gamma: Tensor, epsilon: float = 1e-06) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_add_rms_norm: (y, rstd, x) with x = x1 + x2 and (y, rstd) = npu_rms_norm(x, gamma, epsilon).
    Differentiable in x1, x2 (through y and x) and gamma."""
    return _OPS.add_rms_norm(x1, x2, gamma, epsilon)


@_args.torch_npu_api
def npu_add_rms_norm_v2(x1: Tensor, x2: Tensor, gamma: Tensor, epsilon: float = 1e-06) -> Tensor:
    """torch_npu.npu_add_rms_norm_v2: npu_add_rms_norm in place; x1 becomes y, x2 becomes x = x1 + x2; returns
    rstd."""
    y, rstd, x = _OPS.add_rms_norm(x1, x2, gamma, epsilon)
    x1.copy_(y)
    x2.copy_(x)
    return rstd


@_args.torch_npu_api
def npu_add_rms_norm_v2_functional(x1: Tensor, x2: Tensor, gamma: Tensor,
                                   epsilon: float = 1e-06) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_add_rms_norm_v2_functional: (rstd, y, x), the values npu_add_rms_norm_v2 writes, as new
    tensors."""
    y, rstd, x = _OPS.add_rms_norm(x1, x2, gamma, epsilon)
    return rstd, y, x


@_args.torch_npu_api
def npu_add_rms_norm_cast(x1: Tensor, x2: Tensor, gamma: Tensor,
                          epsilon: float = 1e-06) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_add_rms_norm_cast: (y_fp32, y, rstd, x), npu_add_rms_norm with y also in float32."""
    return _OPS.add_rms_norm_cast(x1, x2, gamma, epsilon)


# ---- the quantised forms -------------------------------------------------------------------------------------------
_INT8_CODE = 1  # torch_npu's code (c10::ScalarType) of int8


def _int8_only(op: str, name: str, value) -> None:
    """None, torch.int8 or its code 1 (int8 output); NotImplementedError for the other upstream formats (int4,
    float8, hifloat8)."""
    if value is None or value == torch.int8 or (isinstance(value, int) and not isinstance(value, bool)
                                                and value == _INT8_CODE):
        return
    if isinstance(value, bool) or not isinstance(value, (int, torch.dtype)):
        raise TypeError(f"{op}: argument '{name}' must be None, a torch.dtype or a torch_npu dtype code (int); got "
                        f"{value!r}")
    raise NotImplementedError(f"{op}: quantisation to {value!r} is not implemented; argument '{name}' must be None or "
                              f"torch.int8")


@_args.torch_npu_api
def npu_add_rms_norm_quant(x1: Tensor, x2: Tensor, gamma: Tensor, scales1: Tensor, zero_points1: Optional[Tensor],
                           beta: Optional[Tensor] = None, scales2: Optional[Tensor] = None,
                           zero_points2: Optional[Tensor] = None, *, axis: int = -1, epsilon: float = 1e-06,
                           div_mode: bool = True, dst_type: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_add_rms_norm_quant: (y1, y2, x) with x = x1 + x2, y = RMSNorm(x) * gamma (+ beta) in fp32 and
    y1 = round(y / scales1 + zero_points1) as int8 (div_mode; y * scales1 otherwise); y2 likewise with scales2 /
    zero_points2 (zeros without scales2)."""
    _int8_only("npu_add_rms_norm_quant", "dst_type", dst_type)
    return _OPS.add_rms_norm_quant(x1, x2, gamma, scales1, zero_points1, beta, scales2, zero_points2, axis, epsilon,
                                   div_mode)


def _outputs(op: str, output_mask, smooth_scale1, smooth_scale2) -> Tuple[bool, bool]:
    """Which of y1 / y2 to compute: output_mask when given (two bools), else y1 always and y2 with both smooth
    scales (upstream's rule)."""
    if output_mask is None or (isinstance(output_mask, (list, tuple)) and len(output_mask) == 0):
        return True, smooth_scale1 is not None and smooth_scale2 is not None
    if not isinstance(output_mask, (list, tuple)) or len(output_mask) != 2 or \
            not all(isinstance(m, bool) for m in output_mask):
        raise TypeError(f"{op}: argument 'output_mask' must be None or two bools; got {output_mask!r}")
    return output_mask[0], output_mask[1]


@_args.torch_npu_api
def npu_add_rms_norm_dynamic_quant(x1: Tensor, x2: Tensor, gamma: Tensor, *, smooth_scale1: Optional[Tensor] = None,
                                   smooth_scale2: Optional[Tensor] = None, beta: Optional[Tensor] = None,
                                   epsilon: float = 1e-6, output_mask: Optional[List[bool]] = None,
                                   y_dtype: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_add_rms_norm_dynamic_quant: (y1, y2, x, scale1, scale2) with x = x1 + x2, y = RMSNorm(x) *
    gamma (+ beta) and yk = round(y * smooth_scalek / scalek) as int8, scalek = max|y * smooth_scalek| / 127 per
    row. Outputs not asked for (output_mask, or y2 without both smooth scales) are zero-dimensional zeros."""
    op = "npu_add_rms_norm_dynamic_quant"
    _int8_only(op, "y_dtype", y_dtype)
    out1, out2 = _outputs(op, output_mask, smooth_scale1, smooth_scale2)
    if output_mask is None and not out2:
        smooth_scale2 = None  # upstream's rule: without output_mask, y2 needs both smooth scales
    return _OPS.add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1, smooth_scale2, beta, epsilon, out1, out2)


@_args.torch_npu_api
def npu_rms_norm_quant(x: Tensor, gamma: Tensor, beta: Tensor, scale: Tensor, offset: Tensor, epsilon: float = 1e-06,
                       *, dst_dtype: Optional[int] = None) -> Tensor:
    """torch_npu.npu_rms_norm_quant: round((RMSNorm(x) * gamma + beta) * scale + offset) as int8, one scale and
    offset for the tensor."""
    _int8_only("npu_rms_norm_quant", "dst_dtype", dst_dtype)
    return _OPS.rms_norm_quant(x, gamma, beta, scale, offset, epsilon)
