"""Qwen3-Next (hybrid Gated DeltaNet + gated full attention, docs/linear_attention.md "In a model: Qwen3-Next") on
this package's ops, in a transformers `Qwen3NextForCausalLM`.

- `HybridCache` — the caches of every layer: a paged K/V cache per full-attention layer (one `BlockAllocator`, a
  sequence's block table is the same in each), and per Gated DeltaNet layer a conv-state cache [slots, K - 1,
  conv_dim] (torch_npu's npu_fused_causal_conv1d layout) and a recurrent-state cache [slots, Nv, Dv, Dk] (the
  npu_recurrent_gated_delta_rule layout), one slot per live sequence. `prepare(seq_ids, q_lens)` reserves one step.
- `GatedDeltaNetLayer` — one linear-attention layer: transformers' projections (in_proj_qkvz, in_proj_ba, out_proj
  stay nn.Linear), the causal conv over q/k/v with SiLU (`npu_fused_causal_conv1d`, reading and updating the
  conv-state cache), q/k L2-normalised as the model does (fp32, x / sqrt(Σx² + 1e-6)), β = sigmoid(b), g = -exp(A_log)·softplus(a + dt_bias), the gated delta rule
  (`npu_chunk_gated_delta_rule` for a prefill from an empty state, `npu_recurrent_gated_delta_rule` updating the
  state cache in place for decode), the gated RMSNorm, out_proj.
- `GatedAttentionLayer` — one full-attention layer: q_proj (query and its output gate), per-head q/k RMSNorm
  (`npu_rms_norm`), partial rotary embedding (`npu_rotary_mul` on the rotary dims), K/V into the paged cache
  (`npu_scatter_nd_update_`), `npu_fused_infer_attention_score` (TND prefill with sparse mode 3, BSND decode over the
  block table), the sigmoid gate, o_proj.
- `Qwen3NextRunner` — kv_cache.runner.PagedModelRunner over these: ragged prefill, batched decode, greedy `generate`,
  and a packed differentiable `train_forward` / `lm_loss` (the conv as `npu_masked_causal_conv1d` over the batch
  padded to [S, B, conv_dim], the delta rule as `npu_chunk_gated_delta_rule` with its autograd, attention as
  `npu_fusion_attention` TND).

transformers is not imported here: the adapters read the modules' attributes.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention.api import npu_fusion_attention
from ..inference.api import npu_fused_infer_attention_score, optimised_causal_mask
from ..kv_cache.api import BlockAllocator, npu_scatter_nd_update_
from ..kv_cache.runner import PagedModelRunner
from ..norm.api import npu_rms_norm
from ..rope.api import npu_rotary_mul
from .causal_conv1d import npu_fused_causal_conv1d, npu_masked_causal_conv1d
from .chunk_gated_delta_rule import npu_chunk_gated_delta_rule
from .recurrent_gated_delta_rule import npu_recurrent_gated_delta_rule, rms_norm_gated

@dataclass
class HybridBatch:
    """One forward step: sequence b has q_lens[b] new tokens and kv_lens[b] tokens after the step; `slot_mapping`
    (int64 [T], sequence-major) is where the new tokens' K/V go, `block_table` (int32 [B, max_blocks]) the paged
    cache's table, `state_slots` (int32 [B]) each sequence's row of the conv- and recurrent-state caches."""
    seq_ids: List[int]
    q_lens: List[int]
    kv_lens: List[int]
    slot_mapping: Tensor
    block_table: Tensor
    block_size: int
    state_slots: Tensor

    @property
    def is_decode(self) -> bool:
        return all(q == 1 for q in self.q_lens)


@dataclass
class HybridTrainBatch:
    """A packed training step without a cache: sequence b is tokens [cu_seqlens[b-1], cu_seqlens[b]) (cumulative
    ends, the last one T); each attends causally to itself only and starts from an empty state."""
    cu_seqlens: List[int]

    @property
    def q_lens(self) -> List[int]:
        return [e - s for s, e in zip([0] + self.cu_seqlens[:-1], self.cu_seqlens)]


class HybridCache:
    """The caches of a hybrid model's layers (see the module docstring). `attention_layers` / `linear_layers` are the
    model's layer indices of each kind; `kv(layer)` -> (key_cache, value_cache) [num_blocks, block_size, Nkv, D],
    `conv_state(layer)` [max_seqs, K - 1, conv_dim], `ssm_state(layer)` [max_seqs, Nv, Dv, Dk]."""

    def __init__(self, *, num_blocks: int, block_size: int, max_seqs: int, attention_layers: Sequence[int],
                 linear_layers: Sequence[int], num_kv_heads: int, head_dim: int, conv_dim: int, conv_width: int,
                 num_v_heads: int, k_head_dim: int, v_head_dim: int, dtype: torch.dtype,
                 state_dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size), ("max_seqs", max_seqs)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"HybridCache: argument '{name}' must be a positive int; got {v!r}")
        self.allocator = BlockAllocator(num_blocks, block_size, "HybridCache")
        self.block_size, self.device = block_size, device
        self._kv = {i: (torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device),
                        torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=device))
                    for i in attention_layers}
        self._conv = {i: torch.zeros(max_seqs, conv_width - 1, conv_dim, dtype=dtype, device=device)
                      for i in linear_layers}
        self._ssm = {i: torch.zeros(max_seqs, num_v_heads, v_head_dim, k_head_dim, dtype=state_dtype, device=device)
                     for i in linear_layers}
        self._free_slots = list(range(max_seqs - 1, -1, -1))
        self._slot = {}

    def kv(self, layer: int):
        return self._kv[layer]

    def conv_state(self, layer: int) -> Tensor:
        return self._conv[layer]

    def ssm_state(self, layer: int) -> Tensor:
        return self._ssm[layer]

    def add_sequence(self) -> int:
        if not self._free_slots:
            raise RuntimeError(f"HybridCache: out of state slots: all {len(self._slot)} are in use (max_seqs)")
        seq = self.allocator.add_sequence()
        slot = self._free_slots.pop()
        self._slot[seq] = slot
        for cache in list(self._conv.values()) + list(self._ssm.values()):  # a new sequence starts from zeros
            cache[slot].zero_()
        return seq

    def free(self, seq_id: int) -> None:
        self.allocator.free(seq_id)
        self._free_slots.append(self._slot.pop(seq_id))

    def seq_lens(self, seq_ids: Sequence[int]) -> Tensor:
        return self.allocator.seq_lens(seq_ids)

    def prepare(self, seq_ids: Sequence[int], q_lens: Sequence[int]) -> HybridBatch:
        seq_ids, q_lens = [int(s) for s in seq_ids], [int(q) for q in q_lens]
        if len(seq_ids) != len(q_lens) or len(set(seq_ids)) != len(seq_ids) or any(q <= 0 for q in q_lens):
            raise ValueError(f"HybridCache.prepare: arguments 'seq_ids' (distinct) and 'q_lens' (positive) must "
                             f"pair up; got {seq_ids} and {q_lens}")
        slots = self.allocator.reserve([s for s, q in zip(seq_ids, q_lens) for _ in range(q)])
        dev = self.device
        return HybridBatch(seq_ids, q_lens, self.seq_lens(seq_ids).tolist(),
                           torch.tensor(slots, dtype=torch.int64, device=dev),
                           self.allocator.block_table(seq_ids).to(dev), self.block_size,
                           torch.tensor([self._slot[s] for s in seq_ids], dtype=torch.int32, device=dev))


def _cu(lens: Sequence[int], device) -> Tensor:
    """int32 [B + 1]: 0 and the cumulative ends (query_start_loc)."""
    return torch.tensor([0] + torch.tensor(list(lens)).cumsum(0).tolist(), dtype=torch.int32, device=device)


def _packed_to_padded(x: Tensor, lens: Sequence[int]) -> Tensor:
    """[T, C] sequence-major tokens -> [S_max, B, C] (zeros after each sequence's end)."""
    out = x.new_zeros(max(lens), len(lens), x.shape[-1])
    start = 0
    for b, n in enumerate(lens):
        out[:n, b] = x[start:start + n]
        start += n
    return out


def _padded_to_packed(y: Tensor, lens: Sequence[int]) -> Tensor:
    return torch.cat([y[:n, b] for b, n in enumerate(lens)])


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """The model's q/k normalisation (the FLA library's): x / sqrt(sum(x^2) + eps) in fp32, back to x's dtype (the
    delta rule ops take normalised q and k, as upstream's do)."""
    xf = x.float()
    return (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + eps)).to(x.dtype)


