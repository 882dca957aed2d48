"""Serving-style MoE blocks on the routing ops and grouped_matmul (docs/moe.md, "MoE blocks").

    block = DeepseekV3MoEBlock.from_hf(hf_model.model.layers[3].mlp)   # shares the HF module's parameters
    y = block(hidden_states)                                            # [..., H] -> [..., H]

The routed experts run as serving engines run them: one `moe_init_routing_v2` (rows grouped by expert), one
`grouped_matmul` for every expert's gate and up projections, SwiGLU, one `grouped_matmul` for the down
projections, and `moe_finalize_routing` to weight and sum each token's expert rows — with the shared expert's
output folded into that sum as its skip input. Gating is `moe_gating_top_k` (DeepSeek-V3: sigmoid scores, the
correction bias steering selection only, group-limited top-k) or `moe_gating_top_k_softmax(_v2)` (Qwen3-MoE).

W8A8 inference: `block.quantize_experts()` turns the routed experts into W8A8GroupedExperts (int8 weights with
float32 per-output-channel scales; activations quantised per token by moe_init_routing_v2 quant_mode 1, or by the
dispatch's int8 mode when sharded; grouped_matmul_swiglu_quant, then a W8A8 grouped_matmul for the down projection).

Parameter names and layouts are those of Hugging Face transformers' blocks (`gate.weight`,
`gate.e_score_correction_bias`, `experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I],
`shared_experts.{gate,up,down}_proj.weight`), so state dicts load either way; grouped_matmul takes the [E, K, N]
operands as transposed views (no copy).
"""
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .._internal.args import DTYPE_CODES
from .distribute import npu_moe_distribute_combine_v2, npu_moe_distribute_dispatch_v2
from .fused_ffn import MoeFfnWeights, needs_grad

_OPS = torch.ops.npu_fa
# The op arguments these blocks use (docs/moe.md): dropless routing, per-expert counts (not a cumsum) as the group
# list, token-major pair order on the way back (finalize mode 2), int8 rows with a per-row scale (quant mode 1).
DROPLESS = 0            # moe_init_routing_v2 drop_pad_mode
COUNTS = 1              # moe_init_routing_v2 expert_tokens_num_type, grouped_matmul(_quant) group_list_type
NO_QUANT, PER_ROW_INT8 = -1, 1   # moe_init_routing_v2 quant_mode
TOKEN_MAJOR_DROPLESS = 2         # moe_finalize_routing drop_pad_mode: pairs f = i*k + j, no capacity
SPLIT_M = 0             # grouped_matmul group_type: the rows of x are split into the experts' groups
NO_ACTIVATION = 0       # grouped_matmul act_type
SIGMOID, GROUP_TOP2_SUM = 1, 1   # moe_gating_top_k norm_type, group_select_mode (a group scores its two best)


def _route(x, idx, experts, quant_mode):
    """moe_init_routing_v2, dropless: the routed rows grouped by expert, their row index, the per-expert counts
    and (quant_mode 1) the rows' scales."""
    return _OPS.moe_init_routing_v2(x, idx, expert_num=experts, drop_pad_mode=DROPLESS,
                                    expert_tokens_num_type=COUNTS, expert_tokens_num_flag=True, quant_mode=quant_mode)


def _grouped(x, weight, bias, counts):
    """One grouped_matmul over the experts' row groups (`counts` rows each)."""
    return _OPS.grouped_matmul([x], [weight], [] if bias is None else [bias], counts, group_type=SPLIT_M,
                               group_list_type=COUNTS, act_type=NO_ACTIVATION)[0][0]


def _grouped_int8(x, weight, weight_scale, x_scale, counts, dtype):
    """grouped_matmul_quant of int8 rows and weights, dequantised with both scales into `dtype`."""
    return _OPS.grouped_matmul_quant([x], [weight], [], [weight_scale], [x_scale], [], [], counts, group_type=SPLIT_M,
                                     group_list_type=COUNTS, act_type=NO_ACTIVATION,
                                     output_dtype=DTYPE_CODES[dtype])[0]


def _combine(y, skip, weights, row_idx, idx):
    """moe_finalize_routing: skip + the weighted sum of each token's k expert rows (fp32)."""
    return _OPS.moe_finalize_routing(y, skip, None, None, weights, row_idx, idx, drop_pad_mode=TOKEN_MAJOR_DROPLESS)

