"""The sparse attention family of DeepSeek-V3.2 (DSA) (aten_ops/cpu/sparse_attention, docs/sparse_attention.md).

- `indexer` — the lightning indexer: torch_npu's npu_lightning_indexer, npu_quant_lightning_indexer,
  npu_lightning_indexer_grad and npu_sparse_lightning_indexer_grad_kl_loss;
- `sparse_flash` — torch_npu's npu_sparse_flash_attention (+ its grad) and npu_kv_quant_sparse_flash_attention;
- `fake` — the fake kernels of the family's ops.
"""
from .indexer import (npu_lightning_indexer, npu_lightning_indexer_grad, npu_quant_lightning_indexer,
                      npu_sparse_lightning_indexer_grad_kl_loss)
from .sparse_flash import (npu_kv_quant_sparse_flash_attention, npu_sparse_flash_attention,
                           npu_sparse_flash_attention_grad)
