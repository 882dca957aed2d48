"""The inference attention family (aten_ops/cpu/inference, docs/inference.md): prefill, decode and the fused
serving entry point over contiguous, paged and int8 KV caches.

- `api` — torch_npu's npu_prompt_flash_attention, npu_fused_infer_attention_score(_v2), npu_incre_flash_attention,
  npu_attention_update, and attention_update;
- `fake` — the fake kernels of the family's ops.
"""
from .api import (
    attention_update,
    npu_attention_update,
    npu_fused_infer_attention_score,
    npu_fused_infer_attention_score_v2,
    npu_incre_flash_attention,
    npu_prompt_flash_attention,
)
