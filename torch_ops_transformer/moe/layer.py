"""MOELayer: a Mixture-of-Experts layer (gate -> route -> grouped expert FFN -> combine) on the
routing ops (moe_gating_top_k_softmax(_v2), moe_init_routing_v2, moe_finalize_routing) and grouped_matmul,
single-process or expert-parallel over a torch.distributed process group. See docs/moe.md."""
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from .fused_ffn import MoeFfnWeights, needs_grad
from .grouped_matmul import ACT_TYPES
from .routing import npu_moe_init_routing_v2

_OPS = torch.ops.npu_fa
_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu", "fast_gelu")
_FUSED_ACT = {"gelu": "gelu_tanh", "gelu_tanh": "gelu_tanh", "relu": "relu", "silu": "silu", "fast_gelu": "fast_gelu"}


def load_balancing_loss(probs: torch.Tensor, expert_idx: torch.Tensor) -> torch.Tensor:
    """Switch-Transformer / GShard auxiliary loss E * sum_e f_e * P_e: f_e the fraction of the T*k assignments
    routed to expert e (before any capacity drop, not differentiable), P_e the mean router probability of e.
    It is 1 for perfectly uniform routing and grows as routing concentrates; 0 for an empty batch."""
    experts = probs.shape[-1]
    flat = expert_idx.reshape(-1).long()
    if flat.numel() == 0:  # an empty batch: no assignments, no imbalance (and a zero gradient for the router)
        return probs.sum() * 0
    f = torch.zeros(experts, dtype=probs.dtype, device=probs.device).index_add_(
        0, flat, torch.ones(flat.numel(), dtype=probs.dtype, device=probs.device)) / flat.numel()
    return experts * torch.sum(f * probs.mean(0))


