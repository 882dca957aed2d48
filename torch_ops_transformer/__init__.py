"""torch_ops_transformer: CANN ops-transformer as native PyTorch ops (`torch.ops.npu_fa.*`).

Importing the package loads the C++ kernels and registers fake kernels and autograd formulas, all
generated from native_functions.yaml. Public Python API:

- `npu_fusion_attention`, `npu_fusion_attention_grad` — torch_npu's exact signatures;
- `flash_attn_func`, `flash_attn_varlen_func` — the FlashAttention-2 convention; `flash_attn_qkvpacked_func`,
  `flash_attn_kvpacked_func`, `flash_attn_varlen_qkvpacked_func`, `flash_attn_varlen_kvpacked_func`,
  `flash_attn_with_kvcache` — the rest of FlashAttention-2's API (module `attention.fa2`; opt-in `import flash_attn` shim:
  `torch_ops_transformer.compat.flash_attn`);
- `FlashAttention` — an nn.Module: FlashAttention(head_dim, num_heads, causal);
- `attention_tiles` — read or override the CPU tile sizes; `tuning` — the per-machine block-size tuning
  (TORCH_OPS_TRANSFORMER_TUNE, `tuning.tuned_tiles`, `tuning.clear_cache`, `tuning.cache_path`;
  `python -m torch_ops_transformer tune`);
- `npu_rotary_mul` (+`_backward`), `npu_rotary_position_embedding`, `npu_apply_rotary_pos_emb`,
  `rope_with_sin_cos_cache`, `npu_interleave_rope` — RoPE;
- `MLAAttention`, `MLALatentCache`, `PagedMLARunner` — DeepSeek's absorbed Multi-head Latent Attention on the MLA ops
  (prolog, latent-space fused attention over a paged latent cache, W_uv and o_proj), from a transformers
  DeepseekV3Attention (`from_hf`), and a runner that drives a transformers DeepSeek-V3 with it (docs/mla.md);
- `DSAAttention`, `DSALatentCache`, `PagedDSARunner` — DeepSeek-V3.2's sparse attention (lightning indexer +
  sparse flash attention over paged caches) and a runner that drives a transformers DeepSeek-V3.2 with it
  (docs/sparse_attention.md);
- `PagedKVCache` — a block-allocated KV cache written through `scatter_pa_kv_cache`; `npu_scatter_pa_kv_cache`
  (torch_npu's form of that write, ND and PA_NZ caches); `npu_kv_rmsnorm_rope_cache` (+`_v2`, `_v2_functional`) —
  MLA's RMSNorm + interleaved rope + latent-cache write.
- `npu_mla_prolog`, `npu_mla_prolog_v2`, `npu_mla_prolog_v3`, `npu_mla_prolog_v3_functional` — the MLA prolog
  (query absorption, interleaved rope, latent RMSNorm, in-place latent cache writes; module `mla.prolog`);
- `npu_prompt_flash_attention`, `npu_fused_infer_attention_score(_v2)`, `attention_update`, `npu_attention_update` —
  inference (prefill).
- `npu_incre_flash_attention` — decode attention over a contiguous or paged KV cache (torch_npu signature).
- `scaled_dot_product_attention`, `sdpa_supported`, `try_scaled_dot_product_attention` —
  F.scaled_dot_product_attention with PyTorch's semantics on our ops (PyTorch fallback otherwise);
  `sdpa_override()` (this thread) and `enable_sdpa_override()`, `disable_sdpa_override()` (every thread) route
  F.scaled_dot_product_attention calls there (docs/sdpa_and_compile.md).
- `enable_compile_lowering()`, `disable_compile_lowering()`, `compile_lowering()` — Inductor passes that rewrite
  attention in torch.compile'd graphs to our ops (module `integrations.inductor_lowering`, imported on first use: it loads Inductor).
- `npu_all_gather_base_mm`, `npu_mm_reduce_scatter_base`, `npu_mm_all_reduce_base`, `npu_mm_all_reduce_add_rms_norm`
  — MC2 matmul fused with collectives (torch_npu signatures); `tensor_parallel` — column/row-parallel Linear layers.
- `register_hf_attention`, `replace_attention_with_flash` — the transformers drop-in (attn_implementation="npu_fa").
  transformers stays optional and is not imported here: "npu_fa" is registered automatically when transformers'
  modeling code is imported (before or after this package); `register_hf_attention()` does it by hand.
- `npu_grouped_matmul`, `grouped_matmul` — grouped (per-expert) matmul with fused bias and activation (also W8A8 and
  int8/int4 weight-only); `npu_grouped_matmul_swiglu_quant` (+ _v2) — W8A8 grouped matmul + SwiGLU + int8 requant.
- `MOELayer` — a Mixture-of-Experts layer (gate, route, expert FFNs, combine), single-process or expert-parallel;
  `DeepseekV3MoEBlock`, `Qwen3MoeBlock`, `replace_moe_blocks` — transformers' MoE blocks on these ops.
- `moe_ffn`, `moe_ffn_prepack`, `MoeFfnWeights` — the fused MoE expert FFN for inference (routing, gate/up + SwiGLU,
  down, weighted combine in one call on weights packed once).
- `npu_moe_gating_top_k_softmax(_v2)`, `npu_moe_gating_top_k` (+`_backward`), `npu_moe_init_routing(_v2)`,
  `npu_moe_compute_expert_tokens`, `npu_moe_finalize_routing`, `npu_moe_token_permute` / `_unpermute` — MoE routing.
- `npu_moe_distribute_dispatch(_v2)`, `npu_moe_distribute_combine(_v2)` — expert-parallel token exchange on any
  torch.distributed group (docs/moe.md).
- `npu_dynamic_quant` (+`_asymmetric`), `npu_dynamic_block_quant`, `npu_swiglu` (+`_backward`) — per-token
  int8/int4 and per-block int8/float8 quantisation, and SwiGLU (package `quant`).
- `npu_rms_norm` (+`_backward`), `npu_gemma_rms_norm`, `npu_add_rms_norm` (+`_v2`, `_v2_functional`, `_cast`,
  `_quant`, `_dynamic_quant`), `npu_rms_norm_quant` — RMSNorm, alone and after a residual add, and quantised (package
  `norm`).
- `npu_sim` — a simulated "npu" device in CPU memory (`npu_sim.enable()` or TOT_NPU_SIM=1; docs/npu_sim.md).
- `oracle` — a differential oracle: every device call of our ops also computed by the CPU kernels and judged
  (`with oracle.check(mode="warn" | "raise" | "sample")` or TOT_ORACLE=...; docs/oracle.md).
- `npu_sim.sdpa` — F.scaled_dot_product_attention on npu tensors runs our flash attention through PyTorch's
  overrideable SDPA hook (installed by `npu_sim.enable()`; opt-in `npu_sim.sdpa.enable()` with torch_npu; docs/npu_sdpa.md).
- `MC2Optimizer`, `MC2DistributedDataParallel` — data-parallel training with the gradient all-reduce fused with
  the optimizer update (an unchanged DDP training loop), on torch.distributed (docs/mc2.md).
- `npu_sparse_flash_attention` (+`_grad`), `npu_kv_quant_sparse_flash_attention` — DeepSeek-V3.2's sparse attention
  over the tokens an indexer selected, plain, paged or int8 MLA caches (package `sparse_attention`).
- `npu_chunk_gated_delta_rule` — the Gated DeltaNet recurrence of Qwen3-Next / Qwen3.5 and Kimi-Linear over whole
  sequences, in chunks (differentiable; package `linear_attention`).
- `npu_fused_causal_conv1d` (+`_v2`), `npu_masked_causal_conv1d` (+`_backward`) — the causal depthwise conv1d of
  Gated DeltaNet / Mamba layers over a conv-state cache, and its masked training form (package `linear_attention`).

The package is laid out family-first, like aten_ops/cpu/ and test/: attention, inference, rope, kv_cache, mla, moe,
mc2, quant, sparse_attention (each with its torch_npu-compatible API, modules and fake kernels), the role packages
integrations, npu_sim, compat, oracle, bench, and the private _internal and _library (docs/architecture.md). This
file only re-exports; `_startup()` below is the one place that says what importing the package does, in order.
"""