# The gated activations of transformers' configs (hidden_act) that the blocks accept.
_ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu,
                "gelu_pytorch_tanh": lambda t: F.gelu(t, approximate="tanh")}


def _activation(op: str, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in _ACTIVATIONS:
        raise ValueError(f"{op}: argument 'hidden_act' must be one of {sorted(_ACTIVATIONS)}; got {name!r}")
    return _ACTIVATIONS[name]


def gated(activation: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """[rows, 2I] -> [rows, I]: activation(first half) * second half (SwiGLU for silu)."""
    def glu(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return activation(gate) * up
    return glu


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(first half) * second half: the swiglu op (torch_npu's npu_swiglu; one pass, fp32 inside)."""
    return _OPS.swiglu(gate_up, -1)


def _glu_of(activation: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    return swiglu if activation is F.silu else gated(activation)


def routed_experts(x: torch.Tensor, expert_idx: torch.Tensor, weights: torch.Tensor, w_gate_up: torch.Tensor,
                   w_down: torch.Tensor, *, skip: Optional[torch.Tensor] = None,
                   glu: Callable[[torch.Tensor], torch.Tensor] = swiglu,
                   bias_gate_up: Optional[torch.Tensor] = None, bias_down: Optional[torch.Tensor] = None
                   ) -> torch.Tensor:
    """skip + sum_j weights[i, j] * expert_{idx[i, j]}(x[i]) with gated experts down(glu(gate_up(x))), dropless.

    x [N, H]; expert_idx [N, k] (any integer dtype, values in [0, E)); weights [N, k] (kept in fp32 if given so:
    the combine accumulates in fp32); w_gate_up [E, H, 2I], w_down [E, I, H] — the [E, K, N] operands of
    grouped_matmul (transposed views are fine); glu maps the [rows, 2I] gate/up output to [rows, I] (default
    SwiGLU: silu(first half) * second half); optional biases [E, 2I] / [E, H]; skip [N, H] is added in the same
    fp32 sum (a shared expert's output). Differentiable in x, weights, the expert weights, the biases and skip."""
    experts = w_gate_up.shape[0]
    idx = expert_idx.to(torch.int32)
    rows, row_idx, counts, _ = _route(x, idx, experts, NO_QUANT)
    y = _grouped(glu(_grouped(rows, w_gate_up, bias_gate_up, counts)), w_down, bias_down, counts)
    return _combine(y, skip, weights, row_idx, idx)


def routed_experts_parallel(x: torch.Tensor, expert_idx: torch.Tensor, weights: torch.Tensor,
                            w_gate_up: torch.Tensor, w_down: torch.Tensor, num_experts: int, group, *,
                            skip: Optional[torch.Tensor] = None,
                            glu: Callable[[torch.Tensor], torch.Tensor] = swiglu) -> torch.Tensor:
    """routed_experts with the experts sharded over the ranks of `group`: rank r holds experts
    [r*E/W, (r+1)*E/W) (w_gate_up [E/W, H, 2I], w_down [E/W, I, H]). As serving engines do it:
    moe_distribute_dispatch_v2 sends each (token, choice) row to its expert's owner (rows arrive grouped by local
    expert, with per-expert counts), the owner runs its experts in two grouped_matmul calls, and
    moe_distribute_combine_v2 sends the results back and sums them with the weights, plus skip (the local shared
    expert's output). Differentiable (dispatch's backward is a combine and vice versa). Equal to routed_experts
    over the ranks' tokens concatenated; ranks may have different token counts, including none."""
    world, rank, global_bs = _ep_layout("routed_experts_parallel", x, w_gate_up.shape[0], num_experts, group)
    idx, w32 = expert_idx.to(torch.int32), weights.float()
    expand_x, _, assist, counts, recv_counts, _, _ = npu_moe_distribute_dispatch_v2(
        x, idx, group, world, rank, num_experts, expert_scales=w32, global_bs=global_bs, expert_token_nums_type=1)
    rows = int(counts.sum())            # expand_x has capacity rows; the received ones come first
    received = expand_x[:rows]
    y = _grouped(glu(_grouped(received, w_gate_up, None, counts)), w_down, None, counts)
    y = F.pad(y, (0, 0, 0, expand_x.shape[0] - rows))
    return npu_moe_distribute_combine_v2(y, idx, assist, recv_counts, w32, group, world, rank, num_experts,
                                         shared_expert_x=skip, global_bs=global_bs).to(x.dtype)


def _ep_layout(op: str, x: torch.Tensor, local: int, num_experts: int, group):
    """(world, rank, global_bs) of an expert-parallel call; checks the experts add up over the ranks."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if local * world != num_experts:
        raise ValueError(f"{op}: {world} ranks holding {local} experts each do not make num_experts={num_experts}")
    # Upstream's static receive capacity: global_bs = the largest batch times W (uneven batches need it).
    max_bs = torch.tensor([x.shape[0]], dtype=torch.int64)
    dist.all_reduce(max_bs, op=dist.ReduceOp.MAX, group=group)
    return world, rank, int(max_bs) * world


class GroupedExperts(nn.Module):
    """E gated experts down_e(act(gate_e(x)) * up_e(x)) stored as transformers stores them:
    gate_up_proj [E, 2I, H] (gate rows, then up rows) and down_proj [E, H, I]."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, hidden_act: str = "silu",
                 device=None, dtype=None):
        super().__init__()
        if num_experts <= 0 or hidden_size <= 0 or intermediate_size <= 0:
            raise ValueError(f"GroupedExperts: num_experts, hidden_size and intermediate_size must be positive; got "
                             f"{num_experts}, {hidden_size}, {intermediate_size}")
        kw = {"device": device, "dtype": dtype}
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.hidden_act = hidden_act
        self.act_fn = _activation("GroupedExperts", hidden_act)
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, **kw))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, **kw))
        nn.init.normal_(self.gate_up_proj, std=hidden_size ** -0.5)
        nn.init.normal_(self.down_proj, std=intermediate_size ** -0.5)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, hidden_act={self.hidden_act!r}")

    process_group = None  # set by shard(): expert parallel over its ranks
    # Inference (autograd recording nothing, single process, SwiGLU, x in the weights' dtype): one fused moe_ffn
    # call on weights packed once (repacked when a parameter changes). False: always the grouped_matmul path.
    fused_inference = True

    def shard(self, process_group) -> "GroupedExperts":
        """Keep only this rank's num_experts / W experts (rank r: [r*E/W, (r+1)*E/W), as new parameters) and run
        expert-parallel over `process_group` from now on. In place; returns self."""
        world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        if self.process_group is not None:
            raise ValueError("GroupedExperts.shard: the experts are already sharded")
        if self.num_experts % world:
            raise ValueError(f"GroupedExperts.shard: num_experts ({self.num_experts}) must be divisible by the "
                             f"process group's size ({world})")
        local = self.num_experts // world
        part = slice(rank * local, (rank + 1) * local)
        self.gate_up_proj = nn.Parameter(self.gate_up_proj.detach()[part].clone())
        self.down_proj = nn.Parameter(self.down_proj.detach()[part].clone())
        self.process_group = process_group
        return self

    def forward(self, x: torch.Tensor, expert_idx: torch.Tensor, weights: torch.Tensor,
                skip: Optional[torch.Tensor] = None) -> torch.Tensor:
        w_gate_up, w_down = self.gate_up_proj.transpose(1, 2), self.down_proj.transpose(1, 2)
        if self.process_group is not None:
            return routed_experts_parallel(x, expert_idx, weights, w_gate_up, w_down, self.num_experts,
                                           self.process_group, skip=skip, glu=_glu_of(self.act_fn))
        if (self.fused_inference and self.act_fn is F.silu and x.device.type == "cpu"
                and x.dtype == self.gate_up_proj.dtype
                and not needs_grad(x, weights, skip, self.gate_up_proj, self.down_proj)):
            packed = self.__dict__.setdefault("_packed", MoeFfnWeights("swiglu", "nk"))
            out = packed(x, self.gate_up_proj, self.down_proj, weights, expert_idx)
            return out if skip is None else out + skip
        return routed_experts(x, expert_idx, weights, w_gate_up, w_down, skip=skip, glu=_glu_of(self.act_fn))


