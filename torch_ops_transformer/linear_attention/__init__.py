"""The linear attention family (aten_ops/cpu/linear_attention, docs/linear_attention.md): the Gated DeltaNet layers
of Qwen3-Next / Qwen3.5 and Kimi-Linear.

- `chunk_gated_delta_rule` — torch_npu's npu_chunk_gated_delta_rule (the prefill / training form);
- `recurrent_gated_delta_rule` — torch_npu's npu_recurrent_gated_delta_rule (+ _functional), the decode form over a
  state cache, and Qwen3-Next's gated RMSNorm (`rms_norm_gated`, `RMSNormGated`);
- `causal_conv1d` — torch_npu's causal depthwise conv1d ops (npu_fused_causal_conv1d, _v2, npu_masked_causal_conv1d
  and its backward);
- `fake_<part>` — the fake kernels of each part.
"""
from . import fake_causal_conv1d, fake_chunk_gated_delta_rule, fake_recurrent_gated_delta_rule  # noqa: F401  (YAML)
from .causal_conv1d import (npu_fused_causal_conv1d, npu_fused_causal_conv1d_v2, npu_masked_causal_conv1d,
                            npu_masked_causal_conv1d_backward)
from .chunk_gated_delta_rule import npu_chunk_gated_delta_rule
from .recurrent_gated_delta_rule import (RMSNormGated, npu_recurrent_gated_delta_rule,
                                         npu_recurrent_gated_delta_rule_functional, rms_norm_gated)
