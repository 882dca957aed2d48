"""torch_ops_transformer: CANN ops-transformer as native PyTorch ops (`torch.ops.npu_fa.*`).

Importing the package loads the C++ kernels and registers fake kernels and autograd formulas, all
generated from native_functions.yaml. Public Python API:

- `npu_fusion_attention`, `npu_fusion_attention_grad` — torch_npu's exact signatures;
- `flash_attn_func`, `flash_attn_varlen_func` — the FlashAttention-2 convention;
- `FlashAttention` — the nn.Module of the seed article;
- `attention_tiles` — read or override the CPU tile sizes;
- `npu_rotary_mul`, `npu_rotary_position_embedding`, `npu_apply_rotary_pos_emb`, `rope_with_sin_cos_cache` — RoPE;
- `PagedKVCache` — a block-allocated KV cache written through `scatter_pa_kv_cache`.
- `npu_prompt_flash_attention`, `npu_fused_infer_attention_score`, `attention_update` — inference (prefill).
- `npu_incre_flash_attention` — decode attention over a contiguous or paged KV cache (torch_npu signature).
- `npu_grouped_matmul`, `grouped_matmul` — grouped (per-expert) matmul with fused bias and activation.
- `MOELayer` — the seed article's Mixture-of-Experts layer, single-process or expert-parallel.
- `npu_moe_gating_top_k_softmax(_v2)`, `npu_moe_gating_top_k`, `npu_moe_init_routing(_v2)`,
  `npu_moe_compute_expert_tokens`, `npu_moe_finalize_routing`, `npu_moe_token_permute` / `_unpermute` — MoE routing.
"""
from ._ops_loader import load as _load

_load()

from ._generated.registrations import OPS  # noqa: E402
from .attention import (  # noqa: E402
    FlashAttention,
    attention_tiles,
    attention_tiles_override,
    flash_attn_func,
    flash_attn_varlen_func,
    npu_fusion_attention,
    npu_fusion_attention_grad,
)
from .grouped_matmul import grouped_matmul, npu_grouped_matmul  # noqa: E402
from .kv_cache import PagedKVCache  # noqa: E402
from .moe_layer import MOELayer  # noqa: E402
from .rope import (  # noqa: E402
    npu_apply_rotary_pos_emb,
    npu_rotary_mul,
    npu_rotary_position_embedding,
    rope_with_sin_cos_cache,
)
from .inference import (  # noqa: E402
    attention_update,
    npu_fused_infer_attention_score,
    npu_incre_flash_attention,
    npu_prompt_flash_attention,
)
from .moe_routing import (  # noqa: E402
    npu_moe_compute_expert_tokens,
    npu_moe_finalize_routing,
    npu_moe_gating_top_k,
    npu_moe_gating_top_k_softmax,
    npu_moe_gating_top_k_softmax_v2,
    npu_moe_init_routing,
    npu_moe_init_routing_v2,
    npu_moe_token_permute,
    npu_moe_token_unpermute,
)

__all__ = [
    "OPS",
    "FlashAttention",
    "attention_tiles",
    "attention_tiles_override",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "npu_fusion_attention",
    "npu_fusion_attention_grad",
    "PagedKVCache",
    "npu_apply_rotary_pos_emb",
    "npu_rotary_mul",
    "npu_rotary_position_embedding",
    "rope_with_sin_cos_cache",
    "attention_update",
    "npu_fused_infer_attention_score",
    "npu_prompt_flash_attention",
    "npu_incre_flash_attention",
    "grouped_matmul",
    "npu_grouped_matmul",
    "MOELayer",
    "npu_moe_compute_expert_tokens",
    "npu_moe_finalize_routing",
    "npu_moe_gating_top_k",
    "npu_moe_gating_top_k_softmax",
    "npu_moe_gating_top_k_softmax_v2",
    "npu_moe_init_routing",
    "npu_moe_init_routing_v2",
    "npu_moe_token_permute",
    "npu_moe_token_unpermute",
]
__version__ = "0.1.0"