from ._internal import aliases as _aliases
from ._internal.version import __version__
from ._library import loader as _loader
from ._library.generated.registrations import OPS
from .attention import (
    FlashAttention,
    attention_tiles,
    attention_tiles_override,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    npu_fusion_attention,
    npu_fusion_attention_grad,
    npu_fusion_attention_grad_v2,
    npu_fusion_attention_v2,
    tuning,
)
from .inference import (
    attention_update,
    npu_attention_update,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_v2,
    npu_incre_flash_attention,
    npu_prompt_flash_attention,
)
from .integrations import (
    disable_sdpa_override,
    enable_sdpa_override,
    scaled_dot_product_attention,
    sdpa_override,
    try_scaled_dot_product_attention,
)
from .integrations import supported as sdpa_supported
from .integrations import hf_autoregister as _hf_autoregister
from .kv_cache import (
    PagedKVCache,
    npu_kv_rmsnorm_rope_cache,
    npu_kv_rmsnorm_rope_cache_v2,
    npu_kv_rmsnorm_rope_cache_v2_functional,
    npu_scatter_pa_kv_cache,
)
from .mc2 import (
    MC2DistributedDataParallel,
    MC2Optimizer,
    mc2_validation,
    npu_all_gather_base_mm,
    npu_all_gather_quant_mm,
    npu_mm_all_reduce_add_rms_norm,
    npu_mm_all_reduce_base,
    npu_mm_reduce_scatter_base,
    tensor_parallel,
)
from .mla import (
    DSAAttention,
    DSALatentCache,
    MLAAttention,
    MLALatentCache,
    PagedDSARunner,
    PagedMLARunner,
    npu_mla_prolog,
    npu_mla_prolog_v2,
    npu_mla_prolog_v3,
    npu_mla_prolog_v3_functional,
)
from .moe import (
    DeepseekV3MoEBlock,
    MOELayer,
    MoeFfnWeights,
    Qwen3MoeBlock,
    grouped_matmul,
    moe_ffn,
    moe_ffn_prepack,
    npu_grouped_matmul,
    npu_grouped_matmul_swiglu_quant,
    npu_grouped_matmul_swiglu_quant_v2,
    npu_moe_compute_expert_tokens,
    npu_moe_distribute_combine,
    npu_moe_distribute_combine_v2,
    npu_moe_distribute_dispatch,
    npu_moe_distribute_dispatch_v2,
    npu_moe_finalize_routing,
    npu_moe_gating_top_k,
    npu_moe_gating_top_k_backward,
    npu_moe_gating_top_k_softmax,
    npu_moe_gating_top_k_softmax_v2,
    npu_moe_init_routing,
    npu_moe_init_routing_v2,
    npu_moe_token_permute,
    npu_moe_token_unpermute,
)
from . import npu_sim, oracle
from .norm import (
    npu_add_rms_norm,
    npu_add_rms_norm_cast,
    npu_add_rms_norm_dynamic_quant,
    npu_add_rms_norm_quant,
    npu_add_rms_norm_v2,
    npu_add_rms_norm_v2_functional,
    npu_gemma_rms_norm,
    npu_rms_norm,
    npu_rms_norm_backward,
    npu_rms_norm_quant,
)
from .quant import npu_dynamic_quant, npu_dynamic_quant_asymmetric, npu_swiglu, npu_swiglu_backward
from .quant import npu_quant_matmul, npu_quantize, npu_trans_quant_param, npu_weight_quant_batchmatmul
from .quant import npu_clipped_swiglu, npu_convert_weight_to_int4pack, npu_transpose_batchmatmul
from .quant import npu_dequant_swiglu_quant, npu_dynamic_block_quant
from .rope import (
    npu_apply_rotary_pos_emb,
    npu_interleave_rope,
    npu_rotary_mul,
    npu_rotary_mul_backward,
    npu_rotary_position_embedding,
    rope_with_sin_cos_cache,
)
from .rope import npu_mrope  # decoder-layer and serving-loop ops: rope, sampling, kv_cache, attention, moe
from .sampling import npu_top_k_top_p
from .linear_attention import (RMSNormGated, npu_recurrent_gated_delta_rule,
                               npu_recurrent_gated_delta_rule_functional, rms_norm_gated)
