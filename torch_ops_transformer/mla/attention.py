"""DeepSeek-style absorbed Multi-head Latent Attention (MLA) on this package's ops (docs/mla.md).

- `MLALatentCache` — the paged latent cache of every layer: c_kv [num_blocks, block_size, 1, kv_lora_rank] and the
  roped key part k_rope [num_blocks, block_size, 1, qk_rope_head_dim] per layer, one `BlockAllocator` for all
  layers (a sequence's block table is the same in each). `prepare(seq_ids, q_lens)` reserves the slots of one
  forward step and returns its `MLABatch` (slot mapping, block table, lengths).
- `MLAAttention` — one attention layer: the prolog (`npu_mla_prolog_v3`: q down-projection + RMSNorm +
  up-projection, W_uk absorbed into the query, interleaved rope, c_kv RMSNorm and k_rope rope written into the
  paged cache; without a q LoRA: q projection, absorption, `npu_interleave_rope` and `npu_kv_rmsnorm_rope_cache`),
  attention in latent space (`npu_fused_infer_attention_score` with query_rope/key_rope, the latent cache as key
  and value), then the per-head W_uv up-projection and o_proj. `MLAAttention.from_hf(DeepseekV3Attention)`.
- `PagedMLARunner` — drives a transformers DeepSeek-V3 (or V2-style) causal LM with MLAAttention in every layer
  and one paged latent cache: ragged prefill (TND) of a batch of prompts, batched decode (BSND), greedy `generate`.

transformers is not imported here: `from_hf` and the runner read the modules' attributes.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..inference.api import npu_fused_infer_attention_score, optimised_causal_mask
from ..kv_cache.api import BlockAllocator, npu_kv_rmsnorm_rope_cache
from ..kv_cache.runner import PagedModelRunner
from .prolog import npu_mla_prolog_v3
from ..rope.api import npu_interleave_rope

@dataclass
class MLABatch:
    """One forward step over a batch of sequences: sequence b has q_lens[b] new tokens (its last ones) and, after the
    step, kv_lens[b] tokens in the cache. `slot_mapping` (int64 [T], T = sum(q_lens), sequence-major) is where the new
    tokens' latents go; `block_table` (int32 [B, max_blocks], padded with 0) is the cache's block table."""
    seq_ids: List[int]
    q_lens: List[int]
    kv_lens: List[int]
    slot_mapping: Tensor
    block_table: Tensor
    block_size: int

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    @property
    def is_decode(self) -> bool:
        return all(q == 1 for q in self.q_lens)

    @property
    def uniform(self) -> bool:
        """Every sequence has the same number of new tokens (so the step can be laid out BSND)."""
        return len(set(self.q_lens)) <= 1


class MLALatentCache:
    """Paged latent caches of `num_layers` MLA layers sharing one block allocator (see the module docstring).

    Layout per layer (cache_mode "PA_BSND" of npu_mla_prolog_v3, the paged layout npu_fused_infer_attention_score
    reads): `kv_cache(layer)` [num_blocks, block_size, 1, kv_lora_rank] holds RMSNorm(c_kv) of each token,
    `kr_cache(layer)` [num_blocks, block_size, 1, qk_rope_head_dim] its roped shared key part. Token p of a sequence
    lives in slot block_table[p // block_size] * block_size + p % block_size."""

    def __init__(self, num_blocks: int, block_size: int, kv_lora_rank: int, qk_rope_head_dim: int,
                 num_layers: int = 1, dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None):
        for name, v in (("num_blocks", num_blocks), ("block_size", block_size), ("kv_lora_rank", kv_lora_rank),
                        ("qk_rope_head_dim", qk_rope_head_dim), ("num_layers", num_layers)):
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"MLALatentCache: argument '{name}' must be a positive int; got {v!r}")
        if not dtype.is_floating_point:
            raise NotImplementedError(f"MLALatentCache: a quantised ({dtype}) latent cache is not implemented; "
                                      f"argument 'dtype' must be a floating-point dtype")
        self.allocator = BlockAllocator(num_blocks, block_size, "MLALatentCache")
        self.num_blocks, self.block_size, self.num_layers = num_blocks, block_size, num_layers
        self.kv_lora_rank, self.qk_rope_head_dim, self.dtype = kv_lora_rank, qk_rope_head_dim, dtype
        self.kv_caches = [torch.zeros(num_blocks, block_size, 1, kv_lora_rank, dtype=dtype, device=device)
                          for _ in range(num_layers)]
        self.kr_caches = [torch.zeros(num_blocks, block_size, 1, qk_rope_head_dim, dtype=dtype, device=device)
                          for _ in range(num_layers)]

    def kv_cache(self, layer: int = 0) -> Tensor:
        return self.kv_caches[layer]

    def kr_cache(self, layer: int = 0) -> Tensor:
        return self.kr_caches[layer]

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_blocks

    def add_sequence(self) -> int:
        return self.allocator.add_sequence()

    def free(self, seq_id: int) -> None:
        self.allocator.free(seq_id)

    def seq_lens(self, seq_ids: Sequence[int]) -> Tensor:
        return self.allocator.seq_lens(seq_ids)

    def block_table(self, seq_ids: Sequence[int]) -> Tensor:
        return self.allocator.block_table(seq_ids)

    def prepare(self, seq_ids: Sequence[int], q_lens: Sequence[int]) -> MLABatch:
        """Reserves the slots of q_lens[b] new tokens of each sequence (atomic: out of blocks is a RuntimeError that
        changes nothing) and returns the step's MLABatch. Every layer's forward of this step uses the same batch."""
        seq_ids, q_lens = [int(s) for s in seq_ids], [int(q) for q in q_lens]
        if len(seq_ids) != len(q_lens):
            raise ValueError(f"MLALatentCache.prepare: {len(seq_ids)} seq_ids but {len(q_lens)} q_lens")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"MLALatentCache.prepare: argument 'seq_ids' must be distinct; got {seq_ids}")
        if any(q <= 0 for q in q_lens):
            raise ValueError(f"MLALatentCache.prepare: argument 'q_lens' must be positive; got {q_lens}")
        owners = [s for s, q in zip(seq_ids, q_lens) for _ in range(q)]
        slots = self.allocator.reserve(owners)
        device = self.kv_caches[0].device
        return MLABatch(seq_ids, q_lens, self.seq_lens(seq_ids).tolist(),
                        torch.tensor(slots, dtype=torch.int64, device=device),
                        self.block_table(seq_ids).to(device), self.block_size)


