"""DeepSeek-V3.2's sparse attention (DSA) on this package's ops, in a transformers DeepseekV32ForCausalLM
(docs/sparse_attention.md, "In a model: DeepSeek-V3.2").

Every layer's attention becomes a `DSAAttention`: the MLA prolog (`npu_mla_prolog_v3`, which also returns c^Q, the
normalised query latent the indexer reads), the lightning indexer's projections (`DSAIndexer`) with its keys written
into a paged indexer-key cache (`npu_scatter_nd_update_`), the top-`index_topk` selection (`npu_lightning_indexer`
over that cache), sparse absorbed MLA over the paged latent cache (`npu_sparse_flash_attention`, attention_mode 2,
PA_BSND, sparse_mode 3), then W_uv and o_proj. `PagedDSARunner` drives the model as `PagedMLARunner` drives a
DeepSeek-V3 (ragged TND prefill, BSND decode, greedy generate), with one `DSALatentCache` for every layer; its
`train_forward` / `lm_loss` run a packed batch differentiably (projections in PyTorch, the same two sparse ops).

transformers' indexer (DeepseekV32Indexer) runs under torch.no_grad and is trained by nothing in its forward (no KL
loss): the selection is a constant of the attention. Ours does the same, so its weights get no gradient.
transformers is not imported here: `from_hf` and the runner read the modules' attributes.
"""
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..kv_cache.api import npu_scatter_nd_update_
from ..norm.api import npu_rms_norm
from ..rope.api import npu_interleave_rope, npu_rotary_mul
from ..sparse_attention import npu_lightning_indexer, npu_sparse_flash_attention
from .attention import MLAAttention, MLABatch, MLALatentCache, PagedMLARunner
from .prolog import npu_mla_prolog_v3


class DSALatentCache(MLALatentCache):
    """MLALatentCache plus, per layer, the indexer's key cache `index_cache(layer)` [num_blocks, block_size, 1,
    index_head_dim] (the roped, LayerNorm-ed indexer key of each token). Same allocator, so a sequence's block table
    and slots are those of its latent rows."""

    def __init__(self, num_blocks: int, block_size: int, kv_lora_rank: int, qk_rope_head_dim: int,
                 index_head_dim: int, num_layers: int = 1, dtype: torch.dtype = torch.float32,
                 device: Optional[torch.device] = None):
        super().__init__(num_blocks, block_size, kv_lora_rank, qk_rope_head_dim, num_layers, dtype, device)
        if not isinstance(index_head_dim, int) or index_head_dim <= 0:
            raise ValueError(f"DSALatentCache: argument 'index_head_dim' must be a positive int; got "
                             f"{index_head_dim!r}")
        self.index_head_dim = index_head_dim
        self.index_caches = [torch.zeros(num_blocks, block_size, 1, index_head_dim, dtype=dtype, device=device)
                             for _ in range(num_layers)]

    def index_cache(self, layer: int = 0) -> Tensor:
        return self.index_caches[layer]


@dataclass
class DSATrainBatch:
    """A packed training step without a cache: sequence b is tokens [cu_seqlens[b-1], cu_seqlens[b]) of the TND
    input (cumulative ends, the last one T); each sequence attends causally to itself only."""
    cu_seqlens: List[int]


