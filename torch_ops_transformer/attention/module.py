"""FlashAttention as an nn.Module over flash_attention_score."""
import math
from typing import Optional

import torch
from torch import Tensor, nn

from .._internal.args import dropout_seed as _draw_seed

_OPS = torch.ops.npu_fa


class FlashAttention(nn.Module):
    """An nn.Module over flash_attention_score: FlashAttention(head_dim, num_heads, causal).

    forward(query, key, value, atten_mask=None) takes BSND tensors [B,S,N,D] (key/value may have fewer heads,
    GQA) or BSH tensors [B,S,N*D], and returns the attention output in the same layout. `causal` is
    bottom-right aligned; `atten_mask` is bool with True = masked out. `dropout` applies in training mode.
    """

    def __init__(self, head_dim: int, num_heads: int, causal: bool = False, dropout: float = 0.0,
                 softmax_scale: Optional[float] = None):
        super().__init__()
        if head_dim <= 0 or num_heads <= 0:
            raise ValueError(f"head_dim and num_heads must be positive; got {head_dim}, {num_heads}")
        self.head_dim, self.num_heads, self.causal, self.dropout = head_dim, num_heads, causal, dropout
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, atten_mask: Optional[Tensor] = None) -> Tensor:
        layout = "BSH" if query.dim() == 3 else "BSND"
        keep = 1.0 - (self.dropout if self.training else 0.0)
        seed, offset = _draw_seed(keep, query.device)
        if self.causal and atten_mask is not None:  # ambiguous: put the causal band into the mask yourself
            raise ValueError("FlashAttention: pass either causal=True or atten_mask, not both")
        mode = 3 if self.causal else 0  # bottom-right causal, or the mask / full attention
        return _OPS.flash_attention_score(
            query, key, value, self.num_heads, layout, atten_mask=atten_mask, scale=self.softmax_scale,
            keep_prob=keep, sparse_mode=mode, seed=seed, offset=offset)[0]

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}, causal={self.causal}, dropout={self.dropout}"