def _interleave_perm(d: int) -> Tensor:
    """Column order that makes the interleaved rope (pairs (x0, x1), (x2, x3), ... de-interleaved, then
    rotate-half) compute the rotate-half rope of the original columns: new column 2i is old i, 2i+1 is old d/2 + i."""
    half = torch.arange(d // 2)
    return torch.stack([half, half + d // 2], dim=1).reshape(-1)


class MLAAttention(nn.Module):
    """Absorbed MLA attention of one layer (docs/mla.md). Weights are kept in the layouts the ops take:

    - `weight_dq` [hidden, q_lora_rank], `gamma_cq` [q_lora_rank], `weight_uq_qr` [q_lora_rank, N*(D+Dr)] with
      per-head columns [nope D | rope Dr] (or, without a q LoRA, `weight_q` [hidden, N*(D+Dr)]);
    - `weight_uk` [N, D, kv_lora_rank] (absorbed into the query), `weight_uv` [N, Dv, kv_lora_rank];
    - `weight_dkv_kr` [hidden, kv_lora_rank + Dr], `gamma_ckv` [kv_lora_rank]; `o_proj` Linear(N*Dv -> hidden).

    The rope columns are in interleaved-pair order (DeepSeek's checkpoints; `from_hf` permutes a model with
    rope_interleave=False so the result is the same). forward(hidden_states, cos, sin, cache, batch): hidden_states
    [B, S, hidden] (BSND, every sequence with S new tokens) or [T, hidden] (TND, T = sum(batch.q_lens), sequence-
    major); cos/sin [B, S, Dr] / [T, Dr] in rotate-half form (cat(cos(f), cos(f)), as transformers' rotary embedding
    returns them); returns the attention output [B, S, hidden] / [T, hidden]."""

    def __init__(self, hidden_size: int, num_heads: int, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: Optional[int] = None, *,
                 scaling: Optional[float] = None, q_norm_eps: float = 1e-6, kv_norm_eps: float = 1e-6,
                 o_proj_bias: bool = False, layer_idx: int = 0, dtype: torch.dtype = torch.float32,
                 device: Optional[torch.device] = None):
        super().__init__()
        if qk_rope_head_dim % 2:
            raise ValueError(f"MLAAttention: argument 'qk_rope_head_dim' must be even; got {qk_rope_head_dim}")
        self.hidden_size, self.num_heads, self.kv_lora_rank = hidden_size, num_heads, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.q_lora_rank, self.layer_idx = q_lora_rank, layer_idx
        self.scaling = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5 if scaling is None else float(scaling)
        self.q_norm_eps, self.kv_norm_eps = float(q_norm_eps), float(kv_norm_eps)
        n, dqk = num_heads, qk_nope_head_dim + qk_rope_head_dim
        kw = dict(dtype=dtype, device=device)
        if q_lora_rank is None:
            self.weight_q = nn.Parameter(torch.empty(hidden_size, n * dqk, **kw))
        else:
            self.weight_dq = nn.Parameter(torch.empty(hidden_size, q_lora_rank, **kw))
            self.gamma_cq = nn.Parameter(torch.ones(q_lora_rank, **kw))
            self.weight_uq_qr = nn.Parameter(torch.empty(q_lora_rank, n * dqk, **kw))
        self.weight_uk = nn.Parameter(torch.empty(n, qk_nope_head_dim, kv_lora_rank, **kw))
        self.weight_uv = nn.Parameter(torch.empty(n, v_head_dim, kv_lora_rank, **kw))
        self.weight_dkv_kr = nn.Parameter(torch.empty(hidden_size, kv_lora_rank + qk_rope_head_dim, **kw))
        self.gamma_ckv = nn.Parameter(torch.ones(kv_lora_rank, **kw))
        self.o_proj = nn.Linear(n * v_head_dim, hidden_size, bias=o_proj_bias, **kw)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    # ------------------------------------------------------------------------------------------------ from_hf
    @classmethod
    @torch.no_grad()
    def from_hf(cls, hf_attention: nn.Module) -> "MLAAttention":
        """The weights of a transformers `DeepseekV3Attention` (or DeepSeek-V2's, same attributes), copied into the
        ops' layouts: q_a_proj / q_a_layernorm / q_b_proj (or q_proj when q_lora_rank is None), kv_a_proj_with_mqa,
        kv_a_layernorm, kv_b_proj split per head into W_uk [N, D, kv_lora_rank] and W_uv [N, Dv, kv_lora_rank],
        o_proj; the softmax scale is the layer's `scaling` (qk_head_dim^-0.5 times yarn's mscale^2 when the
        rope type asks for it). With rope_interleave=False the rope columns are permuted so the interleaved rope of
        the prolog computes transformers' rotate-half rope. attention_bias=True on the q/kv down-projections
        (a bias the fused prolog has no input for) is NotImplementedError."""
        a = hf_attention
        for name in ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj", "num_heads", "kv_lora_rank"):
            if not hasattr(a, name):
                raise TypeError(f"MLAAttention.from_hf: argument 'hf_attention' must be a DeepseekV3Attention "
                                f"(it has no '{name}'); got {type(a).__name__}")
        q_lora = getattr(a, "q_lora_rank", None)
        for name in ("q_a_proj", "kv_a_proj_with_mqa"):
            lin = getattr(a, name, None)
            if lin is not None and lin.bias is not None:
                raise NotImplementedError(f"MLAAttention.from_hf: a bias on '{name}' (attention_bias=True) is not "
                                          f"implemented: the prolog's down-projections have no bias input")
        n, d, dr, dv, r = a.num_heads, a.qk_nope_head_dim, a.qk_rope_head_dim, a.v_head_dim, a.kv_lora_rank
        w_ref = a.kv_b_proj.weight
        m = cls(a.hidden_size if hasattr(a, "hidden_size") else a.o_proj.out_features, n, r, d, dr, dv, q_lora,
                scaling=a.scaling, q_norm_eps=a.q_a_layernorm.variance_epsilon if q_lora is not None else 1e-6,
                kv_norm_eps=a.kv_a_layernorm.variance_epsilon, o_proj_bias=a.o_proj.bias is not None,
                layer_idx=getattr(a, "layer_idx", 0) or 0, dtype=w_ref.dtype, device=w_ref.device,
                **cls._hf_extra_kwargs(a))
        interleaved = bool(getattr(getattr(a, "config", None), "rope_interleave", True))
        perm = None if interleaved else _interleave_perm(dr)

        def q_cols(w):  # [out=N*(D+Dr), in] -> [in, N*(D+Dr)] with the rope columns in interleaved order
            w = w.reshape(n, d + dr, -1)
            if perm is not None:
                w = torch.cat([w[:, :d], w[:, d:][:, perm.to(w.device)]], dim=1)
            return w.reshape(n * (d + dr), -1).t().contiguous()

        if q_lora is None:
            m.weight_q.copy_(q_cols(a.q_proj.weight))
        else:
            m.weight_dq.copy_(a.q_a_proj.weight.t())
            m.gamma_cq.copy_(a.q_a_layernorm.weight)
            m.weight_uq_qr.copy_(q_cols(a.q_b_proj.weight))
        wkv = a.kv_a_proj_with_mqa.weight  # [r + Dr, hidden]
        if perm is not None:
            wkv = torch.cat([wkv[:r], wkv[r:][perm.to(wkv.device)]], dim=0)
        m.weight_dkv_kr.copy_(wkv.t())
        m.gamma_ckv.copy_(a.kv_a_layernorm.weight)
        kvb = a.kv_b_proj.weight.reshape(n, d + dv, r)  # per head: rows [k_nope D | v Dv], columns the latent
        m.weight_uk.copy_(kvb[:, :d])
        m.weight_uv.copy_(kvb[:, d:])
        m.o_proj.load_state_dict(a.o_proj.state_dict())
        return m

    @classmethod
    def _hf_extra_kwargs(cls, hf_attention: nn.Module) -> dict:
        """Constructor arguments a subclass reads from the transformers module (its own extra sizes); none here."""
        return {}

    # ------------------------------------------------------------------------------------------------ forward
    def _prolog(self, x: Tensor, cos: Tensor, sin: Tensor, kv_cache: Tensor, kr_cache: Tensor,
                slots: Tensor) -> Tuple[Tensor, Tensor]:
        """Query in latent space [.., N, kv_lora_rank] and its roped part [.., N, Dr]; writes the new tokens'
        RMSNorm(c_kv) and roped k_rope into the caches at `slots`. x is [T, H] (TND) or [B, S, H] (BSND)."""
        if self.q_lora_rank is not None:
            q, q_rope = npu_mla_prolog_v3(
                x, self.weight_dq, self.weight_uq_qr, self.weight_uk, self.weight_dkv_kr, self.gamma_cq,
                self.gamma_ckv, sin, cos, kv_cache, kr_cache, cache_index=slots,
                rmsnorm_epsilon_cq=self.q_norm_eps, rmsnorm_epsilon_ckv=self.kv_norm_eps, cache_mode="PA_BSND")[:2]
            return q, q_rope
        # No q LoRA (DeepSeek-V2-Lite style): the same chain from its parts.
        lead = x.shape[:-1]
        t = x.reshape(-1, x.shape[-1])
        n, d, dr = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        qc = (t @ self.weight_q).reshape(-1, n, d + dr)
        q = torch.bmm(qc[..., :d].transpose(0, 1), self.weight_uk).transpose(0, 1)  # [T, N, r]
        cos2, sin2 = cos.reshape(1, 1, -1, dr), sin.reshape(1, 1, -1, dr)
        q_rope = npu_interleave_rope(qc[..., d:].transpose(0, 1).unsqueeze(0).contiguous(), cos2, sin2)
        q_rope = q_rope[0].transpose(0, 1)
        kv = (t @ self.weight_dkv_kr).reshape(1, 1, -1, self.kv_lora_rank + dr)
        npu_kv_rmsnorm_rope_cache(kv, self.gamma_ckv, cos2, sin2, slots.reshape(-1), kr_cache, kv_cache,
                                  epsilon=self.kv_norm_eps, cache_mode="PA")
        return q.reshape(*lead, n, -1).contiguous(), q_rope.reshape(*lead, n, dr).contiguous()

    def _step_inputs(self, hidden_states: Tensor, cos: Tensor, sin: Tensor,
                     batch: MLABatch) -> Tuple[bool, Tensor, Tensor, Tensor, Tensor]:
        """Checks that hidden_states fits the batch and lays the step out: (tnd, x, cos, sin, slots) with cos/sin
        [T, Dr] (TND) or [B, S, Dr] (BSND) in x's dtype and the slots of the new tokens ([T] or [B, S])."""
        tnd = hidden_states.dim() == 2
        b = len(batch.seq_ids)
        if tnd:
            if hidden_states.shape[0] != batch.num_tokens:
                raise ValueError(f"{type(self).__name__}: TND hidden_states has {hidden_states.shape[0]} tokens but "
                                 f"the batch has sum(q_lens) = {batch.num_tokens}")
            cos, sin = cos.reshape(-1, self.qk_rope_head_dim), sin.reshape(-1, self.qk_rope_head_dim)
            slots = batch.slot_mapping
        elif hidden_states.dim() == 3:
            s = hidden_states.shape[1]
            if hidden_states.shape[0] != b or not batch.uniform or batch.q_lens[0] != s:
                raise ValueError(f"{type(self).__name__}: BSND hidden_states {list(hidden_states.shape[:2])} needs "
                                 f"every sequence of the batch to have S new tokens; q_lens are {batch.q_lens} (use "
                                 f"TND [T, hidden] for a ragged batch)")
            cos, sin = cos.reshape(b, s, -1), sin.reshape(b, s, -1)
            slots = batch.slot_mapping.reshape(b, s)
        else:
            raise ValueError(f"{type(self).__name__}: hidden_states must be [B, S, hidden] (BSND) or [T, hidden] "
                             f"(TND); got shape {list(hidden_states.shape)}")
        x = hidden_states.contiguous()
        return tnd, x, cos.to(x.dtype).contiguous(), sin.to(x.dtype).contiguous(), slots

    def _up_project(self, latent_out: Tensor, out_shape: Sequence[int]) -> Tensor:
        """W_uv per head, then o_proj: latent attention output [.., N, kv_lora_rank] -> [*out_shape[:-1], hidden]."""
        lat = latent_out.reshape(-1, self.num_heads, self.kv_lora_rank).transpose(0, 1)  # [N, T, r]
        v = torch.bmm(lat, self.weight_uv.transpose(1, 2)).transpose(0, 1).reshape(-1, self.num_heads * self.v_head_dim)
        return self.o_proj(v).reshape(*out_shape[:-1], self.hidden_size)

    def forward(self, hidden_states: Tensor, cos: Tensor, sin: Tensor, cache: MLALatentCache,
                batch: MLABatch) -> Tensor:
        tnd, x, cos, sin, slots = self._step_inputs(hidden_states, cos, sin, batch)
        kv_cache, kr_cache = cache.kv_cache(self.layer_idx), cache.kr_cache(self.layer_idx)
        q, q_rope = self._prolog(x, cos, sin, kv_cache, kr_cache, slots)
        causal = not batch.is_decode
        q_lens = torch.tensor(batch.q_lens, dtype=torch.int64).cumsum(0).tolist() if tnd else batch.q_lens
        # Latent-space attention: one KV head (the latent) shared by all N query heads, value = the latent cache.
        out = npu_fused_infer_attention_score(
            q, kv_cache, kv_cache, query_rope=q_rope, key_rope=kr_cache, block_table=batch.block_table,
            actual_seq_lengths=q_lens, actual_seq_lengths_kv=batch.kv_lens, num_heads=self.num_heads,
            num_key_value_heads=1, scale=self.scaling, input_layout="TND" if tnd else "BSND",
            sparse_mode=3 if causal else 0, atten_mask=optimised_causal_mask(x.device) if causal else None,
            block_size=batch.block_size)[0]
        return self._up_project(out, hidden_states.shape)


# ================================================================================================================
# transformers integration: every layer's self_attn on MLAAttention, one paged latent cache, greedy generation
# ================================================================================================================

class _HFMLAAdapter(nn.Module):
    """Stands in for a DeepseekV3Attention in its decoder layer: transformers' call (hidden_states,
    position_embeddings, attention_mask, ...) -> (output, None), with the step's batch taken from the runner. The
    mask transformers builds is ignored: the batch's lengths and sparse mode 3 say what each query sees."""

    def __init__(self, mla: MLAAttention, runner: "PagedMLARunner"):
        super().__init__()
        self.mla = mla
        self._runner = [runner]  # a list, so the runner is not registered as a submodule

    def forward(self, hidden_states: Tensor, position_embeddings: Tuple[Tensor, Tensor],
                attention_mask: Optional[Tensor] = None, **kwargs) -> Tuple[Tensor, None]:
        runner = self._runner[0]
        if runner.batch is None:
            raise RuntimeError(f"{type(self.mla).__name__} inside a transformers model runs through "
                               f"{type(runner).__name__} (prefill / decode / generate), which supplies the paged "
                               f"cache and the batch")
        cos, sin = position_embeddings
        x = hidden_states[0] if runner.packed else hidden_states  # packed: [1, T, H] -> TND [T, H]
        out = self.mla(x, cos, sin, runner.cache, runner.batch)
        return (out.unsqueeze(0) if runner.packed else out), None


class PagedMLARunner(PagedModelRunner):
    """A transformers DeepSeek-V3 causal LM (`DeepseekV3ForCausalLM`; any model whose decoder layers' `self_attn`
    are DeepseekV3Attention-like) with every layer's attention swapped for MLAAttention (`from_hf`) over one
    MLALatentCache. The model is modified in place; its other modules (embeddings, norms, MLP / MoE, lm_head,
    rotary embedding) stay transformers'.

        runner = PagedMLARunner(model, num_blocks=64, block_size=16)
        tokens = runner.generate([[5, 9, 2], [7, 1]], max_new_tokens=16)   # greedy, ragged prompts

    `prefill(prompts)` runs the prompts as one packed TND step (positions restart at 0 per prompt) and returns
    (seq_ids, last-token logits [B, vocab]); `decode(seq_ids, tokens)` one BSND step of one token per sequence;
    `free(seq_ids)` returns their blocks. Each step calls the base model with use_cache=False (the paged cache is
    ours), so `output_hidden_states=True` works as for transformers' own forward (`last_outputs`). A DeepSeek-V3.2
    model (attention with an indexer) is a TypeError: PagedDSARunner (mla.sparse_attention_runner) runs it."""

    def __init__(self, model: nn.Module, num_blocks: int, block_size: int = 16, dtype: Optional[torch.dtype] = None):
        super().__init__(model)
        layers = model.model.layers
        if any(isinstance(layer.self_attn, _HFMLAAdapter) for layer in layers):
            raise ValueError(f"{type(self).__name__}: the model's attention is already swapped (one runner per "
                             f"model)")
        ref = next(model.parameters())
        self.cache = self._make_cache(model.config, len(layers), num_blocks, block_size, dtype or ref.dtype,
                                      ref.device)
        modules = [self._attention_from_hf(layer.self_attn) for layer in layers]  # all converted before any swap
        for i, (layer, mla) in enumerate(zip(layers, modules)):
            mla.layer_idx = i
            layer.self_attn = _HFMLAAdapter(mla, self)

    _MODEL_EXAMPLE = "DeepseekV3ForCausalLM"

    def _make_cache(self, cfg, num_layers: int, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device) -> MLALatentCache:
        """The paged cache of every layer (a subclass's attention may need more than the latent)."""
        return MLALatentCache(num_blocks, block_size, cfg.kv_lora_rank, cfg.qk_rope_head_dim, num_layers=num_layers,
                              dtype=dtype, device=device)

    def _attention_from_hf(self, hf_attention: nn.Module) -> MLAAttention:
        if hasattr(hf_attention, "indexer"):  # dense MLA would silently drop the indexer's selection
            raise TypeError(f"{type(self).__name__}: the model's attention has a sparse-attention indexer (a "
                            f"DeepSeek-V3.2 model); use PagedDSARunner, which runs its selection")
        return MLAAttention.from_hf(hf_attention)
