"""Expert-parallel MoE dispatch / combine with torch_npu's signatures: `npu_moe_distribute_dispatch(_v2)` and
`npu_moe_distribute_combine(_v2)` (docs/moe.md, "Expert-parallel dispatch and combine").

`group_ep` names the expert-parallel group: a c10d group name, a ProcessGroup, or the HCCL communicator name
torch_npu users pass (see mc2/hccl_names.py). The ops run on any torch.distributed backend through
`all_to_all_single`; their outputs have upstream's shapes (expand_x holds A rows, the capacity, of which the first
sum(expert_token_nums) are the received ones).

Arguments are checked in this order: values (ArgumentError), then features not implemented here
(NotImplementedError naming the argument), then the group. Hardware hints (comm_alg, performance_info, group_tp with
tp_world_size <= 1) are validated and have no effect.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._internal import args as _args
from ..mc2.ops import group_name

_OPS = torch.ops.npu_fa

# torch_npu's communication algorithms (A2: "fullmesh", "hierarchy"; A3: "fullmesh_v1", "fullmesh_v2").
COMM_ALGS = ("", "fullmesh", "fullmesh_v1", "fullmesh_v2", "hierarchy")
# quant_mode values upstream defines: 0 none, 1 static, 2 dynamic per token, 3/4 block / MX formats.
_QUANT_MODES = (0, 1, 2, 3, 4)
_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_int(op: str, name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{op}: argument '{name}' must be an int; got {type(value).__name__}")


def _check_tensor(op: str, name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a Tensor{' or None' if optional else ''}; got "
                        f"{type(value).__name__}")


def _check_common(op: str, ep_world_size, ep_rank_id, moe_expert_num, group_tp, tp_world_size, tp_rank_id,
                  expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs) -> None:
    """The group, expert-layout and tensor-parallel arguments dispatch and combine share."""
    for name, v in (("ep_world_size", ep_world_size), ("ep_rank_id", ep_rank_id), ("moe_expert_num", moe_expert_num),
                    ("tp_world_size", tp_world_size), ("tp_rank_id", tp_rank_id),
                    ("expert_shard_type", expert_shard_type), ("shared_expert_num", shared_expert_num),
                    ("shared_expert_rank_num", shared_expert_rank_num), ("global_bs", global_bs)):
        _check_int(op, name, v)
    if not isinstance(group_tp, str):
        raise TypeError(f"{op}: argument 'group_tp' must be a str; got {type(group_tp).__name__}")
    if expert_shard_type != 0:
        raise ValueError(f"{op}: argument 'expert_shard_type' must be 0 (shared-expert ranks first, the only layout "
                         f"upstream supports); got {expert_shard_type}")
    if not 0 <= shared_expert_rank_num < max(ep_world_size, 1):
        raise ValueError(f"{op}: argument 'shared_expert_rank_num' must lie in [0, ep_world_size) = [0, "
                         f"{ep_world_size}); got {shared_expert_rank_num}")
    valid_shared = (shared_expert_rank_num == 0 and shared_expert_num in (0, 1)) or (
        0 < shared_expert_num <= 4 and shared_expert_rank_num % shared_expert_num == 0 and shared_expert_rank_num > 0)
    if not valid_shared:
        raise ValueError(f"{op}: arguments 'shared_expert_num' ({shared_expert_num}) and 'shared_expert_rank_num' "
                         f"({shared_expert_rank_num}) must be (1, 0) or (0, 0) without shared-expert ranks, or "
                         f"shared_expert_num in [1, 4] dividing shared_expert_rank_num")
    if tp_world_size not in (0, 1, 2):
        raise ValueError(f"{op}: argument 'tp_world_size' must be 0, 1 (no tensor-parallel split) or 2; got "
                         f"{tp_world_size}")
    if not 0 <= tp_rank_id < max(tp_world_size, 1):
        raise ValueError(f"{op}: argument 'tp_rank_id' must lie in [0, max(tp_world_size, 1)) = [0, "
                         f"{max(tp_world_size, 1)}); got {tp_rank_id}")
    if global_bs < 0:
        raise ValueError(f"{op}: argument 'global_bs' must be >= 0 (0: every rank has the same batch); got {global_bs}")
    if shared_expert_rank_num > 0:
        raise NotImplementedError(f"{op}: shared-expert ranks are not implemented; argument 'shared_expert_rank_num' "
                                  f"= {shared_expert_rank_num} must be 0 (compute shared experts locally and pass "
                                  f"their output to combine as shared_expert_x)")
    if tp_world_size == 2:
        raise NotImplementedError(f"{op}: the tensor-parallel split of expert outputs is not implemented; argument "
                                  f"'tp_world_size' = 2 must be 0 or 1")


def _check_comm_alg(op: str, comm_alg) -> None:
    if not isinstance(comm_alg, str):
        raise TypeError(f"{op}: argument 'comm_alg' must be a str; got {type(comm_alg).__name__}")
    if comm_alg not in COMM_ALGS:
        raise ValueError(f"{op}: argument 'comm_alg' must be one of {list(COMM_ALGS)}; got {comm_alg!r}")


def _check_performance_info(op: str, performance_info, ep_world_size: int) -> None:
    """A per-rank wait-time accumulator upstream (int64 [ep_world_size]): validated, left unchanged here."""
    _check_tensor(op, "performance_info", performance_info, optional=True)
    if performance_info is not None and (performance_info.dtype != torch.int64 or
                                         tuple(performance_info.shape) != (ep_world_size,)):
        raise ValueError(f"{op}: argument 'performance_info' must be an int64 tensor of shape (ep_world_size,) = "
                         f"({ep_world_size},); got {performance_info.dtype} {tuple(performance_info.shape)}")


def _check_special_experts(op: str, zero_expert_num, copy_expert_num, const_expert_num) -> None:
    for name, v in (("zero_expert_num", zero_expert_num), ("copy_expert_num", copy_expert_num),
                    ("const_expert_num", const_expert_num)):
        _check_int(op, name, v)
        if v < 0:
            raise ValueError(f"{op}: argument '{name}' must be >= 0; got {v}")
    _args.not_implemented_unless_zero(op, "special (zero / copy / constant) experts", zero_expert_num=zero_expert_num,
                                      copy_expert_num=copy_expert_num, const_expert_num=const_expert_num)


def _dtype_code_matches(op: str, name: str, code, dtype: torch.dtype) -> None:
    """torch_npu's `int?` dtype overrides (fp8 / MX / hifloat8 layouts): None or the dtype the call has anyway."""
    if code is None:
        return
    _check_int(op, name, code)
    if _args.SCALAR_TYPE_CODES.get(code) != dtype:
        raise NotImplementedError(f"{op}: argument '{name}' = {code} asks for a dtype other than {dtype} (an fp8, MX "
                                  f"or hifloat8 layout), which is not implemented; pass None")