class GatedDeltaNetLayer(nn.Module):
    """One Gated DeltaNet layer on the package's ops, sharing transformers' Qwen3NextGatedDeltaNet parameters
    (`hf`, kept as a submodule: its in_proj_qkvz / in_proj_ba / out_proj are used as they are)."""

    def __init__(self, hf: nn.Module, layer_idx: int):
        super().__init__()
        self.hf = hf
        self.layer_idx = layer_idx
        self.nk, self.nv = hf.num_k_heads, hf.num_v_heads
        self.dk, self.dv = hf.head_k_dim, hf.head_v_dim
        self.key_dim, self.value_dim = hf.key_dim, hf.value_dim

    def _inputs(self, x: Tensor):
        """Projections of tokens x [T, hidden]: mixed q|k|v [T, conv_dim], the gate z [T, Nv, Dv], b and a [T, Nv]."""
        hf = self.hf
        qkvz, ba = hf.in_proj_qkvz(x).unsqueeze(0), hf.in_proj_ba(x).unsqueeze(0)
        q, k, v, z, b, a = hf.fix_query_key_value_ordering(qkvz, ba)
        mixed = torch.cat([t.reshape(t.shape[1], -1) for t in (q, k, v)], dim=-1)
        return mixed, z[0], b[0], a[0]

    def _heads(self, mixed: Tensor, b: Tensor, a: Tensor):
        """The conv output split into L2-normalised q, k [T, Nk, Dk] and v [T, Nv, Dv]; β and g [T, Nv]."""
        T = mixed.shape[0]
        q, k, v = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = (_l2norm(t.reshape(T, self.nk, self.dk)) for t in (q, k))
        beta = b.sigmoid()
        g = -self.hf.A_log.float().exp() * F.softplus(a.float() + self.hf.dt_bias)
        return q, k, v.reshape(T, self.nv, self.dv), beta, g

    def _output(self, core: Tensor, z: Tensor) -> Tensor:
        norm = self.hf.norm
        y = rms_norm_gated(core.reshape(-1, self.dv), norm.weight, z.reshape(-1, self.dv), norm.variance_epsilon)
        return self.hf.out_proj(y.reshape(core.shape[0], -1))

    def forward(self, x: Tensor, cache: HybridCache, batch: HybridBatch) -> Tensor:
        """x [T, hidden] (sequence-major, T = sum(batch.q_lens)) -> [T, hidden], reading and updating the caches."""
        mixed, z, b, a = self._inputs(x)
        conv = self.hf.conv1d.weight[:, 0].t().contiguous()  # [K, conv_dim]
        mixed = npu_fused_causal_conv1d(mixed, conv, cache.conv_state(self.layer_idx),
                                        query_start_loc=_cu(batch.q_lens, x.device), cache_indices=batch.state_slots,
                                        activation="silu")
        q, k, v, beta, g = self._heads(mixed, b, a)
        state = cache.ssm_state(self.layer_idx)
        lens = torch.tensor(batch.q_lens, dtype=torch.int32, device=x.device)
        if not batch.is_decode:  # chunked, from each sequence's cached state (zeros for a new one)
            init = state[batch.state_slots.long()]
            core, final = npu_chunk_gated_delta_rule(q, k, v, beta=beta, initial_state=init, actual_seq_lengths=lens,
                                                     scale=self.dk ** -0.5, g=g)
            state[batch.state_slots.long()] = final.to(state.dtype)
        else:
            token_slots = torch.repeat_interleave(batch.state_slots, lens)
            core = npu_recurrent_gated_delta_rule(q, k, v, state, beta=beta, scale=self.dk ** -0.5,
                                                  actual_seq_lengths=lens, ssm_state_indices=token_slots, g=g)
        return self._output(core, z)

    def forward_train(self, x: Tensor, batch: HybridTrainBatch) -> Tensor:
        """Packed training step: x [T, hidden] -> [T, hidden], differentiable, every sequence from zero states."""
        mixed, z, b, a = self._inputs(x)
        lens = batch.q_lens
        conv = self.hf.conv1d.weight[:, 0].t()  # [K, conv_dim]
        mask = torch.zeros(len(lens), max(lens), dtype=torch.bool, device=x.device)
        for i, n in enumerate(lens):
            mask[i, :n] = True
        mixed = F.silu(_padded_to_packed(npu_masked_causal_conv1d(_packed_to_padded(mixed, lens), conv, mask=mask),
                                         lens))
        q, k, v, beta, g = self._heads(mixed, b, a)
        init = x.new_zeros(len(lens), self.nv, self.dv, self.dk, dtype=torch.float32)
        core, _ = npu_chunk_gated_delta_rule(q, k, v, beta=beta, initial_state=init,
                                             actual_seq_lengths=torch.tensor(lens, dtype=torch.int32,
                                                                             device=x.device),
                                             scale=self.dk ** -0.5, g=g)
        return self._output(core, z)


