"""Cases of the expert-parallel dispatch / combine ops: a float64 single-process reference, seeded per-rank data that
every rank can rebuild (so the reference needs no communication), and the opcheck cases (one-rank gloo group).

The reference routes every token to the rank owning each of its experts with plain Python loops: rank q receives,
for each of its local experts in order, the pairs of rank 0, then rank 1, ... in token order; expert e's output for
a row is `expert_fn(e, row)`; combine sums expert_scales[t, k] * output over the active slots and adds the shared
expert's output to tokens with an active slot.
"""
from dataclasses import dataclass
from typing import List, Optional

import torch

from test.mc2.mc2_cases import single_rank_group


@dataclass
class RankData:
    x: torch.Tensor                 # [BS, H] float64
    expert_ids: torch.Tensor        # [BS, K] int32
    expert_scales: torch.Tensor     # [BS, K] float64
    mask: Optional[torch.Tensor]    # None, [BS] or [BS, K] bool
    shared: Optional[torch.Tensor]  # [BS, H] float64


def make_ranks(world: int, batch: List[int], hidden: int, k: int, experts: int, seed: int = 0,
               mask: str = "none", shared: bool = False, skew: bool = False) -> List[RankData]:
    """Seeded data of every rank. skew: experts of rank 0 are picked far more often (uneven loads)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(world):
        bs = batch[r]
        x = torch.randn(bs, hidden, generator=g, dtype=torch.float64)
        prio = torch.rand(bs, experts, generator=g, dtype=torch.float64)
        if skew:
            prio[:, : experts // world] += 1.0
        ids = prio.topk(k, dim=1).indices.to(torch.int32)
        scales = torch.rand(bs, k, generator=g, dtype=torch.float64)
        m = None
        if mask == "token":
            m = torch.arange(bs) < (bs - bs // 3)  # trues first, as upstream requires
        elif mask == "pair":
            m = torch.rand(bs, k, generator=g) > 0.3
        sh = torch.randn(bs, hidden, generator=g, dtype=torch.float64) if shared else None
        out.append(RankData(x, ids, scales, m, sh))
    return out


def expert_weights(experts: int, hidden: int, seed: int = 100) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(experts, hidden, hidden, generator=g, dtype=torch.float64) / hidden ** 0.5


def active_pairs(d: RankData) -> torch.Tensor:
    bs, k = d.expert_ids.shape
    if d.mask is None:
        return torch.ones(bs, k, dtype=torch.bool)
    return d.mask.unsqueeze(1).expand(bs, k) if d.mask.dim() == 1 else d.mask


def reference_dispatch(ranks: List[RankData], world: int, experts: int, q: int):
    """What rank q receives: rows [(expert e, src rank, token, slot)] in expand_x order, and the row values."""
    local = experts // world
    rows, values = [], []
    for le in range(local):
        e = q * local + le
        for r, d in enumerate(ranks):
            act = active_pairs(d)
            for t in range(d.x.shape[0]):
                for s in range(d.expert_ids.shape[1]):
                    if act[t, s] and int(d.expert_ids[t, s]) == e:
                        rows.append((e, r, t, s))
                        values.append(d.x[t])
    vals = torch.stack(values) if values else torch.zeros(0, ranks[0].x.shape[1], dtype=torch.float64)
    return rows, vals


def reference_combine(ranks: List[RankData], weights: torch.Tensor, r: int, xs=None, scales=None, shared=None):
    """Rank r's combine output in float64 with expert e computing row @ weights[e]; xs / scales / shared override
    the data's tensors (autograd leaves for reference gradients)."""
    d = ranks[r]
    x = d.x if xs is None else xs
    w = d.expert_scales if scales is None else scales
    sh = d.shared if shared is None else shared
    act = active_pairs(d)
    ids = d.expert_ids.long()
    per_pair = torch.einsum("th,tshg->tsg", x, weights[ids])        # [BS, K, H]: x[t] @ weights[ids[t, s]]
    out = (per_pair * (w * act).unsqueeze(-1)).sum(1)
    if sh is not None:
        out = out + sh * act.any(1, keepdim=True)
    return out


def apply_local_experts(expand_x: torch.Tensor, counts: torch.Tensor, weights: torch.Tensor, first_expert: int):
    """The expert computation between dispatch and combine: rows of local expert le times weights[first + le];
    rows past the received ones stay zero."""
    outs, start = [], 0
    for le, n in enumerate(counts.tolist()):
        outs.append(expand_x[start:start + n] @ weights[first_expert + le])
        start += n
    outs.append(torch.zeros_like(expand_x[start:]))
    return torch.cat(outs)


# ---------------------------------------------------------------- opcheck (one-rank gloo group)

def _dispatch_case(quant, mask, scales):
    def make():
        g = single_rank_group()
        x = torch.randn(5, 8, dtype=torch.float32, requires_grad=not quant)
        ids = torch.tensor([[0, 2], [1, 3], [2, 0], [3, 1], [0, 1]], dtype=torch.int32)
        m = torch.tensor([True, True, True, True, False]) if mask else None
        sm = torch.rand(4, 8) if scales else None
        return (x, ids, g, 1, 0, 4, sm, m, torch.rand(5, 2), 0, 2 if quant else 0, 0, 1), {}
    return make


def _dispatched(mask=False):
    g = single_rank_group()
    ids = torch.tensor([[0, 2], [1, 3], [2, 0], [3, 1], [0, 1]], dtype=torch.int32)
    m = torch.tensor([True, True, True, True, False]) if mask else None
    out = torch.ops.npu_fa.moe_distribute_dispatch_v2(torch.randn(5, 8), ids, g, 1, 0, 4, None, m)
    return g, ids, m, out


def _dispatch_grad_case(mask):
    def make():
        g, ids, m, out = _dispatched(mask)
        return (torch.randn_like(out[0]), torch.randn(5, 8), ids, out[4], g, 1, 0, 4), {"x_active_mask": m}
    return make


def _combine_case(mask, shared, quant=False):
    def make():
        g, ids, m, out = _dispatched(mask)
        sh = torch.randn(5, 8, requires_grad=True) if shared else None
        return (out[0].clone().requires_grad_(True), ids, out[2], out[4], torch.rand(5, 2, requires_grad=True), g,
                1, 0, 4, m, sh, 0, 2 if quant else 0), {}
    return make


def _combine_grad_case(shared):
    def make():
        g, ids, m, out = _dispatched(False)
        return (torch.randn(5, 8), out[0], ids, out[4], torch.rand(5, 2), g, 1, 0, 4), {
            "shared_expert_x": torch.randn(5, 8) if shared else None}
    return make


OPCHECK_CASES = {
    "moe_distribute_dispatch_v2": {"plain": _dispatch_case(False, False, False),
                                   "mask": _dispatch_case(False, True, False),
                                   "quant_smooth": _dispatch_case(True, False, True)},
    "moe_distribute_dispatch_v2_grad": {"plain": _dispatch_grad_case(False), "mask": _dispatch_grad_case(True)},
    "moe_distribute_combine_v2": {"plain": _combine_case(False, False), "mask_shared": _combine_case(True, True),
                                  "comm_quant": _combine_case(False, False, True)},
    "moe_distribute_combine_v2_grad": {"plain": _combine_grad_case(False), "shared": _combine_grad_case(True)},
}