def quantize_per_channel(weight: torch.Tensor):
    """[E, K, N] float weights -> (int8 [E, K, N], float32 scale [E, N]): symmetric per output channel n,
    scale = max_k |w| / 127 and q = round(w / scale) (half to even) computed in float32, so w ~= q * scale.
    An all-zero channel gets scale 1 (q = 0)."""
    if weight.dim() != 3 or not weight.is_floating_point():
        raise ValueError(f"quantize_per_channel: argument 'weight' must be a floating-point [E, K, N] tensor; got "
                         f"{weight.dtype} of shape {tuple(weight.shape)}")
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return torch.round(w / scale.unsqueeze(1)).clamp_(-127, 127).to(torch.int8).contiguous(), scale.contiguous()


def _w8a8_first_half(rows: torch.Tensor, row_scale: torch.Tensor, counts: torch.Tensor, q_gate_up: torch.Tensor,
                     s_gate_up: torch.Tensor, fused: bool):
    """int8 rows (grouped by expert, `counts` per expert) -> (int8 SwiGLU output, its per-row float32 scale)."""
    if fused:  # one kernel: int8 GEMM, dequantisation, SwiGLU and the requantisation
        h, h_scale, _ = _OPS.grouped_matmul_swiglu_quant(rows, q_gate_up, counts, s_gate_up, row_scale,
                                                         group_list_type=COUNTS)
        return h, h_scale
    # the unfused chain: dequantised gate/up kept in float32, swiglu, then dynamic_quant of its rows
    gate_up = _grouped_int8(rows, q_gate_up, s_gate_up, row_scale, counts, torch.float32)
    h, h_scale, _ = _OPS.dynamic_quant(_OPS.swiglu(gate_up, dim=-1), bits=8)
    return h, h_scale