from .sparse_attention import (npu_lightning_indexer, npu_lightning_indexer_grad, npu_quant_lightning_indexer,
                               npu_sparse_lightning_indexer_grad_kl_loss)
from .kv_cache import (npu_gather_pa_kv_cache, npu_gather_pa_kv_cache_functional, npu_scatter_nd_update,
                       npu_scatter_nd_update_)
from .attention import npu_ring_attention_update
from .moe import npu_grouped_matmul_add, npu_grouped_matmul_add_
from .sparse_attention import (npu_kv_quant_sparse_flash_attention, npu_sparse_flash_attention,
                               npu_sparse_flash_attention_grad)
from .linear_attention import npu_chunk_gated_delta_rule  # linear attention (Gated DeltaNet)
from .linear_attention import (npu_fused_causal_conv1d, npu_fused_causal_conv1d_v2, npu_masked_causal_conv1d,
                               npu_masked_causal_conv1d_backward)


def enable_compile_lowering() -> None:
    """See torch_ops_transformer.integrations.inductor_lowering."""
    from .integrations import inductor_lowering  # lazy: imports Inductor's pattern matcher (heavy)

    inductor_lowering.enable_compile_lowering()


def disable_compile_lowering() -> None:
    from .integrations import inductor_lowering  # lazy: imports Inductor's pattern matcher (heavy)

    inductor_lowering.disable_compile_lowering()