class GatedAttentionLayer(nn.Module):
    """One Qwen3-Next full-attention layer on the package's ops, sharing transformers' Qwen3NextAttention parameters
    (`hf`: q_proj (query and gate), k_proj, v_proj, o_proj, q_norm, k_norm)."""

    def __init__(self, hf: nn.Module, layer_idx: int):
        super().__init__()
        self.hf = hf
        self.layer_idx = layer_idx
        cfg = hf.config
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.scaling = hf.head_dim, hf.scaling

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor):
        """x [T, hidden], cos/sin [T, rotary_dim] -> q [T, N, D], k, v [T, Nkv, D], gate [T, N*D]."""
        hf, T, D = self.hf, x.shape[0], self.head_dim
        q, gate = torch.chunk(hf.q_proj(x).view(T, -1, 2 * D), 2, dim=-1)
        # Qwen3-Next's RMSNorm scales by (1 + weight) (zero-centred weights)
        q = npu_rms_norm(q.contiguous(), 1.0 + hf.q_norm.weight, hf.q_norm.eps)[0]
        k = npu_rms_norm(hf.k_proj(x).view(T, -1, D), 1.0 + hf.k_norm.weight, hf.k_norm.eps)[0]
        v = hf.v_proj(x).view(T, -1, D)
        r = cos.shape[-1]
        c, s = cos.reshape(1, T, 1, r).to(x.dtype), sin.reshape(1, T, 1, r).to(x.dtype)
        q = torch.cat([npu_rotary_mul(q[..., :r].unsqueeze(0).contiguous(), c, s)[0], q[..., r:]], dim=-1)
        k = torch.cat([npu_rotary_mul(k[..., :r].unsqueeze(0).contiguous(), c, s)[0], k[..., r:]], dim=-1)
        return q, k, v, gate.reshape(T, -1)

    def _output(self, out: Tensor, gate: Tensor) -> Tensor:
        return self.hf.o_proj(out.reshape(gate.shape) * torch.sigmoid(gate))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: HybridCache, batch: HybridBatch) -> Tensor:
        q, k, v, gate = self._qkv(x, cos, sin)
        key_cache, value_cache = cache.kv(self.layer_idx)
        slots = batch.slot_mapping.reshape(-1, 1)
        npu_scatter_nd_update_(key_cache.view(-1, self.num_kv_heads, self.head_dim), slots, k)
        npu_scatter_nd_update_(value_cache.view(-1, self.num_kv_heads, self.head_dim), slots, v)
        decode = batch.is_decode
        out = npu_fused_infer_attention_score(
            q.unsqueeze(1) if decode else q, key_cache, value_cache, block_table=batch.block_table,
            actual_seq_lengths=None if decode else torch.tensor(batch.q_lens).cumsum(0).tolist(),
            actual_seq_lengths_kv=batch.kv_lens, num_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
            scale=self.scaling, input_layout="BSND" if decode else "TND", sparse_mode=0 if decode else 3,
            atten_mask=None if decode else optimised_causal_mask(x.device), block_size=batch.block_size)[0]
        return self._output(out, gate)

    def forward_train(self, x: Tensor, cos: Tensor, sin: Tensor, batch: HybridTrainBatch) -> Tensor:
        q, k, v, gate = self._qkv(x, cos, sin)
        out = npu_fusion_attention(q, k, v, self.num_heads, "TND", atten_mask=optimised_causal_mask(x.device),
                                   scale=self.scaling, actual_seq_qlen=batch.cu_seqlens,
                                   actual_seq_kvlen=batch.cu_seqlens, sparse_mode=3)[0]
        return self._output(out, gate)


