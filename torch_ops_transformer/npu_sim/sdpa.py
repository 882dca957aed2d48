"""`F.scaled_dot_product_attention` on npu tensors runs npu_fa.flash_attention_score, through PyTorch's official hook
for out-of-tree devices (docs/npu_sdpa.md):

1. PyTorch asks the PrivateUse1 `_fused_sdp_choice` stub which backend to use. The stub
   (aten_ops/npu/attention/sdpa_choice.cpp) calls the aten::_fused_sdp_choice operator at the PrivateUse1 key,
   registered here: `choose_backend` answers SDPBackend.OVERRIDEABLE when our kernel can take the call, else
   SDPBackend.MATH (PyTorch's math path runs).
2. For OVERRIDEABLE, PyTorch calls aten::_scaled_dot_product_fused_attention_overrideable (bool masks already turned
   into float 0/-inf by PyTorch; no enable_gqa argument: key/value keep their fewer heads) and, in backward,
   aten::_scaled_dot_product_fused_attention_overrideable_backward. Both are registered here for PrivateUse1 and run
   npu_fa.flash_attention_score / flash_attention_score_grad in BNSD. PyTorch owns the autograd formula, the meta
   kernels and the Inductor fallback of these ops, so eager, backward and torch.compile all work.

The support rules are torch_ops_transformer.integrations.sdpa's (`unsupported_reason`) and the mask / is_causal conversion is
its `flash_mask_args`, so both routes have one definition of PyTorch's semantics. Dropout uses our Philox stream:
the seed and offset travel as the op's philox_seed / philox_offset outputs into the backward.

`enable()`: called by npu_sim.enable() for the simulated device; with a real torch_npu it is opt-in and replaces
torch_npu's own SDPA registration for the npu device (with a warning).
"""
import collections
import ctypes
import math
import warnings
from typing import Optional

import torch
from torch import Tensor
from torch.nn.attention import SDPBackend

from .._internal.args import dropout_seed as _draw_seed
from .._internal.real_torch_npu import real_torch_npu_loaded
from .._library.loader import extension_cdll
from ..integrations import sdpa as _sdpa

OVERRIDEABLE = int(SDPBackend.OVERRIDEABLE)  # 4 in torch 2.13
MATH = int(SDPBackend.MATH)                  # 0
ERROR = int(SDPBackend.ERROR)                # -1: PyTorch raises "No viable backend"
_DEVICE = "npu"

# Eager counts: "overrideable" per forward run by our kernel, "backward" per backward, "math: <reason>" per decline.
route_counts: collections.Counter = collections.Counter()
_library: Optional[torch.library.Library] = None


def is_enabled() -> bool:
    return _library is not None


# ---------------------------------------------------------------------------------------------------------------
# 1. the backend choice
# ---------------------------------------------------------------------------------------------------------------
def decline_reason(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False) -> Optional[str]:
    """Why the overrideable route cannot take this call (None: it can)."""
    if not torch._C._get_overrideable_sdp_enabled():
        return "the overrideable backend is disabled (torch.nn.attention.sdpa_kernel)"
    reason = _sdpa.unsupported_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                      device_type=_DEVICE)
    if reason is None and query.dim() == 3 and query.shape[0] != key.shape[0]:
        reason = "3-D query/key with different leading dims"
    return reason


def choose_backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                   enable_gqa=False) -> int:
    """aten::_fused_sdp_choice for PrivateUse1: OVERRIDEABLE when our kernel serves the call, else MATH (or ERROR
    when the user disabled math too, as PyTorch's own choice functions do)."""
    reason = decline_reason(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if reason is None:
        return OVERRIDEABLE
    if not torch.compiler.is_compiling():
        route_counts["math: " + reason] += 1
    return MATH if torch._C._get_math_sdp_enabled() else ERROR


# ---------------------------------------------------------------------------------------------------------------
# 2. the overrideable forward and backward
# ---------------------------------------------------------------------------------------------------------------
def _bnsd(query: Tensor, key: Tensor, value: Tensor):
    """4-D views of q/k/v: a 3-D input is [heads, S, E] with batch 1 (PyTorch's meta kernel reads it so)."""
    if query.dim() == 3:
        return query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
    return query, key, value


def _mask_args(q: Tensor, k: Tensor, attn_bias: Optional[Tensor], is_causal: bool) -> dict:
    """PyTorch hands the overrideable op a float mask (bool masks become 0 / -inf); broadcast it to 4-D like SDPA."""
    mask = None
    if attn_bias is not None:
        mask = attn_bias.reshape((1,) * (4 - attn_bias.dim()) + tuple(attn_bias.shape))
    return _sdpa.flash_mask_args(q, k, mask, is_causal)


def _scale(query: Tensor, scale: Optional[float]) -> float:
    return 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)


def _layout_like(src: Tensor, like: Tensor) -> Tensor:
    """`src` with the strides PyTorch's meta kernels give (empty_like of the input), so compiled code agrees."""
    if src.shape == like.shape and src.stride() == like.stride():
        return src
    if src.shape == like.shape:
        return torch.empty_like(like).copy_(src)
    order = sorted(range(like.dim()), key=lambda i: like.stride(i), reverse=True)
    return torch.empty_permuted(src.shape, order, dtype=src.dtype, device=src.device).copy_(src)


