"""How the ops reach code that does not call them by name (docs/sdpa_and_compile.md, docs/demo_and_hf.md).

- `sdpa` — F.scaled_dot_product_attention with PyTorch's semantics on our ops, and the override that routes
  F.scaled_dot_product_attention there;
- `inductor_lowering` — Inductor passes that rewrite attention in torch.compile'd graphs to our ops (imported on
  first use: it loads Inductor);
- `hf` — the transformers drop-in (attn_implementation="npu_fa", experts_implementation="npu_moe", MoE blocks;
  imports transformers); `hf_autoregister` — registers "npu_fa" once transformers is imported, never importing it.
"""
from .sdpa import (
    disable_sdpa_override,
    enable_sdpa_override,
    scaled_dot_product_attention,
    sdpa_override,
    supported,
    try_scaled_dot_product_attention,
)