def compile_lowering():
    """Context manager: Inductor lowers attention to our ops for graphs compiled inside the block."""
    from .integrations import inductor_lowering  # lazy: imports Inductor's pattern matcher (heavy)

    return inductor_lowering.compile_lowering()


__all__ = [
    "OPS",
    "npu_add_rms_norm",
    "npu_add_rms_norm_cast",
    "npu_add_rms_norm_dynamic_quant",
    "npu_add_rms_norm_quant",
    "npu_add_rms_norm_v2",
    "npu_add_rms_norm_v2_functional",
    "npu_gemma_rms_norm",
    "npu_rms_norm",
    "npu_rms_norm_backward",
    "npu_rms_norm_quant",
    "FlashAttention",
    "attention_tiles",
    "attention_tiles_override",
    "tuning",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "npu_fusion_attention",
    "npu_fusion_attention_grad",
    "npu_fusion_attention_v2",
    "npu_fusion_attention_grad_v2",
    "PagedKVCache",
    "MLAAttention",
    "MLALatentCache",
    "PagedMLARunner",
    "DSAAttention",
    "DSALatentCache",
    "PagedDSARunner",
    "npu_apply_rotary_pos_emb",
    "npu_interleave_rope",
    "npu_rotary_mul",
    "npu_rotary_mul_backward",
    "npu_rotary_position_embedding",
    "rope_with_sin_cos_cache",
    "attention_update",
    "npu_attention_update",
    "npu_fused_infer_attention_score",
    "npu_fused_infer_attention_score_v2",
    "npu_prompt_flash_attention",
    "npu_incre_flash_attention",
    "npu_scatter_pa_kv_cache",
    "npu_kv_rmsnorm_rope_cache",
    "npu_kv_rmsnorm_rope_cache_v2",
    "npu_kv_rmsnorm_rope_cache_v2_functional",
    "npu_mla_prolog",
    "npu_mla_prolog_v2",
    "npu_mla_prolog_v3",
    "npu_mla_prolog_v3_functional",
    "scaled_dot_product_attention",
    "sdpa_supported",
    "try_scaled_dot_product_attention",
    "sdpa_override",
    "enable_sdpa_override",
    "disable_sdpa_override",
    "enable_compile_lowering",
    "disable_compile_lowering",
    "compile_lowering",
    "mc2_validation",
    "npu_all_gather_base_mm",
    "npu_all_gather_quant_mm",
    "npu_mm_all_reduce_add_rms_norm",
    "npu_mm_all_reduce_base",
    "npu_mm_reduce_scatter_base",
    "tensor_parallel",
    "register_hf_attention",
    "replace_attention_with_flash",
    "grouped_matmul",
    "moe_ffn",
    "moe_ffn_prepack",
    "MoeFfnWeights",
    "npu_grouped_matmul",
    "npu_grouped_matmul_swiglu_quant",
    "npu_grouped_matmul_swiglu_quant_v2",
    "DeepseekV3MoEBlock",
    "MOELayer",
    "Qwen3MoeBlock",
    "register_hf_experts",
    "replace_moe_blocks",
    "npu_moe_compute_expert_tokens",
    "npu_moe_finalize_routing",
    "npu_moe_gating_top_k",
    "npu_moe_gating_top_k_backward",
    "npu_moe_gating_top_k_softmax",
    "npu_moe_gating_top_k_softmax_v2",
    "npu_moe_init_routing",
    "npu_moe_init_routing_v2",
    "npu_moe_token_permute",
    "npu_moe_token_unpermute",
    "npu_dynamic_quant",
    "npu_dynamic_quant_asymmetric",
    "npu_dynamic_block_quant",
    "npu_swiglu",
    "npu_swiglu_backward",
    "MC2Optimizer",
    "MC2DistributedDataParallel",
]
__all__ += ["npu_trans_quant_param", "npu_quantize", "npu_quant_matmul", "npu_weight_quant_batchmatmul",
            "npu_transpose_batchmatmul", "npu_convert_weight_to_int4pack", "npu_clipped_swiglu",
            "npu_dequant_swiglu_quant"]
