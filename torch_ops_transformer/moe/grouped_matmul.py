"""Grouped matmul: torch_npu's `npu_grouped_matmul` (floating point and quantised), `npu_grouped_matmul_swiglu_quant`
(and _v2) and a single-tensor convenience function, over `torch.ops.npu_fa.grouped_matmul`, `grouped_matmul_quant`
and `grouped_matmul_swiglu_quant` (semantics in docs/moe.md)."""
from typing import List, Optional, Sequence, Union

import torch

from .._internal import args as _args

# act_type numbering of CANN / torch_npu; names accepted by `grouped_matmul(..., activation=...)`.
ACT_TYPES = {"none": 0, "relu": 1, "gelu_tanh": 2, "gelu": 2, "fast_gelu": 4, "silu": 5}

def _act_type(activation: Union[str, int]) -> int:
    if isinstance(activation, int):
        return activation
    if activation not in ACT_TYPES:
        raise ValueError(f"grouped_matmul: argument 'activation' must be one of {sorted(ACT_TYPES)}; got {activation!r}")
    return ACT_TYPES[activation]


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, group_list, *, bias: Optional[torch.Tensor] = None,
                   group_type: int = 0, group_list_type: int = 0,
                   activation: Union[str, int] = "none") -> torch.Tensor:
    """One-tensor form: group_type 0 (x [M, K], weight [E, K, N], bias [E, N] -> [M, N]) or 2 (x [M, K],
    weight [K, N] -> [E, M, N]). group_list: tensor or list of E cumulative ends (group_list_type 0) or counts (1).
    Differentiable in x, weight and bias."""
    bias_list = [] if bias is None else [bias]
    out, _ = torch.ops.npu_fa.grouped_matmul(
        [x], [weight], bias_list, _args.int_tensor("grouped_matmul", "group_list", group_list, x.device), group_type,
        group_list_type,
        _act_type(activation))
    return out[0]


def _split_rows(y: torch.Tensor, group_list: torch.Tensor, group_list_type: int) -> List[torch.Tensor]:
    counts = group_list if group_list_type == 1 else torch.diff(group_list, prepend=group_list.new_zeros(1))
    return list(torch.split(y, counts.tolist(), dim=0))


def _check_tuning_config(op: str, tuning_config) -> None:
    """A tiling hint (expected tokens per expert, then reserved entries): validated, no effect on CPU."""
    if tuning_config is None:
        return
    if not isinstance(tuning_config, (list, tuple)) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in tuning_config):
        raise TypeError(f"{op}: argument 'tuning_config' must be None or a list of ints; got {tuning_config!r}")
    if tuning_config and tuning_config[0] < 0:
        raise ValueError(f"{op}: argument 'tuning_config'[0] (the expected number of tokens per expert) must be "
                         f">= 0; got {tuning_config[0]}")


def _check_group_ends(op: str, ends: List[int], rows: List[int]) -> None:
    """A group_list given next to several x tensors: its differences must be those tensors' row counts."""
    counts = [b - a for a, b in zip([0] + ends[:-1], ends)]
    if counts != rows:
        raise ValueError(f"{op}: argument 'group_list' {ends} must be the cumulative row counts {rows} of the x "
                         f"tensors (one group per tensor)")


# torch dtype -> ScalarType code, for grouped_matmul_quant's `output_dtype` (torch_npu's own `int?` convention).
_DTYPE_CODES = _args.DTYPE_CODES
_QUANT_OUT = (torch.bfloat16, torch.float16, torch.float32, torch.int8, torch.int32)