def _w8a8_down(h, h_scale, counts, q_down, s_down, dtype):
    return _grouped_int8(h, q_down, s_down, h_scale, counts, dtype)


def routed_experts_w8a8(x: torch.Tensor, expert_idx: torch.Tensor, weights: torch.Tensor, q_gate_up: torch.Tensor,
                        s_gate_up: torch.Tensor, q_down: torch.Tensor, s_down: torch.Tensor, *,
                        skip: Optional[torch.Tensor] = None, fused: bool = True) -> torch.Tensor:
    """routed_experts with W8A8 SwiGLU experts (inference): int8 weights q_gate_up [E, H, 2I], q_down [E, I, H]
    with float32 per-output-channel scales [E, 2I], [E, H] (quantize_per_channel). moe_init_routing_v2 quant_mode 1
    quantises each routed row per token (int8 + float32 scale); the gate/up grouped matmul dequantises with both
    scales, SwiGLU, per-token requantisation (fused: grouped_matmul_swiglu_quant; else grouped_matmul_quant to
    float32, swiglu, dynamic_quant); the down grouped matmul dequantises into x's dtype; moe_finalize_routing
    weights and sums (+ skip) in float32."""
    idx = expert_idx.to(torch.int32)
    rows, row_idx, counts, row_scale = _route(x, idx, q_gate_up.shape[0], PER_ROW_INT8)
    h, h_scale = _w8a8_first_half(rows, row_scale, counts, q_gate_up, s_gate_up, fused)
    y = _w8a8_down(h, h_scale, counts, q_down, s_down, x.dtype)
    return _combine(y, skip, weights, row_idx, idx)


def routed_experts_parallel_w8a8(x: torch.Tensor, expert_idx: torch.Tensor, weights: torch.Tensor,
                                 q_gate_up: torch.Tensor, s_gate_up: torch.Tensor, q_down: torch.Tensor,
                                 s_down: torch.Tensor, num_experts: int, group, *,
                                 skip: Optional[torch.Tensor] = None, fused: bool = True) -> torch.Tensor:
    """routed_experts_w8a8 with this rank's E/W experts: moe_distribute_dispatch_v2 with quant_mode 2 sends every
    row as int8 with its per-row scale (half the bytes of bf16), the owner runs the W8A8 chain on the received
    rows, moe_distribute_combine_v2 returns the x-dtype results and sums them with the weights plus skip."""
    world, rank, global_bs = _ep_layout("routed_experts_parallel_w8a8", x, q_gate_up.shape[0], num_experts, group)
    idx, w32 = expert_idx.to(torch.int32), weights.float()
    expand_x, x_scale, assist, counts, recv_counts, _, _ = npu_moe_distribute_dispatch_v2(
        x, idx, group, world, rank, num_experts, expert_scales=w32, quant_mode=2, global_bs=global_bs,
        expert_token_nums_type=1)
    rows = int(counts.sum())
    h, h_scale = _w8a8_first_half(expand_x[:rows], x_scale[:rows], counts, q_gate_up, s_gate_up, fused)
    y = F.pad(_w8a8_down(h, h_scale, counts, q_down, s_down, x.dtype), (0, 0, 0, expand_x.shape[0] - rows))
    return npu_moe_distribute_combine_v2(y, idx, assist, recv_counts, w32, group, world, rank, num_experts,
                                         shared_expert_x=skip, global_bs=global_bs).to(x.dtype)


