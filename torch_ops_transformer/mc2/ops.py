"""MC2: matmul fused with collective communication, with torch_npu's signatures.

`hcom` names the communication group: a c10d group name (`group.group_name`), a ProcessGroup, or on Ascend the
HCCL communicator name torch_npu users get from `get_hccl_comm_name(rank)`. The ops run on any torch.distributed
backend (gloo here, hccl on Ascend, nccl on CUDA) through PyTorch's functional collectives.
"""
from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist

from .. import _args

OPS = torch.ops.npu_fa

GroupLike = Union[str, "dist.ProcessGroup"]


def _hccl_comm_name(pg) -> Optional[str]:
    """The HCCL communicator name torch_npu reports for a group (None off Ascend)."""
    try:
        backend = pg._get_backend(torch.device("npu"))
        return backend.get_hccl_comm_name(dist.get_rank(pg))
    except Exception:  # no NPU backend in this build / group: not an HCCL name
        return None


def group_name(hcom: GroupLike, op: str = "mc2", arg: str = "hcom") -> str:
    """The c10d group name behind `hcom` (a group name, a ProcessGroup or an HCCL communicator name)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{op}: torch.distributed is not initialised; call torch.distributed.init_process_group() "
                           f"before passing argument '{arg}' ({hcom!r})")
    if isinstance(hcom, dist.ProcessGroup):
        return hcom.group_name
    if not isinstance(hcom, str):
        raise TypeError(f"{op}: argument '{arg}' must be a group name (str) or a ProcessGroup; got {type(hcom).__name__}")
    from torch.distributed.distributed_c10d import _resolve_process_group, _world

    try:
        _resolve_process_group(hcom)
        return hcom
    except Exception:
        pass
    for pg in list(_world.pg_map):
        if _hccl_comm_name(pg) == hcom:
            return pg.group_name
    known = sorted(_world.pg_names.values())
    raise ValueError(f"{op}: argument '{arg}' ({hcom!r}) names no process group; known group names: {known}")


def _world_size(name: str, world_size: Optional[int]) -> int:
    if world_size is not None:
        return world_size
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name).size()


def _check_reduce_op(op: str, reduce_op: str) -> None:
    if reduce_op != "sum":
        raise ValueError(f"{op}: argument 'reduce_op' must be 'sum' (the only reduction torch_npu supports); "
                         f"got {reduce_op!r}")


@_args.torch_npu_api
def npu_all_gather_base_mm(input: torch.Tensor, x2: torch.Tensor, hcom: GroupLike, world_size: Optional[int] = None,
                           *, bias: Optional[torch.Tensor] = None, gather_index: int = 0, gather_output: bool = True,
                           comm_turn: int = 0, chunks: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """AllGather(input) @ x2 + bias and the gathered input (empty when not gather_output). comm_turn is accepted
    for torch_npu compatibility; `chunks` sets the pipeline depth (0 = automatic)."""
    name = group_name(hcom, "npu_all_gather_base_mm")
    return OPS.all_gather_matmul(input, x2, name, _world_size(name, world_size), bias, gather_index, gather_output,
                                 chunks)


@_args.torch_npu_api
def npu_mm_reduce_scatter_base(input: torch.Tensor, x2: torch.Tensor, hcom: GroupLike,
                               world_size: Optional[int] = None, *, reduce_op: str = "sum",
                               bias: Optional[torch.Tensor] = None, comm_turn: int = 0,
                               chunks: int = 0) -> torch.Tensor:
    """ReduceScatter(input @ x2) + bias: this rank's m / world_size rows of the group sum."""
    op = "npu_mm_reduce_scatter_base"
    _check_reduce_op(op, reduce_op)
    name = group_name(hcom, op)
    return OPS.matmul_reduce_scatter(input, x2, name, _world_size(name, world_size), bias, chunks)


@_args.torch_npu_api
def npu_mm_all_reduce_base(x1: torch.Tensor, x2: torch.Tensor, hcom: GroupLike, *, reduce_op: str = "sum",
                           bias: Optional[torch.Tensor] = None, antiquant_scale=None, antiquant_offset=None,
                           x3=None, dequant_scale=None, pertoken_scale=None, comm_quant_scale_1=None,
                           comm_quant_scale_2=None, comm_turn: int = 0, antiquant_group_size: int = 0,
                           chunks: int = 0) -> torch.Tensor:
    """AllReduce(x1 @ x2) + bias (x1 [m, k] or [b, s, k]). Quantisation arguments must be None."""
    op = "npu_mm_all_reduce_base"
    _check_reduce_op(op, reduce_op)
    _args.not_implemented(op, "quantised MC2", antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                          x3=x3, dequant_scale=dequant_scale, pertoken_scale=pertoken_scale,
                          comm_quant_scale_1=comm_quant_scale_1, comm_quant_scale_2=comm_quant_scale_2)
    return OPS.matmul_all_reduce(x1, x2, group_name(hcom, op), bias, chunks)


@_args.torch_npu_api
def npu_mm_all_reduce_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor,
                                   hcom: GroupLike, *, reduce_op: str = "sum", epsilon: float = 1e-6,
                                   bias: Optional[torch.Tensor] = None, antiquant_scale=None, antiquant_offset=None,
                                   dequant_scale=None, antiquant_group_size: int = 0, comm_turn: int = 0,
                                   chunks: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y, norm_out): y = AllReduce(x1 @ x2) + bias + residual, norm_out = RMSNorm(y) * gamma."""
    op = "npu_mm_all_reduce_add_rms_norm"
    _check_reduce_op(op, reduce_op)
    _args.not_implemented(op, "quantised MC2", antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                          dequant_scale=dequant_scale)
    return OPS.matmul_all_reduce_add_rms_norm(x1, x2, residual, gamma, group_name(hcom, op), bias, epsilon, chunks)


def mc2_validation(enable: Optional[bool] = None) -> bool:
    """Query (None) or set cross-rank validation of the MC2 ops (on by default; one tiny all-gather per call)."""
    return OPS.mc2_validation(-1 if enable is None else int(bool(enable)))
