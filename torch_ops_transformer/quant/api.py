"""Activation quantisation and SwiGLU with torch_npu's Python signatures, on top of `torch.ops.npu_fa` (docs/moe.md,
"Quantised routing and activations"):

    y, scale = npu_dynamic_quant(x)                      # int8 rows, fp32 per-row scale (x ~= y * scale)
    y, scale, offset = npu_dynamic_quant_asymmetric(x)   # x ~= (y - offset) * scale
    y, scale = npu_dynamic_block_quant(x, dst_type=torch.int8, col_block_size=128)  # one scale per 1 x 128 block
    h = npu_swiglu(gate_up)                              # silu(first half) * second half; differentiable

npu_dynamic_quant implements the per-token mode and the int8 / int4 (torch.quint4x2: 8 values packed per int32)
outputs; npu_dynamic_block_quant int8 and float8 (e4m3fn, e5m2). Hifloat8 outputs and the per-tensor /
per-channel modes raise NotImplementedError.
"""
from typing import List, Optional, Tuple

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


# npu_dynamic_block_quant's targets: torch.dtype -> torch_npu's code (c10::ScalarType); hifloat8 (code 256 + 34) has
# no torch dtype and is not implemented.
_BLOCK_QUANT_CODES = {torch.int8: 1, torch.float8_e4m3fn: 24, torch.float8_e5m2: 23}


def _block_quant_code(op: str, dst_type) -> int:
    if isinstance(dst_type, torch.dtype):
        if dst_type not in _BLOCK_QUANT_CODES:
            raise ValueError(f"{op}: argument 'dst_type' must be torch.int8, torch.float8_e4m3fn or "
                             f"torch.float8_e5m2 (or their codes 1, 24, 23); got {dst_type}")
        return _BLOCK_QUANT_CODES[dst_type]
    if isinstance(dst_type, bool) or not isinstance(dst_type, int):
        raise TypeError(f"{op}: argument 'dst_type' must be a torch.dtype or a torch_npu dtype code (int); got "
                        f"{dst_type!r}")
    if dst_type >= 256:
        raise NotImplementedError(f"{op}: argument 'dst_type' {dst_type} (hifloat8) is not implemented; use int8 (1), "
                                  f"float8_e4m3fn (24) or float8_e5m2 (23)")
    return dst_type


@_args.torch_npu_api
def npu_dynamic_block_quant(x: Tensor, *, min_scale: float = 0.0, round_mode: str = "rint", dst_type=1,
                            row_block_size: int = 1, col_block_size: int = 128,
                            dst_type_max: float = 0.0) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_dynamic_block_quant: (y, scale) with one scale per block of row_block_size x col_block_size
    values of the 2-D / 3-D x: scale = max(max|block| / Q, min_scale), y = cast(x / scale) (Q: 127 for int8, 448
    float8_e4m3fn, 57344 float8_e5m2, or dst_type_max). dst_type: a torch.dtype or torch_npu's code."""
    op = "npu_dynamic_block_quant"
    if not isinstance(round_mode, str):
        raise TypeError(f"{op}: argument 'round_mode' must be a str; got {round_mode!r}")
    if round_mode == "round":
        raise NotImplementedError(f"{op}: round_mode 'round' belongs to hifloat8 outputs, which are not implemented; "
                                  f"argument 'round_mode' must be 'rint'")
    return _OPS.dynamic_block_quant(x, min_scale, round_mode, _block_quant_code(op, dst_type), row_block_size,
                                    col_block_size, dst_type_max)


