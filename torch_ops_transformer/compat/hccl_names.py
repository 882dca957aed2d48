"""torch_npu's way of naming a group for the MC2 functions, on process groups without HCCL.

Code written for torch_npu gets the `hcom` argument of the MC2 functions from its process group:

    hcom = group._get_backend(torch.device("npu")).get_hccl_comm_name(rank)   # torch > 2.0.1
    hcom = group.get_hccl_comm_name(rank)                                     # torch <= 2.0.1

`install()` makes both work on groups that have no backend for the npu device (gloo groups, on the CPU or with the
simulated npu device): they return the group's c10d name, which the MC2 wrappers take as `hcom`. A group that has an
npu backend (hccl with the real torch_npu) keeps it. The torch_npu shim (torch_ops_transformer.compat) calls
`install()`; it patches `torch.distributed.ProcessGroup` process-wide, once, and does nothing when a real torch_npu
is loaded.

It also maps torch_npu's backend name onto gloo: `init_process_group(backend="hccl")` and `new_group(...,
backend="hccl")` (also in the "cpu:gloo,npu:hccl" form) create gloo groups. `map_backend("nccl", "hccl")` (what
`torch_npu.contrib.transfer_to_npu` does) adds CUDA's name to the mapping.
"""
import sys

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

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


# backend name (lower case) -> the backend that runs it here
BACKEND_MAP = {"hccl": "gloo"}
_original_entry_points = {}


def backend_here(backend):
    """The backend `backend` (a name or "device:name,..." string, or None) runs on here."""
    if not isinstance(backend, str):
        return backend
    if ":" not in backend:
        return BACKEND_MAP.get(backend.lower(), backend)
    parts = []
    for part in backend.split(","):
        device, _, name = part.partition(":")
        parts.append(f"{device}:{BACKEND_MAP.get(name.strip().lower(), name)}")
    return ",".join(parts)


def map_backend(name: str, to: str) -> None:
    """Makes backend `name` run as `to` (itself mapped: "nccl" -> "hccl" -> gloo)."""
    BACKEND_MAP[name.lower()] = BACKEND_MAP.get(to.lower(), to)


def _with_backend_mapped(fn, position: int):
    def patched(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = backend_here(kwargs["backend"])
        elif len(args) > position:
            args = args[:position] + (backend_here(args[position]),) + args[position + 1:]
        return fn(*args, **kwargs)

    patched.__wrapped__ = fn
    patched.__name__, patched.__qualname__, patched.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    return patched


def _map_backend_names() -> None:
    """init_process_group(backend, ...) and new_group(ranks, timeout, backend, ...) take the mapped names."""
    for name, position in (("init_process_group", 0), ("new_group", 2)):
        if name in _original_entry_points:
            continue
        original = getattr(c10d, name)
        _original_entry_points[name] = original
        patched = _with_backend_mapped(original, position)
        setattr(c10d, name, patched)
        setattr(dist, name, patched)


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
    _map_backend_names()
    return True
