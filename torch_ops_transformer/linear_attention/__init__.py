"""The linear-attention family (aten_ops/cpu/linear_attention, docs/linear_attention.md): the layers of Qwen3-Next /
Qwen3.5 Gated DeltaNet and Kimi-Linear.

- `causal_conv1d` — torch_npu's causal depthwise conv1d ops (npu_fused_causal_conv1d, _v2, npu_masked_causal_conv1d
  and its backward);
- `fake_causal_conv1d` — their fake kernels.
"""
from .causal_conv1d import (npu_fused_causal_conv1d, npu_fused_causal_conv1d_v2, npu_masked_causal_conv1d,
                            npu_masked_causal_conv1d_backward)