class W8A8GroupedExperts(nn.Module):
    """Inference-only W8A8 SwiGLU experts, as Ascend serving runs quantised MoE: int8 weights with float32
    per-output-channel scales (buffers gate_up_weight [E, H, 2I], gate_up_scale [E, 2I], down_weight [E, I, H],
    down_scale [E, H]; the [E, K, N] layout grouped matmul takes), activations quantised per token on the fly.
    Built from a GroupedExperts (sharded or not: per-channel quantisation does not depend on the shard) with
    `from_experts`; no gradient flows through it."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, fused: bool = True,
                 process_group=None, device=None):
        super().__init__()
        world = 1 if process_group is None else dist.get_world_size(process_group)
        local = num_experts // world
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.fused, self.process_group = bool(fused), process_group
        kw = {"device": device}
        self.register_buffer("gate_up_weight", torch.zeros(local, hidden_size, 2 * intermediate_size,
                                                           dtype=torch.int8, **kw))
        self.register_buffer("gate_up_scale", torch.ones(local, 2 * intermediate_size, **kw))
        self.register_buffer("down_weight", torch.zeros(local, intermediate_size, hidden_size, dtype=torch.int8, **kw))
        self.register_buffer("down_scale", torch.ones(local, hidden_size, **kw))

    @classmethod
    def from_experts(cls, experts: "GroupedExperts", fused: bool = True) -> "W8A8GroupedExperts":
        """Quantise `experts` (its current weights, any float dtype) per output channel."""
        if not isinstance(experts, GroupedExperts):
            raise TypeError(f"W8A8GroupedExperts.from_experts: argument 'experts' must be a GroupedExperts; got "
                            f"{type(experts).__name__}")
        if experts.act_fn is not F.silu:
            raise NotImplementedError(f"W8A8GroupedExperts: only SwiGLU experts (hidden_act 'silu') are implemented; "
                                      f"got hidden_act={experts.hidden_act!r}")
        out = cls(experts.num_experts, experts.hidden_size, experts.intermediate_size, fused,
                  getattr(experts, "process_group", None), device=experts.gate_up_proj.device)
        for name, w in (("gate_up", experts.gate_up_proj), ("down", experts.down_proj)):
            q, s = quantize_per_channel(w.transpose(1, 2))
            getattr(out, f"{name}_weight").copy_(q)
            getattr(out, f"{name}_scale").copy_(s)
        return out

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, fused={self.fused}, W8A8 per-channel/per-token")

    def forward(self, x: torch.Tensor, expert_idx: torch.Tensor, weights: torch.Tensor,
                skip: Optional[torch.Tensor] = None) -> torch.Tensor:
        args = (self.gate_up_weight, self.gate_up_scale, self.down_weight, self.down_scale)
        if self.process_group is not None:
            return routed_experts_parallel_w8a8(x, expert_idx, weights, *args, self.num_experts,
                                                self.process_group, skip=skip, fused=self.fused)
        return routed_experts_w8a8(x, expert_idx, weights, *args, skip=skip, fused=self.fused)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with bias-free Linear layers (a shared expert); transformers' names."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu", device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype, "bias": False}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)
        self.act_fn = _activation("GatedMLP", hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class DeepseekV3Gate(nn.Module):
    """DeepSeek-V3 router: logits = x W^T in fp32, sigmoid scores; the experts are chosen on scores +
    e_score_correction_bias among the topk_group best of n_group groups (a group scores the sum of its top two);
    weights = the chosen scores, renormalised over the k if norm_topk_prob, times routed_scaling_factor."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, n_group: int = 1, topk_group: int = 1,
                 norm_topk_prob: bool = True, routed_scaling_factor: float = 1.0, device=None):
        super().__init__()
        op = "DeepseekV3Gate"
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"{op}: argument 'top_k' must be in [1, num_experts={num_experts}]; got {top_k}")
        if n_group < 1 or num_experts % n_group or not 1 <= topk_group <= n_group:
            raise ValueError(f"{op}: arguments 'n_group' and 'topk_group' must satisfy num_experts % n_group == 0 "
                             f"and 1 <= topk_group <= n_group; got num_experts={num_experts}, n_group={n_group}, "
                             f"topk_group={topk_group}")
        if n_group > 1 and num_experts // n_group < 2:
            raise ValueError(f"{op}: a group is scored by the sum of its top two experts, so n_group > 1 needs at "
                             f"least 2 experts per group; got {num_experts} experts in {n_group} groups")
        if top_k > topk_group * (num_experts // n_group):
            raise ValueError(f"{op}: argument 'top_k' ({top_k}) exceeds the experts of the topk_group={topk_group} "
                             f"kept groups ({topk_group * (num_experts // n_group)})")
        self.hidden_size, self.num_experts, self.top_k = hidden_size, num_experts, top_k
        self.n_group, self.topk_group = n_group, topk_group
        self.norm_topk_prob, self.routed_scaling_factor = norm_topk_prob, float(routed_scaling_factor)
        # fp32 like transformers' router (kept in fp32 there when the model is loaded in another dtype).
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, device=device, dtype=torch.float32))
        nn.init.normal_(self.weight, std=hidden_size ** -0.5)
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts, device=device, dtype=torch.float32))

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_experts={self.num_experts}, top_k={self.top_k}, "
                f"n_group={self.n_group}, topk_group={self.topk_group}, norm_topk_prob={self.norm_topk_prob}, "
                f"routed_scaling_factor={self.routed_scaling_factor}")

    def forward(self, x2: torch.Tensor):
        """(weights [N, k] fp32, expert_idx [N, k] int32, router logits [N, E] fp32)."""
        logits = F.linear(x2.float(), self.weight.float())
        bias = self.e_score_correction_bias.float()
        y, idx, _ = _OPS.moe_gating_top_k(logits, self.top_k, bias, k_group=self.topk_group,
                                          group_count=self.n_group, group_select_mode=GROUP_TOP2_SUM,
                                          norm_type=SIGMOID, routed_scaling_factor=self.routed_scaling_factor,
                                          eps=1e-20)
        if not self.norm_topk_prob:  # the op always renormalises sigmoid scores: take them unnormalised instead
            y = torch.sigmoid(logits).gather(1, idx.long()) * self.routed_scaling_factor
        return y, idx, logits