class _LinearAdapter(nn.Module):
    """Stands in for Qwen3NextGatedDeltaNet in its decoder layer (transformers' call -> output tensor)."""

    def __init__(self, layer: GatedDeltaNetLayer, runner: "Qwen3NextRunner"):
        super().__init__()
        self.layer = layer
        self._runner = [runner]  # a list, so the runner is not registered as a submodule

    def forward(self, hidden_states: Tensor, **kwargs) -> Tensor:
        runner = self._runner[0]
        batch = runner.current_batch()
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        out = (self.layer.forward_train(x, batch) if isinstance(batch, HybridTrainBatch)
               else self.layer(x, runner.cache, batch))
        return out.reshape(hidden_states.shape)


class _AttentionAdapter(nn.Module):
    """Stands in for Qwen3NextAttention in its decoder layer (transformers' call -> (output, None))."""

    def __init__(self, layer: GatedAttentionLayer, runner: "Qwen3NextRunner"):
        super().__init__()
        self.layer = layer
        self._runner = [runner]

    def forward(self, hidden_states: Tensor, position_embeddings, attention_mask=None, **kwargs):
        runner = self._runner[0]
        batch = runner.current_batch()
        cos, sin = (t.reshape(-1, t.shape[-1]) for t in position_embeddings)
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        out = (self.layer.forward_train(x, cos, sin, batch) if isinstance(batch, HybridTrainBatch)
               else self.layer(x, cos, sin, runner.cache, batch))
        return out.reshape(hidden_states.shape), None


