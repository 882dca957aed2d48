"""The activation quantisation family (aten_ops/cpu/quant, docs/quant.md): per-token int8/int4 quantisation and
SwiGLU.

- `api` — torch_npu's npu_dynamic_quant(_asymmetric), npu_dynamic_block_quant, npu_swiglu (+ backward), npu_trans_quant_param,
  npu_quantize, npu_quant_matmul, npu_weight_quant_batchmatmul, npu_transpose_batchmatmul,
  npu_convert_weight_to_int4pack, npu_clipped_swiglu, npu_dequant_swiglu_quant;
- `fake` — the fake kernels of the family's ops.
"""
from .api import (npu_clipped_swiglu, npu_convert_weight_to_int4pack, npu_dequant_swiglu_quant, npu_dynamic_block_quant,
                  npu_dynamic_quant,
                  npu_dynamic_quant_asymmetric, npu_quant_matmul, npu_quantize, npu_swiglu, npu_swiglu_backward,
                  npu_trans_quant_param, npu_transpose_batchmatmul, npu_weight_quant_batchmatmul)
