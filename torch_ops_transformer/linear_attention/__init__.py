"""The linear attention family (aten_ops/cpu/linear_attention, docs/linear_attention.md): Gated DeltaNet (Qwen3-Next,
Qwen3.5) and Kimi Delta Attention layers.

- `recurrent_gated_delta_rule` — torch_npu's npu_recurrent_gated_delta_rule (+ _functional), Qwen3-Next's gated
  RMSNorm (`rms_norm_gated`, `RMSNormGated`);
- `fake_recurrent_gated_delta_rule` — their fake kernels.
"""
from .recurrent_gated_delta_rule import (RMSNormGated, npu_recurrent_gated_delta_rule,
                                         npu_recurrent_gated_delta_rule_functional, rms_norm_gated)
