"""MC2DistributedDataParallel: DDP whose gradient all-reduce overlaps backward AND the optimizer update.

It is `torch.nn.parallel.DistributedDataParallel` (bucketing, overlap of all-reduce with backward, no_sync,
find_unused_parameters, bucket rebuilding all come from PyTorch) plus one comm hook. The hook averages the bucket
with an async all-reduce and, when an `MC2Optimizer` with comm_policy='overlap' updates these parameters, chains
that bucket's update onto the all-reduce's future: the update of bucket i runs (on the process group's worker
thread) as soon as bucket i is reduced, while backward and the all-reduce of later buckets continue. PyTorch's
own `_register_fused_optim` does the same with a functional optimizer, but it composes with neither comm hooks
nor no_sync, and its optimizer state is not the user's optimizer (no state_dict, no LR scheduler); here the
update is the user's optimizer itself.
"""
import weakref

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from . import _registry
from ._checks import check_bucket_cap_mb, require_process_group

_API = "MC2DistributedDataParallel"


class MC2DistributedDataParallel(DistributedDataParallel):
    """`DistributedDataParallel(module, ...)` + per-bucket optimizer update inside the comm hook.

    Takes DDP's arguments. `device_ids` is accepted for CPU modules too (the usual DDP call passes `[local_rank]`) and
    ignored there, since a CPU module has one device. A custom comm hook cannot be registered on top of it.
    """

    def __init__(self, module, device_ids=None, output_device=None, process_group=None, bucket_cap_mb=None,
                 **ddp_kwargs):
        require_process_group(_API, process_group)
        check_bucket_cap_mb(_API, bucket_cap_mb, allow_none=True)
        device_ids, output_device = _cpu_drops_device_ids(module, device_ids, output_device)
        super().__init__(module, device_ids=device_ids, output_device=output_device, process_group=process_group,
                         bucket_cap_mb=bucket_cap_mb, **ddp_kwargs)
        self._mc2_optimizers = []  # weak references to MC2Optimizers updating inside the hook
        self.register_comm_hook(weakref.ref(self), _allreduce_then_update_hook)
        self._claim_parameters()

    def _claim_parameters(self):
        """Mark the params whose gradients DDP reduces; optimizers built before the wrap learn about it now."""
        reduced = [p for p in self._module_parameters if p.requires_grad]
        for p in reduced:
            _registry.set_owner_ddp(p, self)
        optimizers = {id(o): o for p in reduced for o in _registry.optimizers_of(p)}
        for optimizer in optimizers.values():
            optimizer._on_wrapped_by(self)

    def _attach_mc2_optimizer(self, optimizer):
        if not any(r() is optimizer for r in self._mc2_optimizers):
            self._mc2_optimizers.append(weakref.ref(optimizer))

    def _live_mc2_optimizers(self):
        return [o for o in (r() for r in self._mc2_optimizers) if o is not None]


def _cpu_drops_device_ids(module, device_ids, output_device):
    on_cpu = all(p.device.type == "cpu" for p in module.parameters())
    if not on_cpu or (device_ids is None and output_device is None):
        return device_ids, output_device
    if device_ids is not None and (not isinstance(device_ids, (list, tuple)) or len(device_ids) != 1):
        raise ValueError(f"{_API}: device_ids must be None or a one-element list like [local_rank], got {device_ids!r}")
    return None, None


def _allreduce_then_update_hook(ddp_ref, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    ddp = ddp_ref()
    group = ddp.process_group
    buffer = bucket.buffer()
    buffer.mul_(1.0 / group.size())  # the scaling DDP's built-in reducer applies (grad * (1/world))
    optimizers = ddp._live_mc2_optimizers()
    futures = []
    flags = None
    if optimizers and ddp.find_unused_parameters:
        # Which params some rank produced a gradient for: DDP keeps grad=None for globally unused ones and the
        # optimizer must skip them too; DDP's own used-map is only known after backward, so reduce our own.
        flags = torch.tensor([p.grad is not None for p in bucket.parameters()], dtype=torch.int32)
        futures.append(dist.all_reduce(flags, group=group, async_op=True).get_future())
    futures.append(dist.all_reduce(buffer, group=group, async_op=True).get_future())
    if not optimizers:
        return futures[0].then(lambda fut: fut.value()[0])

    def update_bucket(all_done):
        for fut in all_done.value():
            fut.value()  # re-raises a failed collective
        used = [True] * len(bucket.parameters()) if flags is None else (flags > 0).tolist()
        for optimizer in optimizers:
            optimizer._step_bucket_from_hook(bucket.parameters(), bucket.gradients(), used)
        return buffer

    return torch.futures.collect_all(futures).then(update_bucket)
