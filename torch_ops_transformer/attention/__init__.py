"""The training attention family (aten_ops/cpu/attention, docs/attention.md): FlashAttention forward and backward.

- `api` — torch_npu's npu_fusion_attention(_v2), its gradient, _npu_dropout_gen_mask and
  npu_ring_attention_update;
- `fa2` — all of FlashAttention-2's Python API (flash_attn_func, varlen, packed, with_kvcache, S_dmask);
- `module` — the FlashAttention nn.Module;
- `tiles`, `tuning` — the CPU tile sizes and their per-machine tuning;
- `fake` — the fake kernels of the family's ops (named in native_functions.yaml).
"""
from . import tuning
from .api import (
    _npu_dropout_gen_mask,
    npu_fusion_attention,
    npu_fusion_attention_grad,
    npu_fusion_attention_grad_v2,
    npu_fusion_attention_v2,
    npu_ring_attention_update,
)
from .fa2 import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from .module import FlashAttention
from .tiles import attention_tiles, attention_tiles_override