def _resolve_dtype(op: str, name: str, value) -> Optional[torch.dtype]:
    """None, a torch.dtype or torch_npu's integer dtype code -> a torch.dtype (None stays None)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: argument '{name}' must be None, a torch.dtype or a torch_npu dtype code (int); got "
                        f"{value!r}")
    if value not in _args.SCALAR_TYPE_CODES:
        raise NotImplementedError(f"{op}: argument '{name}' code {value} selects a format this package does not "
                                  f"implement")
    return _args.SCALAR_TYPE_CODES[value]


def _tensors(value) -> List[torch.Tensor]:
    return [] if value is None else list(value)


def _is_quantised(x, weight, *lists) -> bool:
    return (x[0].dtype == torch.int8 or weight[0].dtype in (torch.int8, torch.int32)
            or any(len(_tensors(v)) > 0 for v in lists))


def _quant_call(op, x, weight, bias, scale, per_token_scale, antiquant_scale, antiquant_offset, gl, group_type,
                group_list_type, act_type, output_dtype):
    code = -1 if output_dtype is None else _DTYPE_CODES[output_dtype]
    return torch.ops.npu_fa.grouped_matmul_quant(x, weight, bias, _tensors(scale), _tensors(per_token_scale),
                                                 _tensors(antiquant_scale), _tensors(antiquant_offset), gl,
                                                 group_type, group_list_type, act_type, code)


def _split_covered(y: torch.Tensor, gl: torch.Tensor, group_list_type: int) -> List[torch.Tensor]:
    """One output per group (split_item 0/1) of a quantised split-M result; the groups may end before y's last row."""
    if group_list_type == 2:
        counts = gl[:, 1]
    else:
        counts = gl if group_list_type == 1 else torch.diff(gl, prepend=gl.new_zeros(1))
    counts = counts.tolist()
    return list(torch.split(y[:sum(counts)], counts, dim=0))


