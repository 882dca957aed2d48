"""Sampling with torch_npu's Python signatures, on top of `torch.ops.npu_fa`.

- `npu_top_k_top_p(logits, p=None, k=None)` — per-row top-k and top-p (nucleus) filtering of logits [B, V]: the
  filtered-out logits become -inf, ready for softmax and a draw.
"""
from typing import Optional

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa


@_args.torch_npu_api
def npu_top_k_top_p(logits: Tensor, p: Optional[Tensor] = None, k: Optional[Tensor] = None) -> Tensor:
    """torch_npu.npu_top_k_top_p: logits [B, V] with, per row b, the values below the k[b]-th largest (ties kept)
    and then those outside the top-p[b] nucleus set to -inf. k: int32 (or int64) [B] in [1, V]; p: [B] in [0, 1],
    logits' dtype. The nucleus follows upstream's definition: over the ascending stable sort of the kept values,
    softmax in fp32 and cumulative sums from the smallest; positions whose sum is <= 1 - p[b] are dropped, the
    largest never. Either filter may be None. Returns a new tensor."""
    op = "npu_top_k_top_p"
    if not isinstance(logits, Tensor):
        raise TypeError(f"{op}: argument 'logits' must be a Tensor; got {type(logits).__name__}")
    for name, t in (("p", p), ("k", k)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor or None; got {type(t).__name__}")
    if p is not None and p.dtype != logits.dtype:
        raise TypeError(f"{op}: argument 'p' ({p.dtype}) must have the dtype of 'logits' ({logits.dtype})")
    return _OPS.top_k_top_p(logits, p, k)