class DSAIndexer(nn.Module):
    """The lightning indexer's projections of one layer (weights in `x @ W` layouts):

    - query: c^Q @ `wq_b` [q_lora_rank, n_heads * head_dim], per head [rope Dr | rest];
    - key: LayerNorm(x @ `wk` [hidden, head_dim]) (`k_norm`, with bias), [rope Dr | rest], one head;
    - weights: x @ `weights_proj` [hidden, n_heads] times n_heads^-0.5 * head_dim^-0.5;

    the first Dr columns of query and key take the rotate-half rope (not the interleaved one of the MLA part).
    transformers scores sum_h w_h * ReLU(head_dim^-0.5 * q_h . k); since ReLU(c s) = c ReLU(s) for c > 0, its
    softmax scale is folded into the weights, which gives npu_lightning_indexer's score sum_h w_h * ReLU(q_h . k)."""

    def __init__(self, hidden_size: int, q_lora_rank: int, n_heads: int, head_dim: int, qk_rope_head_dim: int,
                 topk: int, *, norm_eps: float = 1e-6, dtype: torch.dtype = torch.float32,
                 device: Optional[torch.device] = None):
        super().__init__()
        if not 0 < qk_rope_head_dim <= head_dim:
            raise ValueError(f"DSAIndexer: argument 'head_dim' ({head_dim}) must hold the rope part "
                             f"qk_rope_head_dim ({qk_rope_head_dim})")
        self.n_heads, self.head_dim, self.qk_rope_head_dim, self.topk = n_heads, head_dim, qk_rope_head_dim, topk
        kw = dict(dtype=dtype, device=device)
        self.wq_b = nn.Parameter(torch.empty(q_lora_rank, n_heads * head_dim, **kw))
        self.wk = nn.Parameter(torch.empty(hidden_size, head_dim, **kw))
        self.k_norm = nn.LayerNorm(head_dim, eps=norm_eps, **kw)
        self.weights_proj = nn.Parameter(torch.empty(hidden_size, n_heads, **kw))
        self.weights_scale = n_heads ** -0.5 * head_dim ** -0.5
        for p in (self.wq_b, self.wk, self.weights_proj):
            nn.init.normal_(p, std=0.02)

    @classmethod
    @torch.no_grad()
    def from_hf(cls, hf_indexer: nn.Module) -> "DSAIndexer":
        """The weights of a transformers DeepseekV32Indexer (wq_b, wk, k_norm, weights_proj)."""
        a = hf_indexer
        for name in ("wq_b", "wk", "k_norm", "weights_proj", "n_heads", "head_dim", "index_topk"):
            if not hasattr(a, name):
                raise TypeError(f"DSAIndexer.from_hf: argument 'hf_indexer' must be a DeepseekV32Indexer (it has no "
                                f"'{name}'); got {type(a).__name__}")
        w = a.wk.weight
        m = cls(w.shape[1], a.wq_b.weight.shape[1], a.n_heads, a.head_dim, a.qk_rope_head_dim, a.index_topk,
                norm_eps=a.k_norm.eps, dtype=w.dtype, device=w.device)
        m.wq_b.copy_(a.wq_b.weight.t())
        m.wk.copy_(w.t())
        m.k_norm.load_state_dict(a.k_norm.state_dict())
        m.weights_proj.copy_(a.weights_proj.weight.t())
        return m

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        dr = self.qk_rope_head_dim
        return torch.cat([npu_rotary_mul(x[..., :dr].contiguous(), cos, sin, "half"), x[..., dr:]], dim=-1)

    def forward(self, x: Tensor, q_norm: Tensor, cos: Tensor, sin: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """x [.., hidden], c^Q q_norm [.., q_lora_rank], cos/sin [.., Dr] (rotate-half form) -> the indexer's query
        [.., n_heads, head_dim], key [.., 1, head_dim] and weights [.., n_heads] (float32 next to a 16-bit query,
        as the op takes them)."""
        lead = x.shape[:-1]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # one rotation per token, shared by the heads
        q = self._rope((q_norm @ self.wq_b).reshape(*lead, self.n_heads, self.head_dim), cos, sin)
        k = self._rope(self.k_norm(x @ self.wk).unsqueeze(-2), cos, sin)
        w_dtype = q.dtype if q.dtype in (torch.float32, torch.float64) else torch.float32
        w = (x.to(w_dtype) @ self.weights_proj.to(w_dtype)) * self.weights_scale
        return q.contiguous(), k.contiguous(), w.contiguous()


class DSAAttention(MLAAttention):
    """Absorbed MLA with DeepSeek-V3.2's sparse attention (see the module docstring): MLAAttention's weights (a q
    LoRA is required: the indexer reads c^Q) plus `indexer` (DSAIndexer); each query attends to the `index_topk`
    cached tokens (of those it sees causally) the indexer scores highest.

    forward(hidden_states, cos, sin, cache: DSALatentCache, batch: MLABatch) as MLAAttention's (TND [T, hidden] or
    BSND [B, S, hidden]); with a `DSATrainBatch` instead of a cache step it runs `forward_train`."""

    def __init__(self, hidden_size: int, num_heads: int, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: Optional[int] = None, *,
                 index_n_heads: int = 64, index_head_dim: int = 128, index_topk: int = 2048,
                 index_norm_eps: float = 1e-6, **kwargs):
        if q_lora_rank is None:
            raise ValueError("DSAAttention: argument 'q_lora_rank' must be an int: the indexer's query is projected "
                             "from c^Q, the normalised query latent")
        super().__init__(hidden_size, num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                         q_lora_rank, **kwargs)
        ref = self.weight_dq
        self.indexer = DSAIndexer(hidden_size, q_lora_rank, index_n_heads, index_head_dim, qk_rope_head_dim,
                                  index_topk, norm_eps=index_norm_eps, dtype=ref.dtype, device=ref.device)

    @classmethod
    def _hf_extra_kwargs(cls, hf_attention: nn.Module) -> dict:
        ix = hf_attention.indexer
        return dict(index_n_heads=ix.n_heads, index_head_dim=ix.head_dim, index_topk=ix.index_topk,
                    index_norm_eps=ix.k_norm.eps)

    @classmethod
    @torch.no_grad()
    def from_hf(cls, hf_attention: nn.Module) -> "DSAAttention":
        """The weights of a transformers DeepseekV32Attention: its MLA part as MLAAttention.from_hf reads it (the
        softmax scale is the layer's `scaling`, yarn's mscale^2 included), its `indexer` as DSAIndexer.from_hf."""
        if not hasattr(hf_attention, "indexer"):
            raise TypeError(f"DSAAttention.from_hf: argument 'hf_attention' must be a DeepseekV32Attention (it has no "
                            f"'indexer'); got {type(hf_attention).__name__}")
        m = super().from_hf(hf_attention)
        m.indexer = DSAIndexer.from_hf(hf_attention.indexer)
        return m

    # ------------------------------------------------------------------------------------------ paged inference
    def forward(self, hidden_states: Tensor, cos: Tensor, sin: Tensor, cache: Optional[DSALatentCache],
                batch) -> Tensor:
        if isinstance(batch, DSATrainBatch):
            return self.forward_train(hidden_states, cos, sin, batch.cu_seqlens)
        if not isinstance(cache, DSALatentCache):
            raise TypeError(f"DSAAttention: argument 'cache' must be a DSALatentCache (it holds the indexer keys); "
                            f"got {type(cache).__name__}")
        tnd, x, cos, sin, slots = self._step_inputs(hidden_states, cos, sin, batch)
        layer = self.layer_idx
        kv_cache, kr_cache, ki_cache = cache.kv_cache(layer), cache.kr_cache(layer), cache.index_cache(layer)
        q, q_rope, _, q_norm, _ = npu_mla_prolog_v3(
            x, self.weight_dq, self.weight_uq_qr, self.weight_uk, self.weight_dkv_kr, self.gamma_cq, self.gamma_ckv,
            sin, cos, kv_cache, kr_cache, cache_index=slots, rmsnorm_epsilon_cq=self.q_norm_eps,
            rmsnorm_epsilon_ckv=self.kv_norm_eps, cache_mode="PA_BSND", query_norm_flag=True)
        qi, ki, w = self.indexer(x, q_norm.reshape(*x.shape[:-1], -1), cos, sin)
        # The new tokens' indexer keys go to their slots (the latent rows' slots), as the prolog wrote the latents.
        npu_scatter_nd_update_(ki_cache.view(-1, 1, ki_cache.shape[-1]), slots.reshape(-1, 1),
                               ki.reshape(-1, 1, ki.shape[-1]))
        layout = "TND" if tnd else "BSND"
        q_lens = torch.tensor(batch.q_lens).cumsum(0).tolist() if tnd else None  # BSND: every row is a query
        paged = dict(block_table=batch.block_table, actual_seq_lengths_query=q_lens,
                     actual_seq_lengths_kv=batch.kv_lens)
        idx = npu_lightning_indexer(
            qi, ki_cache, w, actual_seq_lengths_query=q_lens, actual_seq_lengths_key=batch.kv_lens,
            block_table=batch.block_table, layout_query=layout, layout_key="PA_BSND", sparse_count=self.indexer.topk,
            sparse_mode=3)[0]
        out = npu_sparse_flash_attention(
            q, kv_cache, kv_cache, idx, self.scaling, query_rope=q_rope, key_rope=kr_cache, layout_query=layout,
            layout_kv="PA_BSND", sparse_mode=3, attention_mode=2, **paged)[0]
        return self._up_project(out, hidden_states.shape)

    # ------------------------------------------------------------------------------------------ training
    def forward_train(self, hidden_states: Tensor, cos: Tensor, sin: Tensor, cu_seqlens: Sequence[int]) -> Tensor:
        """A packed TND batch without a cache, differentiable in the MLA weights: the prolog's projections in
        PyTorch (npu_rms_norm, npu_interleave_rope), the indexer's selection under no_grad (as transformers), then
        npu_sparse_flash_attention over the batch's own latents (layout TND). hidden_states [T, hidden], cos/sin
        [T, Dr], cu_seqlens the cumulative sequence ends (last = T)."""
        if hidden_states.dim() != 2:
            raise ValueError(f"DSAAttention.forward_train: hidden_states must be TND [T, hidden]; got shape "
                             f"{list(hidden_states.shape)}")
        cu = [int(c) for c in cu_seqlens]
        if not cu or cu[-1] != hidden_states.shape[0] or any(b <= a for a, b in zip([0] + cu, cu)):
            raise ValueError(f"DSAAttention.forward_train: argument 'cu_seqlens' must be increasing cumulative "
                             f"sequence ends ending at T = {hidden_states.shape[0]}; got {cu}")
        x = hidden_states
        t, n, d, dr, r = x.shape[0], self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        cos, sin = cos.reshape(t, 1, dr).to(x.dtype), sin.reshape(t, 1, dr).to(x.dtype)
        cq = npu_rms_norm(x @ self.weight_dq, self.gamma_cq, self.q_norm_eps)[0]
        qc = (cq @ self.weight_uq_qr).reshape(t, n, d + dr)
        q = torch.einsum("tnd,ndr->tnr", qc[..., :d], self.weight_uk)  # W_uk absorbed into the query
        q_rope = npu_interleave_rope(qc[..., d:], cos, sin)
        kv = x @ self.weight_dkv_kr
        latent = npu_rms_norm(kv[:, :r], self.gamma_ckv, self.kv_norm_eps)[0].unsqueeze(1)  # [T, 1, r]
        k_rope = npu_interleave_rope(kv[:, None, r:], cos, sin)
        with torch.no_grad():  # the selection is not differentiated (transformers' indexer runs under no_grad)
            qi, ki, w = self.indexer(x, cq, cos[:, 0], sin[:, 0])
            idx = npu_lightning_indexer(qi, ki, w, actual_seq_lengths_query=cu, actual_seq_lengths_key=cu,
                                        layout_query="TND", layout_key="TND", sparse_count=self.indexer.topk,
                                        sparse_mode=3)[0]
        # key and value are the same latent tensor (MLA): autograd adds their two gradients.
        out = npu_sparse_flash_attention(
            q, latent, latent, idx, self.scaling, actual_seq_lengths_query=cu, actual_seq_lengths_kv=cu,
            query_rope=q_rope, key_rope=k_rope, layout_query="TND", layout_kv="TND", sparse_mode=3,
            attention_mode=2)[0]
        return self._up_project(out, x.shape)


class PagedDSARunner(PagedMLARunner):
    """A transformers DeepSeek-V3.2 causal LM (`DeepseekV32ForCausalLM`) with every layer's attention swapped for
    DSAAttention (`from_hf`) over one DSALatentCache: PagedMLARunner's prefill / decode / free / generate (ragged TND
    prefill, BSND decode, greedy; kv_cache.runner.PagedModelRunner), each step selecting `index_topk` keys per query with the lightning indexer over
    the paged indexer-key cache and attending to them with sparse flash attention.

        runner = PagedDSARunner(model, num_blocks=64, block_size=16)
        tokens = runner.generate([[5, 9, 2], [7, 1]], max_new_tokens=16)

    Training: `train_forward(sequences)` runs a packed batch (positions restart per sequence, no cache) and returns
    the logits [T, vocab] with autograd; `lm_loss(sequences)` is the sum over sequences of transformers' causal-LM
    loss of each (mean next-token cross entropy). The indexer gets no gradient (see the module docstring)."""

    _MODEL_EXAMPLE = "DeepseekV32ForCausalLM"

    def _make_cache(self, cfg, num_layers: int, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device) -> DSALatentCache:
        return DSALatentCache(num_blocks, block_size, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.index_head_dim,
                              num_layers=num_layers, dtype=dtype, device=device)

    def _attention_from_hf(self, hf_attention: nn.Module) -> DSAAttention:
        return DSAAttention.from_hf(hf_attention)

    def _train_batch(self, cu_seqlens: List[int]) -> DSATrainBatch:
        return DSATrainBatch(cu_seqlens)
