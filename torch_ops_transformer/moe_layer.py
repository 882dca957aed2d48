"""MOELayer: the seed article's Mixture-of-Experts layer (gate -> route -> grouped expert FFN -> combine) on
grouped_matmul, single-process or expert-parallel over a torch.distributed process group. See docs/moe.md."""
from typing import Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .grouped_matmul import ACT_TYPES

_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu", "fast_gelu")


class Routing:
    """Where each (token, slot) assignment goes. Assignments are ordered by expert, then by priority: every
    token's first choice before any second choice (GShard), tokens in order inside one choice.

    order [R]: flat assignment index (slot * T + token) of each routed row, expert-major
    token [R], weight [R] (fp32): the token a row came from and its combine weight
    expert [R]: the expert of each row; counts [E]: rows per expert (after the capacity drop)
    keep [R] bool, position [R]: capacity mode only (else None): kept or dropped, rank inside the expert
    """

    def __init__(self, order, token, weight, expert, counts, keep=None, position=None):
        self.order, self.token, self.weight, self.expert, self.counts = order, token, weight, expert, counts
        self.keep, self.position = keep, position


def route(probs: torch.Tensor, top_k: int, normalize: bool, capacity: Optional[int]) -> Tuple[Routing, torch.Tensor]:
    """Top-k routing of router probabilities probs [T, E] (fp32). Returns the routing and the top-k expert ids
    [T, k]. With `capacity`, an expert keeps its first `capacity` rows in priority order; the others are dropped
    (weight 0, `keep` False)."""
    tokens, experts = probs.shape
    top_w, top_e = probs.topk(top_k, dim=-1)
    if normalize and top_k > 1:
        top_w = top_w / top_w.sum(-1, keepdim=True)
    flat_e = top_e.t().reshape(-1)                                   # slot-major: priority order
    expert, order = torch.sort(flat_e, stable=True)
    token = order % tokens
    weight = top_w.t().reshape(-1)[order]
    counts = torch.zeros(experts, dtype=torch.int64, device=probs.device).index_add_(
        0, flat_e, torch.ones_like(flat_e))
    keep = position = None
    if capacity is not None:
        starts = torch.cumsum(counts, 0) - counts
        position = torch.arange(order.numel(), device=probs.device) - starts[expert]
        keep = position < capacity
        weight = weight * keep
        counts = counts.clamp(max=capacity)
    return Routing(order, token, weight, expert, counts, keep, position), top_e


def load_balancing_loss(probs: torch.Tensor, top_e: torch.Tensor) -> torch.Tensor:
    """Switch-Transformer / GShard auxiliary loss E * sum_e f_e * P_e: f_e the fraction of the T*k assignments
    routed to expert e (before any capacity drop, not differentiable), P_e the mean router probability of e.
    It is 1 for perfectly uniform routing and grows as routing concentrates."""
    experts = probs.shape[-1]
    f = torch.zeros(experts, dtype=probs.dtype, device=probs.device).index_add_(
        0, top_e.reshape(-1), torch.ones(top_e.numel(), dtype=probs.dtype, device=probs.device)) / top_e.numel()
    return experts * torch.sum(f * probs.mean(0))


