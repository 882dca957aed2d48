"""Fake (meta) kernels of the expert-parallel dispatch / combine ops: output shapes only, no communication. The
received row count is data-dependent, so dispatch's outputs have the static capacity A = G * min(L, K) of
upstream's kernel (G = global_bs, or BS * ep_world_size; L = moe_expert_num / ep_world_size)."""
import torch


def _capacity(a):
    bs, k = a.expert_ids.shape
    g = a.global_bs if a.global_bs else bs * a.ep_world_size
    return g * min(a.moe_expert_num // a.ep_world_size, k)


def moe_distribute_dispatch_v2(a):
    bs, h = a.x.shape
    k = a.expert_ids.shape[1]
    cap = _capacity(a)
    local = a.moe_expert_num // a.ep_world_size
    x = a.x
    return (x.new_empty((cap, h), dtype=torch.int8 if a.quant_mode == 2 else x.dtype),
            x.new_empty((cap,), dtype=torch.float32),
            x.new_empty((max(bs * k, 128 * cap),), dtype=torch.int32),
            x.new_empty((local,), dtype=torch.int64),
            x.new_empty((a.ep_world_size * local,), dtype=torch.int32),
            x.new_empty((a.tp_world_size,), dtype=torch.int32),
            x.new_empty((cap,), dtype=torch.float32))


def moe_distribute_dispatch_v2_grad(a):
    return torch.empty_like(a.x, memory_format=torch.contiguous_format)


def moe_distribute_combine_v2(a):
    return a.expand_x.new_empty((a.expert_ids.shape[0], a.expand_x.shape[1]))


def moe_distribute_combine_v2_grad(a):
    shared = a.shared_expert_x
    return (torch.empty_like(a.expand_x, memory_format=torch.contiguous_format),
            torch.empty_like(a.expert_scales, memory_format=torch.contiguous_format),
            a.expand_x.new_empty(0) if shared is None else torch.empty_like(shared,
                                                                             memory_format=torch.contiguous_format))