@_args.torch_npu_api
def npu_grouped_matmul(x: Sequence[torch.Tensor], weight: Sequence[torch.Tensor], *,
                       bias: Optional[Sequence[torch.Tensor]] = None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None,
                       group_list: Optional[Union[torch.Tensor, Sequence[int]]] = None, activation_input=None,
                       activation_quant_scale=None, activation_quant_offset=None, split_item: Optional[int] = 0,
                       group_type: Optional[int] = None, group_list_type: Optional[int] = 0,
                       act_type: Optional[int] = 0, tuning_config: Optional[Sequence[int]] = None,
                       output_dtype=None, x_dtype=None, weight_dtype=None, scale_dtype=None,
                       per_token_scale_dtype=None) -> List[torch.Tensor]:
    """torch_npu.npu_grouped_matmul (semantics in docs/moe.md).

    group_list a tensor (or None): group_type is required, as in torch_npu: -1 independent products x[i] @ weight[i]
    (no group_list), 0 split along M (one x [M, K] split by group_list, or several x, one group each), 2 split along
    K (x [M, K], weight [K, N] -> [E, M, N]; floating point only). group_list a list of ints (torch_npu's `.List`
    overload): cumulative ends, group_type None (or 0/-1), group_list_type and act_type 0. split_item 0/1: one
    output per group; 2/3: a single output. None for the `int?` arguments means their default. tuning_config is a
    tiling hint (validated).

    Quantised forms (`grouped_matmul_quant`): int8 x and int8 weight (W8A8) with `scale` (fp32/bf16/int64 packed),
    optional `per_token_scale`, int32 or float bias, `output_dtype` bf16/fp16/fp32/int8/int32; bf16/fp16 x with an
    int8 weight or int4 packed in int32 (weight-only) with `antiquant_scale` / `antiquant_offset` per channel or per
    group. group_list_type 2 ((expert, count) pairs) for int8 x. `offset` and the activation_* arguments must be
    None; the *_dtype arguments None or the dtype their tensor has (other formats: NotImplementedError)."""
    op = "npu_grouped_matmul"
    _args.not_implemented(op, "a quantisation offset and activation quantisation", empty_is_none=True,
                          offset=offset, activation_input=activation_input,
                          activation_quant_scale=activation_quant_scale,
                          activation_quant_offset=activation_quant_offset)
    x, weight = list(x), list(weight)
    if not x or not weight:
        raise ValueError(f"{op}: arguments 'x' and 'weight' must be non-empty lists of tensors; got {len(x)} and "
                         f"{len(weight)} tensors")
    split_item = _args.optional_int(op, "split_item", split_item, 0)
    group_list_type = _args.optional_int(op, "group_list_type", group_list_type, 0)
    act_type = _args.optional_int(op, "act_type", act_type, 0)
    if split_item not in (0, 1, 2, 3):
        raise ValueError(f"{op}: argument 'split_item' must be 0, 1 (one output per group), 2 or 3 (one output); "
                         f"got {split_item}")
    _check_tuning_config(op, tuning_config)
    quant = _is_quantised(x, weight, scale, per_token_scale, antiquant_scale, antiquant_offset)
    if quant and x[0].is_floating_point() and weight[0].is_floating_point():
        named = (("scale", scale), ("per_token_scale", per_token_scale), ("antiquant_scale", antiquant_scale),
                 ("antiquant_offset", antiquant_offset))
        given = [n for n, v in named if _tensors(v)]
        raise TypeError(f"{op}: argument{'s' if len(given) > 1 else ''} {', '.join(repr(n) for n in given)} need "
                        f"int8 x and weight (W8A8) or an int8 / int4 (int32-packed) weight (weight-only); got "
                        f"{x[0].dtype} x and {weight[0].dtype} weight")
    first = lambda v: _tensors(v)[0].dtype if _tensors(v) else None  # noqa: E731
    _args.same_dtype_or_none(op, "x_dtype", x_dtype, x[0].dtype, "another x format (int4, fp8...)")
    _args.same_dtype_or_none(op, "weight_dtype", weight_dtype, weight[0].dtype, "another weight format (fp8, fp4...)")
    _args.same_dtype_or_none(op, "scale_dtype", scale_dtype, first(scale), "another 'scale' format")
    _args.same_dtype_or_none(op, "per_token_scale_dtype", per_token_scale_dtype, first(per_token_scale),
                             "another 'per_token_scale' format")
    out_dtype = _resolve_dtype(op, "output_dtype", output_dtype)
    if not quant:
        _args.same_dtype_or_none(op, "output_dtype", output_dtype, x[0].dtype, "a quantised output")
    elif out_dtype is not None and out_dtype not in _QUANT_OUT:
        raise ValueError(f"{op}: argument 'output_dtype' must be None or one of {list(_QUANT_OUT)} for quantised "
                         f"inputs; got {output_dtype!r}")
    bias = list(bias or [])
    single = split_item in (2, 3)

    def run(xs, ws, gl, gt, glt, act):
        """The op's outputs: grouped_matmul (floating point) or grouped_matmul_quant."""
        if quant:
            return _quant_call(op, xs, ws, bias, scale, per_token_scale, antiquant_scale, antiquant_offset, gl, gt,
                               glt, act, out_dtype)
        return torch.ops.npu_fa.grouped_matmul(xs, ws, bias, gl, gt, glt, act)[0]

    def lists(act):
        """Independent products x[i] @ weight[i] (group_type -1), one output each or (split_item 2/3) one."""
        out = run(x, weight, None, -1, 0, act)
        return [torch.cat(out, dim=0)] if single and len(out) > 1 else list(out)

    if isinstance(group_list, (list, tuple)):  # torch_npu's .List overload: cumulative ends, M split
        if group_type not in (None, -1, 0):
            raise ValueError(f"{op}: argument 'group_type' must be None (or -1/0) with a list 'group_list' (the "
                             f"list form splits along M); got {group_type}; pass group_list as a tensor for K split")
        for name, value in (("group_list_type", group_list_type), ("act_type", act_type)):
            if value != 0:
                raise ValueError(f"{op}: argument '{name}' must be 0 or None with a list 'group_list' (cumulative "
                                 f"ends, no activation); got {value}")
        if len(group_list) == 1:
            raise ValueError(f"{op}: a list 'group_list' must not have length 1 (torch_npu's list form); got "
                             f"{list(group_list)}")
        ends = _args.int_tensor(op, "group_list", list(group_list), x[0].device)
        if len(x) > 1:
            _check_group_ends(op, list(group_list), [t.shape[0] for t in x])
            return lists(0)
        out = run(x, weight, ends, 0, 0, 0)
        return out if single else (_split_covered(out[0], ends, 0) if quant else _split_rows(out[0], ends, 0))

    # The messages keep torch_npu's wording, which code written for it may match.
    if group_type is None:
        raise ValueError(f"{op}: Requires manual passing group_type: argument 'group_type' is required, -1 (no "
                         f"grouping), 0 (split along M) or 2 (split along K); got None")
    if group_type not in (-1, 0, 2):
        raise ValueError(f"{op}: The group type must be -1, 0 or 2 (argument 'group_type'); got {group_type}")
    if quant and group_type == 2:
        raise ValueError(f"{op}: quantised inputs support group_type -1 and 0 only (argument 'group_type'); got 2")
    if group_list_type == 2 and not (quant and x[0].dtype == torch.int8 and group_type == 0):
        raise ValueError(f"{op}: argument 'group_list_type' 2 ([E, 2] (expert, count) pairs) is defined for int8 x "
                         f"and weight with group_type 0 only; pass 0 or 1")
    if group_list_type not in (0, 1, 2):
        raise ValueError(f"{op}: argument 'group_list_type' must be 0 (cumulative ends), 1 (counts) or 2 (pairs); "
                         f"got {group_list_type}")
    gl = _args.int_tensor(op, "group_list", group_list, x[0].device)
    if group_type == -1:
        if gl is not None:
            raise ValueError(f"{op}: argument 'group_list' must be None with group_type -1 (independent products)")
        return lists(act_type)
    if group_type == 0 and len(x) > 1:  # several x, one group each; a group_list must agree with their rows
        if gl is not None:
            if group_list_type == 2:
                raise ValueError(f"{op}: argument 'group_list_type' 2 needs a single x")
            ends = gl.tolist() if group_list_type == 0 else torch.cumsum(gl, 0).tolist()
            _check_group_ends(op, ends, [t.shape[0] for t in x])
        return lists(act_type)
    if gl is None:
        raise ValueError(f"{op}: argument 'group_list' is required with group_type {group_type} and a single x")
    out = run(x, weight, gl, group_type, group_list_type, act_type)
    if group_type == 0:
        if single:
            return out
        return _split_covered(out[0], gl, group_list_type) if quant else _split_rows(out[0], gl, group_list_type)
    return out if single else list(out[0].unbind(0))