class MOELayer(nn.Module):
    """Mixture of Experts:

        moe = MOELayer(input_dim=4096, num_experts=8, top_k=2, expert_capacity=32)
        y = moe(x)            # x [..., input_dim] -> y [..., input_dim]; moe.aux_loss holds the balancing loss

    Every expert is a two-layer FFN  act(x W1_e + b1_e) W2_e + b2_e  (hidden_dim, default input_dim); all experts
    run in two grouped_matmul calls. The router is a bias-free linear layer; its top_k weights are the softmax
    probabilities (fp32), renormalised over the k when top_k > 1 and normalize_weights (moe_gating_top_k_softmax_v2
    renorm=1). Routing is moe_init_routing_v2 (CANN's token-major pair order); combining is moe_finalize_routing.
    expert_capacity=None is dropless; an int C keeps at most C rows per expert, in token order (drop/pad mode: a
    dropped assignment contributes nothing; add the residual outside). Inputs of another dtype than the parameters
    are computed in the parameters' dtype and returned in the input's dtype. An empty batch (0 tokens) returns an
empty result (aux_loss 0) and backward gives zero gradients; expert-parallel, a rank may have 0 tokens.

    Expert parallel: with process_group, the group's W ranks each hold num_experts / W experts (rank r: experts
    [r*E/W, (r+1)*E/W)), route their own tokens and exchange the routed rows with all_to_all_single (autograd-aware)
    so each expert sees the rows of every rank; expert_capacity is enforced by the owner over the rows of all ranks
    in the single-process order (the ranks' tokens concatenated in rank order). The gate is replicated: average (or
    sum) its gradients over the group like any data-parallel parameter.

    Inference: when autograd would record nothing (torch.no_grad() / inference_mode, or neither the input nor any
    parameter requires grad) and the layer is single-process and dropless, the experts run as one fused moe_ffn
    call on weights packed once and cached (repacked when a parameter changes: data pointer or version counter).
    Set `fused_inference = False` to always take the grouped_matmul path.
    """

    fused_inference = True

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
        self._packed = MoeFfnWeights(_FUSED_ACT[activation], "kn")

    def extra_repr(self) -> str:
        return (f"input_dim={self.input_dim}, num_experts={self.num_experts}, top_k={self.top_k}, "
                f"expert_capacity={self.expert_capacity}, hidden_dim={self.hidden_dim}, "
                f"activation={self.activation!r}, world_size={self.world_size}")

    def experts(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The local experts' FFN over rows grouped by expert (counts[e] rows for local expert e)."""
        h, _ = _OPS.grouped_matmul([rows], [self.w1], [self.b1], counts, 0, 1, self.act_type)
        y, _ = _OPS.grouped_matmul(h, [self.w2], [self.b2], counts, 0, 1, 0)
        return y[0]

    def gating(self, x2: torch.Tensor):
        """(combine weights [T, k] fp32, expert ids [T, k] int32, router probabilities [T, E] fp32)."""
        logits = self.gate(x2).float()
        if self.normalize_weights and self.top_k > 1:
            weights, expert_idx, _ = _OPS.moe_gating_top_k_softmax_v2(logits, None, self.top_k, 1, False)
        else:
            weights, expert_idx, _ = _OPS.moe_gating_top_k_softmax(logits, None, self.top_k)
        return weights, expert_idx, torch.softmax(logits, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.input_dim:
            raise ValueError(f"MOELayer: the input's last dimension must be input_dim={self.input_dim}; got shape "
                             f"{tuple(x.shape)}")
        in_dtype, shape = x.dtype, x.shape
        x2 = x.reshape(-1, self.input_dim).to(self.w1.dtype)
        weights, expert_idx, probs = self.gating(x2)
        self.aux_loss = load_balancing_loss(probs, expert_idx)
        if self._fused_ok(x2):
            out = self._packed(x2, self.w1, self.w2, weights, expert_idx, self.b1, self.b2)
            return out.reshape(shape).to(in_dtype)
        if self.process_group is None:
            y, row_idx, mode = self._experts_local(x2, expert_idx)
        else:
            y, row_idx, mode = self._experts_parallel(x2, expert_idx)
        if x2.shape[0] == 0:
            # An empty batch: nothing to combine (moe_finalize_routing cannot infer k from zero rows). The empty
            # output still depends on every expert output, so backward gives zero gradients and, expert-parallel,
            # still runs this rank's side of the reverse exchange that the other ranks' backward waits for.
            out = x2 * 0 + (y.sum().to(x2.dtype) + weights.sum().to(x2.dtype)) * 0
        else:
            out = _OPS.moe_finalize_routing(y, None, None, None, weights.to(y.dtype), row_idx, expert_idx, mode)
        return out.reshape(shape).to(in_dtype)

    def _fused_ok(self, x2: torch.Tensor) -> bool:
        return (self.fused_inference and self.process_group is None and self.expert_capacity is None
                and x2.device.type == "cpu" and not needs_grad(x2, self.w1, self.b1, self.w2, self.b2))

    def _experts_local(self, x2: torch.Tensor, expert_idx: torch.Tensor):
        """(expert outputs, expanded_row_idx, finalize drop_pad_mode): dropless rows [T*k, H], or with a capacity
        the [E, C, H] layout in which empty slots are zero rows (computed, then never read)."""
        cap, experts = self.expert_capacity, self.num_experts
        if cap is None:
            rows, row_idx, counts, _ = npu_moe_init_routing_v2(
                x2, expert_idx, expert_num=experts, expert_tokens_num_type=1, expert_tokens_num_flag=True)
            return self.experts(rows, counts), row_idx, 2
        rows, row_idx, _, _ = npu_moe_init_routing_v2(
            x2, expert_idx, expert_capacity=cap, expert_num=experts, drop_pad_mode=1, expert_tokens_num_type=1,
            expert_tokens_num_flag=True)
        counts = torch.full((experts,), cap, dtype=torch.int64, device=x2.device)
        y = self.experts(rows.reshape(experts * cap, -1), counts)
        return y.reshape(experts, cap, -1), row_idx, 3

    def _experts_parallel(self, x2: torch.Tensor, expert_idx: torch.Tensor):
        world, local, group = self.world_size, self.local_experts, self.process_group
        rows, row_idx, counts, _ = npu_moe_init_routing_v2(
            x2, expert_idx, expert_num=self.num_experts, expert_tokens_num_type=1, expert_tokens_num_flag=True)
        send_counts = counts.view(world, local)                        # rows for (destination rank, its expert)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=group)  # [source rank, local expert]
        send_splits = send_counts.sum(1).tolist()
        recv_splits = recv_counts.sum(1).tolist()
        received = _AllToAllRows.apply(rows, recv_splits, send_splits, group)
        # Rows arrive grouped by source rank, then expert: regroup by expert (stable, so by source rank inside).
        expert_of_row = torch.repeat_interleave(
            torch.arange(local, device=x2.device).repeat(world), recv_counts.reshape(-1))
        if self.expert_capacity is None:
            perm = torch.sort(expert_of_row, stable=True).indices
            y = self.experts(received[perm], recv_counts.sum(0))
        else:
            perm, y = self._capacity_experts(received, expert_of_row, row_idx, x2.shape[0], send_splits,
                                             recv_splits)
        y_back = torch.empty_like(y).index_copy(0, perm, y)            # back to arrival order
        back = _AllToAllRows.apply(y_back, send_splits, recv_splits, group)
        return back, row_idx, 2

    def _capacity_experts(self, received, expert_of_row, row_idx, tokens, send_splits, recv_splits):
        """Capacity drop at the expert's owner in the single-process order over the global batch: each row travels
        with its global pair index (global token * k + choice); an expert keeps its `expert_capacity` smallest,
        dropped rows return zeros."""
        group, cap, k = self.process_group, self.expert_capacity, self.top_k
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([tokens]), group=group)
        sizes = torch.cat(sizes)
        offset, total = int(sizes[:self.rank].sum()), int(sizes.sum())
        pair_of_row = torch.empty_like(row_idx, dtype=torch.int64).index_copy_(
            0, row_idx.long(), torch.arange(row_idx.numel()))
        key = offset * k + pair_of_row
        recv_key = torch.empty(sum(recv_splits), dtype=key.dtype)
        dist.all_to_all_single(recv_key, key, recv_splits, send_splits, group=group)
        perm = torch.argsort(expert_of_row * (k * total) + recv_key)
        expert = expert_of_row[perm]
        counts = torch.zeros(self.local_experts, dtype=torch.int64).index_add_(0, expert, torch.ones_like(expert))
        position = torch.arange(expert.numel()) - (torch.cumsum(counts, 0) - counts)[expert]
        kept = (position < cap).nonzero().squeeze(1)
        y = self.experts(received[perm][kept], counts.clamp(max=cap))
        return perm, y.new_zeros(perm.numel(), y.shape[1]).index_copy(0, kept, y)


class _AllToAllRows(torch.autograd.Function):
    """Differentiable variable-size all-to-all of rows: its backward is the reverse exchange. Our own (on the plain
    synchronous `dist.all_to_all_single`) rather than the deprecated `torch.distributed.nn.functional` wrapper."""

    @staticmethod
    def forward(ctx, rows, recv_splits, send_splits, group):
        ctx.splits, ctx.group = (recv_splits, send_splits), group
        out = rows.new_empty(sum(recv_splits), *rows.shape[1:])
        dist.all_to_all_single(out, rows.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        recv_splits, send_splits = ctx.splits
        back = grad.new_empty(sum(send_splits), *grad.shape[1:])
        dist.all_to_all_single(back, grad.contiguous(), send_splits, recv_splits, group=ctx.group)
        return back, None, None, None


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
