"""The normalisation family (aten_ops/cpu/norm, docs/norm.md): RMSNorm, alone and after a residual add.

- `api` — torch_npu's npu_rms_norm (+ backward), npu_gemma_rms_norm, npu_add_rms_norm (+ _v2, _v2_functional,
  _cast), the quantised npu_add_rms_norm_quant, npu_add_rms_norm_dynamic_quant, npu_rms_norm_quant;
- `fake` — the fake kernels of the family's ops.
"""
from .api import (
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
