"""`python -m torch_ops_transformer.bench moe_routing`: each MoE routing op vs a straightforward PyTorch version
(softmax + topk, argsort + index_select + bincount, index_select + weighted sum) on the same inputs.

Both contenders run in the same process, alternating, median of the repetitions; speed-up = torch / ours. Every
pair is checked to agree before it is timed.
"""
from typing import Callable, Dict, List, Tuple

import torch

from ..moe.routing import npu_moe_init_routing_v2
from .common import format_table, time_alternating

# (tokens N, hidden H, experts E, top-k)
SHAPES: List[Tuple[int, int, int, int]] = [(4096, 1024, 8, 2), (4096, 1024, 64, 8)]
QUICK_SHAPES: List[Tuple[int, int, int, int]] = [(256, 64, 8, 2)]


# ---- the straightforward PyTorch versions ------------------------------------------------------------------------
def torch_gating(logits: torch.Tensor, k: int):
    y, idx = torch.softmax(logits.float(), -1).topk(k, -1)
    n = logits.shape[0]
    row_idx = (torch.arange(k, dtype=torch.int32)[None] * n + torch.arange(n, dtype=torch.int32)[:, None])
    return y.to(logits.dtype), idx.int(), row_idx


def torch_group_gating(logits, k, bias, k_group, groups, scale):
    s = torch.sigmoid(logits.float())
    sel = s + bias
    n, e = sel.shape
    score = sel.view(n, groups, -1).topk(2, -1).values.sum(-1)
    keep = torch.zeros(n, groups, dtype=torch.bool).scatter_(1, score.topk(k_group, -1).indices, True)
    sel = sel.masked_fill(~keep.repeat_interleave(e // groups, 1), float("-inf"))
    idx = sel.topk(k, -1).indices
    y = s.gather(1, idx)
    return (y / (y.sum(-1, keepdim=True) + 1e-20) * scale).to(logits.dtype), idx.int()


def torch_dispatch(x, expert_idx, num_experts):
    k = expert_idx.shape[1]
    order = torch.argsort(expert_idx.flatten(), stable=True)
    expanded = x.index_select(0, order // k)
    row = torch.empty_like(order)
    row[order] = torch.arange(order.numel())
    counts = torch.bincount(expert_idx.flatten(), minlength=num_experts)
    return expanded, row.int(), counts


def torch_dispatch_capacity(x, expert_idx, num_experts, capacity):
    k = expert_idx.shape[1]
    flat = expert_idx.flatten().long()
    order = torch.argsort(flat, stable=True)
    e_sorted = flat[order]
    counts = torch.bincount(flat, minlength=num_experts)
    starts = torch.cumsum(counts, 0) - counts
    pos = torch.arange(flat.numel()) - starts[e_sorted]
    ok = pos < capacity
    slot = e_sorted * capacity + pos
    out = x.new_zeros(num_experts * capacity, x.shape[1])
    out[slot[ok]] = x[order[ok] // k]
    dest = torch.full_like(flat, -1)
    dest[order[ok]] = slot[ok]
    return out.view(num_experts, capacity, -1), dest.int(), counts


def torch_combine(rows, dst, scales, skip):
    n, k = scales.shape
    gathered = rows.index_select(0, dst.long()).view(n, k, -1)
    return skip + (gathered.float() * scales.float()[..., None]).sum(1).to(rows.dtype)


def torch_permute(tokens, indices):
    order = torch.argsort(indices.flatten(), stable=True)
    return tokens.index_select(0, order // indices.shape[1]), torch.argsort(order).int()


def torch_unpermute(permuted, sorted_indices, probs):
    n, k = probs.shape
    rows = permuted.index_select(0, sorted_indices.long()).view(n, k, -1)
    return (rows.float() * probs.float()[..., None]).sum(1).to(permuted.dtype)


# ---- the table ---------------------------------------------------------------------------------------------------
def _check(name, ours, theirs):
    o, t = ours(), theirs()
    o = o if isinstance(o, tuple) else (o,)
    t = t if isinstance(t, tuple) else (t,)
    if name.startswith("gating"):  # torch.topk orders tied (bf16) logits arbitrarily: compare the weights only
        o, t = o[:1], t[:1]
    for a, b in zip(o, t):
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2, msg=lambda m: f"{name}: {m}")


def cases(N: int, H: int, E: int, k: int, dtype: torch.dtype) -> Dict[str, Tuple[Callable, Callable]]:
    ops = torch.ops.npu_fa
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, H, generator=g).to(dtype)
    logits = torch.randn(N, E, generator=g).to(dtype)
    y, expert, _ = ops.moe_gating_top_k_softmax(logits, None, k)
    scales = y.float()
    bias = torch.randn(E, generator=g) * 0.1
    groups = 4 if E >= 8 else 1
    k_group = max(1, groups // 2)
    capacity = max(1, int(1.25 * N * k / E))
    rows, dst = npu_moe_init_routing_v2(x, expert, expert_num=E)[:2]
    permuted, sorted_idx = ops.moe_token_permute(x, expert, None, False)
    skip = torch.randn(N, H, generator=g).to(dtype)
    sorted_experts = torch.sort(expert.flatten()).values
    return {
        "gating_top_k_softmax": (lambda: ops.moe_gating_top_k_softmax(logits, None, k), lambda: torch_gating(logits, k)),
        "gating_top_k (groups)": (
            lambda: ops.moe_gating_top_k(logits, k, bias, k_group, groups, 1, 0, 1, False, 2.5, 1e-20)[:2],
            lambda: torch_group_gating(logits, k, bias, k_group, groups, 2.5)),
        "init_routing_v2 dropless": (
            lambda: npu_moe_init_routing_v2(x, expert, expert_num=E, expert_tokens_num_flag=True,
                                            expert_tokens_num_type=1)[:3],
            lambda: torch_dispatch(x, expert, E)),
        "init_routing_v2 capacity": (
            lambda: npu_moe_init_routing_v2(x, expert, drop_pad_mode=1, expert_num=E, expert_capacity=capacity,
                                            expert_tokens_num_flag=True, expert_tokens_num_type=1)[:3],
            lambda: torch_dispatch_capacity(x, expert, E, capacity)),
        "compute_expert_tokens": (lambda: ops.moe_compute_expert_tokens(sorted_experts, E),
                                  lambda: torch.bincount(sorted_experts, minlength=E).cumsum(0).int()),
        "finalize_routing": (lambda: ops.moe_finalize_routing(rows, skip, None, None, scales, dst, expert, 2),
                             lambda: torch_combine(rows, dst, scales, skip)),
        "token_permute": (lambda: ops.moe_token_permute(x, expert, None, False), lambda: torch_permute(x, expert)),
        "token_unpermute": (lambda: ops.moe_token_unpermute(permuted, sorted_idx, scales, False, None),
                            lambda: torch_unpermute(permuted, sorted_idx, scales)),
    }


def main(quick: bool = False, reps: int = 5) -> None:
    threads = torch.get_num_threads()
    print(f"# moe_routing: routing ops vs straightforward PyTorch (argsort / topk / index_select), {threads} threads, "
          f"median of {reps}")
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for N, H, E, k in (QUICK_SHAPES if quick else SHAPES):
            with torch.no_grad():
                for name, (ours, theirs) in cases(N, H, E, k, dtype).items():
                    _check(name, ours, theirs)
                    t = time_alternating({"ours": ours, "torch": theirs}, reps=reps, min_time=0.0 if quick else 0.05)
                    rows.append([name, f"N={N} H={H} E={E} k={k}", {torch.float32: "fp32"}.get(dtype, "bf16"),
                                 f"{t['ours'] * 1e3:.3f}", f"{t['torch'] * 1e3:.3f}", f"{t['torch'] / t['ours']:.2f}x"])
            print(f"  done: N={N} E={E} k={k} {dtype}", flush=True)
    print(format_table(["op", "shape", "dtype", "ours ms", "torch ms", "speed-up"], rows))
