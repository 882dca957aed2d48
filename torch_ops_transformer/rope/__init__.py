"""The rotary position embedding family (aten_ops/cpu/rope, docs/rope.md).

- `api` — torch_npu's npu_rotary_mul (+ backward), npu_rotary_position_embedding, npu_apply_rotary_pos_emb,
  npu_interleave_rope, vLLM's rope_with_sin_cos_cache and npu_mrope;
- `fake` — the fake kernels of the family's ops.
"""
from .api import (
    ROTARY_MODES,
    npu_apply_rotary_pos_emb,
    npu_interleave_rope,
    npu_mrope,
    npu_rotary_mul,
    npu_rotary_mul_backward,
    npu_rotary_position_embedding,
    rope_with_sin_cos_cache,
)
