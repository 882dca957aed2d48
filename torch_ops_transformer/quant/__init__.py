"""The activation quantisation family (aten_ops/cpu/quant, docs/quant.md): per-token int8/int4 quantisation and
SwiGLU.

- `api` — torch_npu's npu_dynamic_quant(_asymmetric), npu_swiglu (+ backward);
- `fake` — the fake kernels of the family's ops.
"""
from .api import npu_dynamic_quant, npu_dynamic_quant_asymmetric, npu_swiglu, npu_swiglu_backward