def _check_dispatch_args(op: str, x, expert_ids, ep_world_size, quant_mode, expert_token_nums_type) -> None:
    _check_tensor(op, "x", x)
    _check_tensor(op, "expert_ids", expert_ids)
    _check_int(op, "quant_mode", quant_mode)
    _check_int(op, "expert_token_nums_type", expert_token_nums_type)
    if quant_mode not in _QUANT_MODES:
        raise ValueError(f"{op}: argument 'quant_mode' must be one of {list(_QUANT_MODES)}; got {quant_mode}")
    if expert_token_nums_type not in (0, 1):
        raise ValueError(f"{op}: argument 'expert_token_nums_type' must be 0 (cumulative) or 1 (counts); got "
                         f"{expert_token_nums_type}")
    if x.dtype == torch.int32:
        raise NotImplementedError(f"{op}: int32 x (eight packed int4 values per element, sent as they are) is not "
                                  f"implemented; argument 'x' must be float16, bfloat16, float32 or float64")
    if x.dtype not in _X_DTYPES:
        raise TypeError(f"{op}: argument 'x' must be float16, bfloat16, float32 or float64; got {x.dtype}")
    if quant_mode not in (0, 2):
        raise NotImplementedError(f"{op}: argument 'quant_mode' = {quant_mode} is not implemented; 0 (none) and 2 "
                                  f"(dynamic per-token int8) are")