def fused_attention_overrideable(query: Tensor, key: Tensor, value: Tensor, attn_bias: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, return_debug_mask: bool = False,
                                 *, scale: Optional[float] = None):
    """aten::_scaled_dot_product_fused_attention_overrideable on PrivateUse1: (output, logsumexp [B, N, Sq] fp32,
    cum_seq_q, cum_seq_k (undefined: no varlen), max_q, max_k, philox_seed, philox_offset, debug_attn_mask)."""
    q, k, v = _bnsd(query, key, value)
    keep = 1.0 - dropout_p
    seed, offset = _draw_seed(keep, q.device)
    out, smax, ssum, _, seed_out, offset_out = torch.ops.npu_fa.flash_attention_score(
        q, k, v, q.shape[1], "BNSD", scale=_scale(query, scale), keep_prob=keep, seed=seed, offset=offset,
        **_mask_args(q, k, attn_bias, is_causal))
    if seed is None:  # no dropout: the schema still returns 0-d int64 philox tensors (PyTorch's meta does)
        seed_out = offset_out = torch.zeros((), dtype=torch.int64, device=q.device)
    # softmax_max / softmax_sum are [B, N, Sq, 8] (8 equal lanes); a row that sees no key has -inf + log 0 = -inf.
    lse = smax[..., 0] + torch.log(ssum[..., 0])
    if query.dim() == 3:
        out = out.squeeze(0)
    if not torch.compiler.is_compiling():
        route_counts["overrideable"] += 1
    return (_layout_like(out, query), lse, None, None, q.shape[2], k.shape[2], seed_out.to(q.device),
            offset_out.to(q.device), None)


def fused_attention_overrideable_backward(grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor,
                                          attn_bias: Optional[Tensor], grad_input_mask, out: Tensor,
                                          logsumexp: Tensor, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p: float,
                                          is_causal: bool, philox_seed: Tensor, philox_offset: Tensor, *,
                                          scale: Optional[float] = None):
    """aten::_scaled_dot_product_fused_attention_overrideable_backward on PrivateUse1: (dq, dk, dv, d attn_bias).
    logsumexp stands in for the op's softmax statistics: max = lse, sum = 1 gives the same probabilities."""
    q, k, v = _bnsd(query, key, value)
    dy, o = (t.unsqueeze(0) if t.dim() == 3 else t for t in (grad_out, out))
    b, n, sq = q.shape[0], q.shape[1], q.shape[2]
    stats = logsumexp.reshape(b, n, sq, 1).expand(b, n, sq, 8).contiguous()
    keep = 1.0 - dropout_p
    args = _mask_args(q, k, attn_bias, is_causal)
    dq, dk, dv, dpse, _ = torch.ops.npu_fa.flash_attention_score_grad(
        q, k, v, dy, q.shape[1], "BNSD", softmax_max=stats, softmax_sum=torch.ones_like(stats), attention_in=o,
        scale=_scale(query, scale), keep_prob=keep, seed=philox_seed if keep < 1.0 else None,
        offset=philox_offset if keep < 1.0 else None, **args)
    if query.dim() == 3:
        dq, dk, dv = dq.squeeze(0), dk.squeeze(0), dv.squeeze(0)
    grad_bias = None
    if attn_bias is not None and grad_input_mask[3]:
        grad_bias = dpse.sum_to_size(attn_bias.shape).to(attn_bias.dtype)
    if not torch.compiler.is_compiling():
        route_counts["backward"] += 1
    return _layout_like(dq, query), _layout_like(dk, key), _layout_like(dv, value), grad_bias


# ---------------------------------------------------------------------------------------------------------------
# installation
# ---------------------------------------------------------------------------------------------------------------
def _install_choice_stub() -> None:
    lib = extension_cdll()
    error = ctypes.create_string_buffer(1024)
    fn = lib.tot_sdpa_install_choice_stub
    fn.argtypes = [ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    if fn(error, len(error)) != 0:
        raise RuntimeError(f"npu_sdpa.enable(): {error.value.decode(errors='replace')}")


def enable() -> None:
    """Route F.scaled_dot_product_attention on npu tensors to our kernels for the rest of the process (idempotent).

    The simulated device calls this from npu_sim.enable(). With a real torch_npu it is opt-in: torch_npu registers
    its own choice function and overrideable kernels for PrivateUse1, and this replaces them (with a warning)."""
    global _library
    if _library is not None:
        return
    if torch._C._get_privateuse1_backend_name() != _DEVICE:
        raise RuntimeError("npu_sdpa.enable(): no 'npu' device in this process (PrivateUse1 is named "
                           f"{torch._C._get_privateuse1_backend_name()!r}); import torch_npu or call "
                           "torch_ops_transformer.npu_sim.enable() first")
    if real_torch_npu_loaded():
        warnings.warn("torch_ops_transformer.npu_sim.sdpa.enable(): replacing torch_npu's scaled_dot_product_attention "
                      "backend for the npu device with torch_ops_transformer's kernels", stacklevel=2)
    _install_choice_stub()
    lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
    lib.impl("_fused_sdp_choice", choose_backend)
    lib.impl("_scaled_dot_product_fused_attention_overrideable", fused_attention_overrideable)
    lib.impl("_scaled_dot_product_fused_attention_overrideable_backward", fused_attention_overrideable_backward)
    _library = lib
