"""The linear attention family (aten_ops/cpu/linear_attention, docs/linear_attention.md): the Gated DeltaNet layers
of Qwen3-Next / Qwen3.5 and Kimi-Linear.

- `chunk_gated_delta_rule` — torch_npu's npu_chunk_gated_delta_rule (the prefill / training form);
- `fake_chunk_gated_delta_rule` — its fake kernels (one fake module per part of the family).
"""
from . import fake_chunk_gated_delta_rule  # noqa: F401  (the YAML names it; imported with the family)
from .chunk_gated_delta_rule import npu_chunk_gated_delta_rule
