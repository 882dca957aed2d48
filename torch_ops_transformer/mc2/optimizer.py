"""MC2Optimizer: a standard torch optimizer whose gradient all-reduce is pipelined with its update.

`optimizer.step()` "triggers MC2": instead of all-reducing every gradient and then updating,
the gradients are cut into buckets; the all-reduce of bucket i+1 is in flight (an async work handle on the
process group — gloo here, hccl/nccl on accelerators) while bucket i is updated. The update itself is the
unmodified torch optimizer (`optimizer_class`), run on the bucket's parameters: one inner optimizer instance per
parameter subset, all sharing this optimizer's `state` and taking their hyperparameters from its `param_groups`.
So `state_dict()` has exactly the format of `optimizer_class`, and LR schedulers drive `param_groups` as usual.

Parameters owned by an `MC2DistributedDataParallel` are already averaged by DDP; with comm_policy='overlap'
their update runs inside DDP's comm hook, per bucket, during backward, and `step()` only finishes what remains.
"""
import threading

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from . import _registry
from ._checks import check_bucket_cap_mb, require_process_group
from .buckets import all_reduce_async, build_buckets, check_grads, check_same_layout_on_all_ranks, pack, unpack

COMM_POLICIES = ("overlap", "sequential", "none")
_API = "MC2Optimizer"