@_args.torch_npu_api
def npu_swiglu(input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002 (upstream's name)
    """torch_npu.npu_swiglu: silu(A) * B for the halves A (first), B (second) of input along dim. Differentiable."""
    return _OPS.swiglu(input, dim)


@_args.torch_npu_api
def npu_swiglu_backward(grad_output: Tensor, input: Tensor, dim: int = -1) -> Tensor:  # noqa: A002
    """torch_npu.npu_swiglu_backward: the gradient of npu_swiglu w.r.t. input."""
    return _OPS.swiglu_grad(grad_output, input, dim)


# ---- Quantised matmul ------------------------------------------------------------------------------------------
# torch_npu passes dtypes as ScalarType codes; the quantised torch.dtypes have their own.
_QUANT_DTYPE_CODES = {torch.uint8: 0, torch.int8: 1, torch.int32: 3, torch.qint8: 12, torch.quint8: 13,
                      torch.qint32: 14, torch.quint4x2: 16}
_MATMUL_OUTPUT_CODES = {torch.int8: 1, torch.int32: 3, torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}


def _dtype_code(op: str, name: str, value, codes: dict) -> int:
    """A torch.dtype of `codes` or one of its integer codes (torch_npu's int dtype arguments)."""
    if isinstance(value, torch.dtype):
        if value not in codes:
            raise ValueError(f"{op}: argument '{name}' must be one of {', '.join(map(str, codes))}; got {value}")
        return codes[value]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: argument '{name}' must be a torch.dtype or a torch_npu dtype code (int); got {value!r}")
    if value not in codes.values():
        raise ValueError(f"{op}: argument '{name}' must be one of {', '.join(map(str, codes))} or their codes "
                         f"{sorted(set(codes.values()))}; got {value}")
    return value


def _format_or_none(op: str, name: str, value, tensor: Tensor, feature: str) -> None:
    """x1_dtype / x2_dtype / weight_dtype...: None or the tensor's own dtype (torch.quint4x2 for int32-packed int4);
    anything else selects a format not implemented here (float8, hifloat8, float4)."""
    if tensor.dtype == torch.int32 and value in (torch.quint4x2, _QUINT4X2_CODE):
        return
    _args.same_dtype_or_none(op, name, value, tensor.dtype, feature)


def _group_sizes(op: str, value) -> Optional[List[int]]:
    """None or a list / tuple of ints (the op checks its length and values, naming the argument)."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError(f"{op}: argument 'group_sizes' must be None or a list of 3 ints [group_m, group_n, group_k]; "
                        f"got {value!r}")
    return list(value)


@_args.torch_npu_api
def npu_trans_quant_param(scale: Tensor, offset: Optional[Tensor] = None, round_mode: Optional[int] = 0) -> Tensor:
    """torch_npu.npu_trans_quant_param: float32 scale (and offset) -> int64 (scale's fp32 bits truncated to FP19 in
    bits 0-31, bit 46 set, the offset as a 9-bit integer in bits 37-45), the `scale` form of npu_quant_matmul."""
    return _OPS.trans_quant_param(scale, offset, _args.optional_int("npu_trans_quant_param", "round_mode",
                                                                    round_mode, 0))


@_args.torch_npu_api
def npu_quantize(input: Tensor, scales: Tensor, zero_points: Optional[Tensor], dtype,  # noqa: A002
                 axis: int = 1, div_mode: bool = True) -> Tensor:
    """torch_npu.npu_quantize: div_mode True, per channel along axis, round(input / scales) + zero_points (like
    torch.quantize_per_channel(...).int_repr()); div_mode False, round(input * scales + zero_points) to int8, or to
    int4 packed eight per int32 (dtype torch.quint4x2)."""
    code = _dtype_code("npu_quantize", "dtype", dtype, _QUANT_DTYPE_CODES)
    return _OPS.quantize(input, scales, zero_points, code, axis, div_mode)


@_args.torch_npu_api
def npu_quant_matmul(x1: Tensor, x2: Tensor, scale: Tensor, *, offset: Optional[Tensor] = None,
                     pertoken_scale: Optional[Tensor] = None, bias: Optional[Tensor] = None, output_dtype=None,
                     x1_dtype=None, x2_dtype=None, pertoken_scale_dtype=None, scale_dtype=None,
                     group_sizes: Optional[List[int]] = None, y_scale: Optional[Tensor] = None) -> Tensor:
    """torch_npu.npu_quant_matmul: W8A8 (int8 x1, x2) or W4A4 (int32 holding 8 int4) matmul in int32, dequantised
    by scale (per tensor / channel; float32, bfloat16 or npu_trans_quant_param's int64) and pertoken_scale, plus
    bias and offset; output_dtype int8 (default), float16, bfloat16, int32 (the accumulation). group_sizes
    [0, 0, G] (or [1, 1, G]) selects the per-group forms: A8W4 (int8 x1, int4 x2, scale [K/G, N], offset the
    y_offset [N] that carries 8 * sum(x2 * scale), docs/quant.md) and A4W4 per-token per-group asymmetric (offset
    the float16 zero points [K/G, N])."""
    op = "npu_quant_matmul"
    code = 1 if output_dtype is None else _dtype_code(op, "output_dtype", output_dtype, _MATMUL_OUTPUT_CODES)
    _format_or_none(op, "x1_dtype", x1_dtype, x1, "a low-precision float format of x1")
    _format_or_none(op, "x2_dtype", x2_dtype, x2, "a low-precision float format of x2")
    if pertoken_scale is not None:
        _args.same_dtype_or_none(op, "pertoken_scale_dtype", pertoken_scale_dtype, pertoken_scale.dtype,
                                 "a float8_e8m0 (mx) pertoken_scale")
    elif pertoken_scale_dtype is not None:
        _args.same_dtype_or_none(op, "pertoken_scale_dtype", pertoken_scale_dtype, None, "pertoken_scale_dtype")
    _args.same_dtype_or_none(op, "scale_dtype", scale_dtype, scale.dtype, "a float8_e8m0 (mx) scale")
    if y_scale is not None:
        raise NotImplementedError(f"{op}: argument 'y_scale' (an output scale for float8 outputs) is not "
                                  f"implemented; pass None")
    groups = _group_sizes(op, group_sizes)
    return _OPS.quant_matmul(x1, x2, scale, offset, pertoken_scale, bias, code, groups)


@_args.torch_npu_api
def npu_weight_quant_batchmatmul(x: Tensor, weight: Tensor, antiquant_scale: Tensor,
                                 antiquant_offset: Optional[Tensor] = None, quant_scale: Optional[Tensor] = None,
                                 quant_offset: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                                 antiquant_group_size: int = 0, inner_precise: int = 0, weight_dtype=None) -> Tensor:
    """torch_npu.npu_weight_quant_batchmatmul: x @ ((weight + antiquant_offset) * antiquant_scale) + bias with an
    int8 or int4 (int32 holding 8) weight, per tensor / channel / group of antiquant_group_size rows; optionally
    quantised to int8 by quant_scale / quant_offset. inner_precise (0 high precision, 1 high performance) selects
    the same computation here."""
    op = "npu_weight_quant_batchmatmul"
    if inner_precise not in (0, 1):
        raise ValueError(f"{op}: argument 'inner_precise' must be 0 or 1; got {inner_precise!r}")
    _format_or_none(op, "weight_dtype", weight_dtype, weight, "a float8/hifloat8/float4 weight")
    return _OPS.weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset, quant_scale, quant_offset,
                                         bias, antiquant_group_size)


@_args.torch_npu_api
def npu_convert_weight_to_int4pack(weight: Tensor, inner_k_tiles: int = 0) -> Tensor:
    """torch_npu.npu_convert_weight_to_int4pack: int32 [k, n] of int4 values -> int32 [k, n / 8], eight values per
    word along the last axis, low nibble first (inner_k_tiles: reserved upstream, unused)."""
    return _OPS.convert_weight_to_int4pack(weight, inner_k_tiles)


@_args.torch_npu_api
def npu_clipped_swiglu(x: Tensor, *, group_index: Optional[Tensor] = None, dim: int = -1, alpha: float = 1.702,
                       limit: float = 7.0, bias: float = 1.0, interleaved: bool = True) -> Tensor:
    """torch_npu.npu_clipped_swiglu (gpt-oss): A = min(A, limit), B = clamp(B, -limit, limit),
    A * sigmoid(alpha * A) * (B + bias) over the even/odd (interleaved) or first/second halves along dim; with
    group_index only the first sum(group_index) rows are computed, the rest are zeros."""
    return _OPS.clipped_swiglu(x, group_index, dim, float(alpha), float(limit), float(bias), interleaved)


# torch_npu's dst_type codes of the low-precision float outputs of npu_dequant_swiglu_quant (Ascend 950): torch's
# ScalarType codes of float8_e5m2 / float8_e4m3fn and torch_npu's own codes (hifloat8, float8, float4).
_FLOAT_OUTPUT_CODES = (23, 24, 290, 291, 292, 296, 297)
_ROUND_MODES = ("rint", "round", "floor", "ceil", "trunc")


def _dsq_dst_type(op: str, dst_type) -> None:
    """None, torch.int8 or its code 1: the int8 output; the float8 / hifloat8 / float4 outputs are not implemented."""
    if dst_type is None or dst_type in (torch.int8, _INT8_CODE):
        return
    if isinstance(dst_type, bool) or not isinstance(dst_type, (int, torch.dtype)):
        raise TypeError(f"{op}: argument 'dst_type' must be None, a torch.dtype or a torch_npu dtype code (int); "
                        f"got {dst_type!r}")
    if (isinstance(dst_type, torch.dtype) and dst_type.is_floating_point and dst_type.itemsize == 1) or \
            dst_type in _FLOAT_OUTPUT_CODES:
        raise NotImplementedError(f"{op}: the output format dst_type={dst_type!r} (float8 / hifloat8 / float4) is "
                                  f"not implemented; argument 'dst_type' must be None or torch.int8")
    raise ValueError(f"{op}: argument 'dst_type' must be None, torch.int8 (1) or a float8 / hifloat8 / float4 "
                     f"code; got {dst_type!r}")


@_args.torch_npu_api
def npu_dequant_swiglu_quant(x: Tensor, *, weight_scale: Optional[Tensor] = None,
                             activation_scale: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                             quant_scale: Optional[Tensor] = None, quant_offset: Optional[Tensor] = None,
                             group_index: Optional[Tensor] = None, activate_left: bool = False, quant_mode: int = 0,
                             dst_type=None, round_mode: Optional[int] = None, activate_dim: Optional[int] = None,
                             swiglu_mode: int = 0, clamp_limit: float = 7.0, glu_alpha: float = 1.702,
                             glu_bias: float = 1.0) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_dequant_swiglu_quant: an int32 matmul accumulation x dequantised (weight_scale per channel,
    activation_scale per token, bias), SwiGLU (activate_left: the first half is activated; swiglu_mode 1 / 2: the
    clamped gpt-oss form over the even/odd positions / the halves), then int8 per token: dynamic (quant_mode 1,
    quant_scale as smoothing, the scale returned) or static (quant_mode 0, round(s / quant_scale + quant_offset)).
    group_index (token counts) selects row g of the [G, ...] scales for group g's tokens (MoE)."""
    op = "npu_dequant_swiglu_quant"
    _dsq_dst_type(op, dst_type)
    mode = _args.optional_int(op, "round_mode", round_mode, 0)
    if not 0 <= mode < len(_ROUND_MODES):
        raise ValueError(f"{op}: argument 'round_mode' must be in [0, 4] ({', '.join(_ROUND_MODES)}); got {mode}")
    if mode != 0:
        raise ValueError(f"{op}: the int8 output rounds with 'rint' only; argument 'round_mode' must be None or 0; "
                         f"got {mode} ({_ROUND_MODES[mode]!r})")
    dim = _args.optional_int(op, "activate_dim", activate_dim, -1)
    return _OPS.dequant_swiglu_quant(x, weight_scale, activation_scale, bias, quant_scale, quant_offset, group_index,
                                     bool(activate_left), quant_mode, dim, swiglu_mode, float(clamp_limit),
                                     float(glu_alpha), float(glu_bias))


@_args.torch_npu_api
def npu_transpose_batchmatmul(input: Tensor, weight: Tensor, *, bias: Optional[Tensor] = None,  # noqa: A002
                              scale: Optional[Tensor] = None, perm_x1: Optional[List[int]] = None,
                              perm_x2: Optional[List[int]] = None, perm_y: Optional[List[int]] = None,
                              batch_split_factor: Optional[int] = 1) -> Tensor:
    """torch_npu.npu_transpose_batchmatmul: (input.permute(perm_x1) @ weight.permute(perm_x2)).permute(perm_y);
    with scale (npu_trans_quant_param's int64, [B * N]) an int8 [M, 1, B * N]; batch_split_factor s > 1 gives
    [s, M, B * N / s]."""
    op = "npu_transpose_batchmatmul"
    if bias is not None:
        raise NotImplementedError(f"{op}: argument 'bias' is not supported (upstream reserves it); pass None")
    split = _args.optional_int(op, "batch_split_factor", batch_split_factor, 1)
    return _OPS.transpose_batchmatmul(input, weight, scale, [0, 1, 2] if perm_x1 is None else list(perm_x1),
                                      [0, 1, 2] if perm_x2 is None else list(perm_x2),
                                      [1, 0, 2] if perm_y is None else list(perm_y), split)
