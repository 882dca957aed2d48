"""Activation quantisation and SwiGLU with torch_npu's Python signatures, on top of `torch.ops.npu_fa` (docs/moe.md,
"Quantised routing and activations"):

    y, scale = npu_dynamic_quant(x)                      # int8 rows, fp32 per-row scale (x ~= y * scale)
    y, scale, offset = npu_dynamic_quant_asymmetric(x)   # x ~= (y - offset) * scale
    h = npu_swiglu(gate_up)                              # silu(first half) * second half; differentiable

Only the per-token mode and the int8 / int4 (torch.quint4x2: 8 values packed per int32) outputs are implemented;
the float8 / hifloat8 outputs and the per-tensor / per-channel modes raise NotImplementedError.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa

# torch_npu's codes (c10::ScalarType) of the implemented outputs, next to the torch.dtypes themselves.
_INT8_CODE, _QUINT4X2_CODE = 1, 16
_QUANT_MODES = ("pertoken", "pertensor", "perchannel")


def _bits(op: str, dst_type) -> int:
    """8 for int8 (None, torch.int8 or its code), 4 for int4 (torch.quint4x2 or its code); NotImplementedError for
    the other upstream formats (float8, hifloat8)."""
    if dst_type is None or dst_type in (torch.int8, _INT8_CODE):
        return 8
    if dst_type in (torch.quint4x2, _QUINT4X2_CODE):
        return 4
    if isinstance(dst_type, bool) or not isinstance(dst_type, (int, torch.dtype)):
        raise TypeError(f"{op}: argument 'dst_type' must be None, a torch.dtype or a torch_npu dtype code (int); "
                        f"got {dst_type!r}")
    raise NotImplementedError(f"{op}: quantisation to {dst_type!r} is not implemented; argument 'dst_type' must be "
                              f"None, torch.int8 or torch.quint4x2")


def _check_mode(op: str, quant_mode, dst_type_max) -> None:
    if not isinstance(quant_mode, str):
        raise TypeError(f"{op}: argument 'quant_mode' must be a str; got {quant_mode!r}")
    if quant_mode not in _QUANT_MODES:
        raise ValueError(f"{op}: argument 'quant_mode' must be one of {', '.join(map(repr, _QUANT_MODES))}; got "
                         f"{quant_mode!r}")
    if quant_mode != "pertoken":
        raise NotImplementedError(f"{op}: the {quant_mode} mode is not implemented; argument 'quant_mode' must be "
                                  f"'pertoken'")
    if isinstance(dst_type_max, bool) or not isinstance(dst_type_max, (int, float)):
        raise TypeError(f"{op}: argument 'dst_type_max' must be a float; got {dst_type_max!r}")
    if dst_type_max != 0:
        raise NotImplementedError(f"{op}: argument 'dst_type_max' (the range of a float8/hifloat8 output) is not "
                                  f"implemented; it must be 0.0 (int8/int4 use their own range); got {dst_type_max}")


@_args.torch_npu_api
def npu_dynamic_quant(input: Tensor, *, smooth_scales: Optional[Tensor] = None,  # noqa: A002 (upstream's name)
                      group_index: Optional[Tensor] = None, dst_type=None, quant_mode: str = "pertoken",
                      dst_type_max: float = 0.0) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_dynamic_quant: per-token symmetric quantisation, (y, scale) with scale = max|x * smooth| / 127
    (7 for int4) per row and y = round(x * smooth / scale) (half to even). smooth_scales [H], or [G, H] with
    group_index (cumulative row ends, last = the row count) for MoE: group g's rows use row g."""
    op = "npu_dynamic_quant"
    bits = _bits(op, dst_type)
    _check_mode(op, quant_mode, dst_type_max)
    y, scale, _ = _OPS.dynamic_quant(input, smooth_scales, group_index, False, bits)
    return y, scale


@_args.torch_npu_api
def npu_dynamic_quant_asymmetric(input: Tensor, *, smooth_scales: Optional[Tensor] = None,  # noqa: A002
                                 group_index: Optional[Tensor] = None, dst_type=None, quant_mode: str = "pertoken",
                                 dst_type_max: float = 0.0) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_dynamic_quant_asymmetric: per-token asymmetric quantisation, (y, scale, offset) with scale =
    (max - min) / 255 (15 for int4), offset = 127 - max / scale (7 for int4), y = round(x / scale + offset)."""
    op = "npu_dynamic_quant_asymmetric"
    bits = _bits(op, dst_type)
    _check_mode(op, quant_mode, dst_type_max)
    return _OPS.dynamic_quant(input, smooth_scales, group_index, True, bits)


@_args.torch_npu_api
def npu_swiglu(input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002 (upstream's name)
    """torch_npu.npu_swiglu: silu(A) * B for the halves A (first), B (second) of input along dim. Differentiable."""
    return _OPS.swiglu(input, dim)


@_args.torch_npu_api
def npu_swiglu_backward(grad_output: Tensor, input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002
    """torch_npu.npu_swiglu_backward: the gradient of npu_swiglu w.r.t. input."""
    return _OPS.swiglu_grad(grad_output, input, dim)