def _hyperparameters(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


class MC2Optimizer(Optimizer):
    """Gradient all-reduce (average over the process group) fused with the parameter update, bucket by bucket.

    comm_policy: 'overlap' (default) pipelines the all-reduce of the next bucket with the update of this one;
    'sequential' all-reduces every bucket, then runs one update over all parameters (the reference);
    'none' does no communication (gradients already averaged by the caller, or single process).
    bucket_cap_mb: gradient bytes per bucket; smaller buckets pipeline more finely but cost more collectives.
    optimizer_class / **optimizer_kwargs: the torch optimizer doing the update (AdamW by default).
    """

    def __init__(self, params, lr=1e-3, comm_policy="overlap", optimizer_class=torch.optim.AdamW,
                 bucket_cap_mb=4.0, process_group=None, **optimizer_kwargs):
        if comm_policy not in COMM_POLICIES:
            raise ValueError(f"{_API}: comm_policy must be one of {COMM_POLICIES}, got {comm_policy!r}")
        check_bucket_cap_mb(_API, bucket_cap_mb, allow_none=False)
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)) \
                or issubclass(optimizer_class, MC2Optimizer):
            raise TypeError(f"{_API}: optimizer_class must be a torch.optim.Optimizer subclass (e.g. "
                            f"torch.optim.AdamW), got {optimizer_class!r}")
        self._comm_policy = comm_policy
        self._group = None if comm_policy == "none" else require_process_group(_API, process_group)
        self._cap_bytes = int(bucket_cap_mb * 1024 * 1024)
        self._optimizer_class, self._lr, self._optimizer_kwargs = optimizer_class, lr, optimizer_kwargs
        # A throwaway instance validates lr/kwargs exactly as optimizer_class does and yields its defaults.
        template = optimizer_class([torch.zeros(1, requires_grad=True)], lr=lr, **optimizer_kwargs)
        self._inner_cache = {}  # tuple of param ids -> (inner optimizer, index of each inner group's parent)
        self._free_buckets = (None, [])  # (param ids, buckets) for parameters no MC2-DDP owns
        self._stepped_in_hook = set()  # ids of params already updated by an MC2-DDP comm hook this iteration
        self._hook_lock = threading.Lock()  # comm hooks run on the process group's worker threads
        super().__init__(params, template.defaults)

    @property
    def comm_policy(self) -> str:
        """Fixed at construction: it decides whether an MC2-DDP runs this optimizer inside its comm hook."""
        return self._comm_policy

    # ---- parameter bookkeeping -------------------------------------------------------------------------
    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        new_params = self.param_groups[-1]["params"]
        for p in new_params:
            _registry.add_optimizer(p, self)
        self._forget_layout()
        for ddp in {id(d): d for d in map(_registry.owner_ddp, new_params) if d is not None}.values():
            self._on_wrapped_by(ddp)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)  # replaces self.state and the param_groups dicts
        self._forget_layout()

    def _forget_layout(self):
        self._inner_cache.clear()
        self._free_buckets = (None, [])

    def _on_wrapped_by(self, ddp):
        """Called when an MC2DistributedDataParallel owns some of our params: DDP averages their gradients."""
        self._forget_layout()
        if self._comm_policy == "overlap":
            ddp._attach_mc2_optimizer(self)

    def _all_params(self):
        return [p for g in self.param_groups for p in g["params"]]

    # ---- the update, on any subset of parameters, by the unmodified torch optimizer -------------------
    def _inner_for(self, params) -> Optimizer:
        key = tuple(id(p) for p in params)
        cached = self._inner_cache.get(key)
        if cached is None:
            wanted, groups, parents = set(key), [], []
            for index, group in enumerate(self.param_groups):
                subset = [p for p in group["params"] if id(p) in wanted]
                if subset:
                    groups.append({**_hyperparameters(group), "params": subset})
                    parents.append(index)
            inner = self._optimizer_class(groups, lr=self._lr, **self._optimizer_kwargs)
            for p, s in inner.state.items():  # optimizers that create state eagerly (e.g. Adagrad)
                self.state.setdefault(p, s)
            inner.state = self.state  # one state for all subsets: state_dict() sees everything
            cached = self._inner_cache[key] = (inner, parents)
        inner, parents = cached
        for inner_group, index in zip(inner.param_groups, parents):  # LR schedulers edit self.param_groups
            inner_group.update(_hyperparameters(self.param_groups[index]))
        return inner

    # ---- step ------------------------------------------------------------------------------------------
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        owned = [p for p in self._all_params() if _registry.owner_ddp(p) is not None]
        free = [p for p in self._all_params() if p.requires_grad and _registry.owner_ddp(p) is None]
        self._finish_ddp_owned(owned)
        if free:
            self._step_free(free)
        return loss

    def _finish_ddp_owned(self, owned):
        """DDP already averaged these gradients; update those its comm hook did not update during backward."""
        with self._hook_lock:
            todo = [p for p in owned if p.grad is not None and id(p) not in self._stepped_in_hook]
            self._stepped_in_hook.clear()
        if todo:
            self._inner_for(todo).step()

    def _step_free(self, free):
        if self._comm_policy == "none":
            self._inner_for(free).step()
            return
        check_grads(free)
        buckets = self._buckets_for(free)
        world = dist.get_world_size(self._group)
        if self._comm_policy == "sequential":
            self._step_sequential(buckets, world, free)
        else:
            self._step_overlapped(buckets, world)

    def _buckets_for(self, free):
        ids = tuple(id(p) for p in free)
        if self._free_buckets[0] != ids:
            buckets = build_buckets(free, self._cap_bytes)
            check_same_layout_on_all_ranks(buckets, self._group)
            self._free_buckets = (ids, buckets)
        return self._free_buckets[1]

    def _launch(self, bucket, world):
        flat = pack(bucket, world)
        return flat, all_reduce_async(flat, self._group)

    def _step_sequential(self, buckets, world, free):
        in_flight = [self._launch(b, world) for b in buckets]
        try:
            for bucket in buckets:
                flat, work = in_flight.pop(0)
                work.wait()
                unpack(bucket, flat)
        finally:
            _drain(in_flight)
        self._inner_for(free).step()

    def _step_overlapped(self, buckets, world):
        """Pipeline: pack + launch bucket i+1, then wait for bucket i and update it while i+1 is on the wire."""
        in_flight = [self._launch(buckets[0], world)]
        try:
            for i, bucket in enumerate(buckets):
                if i + 1 < len(buckets):
                    in_flight.append(self._launch(buckets[i + 1], world))
                flat, work = in_flight.pop(0)
                work.wait()
                unpack(bucket, flat)
                self._inner_for(bucket.params).step()
        finally:
            _drain(in_flight)

    # ---- called by MC2DistributedDataParallel's comm hook (on a process-group worker thread) ----------
    def _step_bucket_from_hook(self, params, averaged_grads, used):
        """Update our params of one DDP bucket with its averaged gradients (views into the bucket buffer)."""
        mine_ids = {id(p) for p in self._all_params()}
        with self._hook_lock:
            selected = []
            for p, g, is_used in zip(params, averaged_grads, used):
                if id(p) not in mine_ids:
                    continue
                if id(p) in self._stepped_in_hook:
                    raise RuntimeError(
                        f"{_API}: a second synchronised backward ran before optimizer.step(); with "
                        "MC2DistributedDataParallel the update happens during backward, so call optimizer.step() "
                        "after every synchronised backward and accumulate gradients inside model.no_sync()")
                if is_used:
                    _set_grad(p, g)
                selected.append(p)
            if selected:
                self._inner_for(selected).step()
            self._stepped_in_hook.update(id(p) for p in selected)


def _drain(in_flight):
    """After a failure mid-step: still complete the all-reduces already issued (the peers issued them too), so a
    local error does not leave the group out of step; their own errors are secondary to the one propagating."""
    for _, work in in_flight:
        try:
            work.wait()
        except RuntimeError:
            pass


def _set_grad(p, averaged):
    if p.grad is None:
        p.grad = averaged.clone()
    elif p.grad.data_ptr() != averaged.data_ptr():  # gradient_as_bucket_view=True: already the same memory
        p.grad.copy_(averaged)
