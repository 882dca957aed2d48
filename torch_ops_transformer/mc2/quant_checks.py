"""Argument checks of the quantised MC2 forms (docs/mc2.md, "Quantised MC2"), in torch_npu's order. Bad values
raise ValueError (ArgumentError under the torch_npu wrappers: also a RuntimeError, torch_npu's type), a wrong dtype
TypeError, an upstream feature not implemented here NotImplementedError; every message names the function, the
argument, what it must be and what was given."""
from typing import Optional

import torch

from .._internal import args as _args

# dequant_scale of npu_mm_all_reduce_base: npu_trans_quant_param's int64 packing (uint64 is the same bits), or a
# float scale; x2_scale of the all-gather / reduce-scatter forms: float32 or the int64 packing.
DEQUANT_DTYPES = (torch.int64, torch.uint64, torch.float32, torch.bfloat16)
X2_SCALE_DTYPES = (torch.float32, torch.int64)
QUANT_OUTPUTS = (torch.float16, torch.bfloat16, torch.float32)


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def input_kind(op: str, x1, x2, first: str = "x1") -> str:
    """'float' (float16 / bfloat16 / float32 / float64 x1 and x2), 'int8' (int8 x1 and x2) or 'weight_int8'
    (float x1, int8 x2). An integer x1 with a float x2 is no combination torch_npu accepts; int4 packed in int32 and
    float8 inputs are not implemented."""
    for name, t in ((first, x1), ("x2", x2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    int1, int2 = not x1.dtype.is_floating_point, not x2.dtype.is_floating_point
    if int1 and not int2:
        # torch_npu's wording is kept in the message: code written for it matches on it.
        raise _args.ArgumentError(f"{op}: the dtypes of {first} ({x1.dtype}) and x2 ({x2.dtype}) are no valid "
                                  f"combination (torch_npu: when neither dtype of x1 or dtype of x2 is vaild): an "
                                  f"integer {first} (quantised) needs an int8 x2")
    for name, t in ((first, x1), ("x2", x2)):
        if t.dtype == torch.int32:
            raise NotImplementedError(f"{op}: int4 inputs (8 values packed in an int32 '{name}') are not "
                                      f"implemented; pass int8")
        if t.dtype.is_floating_point and t.dtype.itemsize == 1:
            raise NotImplementedError(f"{op}: float8 inputs ('{name}' {t.dtype}) are not implemented; pass int8, "
                                      f"float16, bfloat16 or float32")
        if not t.dtype.is_floating_point and t.dtype != torch.int8:
            raise _args.ArgumentError(f"{op}: argument '{name}' must be an int8 tensor for quantised MC2; got "
                                      f"{t.dtype}")
    return "int8" if int1 else "weight_int8" if int2 else "float"


def check_k(op: str, x1: torch.Tensor, x2: torch.Tensor, first: str = "x1") -> None:
    if x1.shape[-1] != x2.shape[0]:
        raise ValueError(f"{op}: {first}'s last dim (k = {x1.shape[-1]}) must equal x2's first dim; got {first} of "
                         f"shape {_shape(x1)} and x2 of shape {_shape(x2)}")


def _tensor_or_none(op: str, name: str, t) -> None:
    if t is not None and not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a Tensor or None; got {type(t).__name__}")


def _must_be_none(op: str, why: str, **args) -> None:
    given = [f"'{n}'" for n, v in args.items() if v is not None]
    if given:
        raise ValueError(f"{op}: {' and '.join(given)} must be None {why}")


def _channel_shape_ok(t: torch.Tensor, n: int) -> bool:
    """[1] (per tensor), [n] or [1, n] (per channel)."""
    return (t.dim() == 1 or (t.dim() == 2 and t.shape[0] == 1)) and t.numel() in (1, n)


# ---- npu_mm_all_reduce_base ------------------------------------------------------------------------------------

def all_reduce_output_dtype(kind: str, x1: torch.Tensor, dequant_scale: Optional[torch.Tensor]) -> torch.dtype:
    """torch_npu's output dtype: int8 inputs give float16, bfloat16 with a bfloat16 dequant_scale; otherwise x1's."""
    if kind != "int8":
        return x1.dtype
    return torch.bfloat16 if dequant_scale is not None and dequant_scale.dtype == torch.bfloat16 else torch.float16


def all_reduce_scales(op: str, kind: str, antiquant_scale, antiquant_offset, dequant_scale) -> None:
    """Which scales each form takes (torch_npu's first check): the others must be None."""
    for name, t in (("antiquant_scale", antiquant_scale), ("antiquant_offset", antiquant_offset),
                    ("dequant_scale", dequant_scale)):
        _tensor_or_none(op, name, t)
    if kind == "int8":
        _must_be_none(op, "with int8 x1 and x2 (they dequantise the int8 weight of a float x1)",
                      antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset)
    elif kind == "weight_int8":
        _must_be_none(op, "with a float x1 and an int8 x2 (it dequantises the int8 product of int8 x1 and x2)",
                      dequant_scale=dequant_scale)
    else:
        _must_be_none(op, "when neither x1 nor x2 is int8", antiquant_scale=antiquant_scale,
                      antiquant_offset=antiquant_offset, dequant_scale=dequant_scale)


def all_reduce_x3(op: str, x3, shape: tuple, dtype: torch.dtype) -> None:
    _tensor_or_none(op, "x3", x3)
    if x3 is None:
        return
    if _shape(x3) != shape:
        raise ValueError(f"{op}: x3 must have the output's shape {shape}; got {_shape(x3)}")
    if x3.dtype != dtype:
        raise ValueError(f"{op}: x3's dtype ({x3.dtype}) must equal the output's ({dtype})")


def pertoken(op: str, pertoken_scale, dequant_scale, m: int) -> None:
    """pertoken_scale: float32 [m] (m = the rows of x1, b*s for a 3-D x1), next to a dequant_scale."""
    _tensor_or_none(op, "pertoken_scale", pertoken_scale)
    if pertoken_scale is None:
        return
    if dequant_scale is None:
        raise ValueError(f"{op}: argument 'pertoken_scale' needs a dequant_scale (it scales the int8 product's rows "
                         f"after dequant_scale); got dequant_scale None")
    if pertoken_scale.dim() != 1 or pertoken_scale.shape[0] != m:
        raise ValueError(f"{op}: argument 'pertoken_scale' must be 1-D [m] = [{m}] (one scale per row of x1); got "
                         f"shape {_shape(pertoken_scale)}")
    if pertoken_scale.dtype != torch.float32:
        raise TypeError(f"{op}: argument 'pertoken_scale' must be float32; got {pertoken_scale.dtype}")


def dequant(op: str, dequant_scale, pertoken_scale, n: int) -> None:
    """int8 x1 and x2: dequant_scale [1] / [n] / [1, n], int64 / uint64 (npu_trans_quant_param), bfloat16, or
    float32 next to a pertoken_scale (torch_npu's combinations)."""
    if dequant_scale is None:
        raise ValueError(f"{op}: argument 'dequant_scale' is required with int8 x1 and x2 (the int32 product's "
                         f"scale, [1] or [n] = [{n}]); got None")
    if dequant_scale.dtype not in DEQUANT_DTYPES:
        raise TypeError(f"{op}: argument 'dequant_scale' must be int64 / uint64 (npu_trans_quant_param's packing), "
                        f"float32 or bfloat16; got {dequant_scale.dtype}")
    if not _channel_shape_ok(dequant_scale, n):
        raise ValueError(f"{op}: argument 'dequant_scale' must be [1] (per tensor), [n] or [1, n] (per channel) "
                         f"with n = {n}; got shape {_shape(dequant_scale)}")
    if dequant_scale.dtype == torch.float32 and pertoken_scale is None:
        raise ValueError(f"{op}: a float32 'dequant_scale' needs a pertoken_scale (torch_npu's combinations); "
                         f"without one pass npu_trans_quant_param(dequant_scale) (int64) or a bfloat16 scale")


def bias(op: str, b, n: int, dtype: torch.dtype, why: str) -> None:
    _tensor_or_none(op, "bias", b)
    if b is None:
        return
    if _shape(b) != (n,):
        raise ValueError(f"{op}: bias must have shape ({n},) (x2's last dim); got {_shape(b)}")
    if b.dtype != dtype:
        raise TypeError(f"{op}: bias must be {dtype} {why}; got {b.dtype}")


def antiquant(op: str, x1: torch.Tensor, x2: torch.Tensor, scale, offset, group_size) -> None:
    """Weight-only int8: w = (x2 + antiquant_offset) * antiquant_scale, the scale of x1's dtype per tensor [1],
    per channel [n] / [1, n], or per group of `group_size` rows of x2 [ceil(k / group_size), n]; the offset of the
    scale's dtype and shape."""
    k, n = x2.shape
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"{op}: argument 'antiquant_group_size' must be an int; got {type(group_size).__name__}")
    if group_size != 0 and (group_size % 32 != 0 or not 32 <= group_size <= k - 1):
        raise ValueError(f"{op}: argument 'antiquant_group_size' must be 0 (per tensor / channel) or a multiple of "
                         f"32 in [32, k - 1] = [32, {k - 1}]; got {group_size}")
    if scale is None:
        raise ValueError(f"{op}: argument 'antiquant_scale' is required with a float x1 and an int8 x2 (the int8 "
                         f"weight's scale); got None")
    if scale.dtype != x1.dtype:
        raise TypeError(f"{op}: argument 'antiquant_scale' must have x1's dtype ({x1.dtype}); got {scale.dtype}")
    groups = -(-k // group_size) if group_size else 0
    if group_size and _shape(scale) != (groups, n):
        raise ValueError(f"{op}: argument 'antiquant_scale' must be [ceil(k / antiquant_group_size), n] = "
                         f"[{groups}, {n}] per group; got shape {_shape(scale)}")
    if not group_size and not _channel_shape_ok(scale, n):
        raise ValueError(f"{op}: argument 'antiquant_scale' must be [1] (per tensor), [n] or [1, n] (per channel) "
                         f"with n = {n}; got shape {_shape(scale)}")
    if offset is not None and (offset.dtype != scale.dtype or offset.shape != scale.shape):
        raise ValueError(f"{op}: argument 'antiquant_offset' must have antiquant_scale's dtype and shape "
                         f"({scale.dtype}, {_shape(scale)}); got {offset.dtype}, {_shape(offset)}")


# ---- all-gather / reduce-scatter forms --------------------------------------------------------------------------

def scale_args(op: str, kind: str, x1_scale, x2_scale, m: int, n: int, first: str = "input") -> None:
    """x1_scale float32 [m, 1] (or [m]) per token, x2_scale float32 / int64 [1, n] (or [n], [1]) per channel: for
    int8 inputs only, where x2_scale is required."""
    _tensor_or_none(op, "x1_scale", x1_scale)
    _tensor_or_none(op, "x2_scale", x2_scale)
    if kind != "int8":
        _must_be_none(op, f"with a float {first} (they dequantise int8 inputs)", x1_scale=x1_scale,
                      x2_scale=x2_scale)
        return
    if x2_scale is None:
        raise ValueError(f"{op}: argument 'x2_scale' is required with int8 inputs (x2's per-channel scale, "
                         f"[1, n] = [1, {n}]); got None")
    if x2_scale.dtype not in X2_SCALE_DTYPES:
        raise TypeError(f"{op}: argument 'x2_scale' must be float32 or int64 (npu_trans_quant_param's packing); got "
                        f"{x2_scale.dtype}")
    if not _channel_shape_ok(x2_scale, n):
        raise ValueError(f"{op}: argument 'x2_scale' must be [1, n] = [1, {n}] (or [n], or [1] per tensor); got "
                         f"shape {_shape(x2_scale)}")
    if x1_scale is None:
        return
    if x1_scale.dtype != torch.float32:
        raise TypeError(f"{op}: argument 'x1_scale' must be float32; got {x1_scale.dtype}")
    if _shape(x1_scale) not in ((m, 1), (m,)):
        raise ValueError(f"{op}: argument 'x1_scale' must be [m, 1] = [{m}, 1] (one scale per row of {first}); got "
                         f"shape {_shape(x1_scale)}")


def scaled_output_dtype(op: str, name: str, value, x2_scale: torch.Tensor, default: torch.dtype) -> torch.dtype:
    """The int8 forms' output dtype: float16 with an int64 x2_scale (torch_npu's rule; `value` must then be None or
    float16), else `value` (float16 / bfloat16 / float32), `default` when None."""
    dtype = _as_dtype(op, name, value)
    if x2_scale.dtype == torch.int64:
        if dtype not in (None, torch.float16):
            raise ValueError(f"{op}: argument '{name}' must be None or torch.float16 with an int64 x2_scale (its "
                             f"output is float16); got {dtype}")
        return torch.float16
    return default if dtype is None else dtype


def _as_dtype(op: str, name: str, value) -> Optional[torch.dtype]:
    """A torch.dtype or its ScalarType code; quantised outputs (int8, float8) are not implemented."""
    if value is None:
        return None
    dtype = value
    if isinstance(value, int) and not isinstance(value, bool):
        dtype = _args.SCALAR_TYPE_CODES.get(value)
        if dtype is None:
            raise NotImplementedError(f"{op}: argument '{name}' = {value} is a dtype code of torch_npu's own formats "
                                      f"(hifloat8, float4, ...), which is not implemented")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{op}: argument '{name}' must be a torch.dtype (or its int code) or None; got "
                        f"{type(value).__name__}")
    if dtype not in QUANT_OUTPUTS:
        raise NotImplementedError(f"{op}: argument '{name}' = {dtype} (a quantised or integer output) is not "
                                  f"implemented; pass float16, bfloat16 or float32")
    return dtype


def quant_output_dtype(op: str, value) -> Optional[torch.dtype]:
    return _as_dtype(op, "y_dtype", value)