def _swiglu_quant_checks(op, x, weight, weight_scale):
    if weight.dtype == torch.int32:
        raise NotImplementedError(f"{op}: an int4 weight (int32 holding eight int4, A8W4/A4W4) is not implemented; "
                                  f"argument 'weight' must be int8")
    if weight.dim() != 3:
        raise ValueError(f"{op}: argument 'weight' must be [E, K, N] (ND layout; the NZ format is NPU-only); got "
                         f"shape {tuple(weight.shape)}")
    if weight_scale.dtype == torch.float16:  # exact in fp32
        weight_scale = weight_scale.float()
    return weight_scale


@_args.torch_npu_api
def npu_grouped_matmul_swiglu_quant(x: torch.Tensor, weight: torch.Tensor, group_list: torch.Tensor,
                                    weight_scale: torch.Tensor, x_scale: torch.Tensor, *,
                                    bias: Optional[torch.Tensor] = None, offset: Optional[torch.Tensor] = None):
    """torch_npu.npu_grouped_matmul_swiglu_quant (A8W8): returns (int8 [M, N/2], fp32 scale [M], fp32 offset [])."""
    op = "npu_grouped_matmul_swiglu_quant"
    _args.not_implemented(op, "the A8W4 weight-assist matrix and a quantisation offset", bias=bias, offset=offset)
    weight_scale = _swiglu_quant_checks(op, x, weight, weight_scale)
    gl = _args.host_int_tensor(op, "group_list", group_list, x.device)
    return torch.ops.npu_fa.grouped_matmul_swiglu_quant(x, weight, gl, weight_scale, x_scale, 0)