class SoftmaxTopKGate(nn.Module):
    """Qwen3-MoE / Mixtral router: softmax over the expert logits (fp32), top-k, renormalised over the k when
    norm_topk_prob. The logits are computed in the input's dtype, as transformers does."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, norm_topk_prob: bool = True, device=None,
                 dtype=None):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"SoftmaxTopKGate: argument 'top_k' must be in [1, num_experts={num_experts}]; got "
                             f"{top_k}")
        self.hidden_size, self.num_experts, self.top_k, self.norm_topk_prob = hidden_size, num_experts, top_k, \
            norm_topk_prob
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=hidden_size ** -0.5)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_experts={self.num_experts}, top_k={self.top_k}, "
                f"norm_topk_prob={self.norm_topk_prob}")

    def forward(self, x2: torch.Tensor):
        logits = F.linear(x2, self.weight).float()
        if self.norm_topk_prob:  # renorm 1: top-k of the logits, softmax over the k = renormalised top-k probs
            y, idx, _ = _OPS.moe_gating_top_k_softmax_v2(logits, k=self.top_k, renorm=1)
        else:
            y, idx, _ = _OPS.moe_gating_top_k_softmax(logits, k=self.top_k)
        return y, idx, logits


class DeepseekV3MoEBlock(nn.Module):
    """DeepSeek-V3 MoE block: routed experts (group-limited sigmoid gating with bias correction) plus
    n_shared_experts shared experts fused into one MLP of width n_shared_experts * moe_intermediate_size.

        block = DeepseekV3MoEBlock(hidden_size=7168, moe_intermediate_size=2048, n_routed_experts=256,
                                   num_experts_per_tok=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)
        block = DeepseekV3MoEBlock.from_hf(hf_deepseek_v3_moe)    # or from transformers' module

    The output has the input's dtype; the combine (routed sum plus the shared expert) accumulates in fp32.
    The router runs in fp32 whatever the input dtype, as transformers' does."""

    def __init__(self, hidden_size: int, moe_intermediate_size: int, n_routed_experts: int, num_experts_per_tok: int,
                 n_group: int = 1, topk_group: int = 1, norm_topk_prob: bool = True,
                 routed_scaling_factor: float = 1.0, n_shared_experts: int = 1, hidden_act: str = "silu",
                 device=None, dtype=None):
        super().__init__()
        if n_shared_experts < 0:
            raise ValueError(f"DeepseekV3MoEBlock: argument 'n_shared_experts' must be >= 0; got {n_shared_experts}")
        self.hidden_size = hidden_size
        self.gate = DeepseekV3Gate(hidden_size, n_routed_experts, num_experts_per_tok, n_group, topk_group,
                                   norm_topk_prob, routed_scaling_factor, device=device)
        self.experts = GroupedExperts(n_routed_experts, hidden_size, moe_intermediate_size, hidden_act, device,
                                      dtype)
        self.shared_experts = (GatedMLP(hidden_size, moe_intermediate_size * n_shared_experts, hidden_act, device,
                                        dtype) if n_shared_experts else None)

    @classmethod
    def from_config(cls, config, device=None, dtype=None) -> "DeepseekV3MoEBlock":
        """From a transformers DeepseekV3Config (or any object with its attribute names)."""
        experts = getattr(config, "n_routed_experts", None) or getattr(config, "num_local_experts")
        return cls(config.hidden_size, config.moe_intermediate_size, experts, config.num_experts_per_tok,
                   config.n_group or 1, config.topk_group or 1, config.norm_topk_prob, config.routed_scaling_factor,
                   config.n_shared_experts or 0, config.hidden_act, device=device, dtype=dtype)

    @classmethod
    def from_hf(cls, module: nn.Module) -> "DeepseekV3MoEBlock":
        """A block sharing the parameters and buffers of transformers' DeepseekV3MoE `module` (no copy: training
        either one trains both)."""
        _check_hf(module, ("gate", "experts", "shared_experts"), "DeepseekV3MoE")
        gate, experts = module.gate, module.experts
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block.hidden_size = gate.hidden_dim
        block.gate = DeepseekV3Gate.__new__(DeepseekV3Gate)
        nn.Module.__init__(block.gate)
        g = block.gate
        g.hidden_size, g.num_experts, g.top_k = gate.hidden_dim, gate.num_experts, gate.top_k
        g.n_group, g.topk_group = gate.num_group, gate.topk_group
        g.norm_topk_prob, g.routed_scaling_factor = bool(gate.norm_topk_prob), float(gate.routed_scaling_factor)
        g.weight = gate.weight
        g.register_buffer("e_score_correction_bias", gate.e_score_correction_bias)
        block.experts = _experts_from_hf(experts, module.config.hidden_act)
        shared = module.shared_experts
        block.shared_experts = GatedMLP.__new__(GatedMLP)
        nn.Module.__init__(block.shared_experts)
        for name in ("gate_proj", "up_proj", "down_proj"):
            setattr(block.shared_experts, name, getattr(shared, name))
        block.shared_experts.act_fn = _activation("DeepseekV3MoEBlock.from_hf", module.config.hidden_act)
        return block

    def shard_experts(self, process_group) -> "DeepseekV3MoEBlock":
        """Expert parallel: keep this rank's share of the routed experts (GroupedExperts.shard); the gate and the
        shared expert stay replicated (average their gradients over the group like data-parallel parameters)."""
        self.experts.shard(process_group)
        return self

    def quantize_experts(self, fused: bool = True) -> "DeepseekV3MoEBlock":
        """W8A8 inference: replace the routed experts by W8A8GroupedExperts quantised from their current weights
        (after shard_experts too). The gate and the shared expert stay in the model's dtype. Returns self."""
        if not isinstance(self.experts, GroupedExperts):
            raise ValueError("DeepseekV3MoEBlock.quantize_experts: the experts are already quantised")
        self.experts = W8A8GroupedExperts.from_experts(self.experts, fused)
        return self

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x2 = _tokens("DeepseekV3MoEBlock", hidden_states, self.hidden_size)
        weights, idx, _ = self.gate(x2)
        shared = self.shared_experts(x2) if self.shared_experts is not None else None
        return self.experts(x2, idx, weights, skip=shared).reshape(shape)


