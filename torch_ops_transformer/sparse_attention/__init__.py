"""The sparse attention family (aten_ops/cpu/sparse_attention, docs/sparse_attention.md): DeepSeek-V3.2's sparse
attention (DSA).

- `sparse_flash` — torch_npu's npu_sparse_flash_attention (+ its grad) and npu_kv_quant_sparse_flash_attention;
- `fake` — the fake kernels of the family's ops.
"""
from .sparse_flash import (npu_kv_quant_sparse_flash_attention, npu_sparse_flash_attention,
                           npu_sparse_flash_attention_grad)