def _dispatch(op, x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, scales, x_active_mask,
              expert_scales, tp_world_size, quant_mode, global_bs, expert_token_nums_type):
    name = group_name(group_ep, op, "group_ep")
    return _OPS.moe_distribute_dispatch_v2(x, expert_ids, name, ep_world_size, ep_rank_id, moe_expert_num, scales,
                                           x_active_mask, expert_scales, min(tp_world_size, 1), quant_mode,
                                           global_bs, expert_token_nums_type)


@_args.torch_npu_api
def npu_moe_distribute_dispatch_v2(x: Tensor, expert_ids: Tensor, group_ep: str, ep_world_size: int, ep_rank_id: int,
                                   moe_expert_num: int, *, scales: Optional[Tensor] = None,
                                   x_active_mask: Optional[Tensor] = None, expert_scales: Optional[Tensor] = None,
                                   elastic_info: Optional[Tensor] = None, performance_info: Optional[Tensor] = None,
                                   group_tp: str = "", tp_world_size: int = 0, tp_rank_id: int = 0,
                                   expert_shard_type: int = 0, shared_expert_num: int = 1,
                                   shared_expert_rank_num: int = 0, quant_mode: int = 0, global_bs: int = 0,
                                   expert_token_nums_type: int = 1, comm_alg: str = "", zero_expert_num: int = 0,
                                   copy_expert_num: int = 0, const_expert_num: int = 0,
                                   y_dtype: Optional[int] = None, x_dtype: Optional[int] = None,
                                   scales_dtype: Optional[int] = None
                                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_distribute_dispatch_v2: sends every token to the ranks of its top-k experts.

    Returns (expand_x [A, H], dynamic_scales [A], assist_info_for_combine, expert_token_nums [L],
    ep_recv_counts [ep_world_size * L], tp_recv_counts [tp_world_size], expand_scales [A]); see docs/moe.md."""
    op = "npu_moe_distribute_dispatch_v2"
    _check_dispatch_args(op, x, expert_ids, ep_world_size, quant_mode, expert_token_nums_type)
    _check_common(op, ep_world_size, ep_rank_id, moe_expert_num, group_tp, tp_world_size, tp_rank_id,
                  expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs)
    _check_comm_alg(op, comm_alg)
    _check_performance_info(op, performance_info, ep_world_size)
    _check_special_experts(op, zero_expert_num, copy_expert_num, const_expert_num)
    _args.not_implemented(op, "elastic expert-parallel scaling", elastic_info=elastic_info)
    _dtype_code_matches(op, "y_dtype", y_dtype, torch.int8 if quant_mode == 2 else x.dtype)
    _dtype_code_matches(op, "x_dtype", x_dtype, x.dtype)
    _dtype_code_matches(op, "scales_dtype", scales_dtype, torch.float32)
    return _dispatch(op, x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, scales, x_active_mask,
                     expert_scales, tp_world_size, quant_mode, global_bs, expert_token_nums_type)


def _expand_idx(expert_ids: Tensor, moe_expert_num: int) -> Tensor:
    """v1's expand_idx [BS * K]: for each (token, slot) pair, how many earlier pairs (token-major) go to its
    expert."""
    flat = expert_ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    sorted_e = flat[order]
    pos = torch.arange(flat.numel(), device=flat.device)
    first = torch.searchsorted(sorted_e, sorted_e, right=False)
    out = torch.empty_like(flat)
    out[order] = pos - first
    return out.to(torch.int32)


@_args.torch_npu_api
def npu_moe_distribute_dispatch(x: Tensor, expert_ids: Tensor, group_ep: str, ep_world_size: int, ep_rank_id: int,
                                moe_expert_num: int, *, scales: Optional[Tensor] = None,
                                x_active_mask: Optional[Tensor] = None, expert_scales: Optional[Tensor] = None,
                                group_tp: str = "", tp_world_size: int = 0, tp_rank_id: int = 0,
                                expert_shard_type: int = 0, shared_expert_num: int = 1,
                                shared_expert_rank_num: int = 0, quant_mode: int = 0, global_bs: int = 0,
                                expert_token_nums_type: int = 1
                                ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_distribute_dispatch: dispatch_v2's results, with expand_idx [BS * K] (int32, the index of
    each pair among this rank's pairs of the same expert) in place of assist_info_for_combine."""
    op = "npu_moe_distribute_dispatch"
    _check_dispatch_args(op, x, expert_ids, ep_world_size, quant_mode, expert_token_nums_type)
    _check_common(op, ep_world_size, ep_rank_id, moe_expert_num, group_tp, tp_world_size, tp_rank_id,
                  expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs)
    out = _dispatch(op, x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, scales, x_active_mask,
                    expert_scales, tp_world_size, quant_mode, global_bs, expert_token_nums_type)
    return (out[0], out[1], _expand_idx(expert_ids, moe_expert_num), *out[3:])


def _check_combine_args(op, expand_x, expert_ids, expert_scales, x_active_mask, tp_send_counts, expand_scales,
                        shared_expert_x, comm_quant_mode) -> None:
    for name, t in (("expand_x", expand_x), ("expert_ids", expert_ids), ("expert_scales", expert_scales)):
        _check_tensor(op, name, t)
    for name, t in (("x_active_mask", x_active_mask), ("tp_send_counts", tp_send_counts),
                    ("expand_scales", expand_scales), ("shared_expert_x", shared_expert_x)):
        _check_tensor(op, name, t, optional=True)
    _check_int(op, "comm_quant_mode", comm_quant_mode)
    if comm_quant_mode not in (0, 2):
        raise ValueError(f"{op}: argument 'comm_quant_mode' must be 0 (none) or 2 (int8 communication); got "
                         f"{comm_quant_mode}")
    if expand_x.dtype == torch.int32:
        raise NotImplementedError(f"{op}: int32 expand_x (quantised expert outputs) is not implemented; argument "
                                  f"'expand_x' must be float16, bfloat16, float32 or float64")
    # Upstream's layout-specific helpers: accepted (combine here needs ep_send_counts only), checked for form.
    if expand_scales is not None and (expand_scales.dim() != 1 or expand_scales.dtype != torch.float32):
        raise ValueError(f"{op}: argument 'expand_scales' must be a 1-D float32 tensor (dispatch's expand_scales); "
                         f"got {expand_scales.dtype} {tuple(expand_scales.shape)}")
    if tp_send_counts is not None and (tp_send_counts.dim() != 1 or tp_send_counts.dtype != torch.int32):
        raise ValueError(f"{op}: argument 'tp_send_counts' must be a 1-D int32 tensor (dispatch's tp_recv_counts); "
                         f"got {tp_send_counts.dtype} {tuple(tp_send_counts.shape)}")


def _combine(op, expand_x, expert_ids, assist, ep_send_counts, expert_scales, group_ep, ep_world_size, ep_rank_id,
             moe_expert_num, x_active_mask, shared_expert_x, global_bs, comm_quant_mode):
    name = group_name(group_ep, op, "group_ep")
    return _OPS.moe_distribute_combine_v2(expand_x, expert_ids, assist, ep_send_counts, expert_scales, name,
                                          ep_world_size, ep_rank_id, moe_expert_num, x_active_mask, shared_expert_x,
                                          global_bs, comm_quant_mode)


@_args.torch_npu_api
def npu_moe_distribute_combine_v2(expand_x: Tensor, expert_ids: Tensor, assist_info_for_combine: Tensor,
                                  ep_send_counts: Tensor, expert_scales: Tensor, group_ep: str, ep_world_size: int,
                                  ep_rank_id: int, moe_expert_num: int, *, tp_send_counts: Optional[Tensor] = None,
                                  x_active_mask: Optional[Tensor] = None, expand_scales: Optional[Tensor] = None,
                                  shared_expert_x: Optional[Tensor] = None, elastic_info: Optional[Tensor] = None,
                                  ori_x: Optional[Tensor] = None, const_expert_alpha_1: Optional[Tensor] = None,
                                  const_expert_alpha_2: Optional[Tensor] = None,
                                  const_expert_v: Optional[Tensor] = None, performance_info: Optional[Tensor] = None,
                                  group_tp: str = "", tp_world_size: int = 0, tp_rank_id: int = 0,
                                  expert_shard_type: int = 0, shared_expert_num: int = 1,
                                  shared_expert_rank_num: int = 0, global_bs: int = 0, comm_quant_mode: int = 0,
                                  comm_alg: str = "", zero_expert_num: int = 0, copy_expert_num: int = 0,
                                  const_expert_num: int = 0) -> Tensor:
    """torch_npu.npu_moe_distribute_combine_v2: out[t] = sum_k expert_scales[t, k] * (t's row at expert k) +
    shared_expert_x[t], the rows coming back from the ranks dispatch_v2 sent them to. ori_x and const_expert_*
    only serve the special experts (not implemented): accepted and unused otherwise."""
    op = "npu_moe_distribute_combine_v2"
    _check_tensor(op, "assist_info_for_combine", assist_info_for_combine)
    _check_tensor(op, "ep_send_counts", ep_send_counts)
    _check_combine_args(op, expand_x, expert_ids, expert_scales, x_active_mask, tp_send_counts, expand_scales,
                        shared_expert_x, comm_quant_mode)
    _check_common(op, ep_world_size, ep_rank_id, moe_expert_num, group_tp, tp_world_size, tp_rank_id,
                  expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs)
    _check_comm_alg(op, comm_alg)
    _check_performance_info(op, performance_info, ep_world_size)
    _check_special_experts(op, zero_expert_num, copy_expert_num, const_expert_num)
    _args.not_implemented(op, "elastic expert-parallel scaling", elastic_info=elastic_info)
    return _combine(op, expand_x, expert_ids, assist_info_for_combine, ep_send_counts, expert_scales, group_ep,
                    ep_world_size, ep_rank_id, moe_expert_num, x_active_mask, shared_expert_x, global_bs,
                    comm_quant_mode)


@_args.torch_npu_api
def npu_moe_distribute_combine(expand_x: Tensor, expert_ids: Tensor, expand_idx: Tensor, ep_send_counts: Tensor,
                               expert_scales: Tensor, group_ep: str, ep_world_size: int, ep_rank_id: int,
                               moe_expert_num: int, *, tp_send_counts: Optional[Tensor] = None,
                               x_active_mask: Optional[Tensor] = None, activation_scale: Optional[Tensor] = None,
                               weight_scale: Optional[Tensor] = None, group_list: Optional[Tensor] = None,
                               expand_scales: Optional[Tensor] = None, shared_expert_x: Optional[Tensor] = None,
                               group_tp: str = "", tp_world_size: int = 0, tp_rank_id: int = 0,
                               expert_shard_type: int = 0, shared_expert_num: int = 1, shared_expert_rank_num: int = 0,
                               global_bs: int = 0, out_dtype: int = 0, comm_quant_mode: int = 0,
                               group_list_type: int = 0) -> Tensor:
    """torch_npu.npu_moe_distribute_combine: combine_v2 with v1's expand_idx (from npu_moe_distribute_dispatch).
    activation_scale, weight_scale, group_list, out_dtype and group_list_type are reserved upstream."""
    op = "npu_moe_distribute_combine"
    _check_tensor(op, "expand_idx", expand_idx)
    _check_tensor(op, "ep_send_counts", ep_send_counts)
    _check_combine_args(op, expand_x, expert_ids, expert_scales, x_active_mask, tp_send_counts, expand_scales,
                        shared_expert_x, comm_quant_mode)
    _check_common(op, ep_world_size, ep_rank_id, moe_expert_num, group_tp, tp_world_size, tp_rank_id,
                  expert_shard_type, shared_expert_num, shared_expert_rank_num, global_bs)
    reserved = [n for n, v in (("activation_scale", activation_scale), ("weight_scale", weight_scale),
                               ("group_list", group_list)) if v is not None]
    reserved += [n for n, v in (("out_dtype", out_dtype), ("group_list_type", group_list_type)) if v != 0]
    if reserved:
        raise ValueError(f"{op}: arguments {reserved} are reserved upstream; pass None (tensors) or 0 (ints)")
    if expand_idx.dim() != 1 or expand_idx.numel() != expert_ids.numel():
        raise ValueError(f"{op}: argument 'expand_idx' must be 1-D of BS * K = {expert_ids.numel()} entries "
                         f"(dispatch's expand_idx); got shape {tuple(expand_idx.shape)}")
    return _combine(op, expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales, group_ep, ep_world_size,
                    ep_rank_id, moe_expert_num, x_active_mask, shared_expert_x, global_bs, comm_quant_mode)