def _tokens(block: str, hidden_states: torch.Tensor, hidden_size: int) -> torch.Tensor:
    """A block's input [..., hidden_size] as [tokens, hidden_size]."""
    if hidden_states.shape[-1] != hidden_size:
        raise ValueError(f"{block}: the input's last dimension must be hidden_size={hidden_size}; got shape "
                         f"{tuple(hidden_states.shape)}")
    return hidden_states.reshape(-1, hidden_size)


class Qwen3MoeBlock(nn.Module):
    """Qwen3-MoE sparse block: softmax top-k gating (renormalised over the k when norm_topk_prob), routed experts,
    no shared expert. `Qwen3MoeBlock.from_hf(hf_qwen3_moe_sparse_moe_block)` shares that module's parameters."""

    def __init__(self, hidden_size: int, moe_intermediate_size: int, num_experts: int, num_experts_per_tok: int,
                 norm_topk_prob: bool = True, hidden_act: str = "silu", device=None, dtype=None):
        super().__init__()
        self.hidden_size = hidden_size
        self.gate = SoftmaxTopKGate(hidden_size, num_experts, num_experts_per_tok, norm_topk_prob, device, dtype)
        self.experts = GroupedExperts(num_experts, hidden_size, moe_intermediate_size, hidden_act, device, dtype)

    @classmethod
    def from_hf(cls, module: nn.Module) -> "Qwen3MoeBlock":
        _check_hf(module, ("gate", "experts"), "Qwen3MoeSparseMoeBlock")
        gate = module.gate
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block.hidden_size = gate.hidden_dim
        block.gate = SoftmaxTopKGate.__new__(SoftmaxTopKGate)
        nn.Module.__init__(block.gate)
        g = block.gate
        g.hidden_size, g.num_experts, g.top_k, g.norm_topk_prob = (gate.hidden_dim, gate.num_experts, gate.top_k,
                                                                   bool(gate.norm_topk_prob))
        g.weight = gate.weight
        block.experts = _experts_from_hf(module.experts, module.experts.config.hidden_act)
        return block

    def shard_experts(self, process_group) -> "Qwen3MoeBlock":
        """Expert parallel: keep this rank's share of the experts (GroupedExperts.shard); the gate stays
        replicated."""
        self.experts.shard(process_group)
        return self

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x2 = _tokens("Qwen3MoeBlock", hidden_states, self.hidden_size)
        weights, idx, _ = self.gate(x2)
        return self.experts(x2, idx, weights).reshape(shape)