__all__ += ["npu_moe_distribute_combine", "npu_moe_distribute_combine_v2", "npu_moe_distribute_dispatch",
            "npu_moe_distribute_dispatch_v2"]
__all__ += ["npu_mrope", "npu_top_k_top_p", "npu_gather_pa_kv_cache", "npu_gather_pa_kv_cache_functional",
            "npu_scatter_nd_update", "npu_scatter_nd_update_", "npu_ring_attention_update", "npu_grouped_matmul_add",
            "npu_grouped_matmul_add_"]
__all__ += ["npu_sparse_flash_attention", "npu_sparse_flash_attention_grad", "npu_kv_quant_sparse_flash_attention"]
__all__ += ["npu_recurrent_gated_delta_rule", "npu_recurrent_gated_delta_rule_functional", "rms_norm_gated",
            "RMSNormGated"]
__all__ += ["npu_chunk_gated_delta_rule"]
__all__ += ["npu_fused_causal_conv1d", "npu_fused_causal_conv1d_v2", "npu_masked_causal_conv1d",
            "npu_masked_causal_conv1d_backward"]


def _startup() -> None:
    """What importing the package does, in this order (each step needs the ones before it)."""
    _loader.load()  # the compiled ops, then their fake kernels and autograd formulas (generated from the YAML)
    tuning._autoload()  # this machine's tuned tile sizes (docs/attention.md, "Block-size tuning")
    npu_sim.enable_from_environment()  # TOT_NPU_SIM=1: the simulated npu device (docs/npu_sim.md)
    oracle.from_env()  # TOT_ORACLE=warn|raise|sample: check every device call of our ops (docs/oracle.md)
    _hf_autoregister.install()  # attn_implementation="npu_fa" once transformers is imported (never imports it here)
    _aliases.install()  # the old dotted module paths keep importing, with a DeprecationWarning


_startup()

_LAZY_HF = ("register_hf_attention", "replace_attention_with_flash", "register_hf_experts", "replace_moe_blocks")


def __getattr__(name):
    if name in _LAZY_HF:
        from .integrations import hf  # lazy: imports transformers (optional)

        return getattr(hf, name)
    return _aliases.attribute(name)  # an old module name (tot.sdpa, tot.fa2, ...), or AttributeError