class MOELayer(nn.Module):
    """Mixture of Experts, as in the seed article:

        moe = MOELayer(input_dim=4096, num_experts=8, top_k=2, expert_capacity=32)
        y = moe(x)            # x [..., input_dim] -> y [..., input_dim]; moe.aux_loss holds the balancing loss

    Every expert is a two-layer FFN  act(x W1_e + b1_e) W2_e + b2_e  (hidden_dim, default input_dim); all experts
    run in two grouped_matmul calls. The router is a bias-free linear layer followed by a softmax (fp32); the top_k
    weights are renormalised to sum to 1 when top_k > 1 (normalize_weights). expert_capacity=None is dropless;
    an int C keeps at most C rows per expert (capacity drop: a dropped assignment contributes nothing, so a token
    whose every choice is dropped gets 0; add the residual outside). Inputs of another dtype than the parameters are
    computed in the parameters' dtype and returned in the input's dtype.

    Expert parallel: with process_group, the group's W ranks each hold num_experts / W experts (rank r: experts
    [r*E/W, (r+1)*E/W)), route their own tokens and exchange the routed rows with all_to_all_single (autograd-aware)
    so each expert sees the rows of every rank; expert_capacity is enforced by the owner over the rows of all ranks
    in the single-process priority order. The gate is replicated: average (or sum) its gradients over the group
    like any data-parallel parameter.
    """

    def __init__(self, input_dim: int, num_experts: int, top_k: int = 2, expert_capacity: Optional[int] = None,
                 hidden_dim: Optional[int] = None, activation: str = "gelu", normalize_weights: bool = True,
                 process_group=None, device=None, dtype=None):
        super().__init__()
        _check_config(input_dim, num_experts, top_k, expert_capacity, activation)
        self.input_dim, self.num_experts, self.top_k = input_dim, num_experts, top_k
        self.expert_capacity = expert_capacity
        self.hidden_dim = hidden_dim or input_dim
        self.activation = activation
        self.act_type = ACT_TYPES[activation]
        self.normalize_weights = normalize_weights
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group) if process_group is not None else 1
        self.rank = dist.get_rank(process_group) if process_group is not None else 0
        if num_experts % self.world_size:
            raise ValueError(f"MOELayer: num_experts ({num_experts}) must be divisible by the process group's size "
                             f"({self.world_size})")
        self.local_experts = num_experts // self.world_size
        kw = {"device": device, "dtype": dtype}
        self.gate = nn.Linear(input_dim, num_experts, bias=False, **kw)
        e, h, f = self.local_experts, input_dim, self.hidden_dim
        self.w1 = nn.Parameter(torch.empty(e, h, f, **kw))
        self.b1 = nn.Parameter(torch.zeros(e, f, **kw))
        self.w2 = nn.Parameter(torch.empty(e, f, h, **kw))
        self.b2 = nn.Parameter(torch.zeros(e, h, **kw))
        nn.init.normal_(self.w1, std=h ** -0.5)
        nn.init.normal_(self.w2, std=f ** -0.5)
        self.aux_loss: Optional[torch.Tensor] = None

    def extra_repr(self) -> str:
        return (f"input_dim={self.input_dim}, num_experts={self.num_experts}, top_k={self.top_k}, "
                f"expert_capacity={self.expert_capacity}, hidden_dim={self.hidden_dim}, "
                f"activation={self.activation!r}, world_size={self.world_size}")

    def experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The local experts' FFN over rows grouped by expert (counts[e] rows for local expert e)."""
        h, _ = torch.ops.npu_fa.grouped_matmul([rows], [self.w1], [self.b1], counts, 0, 1, self.act_type)
        y, _ = torch.ops.npu_fa.grouped_matmul(h, [self.w2], [self.b2], counts, 0, 1, 0)
        return y[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.input_dim:
            raise ValueError(f"MOELayer: the input's last dimension must be input_dim={self.input_dim}; got shape "
                             f"{tuple(x.shape)}")
        in_dtype, shape = x.dtype, x.shape
        x2 = x.reshape(-1, self.input_dim).to(self.w1.dtype)
        probs = torch.softmax(self.gate(x2).float(), dim=-1)
        # Expert parallel: the capacity is enforced by each expert's owner, over the rows of every rank.
        local_capacity = self.expert_capacity if self.process_group is None else None
        routing, top_e = route(probs, self.top_k, self.normalize_weights, local_capacity)
        self.aux_loss = load_balancing_loss(probs, top_e)
        if self.process_group is None:
            y = self._dispatch_local(x2, routing)
        else:
            y = self._dispatch_expert_parallel(x2, routing)
        out = torch.zeros_like(x2).index_add_(0, routing.token, y * routing.weight.to(y.dtype).unsqueeze(1))
        return out.reshape(shape).to(in_dtype)

    def _dispatch_local(self, x2: torch.Tensor, routing: Routing) -> torch.Tensor:
        """Expert outputs for every routed row (rows in routing order)."""
        if routing.keep is None:
            return self.experts(x2[routing.token], routing.counts)
        # Capacity mode, static shapes: E*C slots (empty slots are zero rows, computed and discarded); dropped
        # rows go to one extra slot that is cut off before the experts and read back as zeros.
        cap, experts = self.expert_capacity, self.num_experts
        slot = _capacity_slots(routing, cap, experts)
        rows = x2.new_zeros(experts * cap + 1, x2.shape[1]).index_copy(0, slot, x2[routing.token])
        counts = torch.full((experts,), cap, dtype=torch.int64, device=x2.device)
        y = self.experts(rows[:-1], counts)
        y = torch.cat([y, y.new_zeros(1, y.shape[1])])
        return y[slot]

    def _dispatch_expert_parallel(self, x2: torch.Tensor, routing: Routing) -> torch.Tensor:
        from torch.distributed.nn.functional import all_to_all_single

        world, local, group = self.world_size, self.local_experts, self.process_group
        send_counts = routing.counts.view(world, local)                # rows for (destination rank, its expert)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)  # [source rank, local expert]
        send_splits = send_counts.sum(1).tolist()
        recv_splits = recv_counts.sum(1).tolist()
        sent = x2[routing.token]
        received = all_to_all_single(sent.new_empty(sum(recv_splits), sent.shape[1]), sent, recv_splits,
                                     send_splits, group=group)
        # Rows arrive grouped by source rank, then expert: regroup by expert (stable, so by source rank inside).
        expert_of_row = torch.repeat_interleave(
            torch.arange(local, device=x2.device).repeat(world), recv_counts.reshape(-1))
        if self.expert_capacity is None:
            perm = torch.sort(expert_of_row, stable=True).indices
            y = self.experts(received[perm], recv_counts.sum(0))
        else:
            perm, y = self._capacity_experts(received, expert_of_row, routing, x2.shape[0], send_splits,
                                             recv_splits)
        y_back = torch.empty_like(y).index_copy(0, perm, y)            # back to arrival order
        return all_to_all_single(y_back.new_empty(sent.shape[0], y_back.shape[1]), y_back, send_splits,
                                 recv_splits, group=group)

    def _capacity_experts(self, received, expert_of_row, routing, tokens, send_splits, recv_splits):
        """Capacity drop at the expert's owner, in the single-process layer's priority order over the global batch
        (the ranks' tokens concatenated in rank order): each row travels with its key choice*T_global + global
        token index; an expert keeps its `expert_capacity` smallest keys, dropped rows return zeros."""
        group, cap = self.process_group, self.expert_capacity
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([tokens]), group=group)
        sizes = torch.cat(sizes)
        offset, total = int(sizes[:self.rank].sum()), int(sizes.sum())
        key = (routing.order // tokens) * total + offset + routing.token
        recv_key = torch.empty(sum(recv_splits), dtype=key.dtype)
        dist.all_to_all_single(recv_key, key, recv_splits, send_splits, group=group)
        perm = torch.argsort(expert_of_row * (self.top_k * total) + recv_key)
        expert = expert_of_row[perm]
        counts = torch.zeros(self.local_experts, dtype=torch.int64).index_add_(0, expert, torch.ones_like(expert))
        position = torch.arange(expert.numel()) - (torch.cumsum(counts, 0) - counts)[expert]
        kept = (position < cap).nonzero().squeeze(1)
        y = self.experts(received[perm][kept], counts.clamp(max=cap))
        return perm, y.new_zeros(perm.numel(), y.shape[1]).index_copy(0, kept, y)


def _capacity_slots(routing: Routing, cap: int, experts: int) -> torch.Tensor:
    """Slot expert*cap + position of each kept row; experts*cap (the discard slot) for dropped rows."""
    expert = routing.expert
    return torch.where(routing.keep, expert * cap + routing.position, torch.full_like(expert, experts * cap))


def _check_config(input_dim, num_experts, top_k, expert_capacity, activation):
    if input_dim <= 0 or num_experts <= 0:
        raise ValueError(f"MOELayer: input_dim and num_experts must be positive; got {input_dim}, {num_experts}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"MOELayer: top_k must be in [1, num_experts={num_experts}]; got {top_k}")
    if expert_capacity is not None and expert_capacity <= 0:
        raise ValueError(f"MOELayer: expert_capacity must be a positive number of tokens per expert or None "
                         f"(dropless); got {expert_capacity}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"MOELayer: activation must be one of {_ACTIVATIONS}; got {activation!r}")
