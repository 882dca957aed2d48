"""Grouped matmul: torch_npu's `npu_grouped_matmul` signature and a single-tensor convenience function, both over
`torch.ops.npu_fa.grouped_matmul` (semantics in docs/moe.md)."""
from typing import List, Optional, Sequence, Union

import torch

from .. import _args

# act_type numbering of CANN / torch_npu; names accepted by `grouped_matmul(..., activation=...)`.
ACT_TYPES = {"none": 0, "relu": 1, "gelu_tanh": 2, "gelu": 2, "fast_gelu": 4, "silu": 5}

_QUANT_ARGS = ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale", "activation_input",
               "activation_quant_scale", "activation_quant_offset")


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


def _lists(x, weight, bias, split_item, act_type):
    """Independent products x[i] @ weight[i] (group_type -1), one output each or (split_item 2/3) concatenated."""
    out, _ = torch.ops.npu_fa.grouped_matmul(x, weight, bias, None, -1, 0, act_type)
    return [torch.cat(out, dim=0)] if split_item in (2, 3) and len(out) > 1 else list(out)


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
    """torch_npu.npu_grouped_matmul, non-quantised (semantics in docs/moe.md).

    group_list a tensor (or None): group_type is required, as in torch_npu: -1 independent products x[i] @ weight[i]
    (no group_list), 0 split along M (one x [M, K] split by group_list, or several x, one group each), 2 split along
    K (x [M, K], weight [K, N] -> [E, M, N]). group_list a list of ints (torch_npu's `.List` overload): cumulative
    ends, group_type None (or 0/-1), group_list_type and act_type 0. split_item 0/1: one output per group; 2/3: a
    single output. None for the `int?` arguments means their default. tuning_config is a tiling hint (validated).
    The quantisation arguments must be None or empty lists, the dtype arguments None or the dtype the tensor has
    (NotImplementedError otherwise)."""
    op = "npu_grouped_matmul"
    _args.not_implemented(op, "quantised / anti-quantised matmul", empty_is_none=True,
                          **dict(zip(_QUANT_ARGS, (scale, offset, antiquant_scale, antiquant_offset, per_token_scale,
                                                   activation_input, activation_quant_scale, activation_quant_offset))))
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
    _args.same_dtype_or_none(op, "x_dtype", x_dtype, x[0].dtype, "a quantised x format")
    _args.same_dtype_or_none(op, "weight_dtype", weight_dtype, weight[0].dtype, "a quantised weight format")
    _args.same_dtype_or_none(op, "scale_dtype", scale_dtype, None, "quantisation (the dtype of 'scale')")
    _args.same_dtype_or_none(op, "per_token_scale_dtype", per_token_scale_dtype, None,
                             "per-token quantisation (the dtype of 'per_token_scale')")
    _args.same_dtype_or_none(op, "output_dtype", output_dtype, x[0].dtype, "a quantised output")
    bias = list(bias or [])
    single = split_item in (2, 3)

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
            return _lists(x, weight, bias, split_item, 0)
        out, _ = torch.ops.npu_fa.grouped_matmul(x, weight, bias, ends, 0, 0, 0)
        return out if single else _split_rows(out[0], ends, 0)

    # The messages keep torch_npu's wording, which code written for it may match.
    if group_type is None:
        raise ValueError(f"{op}: Requires manual passing group_type: argument 'group_type' is required, -1 (no "
                         f"grouping), 0 (split along M) or 2 (split along K); got None")
    if group_type not in (-1, 0, 2):
        raise ValueError(f"{op}: The group type must be -1, 0 or 2 (argument 'group_type'); got {group_type}")
    if group_list_type == 2:
        raise NotImplementedError(f"{op}: argument 'group_list_type' 2 ([E, 2] group index / size pairs) is defined "
                                  f"for int8 (quantised) inputs only, which are not implemented; pass 0 or 1")
    if group_list_type not in (0, 1):
        raise ValueError(f"{op}: argument 'group_list_type' must be 0 (cumulative ends) or 1 (counts); got "
                         f"{group_list_type}")
    gl = _args.int_tensor(op, "group_list", group_list, x[0].device)
    if group_type == -1:
        if gl is not None:
            raise ValueError(f"{op}: argument 'group_list' must be None with group_type -1 (independent products)")
        return _lists(x, weight, bias, split_item, act_type)
    if group_type == 0 and len(x) > 1:  # several x, one group each; a group_list must agree with their rows
        if gl is not None:
            ends = gl.tolist() if group_list_type == 0 else torch.cumsum(gl, 0).tolist()
            _check_group_ends(op, ends, [t.shape[0] for t in x])
        return _lists(x, weight, bias, split_item, act_type)
    if gl is None:
        raise ValueError(f"{op}: argument 'group_list' is required with group_type {group_type} and a single x")
    out, _ = torch.ops.npu_fa.grouped_matmul(x, weight, bias, gl, group_type, group_list_type, act_type)
    if group_type == 0:
        return out if single else _split_rows(out[0], gl, group_list_type)
    return out if single else list(out[0].unbind(0))
