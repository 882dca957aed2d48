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


@_args.torch_npu_api
def npu_grouped_matmul(x: Sequence[torch.Tensor], weight: Sequence[torch.Tensor], *,
                       bias: Optional[Sequence[torch.Tensor]] = None, scale=None, offset=None, antiquant_scale=None,
                       antiquant_offset=None, per_token_scale=None, group_list=None, activation_input=None,
                       activation_quant_scale=None, activation_quant_offset=None, split_item: int = 0,
                       group_type: Optional[int] = None, group_list_type: int = 0, act_type: int = 0,
                       output_dtype: Optional[torch.dtype] = None) -> List[torch.Tensor]:
    """torch_npu.npu_grouped_matmul on CPU (non-quantised path).

    group_type None picks 0 when a single x comes with group_list (split along M), else -1 (lists).
    split_item 0/1: one output per group; 2/3: a single output (the groups' rows concatenated, or for group_type 2
    the [E, M, N] tensor). The quantisation arguments must be None or empty lists (NotImplementedError otherwise)."""
    op = "npu_grouped_matmul"
    _args.not_implemented(op, "quantised / anti-quantised matmul", empty_is_none=True,
                          **dict(zip(_QUANT_ARGS, (scale, offset, antiquant_scale, antiquant_offset, per_token_scale,
                                                   activation_input, activation_quant_scale, activation_quant_offset))))
    if split_item not in (0, 1, 2, 3):
        raise ValueError(f"{op}: argument 'split_item' must be 0, 1, 2 or 3; got {split_item}")
    x, weight = list(x), list(weight)
    if not x:
        raise ValueError(f"{op}: argument 'x' must be a non-empty list of tensors")
    if output_dtype is not None and output_dtype != x[0].dtype:
        raise NotImplementedError(f"{op}: a quantised output is not implemented; argument 'output_dtype' must be "
                                  f"None or x's dtype {x[0].dtype}; got {output_dtype}")
    gl = _args.int_tensor(op, "group_list", group_list, x[0].device)
    if group_type is None:
        group_type = 0 if (len(x) == 1 and gl is not None) else -1
    out, _ = torch.ops.npu_fa.grouped_matmul(x, weight, list(bias or []), gl, group_type, group_list_type,
                                             act_type)
    single = split_item in (2, 3)
    if group_type == -1:
        return [torch.cat(out, dim=0)] if single and len(out) > 1 else out
    if group_type == 0:
        return out if single else _split_rows(out[0], gl, group_list_type)
    return out if single else list(out[0].unbind(0))
