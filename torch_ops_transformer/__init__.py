"""torch_ops_transformer: CANN ops-transformer as native PyTorch ops (`torch.ops.npu_fa.*`).

Importing the package loads the C++ kernels and registers fake kernels and autograd formulas, all
generated from native_functions.yaml. Public Python API:

- `npu_fusion_attention`, `npu_fusion_attention_grad` — torch_npu's exact signatures;
- `flash_attn_func`, `flash_attn_varlen_func` — the FlashAttention-2 convention;
- `FlashAttention` — the nn.Module of the seed article;
- `attention_tiles` — read or override the CPU tile sizes;
- `npu_prompt_flash_attention`, `npu_fused_infer_attention_score`, `attention_update` — inference (prefill).
- `npu_incre_flash_attention` — decode attention over a contiguous or paged KV cache (torch_npu signature).
"""
from ._ops_loader import load as _load

_load()

from ._generated.registrations import OPS  # noqa: E402
from .attention import (  # noqa: E402
    FlashAttention,
    attention_tiles,
    attention_tiles_override,
    flash_attn_func,
    flash_attn_varlen_func,
    npu_fusion_attention,
    npu_fusion_attention_grad,
)
from .inference import (  # noqa: E402  (prefill)
    attention_update,
    npu_fused_infer_attention_score,
    npu_prompt_flash_attention,
)
from .inference import npu_incre_flash_attention  # noqa: E402

__all__ = [
    "OPS",
    "FlashAttention",
    "attention_tiles",
    "attention_tiles_override",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "npu_fusion_attention",
    "npu_fusion_attention_grad",
    # prefill
    "attention_update",
    "npu_fused_infer_attention_score",
    "npu_prompt_flash_attention",
    "npu_incre_flash_attention",
]
__version__ = "0.1.0"