@_args.torch_npu_api
def npu_grouped_matmul_swiglu_quant_v2(x: torch.Tensor, weight: Sequence[torch.Tensor],
                                       weight_scale: Sequence[torch.Tensor], x_scale: torch.Tensor,
                                       group_list: torch.Tensor, *, smooth_scale: Optional[torch.Tensor] = None,
                                       weight_assist_matrix=None, bias: Optional[torch.Tensor] = None,
                                       dequant_mode: Optional[int] = 0, dequant_dtype=0, quant_mode: Optional[int] = 0,
                                       quant_dtype=1, group_list_type: Optional[int] = 0,
                                       tuning_config: Optional[Sequence[int]] = None, x_dtype=None,
                                       weight_dtype=None, weight_scale_dtype=None, x_scale_dtype=None):
    """torch_npu.npu_grouped_matmul_swiglu_quant_v2, A8W8 per-token / per-channel form: returns (int8 [M, N/2],
    fp32 scale [M]). The dequantised product is computed in fp32 whatever dequant_dtype says."""
    op = "npu_grouped_matmul_swiglu_quant_v2"
    _args.not_implemented(op, "A4W4 smoothing, the A8W4 weight-assist matrix and a bias", empty_is_none=True,
                          smooth_scale=smooth_scale, weight_assist_matrix=weight_assist_matrix, bias=bias)
    dequant_mode = _args.optional_int(op, "dequant_mode", dequant_mode, 0)
    quant_mode = _args.optional_int(op, "quant_mode", quant_mode, 0)
    group_list_type = _args.optional_int(op, "group_list_type", group_list_type, 0)
    _args.not_implemented_unless_zero(op, "per-group and MX quantisation", dequant_mode=dequant_mode,
                                      quant_mode=quant_mode)
    if group_list_type not in (0, 1):
        raise ValueError(f"{op}: argument 'group_list_type' must be 0 (cumsum) or 1 (counts); got {group_list_type}")
    if quant_dtype not in (None, 0, 1, torch.int8):  # 0 (the doc's int8) or ScalarType code 1 (the schema's default)
        raise NotImplementedError(f"{op}: argument 'quant_dtype' must be int8 (0, 1 or torch.int8); other output "
                                  f"formats are not implemented; got {quant_dtype!r}")
    if dequant_dtype not in (None, 0, 5, 6, 15, torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"{op}: argument 'dequant_dtype' must be 0 (float32) or a float dtype; got {dequant_dtype!r}")
    _check_tuning_config(op, tuning_config)
    weight, weight_scale = list(weight), list(weight_scale)
    if len(weight) != 1 or len(weight_scale) != 1:
        raise ValueError(f"{op}: arguments 'weight' and 'weight_scale' must be lists of one tensor; got "
                         f"{len(weight)} and {len(weight_scale)}")
    _args.same_dtype_or_none(op, "x_dtype", x_dtype, x.dtype, "another x format")
    _args.same_dtype_or_none(op, "weight_dtype", weight_dtype, weight[0].dtype, "another weight format")
    _args.same_dtype_or_none(op, "weight_scale_dtype", weight_scale_dtype, weight_scale[0].dtype,
                             "another weight_scale format")
    _args.same_dtype_or_none(op, "x_scale_dtype", x_scale_dtype, x_scale.dtype, "another x_scale format")
    ws = _swiglu_quant_checks(op, x, weight[0], weight_scale[0])
    gl = _args.host_int_tensor(op, "group_list", group_list, x.device)
    out, scale, _ = torch.ops.npu_fa.grouped_matmul_swiglu_quant(x, weight[0], gl, ws, x_scale, group_list_type)
    return out, scale


# ================================================================================================================
# torch_npu.npu_grouped_matmul_add(_): MindSpeed's weight-gradient accumulation
# ================================================================================================================

def _gmm_add(op: str, y, x, weight, group_list, transpose_x, transpose_weight, group_type, group_list_type) -> None:
    for name, t in (("input", y), ("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    if not isinstance(group_list, torch.Tensor):
        group_list = torch.tensor(list(group_list), dtype=torch.int64)
    glt = 0 if group_list_type is None else int(group_list_type)
    torch.ops.npu_fa.grouped_matmul_add(y, x, weight, group_list, bool(transpose_x), bool(transpose_weight),
                                        int(group_type), glt)


@_args.torch_npu_api
def npu_grouped_matmul_add_(input: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, group_list, *,  # noqa: A002
                            transpose_x: bool = True, transpose_weight: bool = False, group_type: int = 2,
                            group_list_type: Optional[int] = 0) -> torch.Tensor:
    """torch_npu.npu_grouped_matmul_add_ (MindSpeed's gradient accumulation of grouped weights): input[g] +=
    x_g^T @ weight_g in place, returns input. x [M, K] and weight [M, N] are split along M (the tokens) into groups by
    group_list (int64 [G]: cumulative ends, or counts with group_list_type=1); input [G*K, N] or [G, K, N], float32
    (MindSpeed's main_grad; or x's dtype). Accumulates in fp32. Only transpose_x=True, transpose_weight=False and
    group_type=2, upstream's supported form."""
    _gmm_add("npu_grouped_matmul_add_", input, x, weight, group_list, transpose_x, transpose_weight, group_type,
             group_list_type)
    return input


@_args.torch_npu_api
def npu_grouped_matmul_add(input: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, group_list, *,  # noqa: A002
                           transpose_x: bool = True, transpose_weight: bool = False, group_type: int = 2,
                           group_list_type: Optional[int] = 0) -> torch.Tensor:
    """torch_npu.npu_grouped_matmul_add: npu_grouped_matmul_add_ on a copy of input (input is left unchanged)."""
    op = "npu_grouped_matmul_add"
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{op}: argument 'input' must be a Tensor; got {type(input).__name__}")
    out = input.clone(memory_format=torch.contiguous_format)
    _gmm_add(op, out, x, weight, group_list, transpose_x, transpose_weight, group_type, group_list_type)
    return out
