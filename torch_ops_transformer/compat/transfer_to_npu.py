"""`torch_npu.contrib.transfer_to_npu` of the shim: importing it makes code written for CUDA run on the npu device.

What torch_npu's module does on import, and what this one does (process-wide, once, when the shim is installed):

- a device given as "cuda", "cuda:0" or torch.device("cuda") to the tensor factories (`torch.tensor`, `torch.empty`,
  `torch.zeros`, `torch.ones`, `torch.full`, `torch.rand*`, `torch.arange`, the `*_like` and `Tensor.new_*`
  functions, ...) and to `Tensor.to` / `Module.to` (also a device ordinal: `.to(0)`) means "npu";
- `Tensor.cuda()`, `Module.cuda()` are `.npu()`; `Tensor.is_cuda` stays what it is (False on npu tensors);
- `torch.cuda.<name>` is `torch.npu.<name>` for the device functions the simulated device has (`is_available`,
  `device_count`, `current_device`, `set_device`, `synchronize`, `manual_seed(_all)`, `Stream`, `Event`,
  `current_stream`, `stream`, `empty_cache`, `memory_*`, `mem_get_info`, `get_device_properties`, ...);
- `torch.distributed.init_process_group` / `new_group` with backend "nccl" take torch_npu's "hccl" (which the shim
  runs on gloo: docs/torch_npu_compat.md).

Not done (torch_npu does more): `torch.Generator(device="cuda")`, CUDA-only modules such as `torch.backends.cuda`,
`torch.cuda.amp`, CUDA graphs.
"""
import functools

import torch

from . import hccl_names, installed

_applied = False

# Functions taking a `device` argument, patched in `torch` (and in torch.Tensor for the methods).
_FACTORIES = ("tensor", "as_tensor", "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones",
              "ones_like", "full", "full_like", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
              "randperm", "arange", "range", "linspace", "logspace", "eye", "tril_indices", "triu_indices")
_TENSOR_METHODS = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided")
# torch.cuda names answered by the simulated device module.
_CUDA_NAMES = ("is_available", "device_count", "current_device", "set_device", "synchronize", "manual_seed",
               "manual_seed_all", "get_rng_state", "set_rng_state", "is_bf16_supported", "get_device_name",
               "get_device_properties", "empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
               "max_memory_reserved", "memory_stats", "mem_get_info", "reset_peak_memory_stats", "Stream", "Event",
               "current_stream", "default_stream", "set_stream", "stream", "device", "is_initialized")


def _npu_device(device):
    """`device` with CUDA replaced by npu (other values unchanged)."""
    if isinstance(device, str) and device.split(":")[0] == "cuda":
        return "npu" + device[4:]
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("npu", device.index)
    return device


def _patch_device_kwarg(owner, name: str) -> None:
    original = getattr(owner, name, None)
    if original is None:
        return

    @functools.wraps(original)
    def patched(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _npu_device(kwargs["device"])
        return original(*args, **kwargs)

    setattr(owner, name, patched)


def _patch_to(owner) -> None:
    original = owner.to

    @functools.wraps(original)
    def to(self, *args, **kwargs):
        args = tuple(f"npu:{a}" if isinstance(a, int) and not isinstance(a, bool) else _npu_device(a)
                     for a in args)
        if "device" in kwargs:
            kwargs["device"] = _npu_device(kwargs["device"])
        return original(self, *args, **kwargs)

    owner.to = to


def _cuda_as_npu(self, device=None, non_blocking: bool = False, **kwargs):
    return self.npu(device, non_blocking=non_blocking, **kwargs) if isinstance(self, torch.Tensor) \
        else self.npu(device)


def apply() -> None:
    """Does what importing torch_npu.contrib.transfer_to_npu does (idempotent). Needs the shim installed."""
    global _applied
    if _applied:
        return
    if not installed() or not hasattr(torch, "npu"):
        raise RuntimeError("torch_npu.contrib.transfer_to_npu: the torch_npu shim is not installed "
                           "(torch_ops_transformer.compat.install())")
    for name in _FACTORIES:
        _patch_device_kwarg(torch, name)
    for name in _TENSOR_METHODS:
        _patch_device_kwarg(torch.Tensor, name)
    _patch_to(torch.Tensor)
    _patch_to(torch.nn.Module)
    torch.Tensor.cuda = _cuda_as_npu
    torch.nn.Module.cuda = _cuda_as_npu
    for name in _CUDA_NAMES:
        if hasattr(torch.npu, name):
            setattr(torch.cuda, name, getattr(torch.npu, name))
    hccl_names.map_backend("nccl", "hccl")
    _applied = True


def applied() -> bool:
    return _applied

