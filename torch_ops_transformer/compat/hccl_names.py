"""torch_npu's way of naming a group for the MC2 functions, on process groups without HCCL.

Code written for torch_npu gets the `hcom` argument of the MC2 functions from its process group:

    hcom = group._get_backend(torch.device("npu")).get_hccl_comm_name(rank)   # torch > 2.0.1
    hcom = group.get_hccl_comm_name(rank)                                     # torch <= 2.0.1

`install()` makes both work on groups that have no backend for the npu device (gloo groups, on the CPU or with the
simulated npu device): they return the group's c10d name, which the MC2 wrappers take as `hcom`. A group that has an
npu backend (hccl with the real torch_npu) keeps it. The torch_npu shim (torch_ops_transformer.compat) calls
`install()`; it patches `torch.distributed.ProcessGroup` process-wide, once, and does nothing when a real torch_npu
is loaded.
"""
import sys

import torch
import torch.distributed as dist

from .._internal.real_torch_npu import is_shim

_original_get_backend = None


def _check_rank(rank) -> None:
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise ValueError(f"get_hccl_comm_name: argument 'rank' must be a non-negative int (this process's global "
                         f"rank); got {rank!r}")


def _get_hccl_comm_name(self, rank: int, init_comm: bool = True) -> str:
    """The name the MC2 functions take as `hcom` for this group (its c10d group name)."""
    _check_rank(rank)
    return self.group_name


class NpuBackendView:
    """What `group._get_backend(torch.device("npu"))` returns for a group with no npu backend: its CPU backend
    (every attribute is the CPU backend's) plus torch_npu's `get_hccl_comm_name`."""

    def __init__(self, group, cpu_backend):
        self._group = group
        self._backend = cpu_backend

    def get_hccl_comm_name(self, rank: int, init_comm: bool = True) -> str:
        return _get_hccl_comm_name(self._group, rank, init_comm)

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def __repr__(self):
        return f"NpuBackendView(group={self._group.group_name!r}, backend={self._backend!r})"


def _is_npu(device) -> bool:
    if isinstance(device, str):
        return device.split(":")[0] == "npu"
    return isinstance(device, torch.device) and device.type == "npu"


def _get_backend(self, device):
    try:
        return _original_get_backend(self, device)
    except RuntimeError:
        if not _is_npu(device):
            raise
    # No npu backend: a view of the CPU one (whose lookup raises in turn when the group has none).
    return NpuBackendView(self, _original_get_backend(self, torch.device("cpu")))


def installed() -> bool:
    return _original_get_backend is not None


def install() -> bool:
    """Adds `get_hccl_comm_name` to process groups and their npu backend lookup (idempotent). Returns whether it is
    installed: False when a real torch_npu is loaded, whose groups have their own."""
    global _original_get_backend
    if installed():
        return True
    loaded = sys.modules.get("torch_npu")
    if loaded is not None and not is_shim(loaded):
        return False
    pg = dist.ProcessGroup
    _original_get_backend = pg._get_backend
    pg._get_backend = _get_backend
    if not hasattr(pg, "get_hccl_comm_name"):
        pg.get_hccl_comm_name = _get_hccl_comm_name
    return True