def _check_hf(module: nn.Module, parts, expected: str) -> None:
    missing = [p for p in parts if not hasattr(module, p)]
    if missing:
        raise TypeError(f"from_hf: argument 'module' must be transformers' {expected} (with {', '.join(parts)}); "
                        f"got {type(module).__name__} without {', '.join(missing)}")


def _experts_from_hf(experts: nn.Module, hidden_act: str) -> GroupedExperts:
    """GroupedExperts over transformers' 3-D expert parameters (shared, not copied)."""
    for flag, ok in (("is_transposed", False), ("has_bias", False), ("has_gate", True), ("is_concatenated", True),
                     ("has_post_expert_norm", False)):
        if getattr(experts, flag, ok) != ok:
            raise NotImplementedError(f"from_hf: experts with {flag}={not ok} are not supported (transformers' "
                                      f"DeepSeek-V3 / Qwen3-MoE layout: gate_up_proj [E, 2I, H], down_proj [E, H, I])")
    out = GroupedExperts.__new__(GroupedExperts)
    nn.Module.__init__(out)
    e, two_i, h = experts.gate_up_proj.shape
    out.num_experts, out.hidden_size, out.intermediate_size = e, h, two_i // 2
    out.hidden_act = hidden_act
    out.act_fn = _activation("from_hf", hidden_act)
    out.gate_up_proj, out.down_proj = experts.gate_up_proj, experts.down_proj
    return out