class Qwen3NextRunner(PagedModelRunner):
    """A transformers Qwen3-Next causal LM (`Qwen3NextForCausalLM`) with every Gated DeltaNet layer swapped for
    GatedDeltaNetLayer and every full-attention layer for GatedAttentionLayer, over one HybridCache (see
    kv_cache.runner.PagedModelRunner for prefill / decode / generate / train_forward / lm_loss).

        runner = Qwen3NextRunner(model, num_blocks=64, block_size=16, max_seqs=8)
        tokens = runner.generate([[5, 9, 2], [7, 1]], max_new_tokens=16)
    """

    _MODEL_EXAMPLE = "Qwen3NextForCausalLM"

    def __init__(self, model: nn.Module, num_blocks: int, block_size: int = 16, max_seqs: int = 8,
                 dtype: Optional[torch.dtype] = None, state_dtype: torch.dtype = torch.float32):
        super().__init__(model)
        cfg, layers = model.config, model.model.layers
        kinds = list(getattr(cfg, "layer_types", []))
        if len(kinds) != len(layers) or any(k not in ("linear_attention", "full_attention") for k in kinds):
            raise TypeError(f"Qwen3NextRunner: argument 'model' must be a Qwen3-Next model (config.layer_types of "
                            f"'linear_attention' / 'full_attention' per layer); got {kinds}")
        if any(isinstance(getattr(l, "linear_attn", getattr(l, "self_attn", None)), (_LinearAdapter, _AttentionAdapter))
               for l in layers):
            raise ValueError("Qwen3NextRunner: the model's layers are already swapped (one runner per model)")
        lin = [i for i, k in enumerate(kinds) if k == "linear_attention"]
        att = [i for i, k in enumerate(kinds) if k == "full_attention"]
        gdn = layers[lin[0]].linear_attn if lin else None
        self.cache = HybridCache(
            num_blocks=num_blocks, block_size=block_size, max_seqs=max_seqs, attention_layers=att,
            linear_layers=lin, num_kv_heads=cfg.num_key_value_heads, head_dim=layers[att[0]].self_attn.head_dim
            if att else 1, conv_dim=gdn.conv_dim if gdn else 1, conv_width=gdn.conv_kernel_size if gdn else 2,
            num_v_heads=cfg.linear_num_value_heads, k_head_dim=cfg.linear_key_head_dim,
            v_head_dim=cfg.linear_value_head_dim, dtype=dtype or next(model.parameters()).dtype,
            state_dtype=state_dtype, device=self.device)
        for i in lin:
            layers[i].linear_attn = _LinearAdapter(GatedDeltaNetLayer(layers[i].linear_attn, i), self)
        for i in att:
            layers[i].self_attn = _AttentionAdapter(GatedAttentionLayer(layers[i].self_attn, i), self)

    def current_batch(self):
        if self.batch is None:
            raise RuntimeError("Qwen3-Next layers swapped by Qwen3NextRunner run through it (prefill / decode / "
                               "generate / train_forward), which supplies the caches and the batch")
        return self.batch

    def _train_batch(self, cu_seqlens: List[int]) -> HybridTrainBatch:
        return HybridTrainBatch(list(cu_seqlens))
