"""Gradient buckets of MC2Optimizer: flat buffers all-reduced asynchronously, one collective per bucket.

A bucket holds parameters of one (device, dtype), up to `cap_bytes` of gradients. Its flat buffer is
`[grad_0 / world, grad_1 / world, ..., used_0, used_1, ...]`: the trailing "used" flags (1 if this rank has a
gradient for the parameter) ride in the same all-reduce, so a parameter no rank produced a gradient for keeps
`grad = None` and is skipped by the optimizer — what DDP(find_unused_parameters=True) + optimizer does.
"""
import zlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Bucket:
    params: list
    offsets: list = field(default_factory=list)  # start of each parameter's gradient in the flat buffer
    numel: int = 0  # gradient elements (the flags follow)

    def __post_init__(self):
        for p in self.params:
            self.offsets.append(self.numel)
            self.numel += p.numel()


def build_buckets(params, cap_bytes: int) -> list:
    """Group params by (device, dtype) in their given order, closing a bucket once it reaches cap_bytes."""
    open_buckets, done = {}, []
    for p in params:
        key = (p.device, p.dtype)
        group = open_buckets.setdefault(key, [])
        group.append(p)
        if sum(q.numel() for q in group) * p.element_size() >= cap_bytes:
            done.append(Bucket(group))
            open_buckets[key] = []
    done.extend(Bucket(g) for g in open_buckets.values() if g)
    return done


def check_same_layout_on_all_ranks(buckets, group):
    """One small all_gather at bucket-build time: mismatched models would otherwise hang or mix tensors."""
    text = ";".join(f"{b.params[0].dtype}:" + ",".join(str(tuple(p.shape)) for p in b.params) for b in buckets)
    mine = torch.tensor([len(buckets), sum(b.numel for b in buckets), zlib.crc32(text.encode())], dtype=torch.int64)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(everyone, mine, group=group)
    differing = [r for r, t in enumerate(everyone) if not torch.equal(t, everyone[0])]
    if differing:
        raise RuntimeError(
            "MC2Optimizer: the ranks do not hold the same parameters (count, shapes, dtypes) to all-reduce; "
            f"(buckets, elements, layout hash) per rank: {[t.tolist() for t in everyone]}"
        )


def check_grads(params):
    """Before any collective is launched, so a bad gradient fails this rank's step() without leaving
    a half-issued sequence of all-reduces behind. (torch itself keeps .grad's dtype/shape/device = the param's.)"""
    for p in params:
        if p.grad is not None and p.grad.is_sparse:
            raise RuntimeError("MC2Optimizer: sparse gradients are not supported (use a dense embedding, or "
                               "comm_policy='none' if the gradients are already averaged)")


def pack(bucket: Bucket, world_size: int) -> torch.Tensor:
    """Flat buffer of grad * (1/world) — the same scaling DDP's reducer applies — followed by the used flags."""
    first = bucket.params[0]
    flat = torch.empty(bucket.numel + len(bucket.params), dtype=first.dtype, device=first.device)
    flags = flat[bucket.numel:]
    for i, (p, off) in enumerate(zip(bucket.params, bucket.offsets)):
        view = flat[off:off + p.numel()].view_as(p)
        if p.grad is None:
            view.zero_()
            flags[i] = 0
        else:
            torch.mul(p.grad, 1.0 / world_size, out=view)
            flags[i] = 1
    return flat


def unpack(bucket: Bucket, flat: torch.Tensor):
    """Point `.grad` at the averaged gradients inside the reduced buffer (no copy, as DDP's
    gradient_as_bucket_view); a parameter no rank had a gradient for stays None."""
    used = (flat[bucket.numel:] > 0).tolist()
    for i, (p, off) in enumerate(zip(bucket.params, bucket.offsets)):
        if used[i]:
            p.grad = flat[off:off + p.numel()].view_as(p)


def all_reduce_async(flat: torch.Tensor, group):
    return dist.all_reduce(flat, group=group, async_op=True)
