"""Python API of the training attention ops: torch_npu-compatible wrappers, the FlashAttention-2 functions and
the FlashAttention nn.Module. All of them call torch.ops.npu_fa.flash_attention_score(_grad).

Mask polarity: `atten_mask` follows CANN — True / 1 means *masked out* (the opposite of SDPA's boolean mask).
"""
import contextlib
import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from . import _args
from .layout import attention_dims

_OPS = torch.ops.npu_fa
MAX_TOKENS = 2147483647
SeqLens = Optional[Union[Sequence[int], Tensor]]


def _draw_seed(keep_prob: float, device) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Seed and offset of the dropout stream, drawn from torch's default generator (traceable by torch.compile)."""
    if keep_prob >= 1.0:
        return None, None
    seed = torch.randint(0, 2**62, (), dtype=torch.int64, device=device)
    return seed, torch.zeros((), dtype=torch.int64, device=device)


def _as_int(t: Tensor):
    """torch_npu returns seed/offset as Python ints; inside torch.compile they stay 0-d tensors (no graph break)."""
    return t if torch.compiler.is_compiling() else int(t.item())


def _check_fusion_args(op: str, padding_mask, prefix) -> None:
    _args.reserved(op, padding_mask=padding_mask)  # torch_npu reserves it: masks go through atten_mask
    _args.not_implemented(op, "sparse_mode 5 (prefix)", prefix=prefix)


@_args.torch_npu_api
def npu_fusion_attention(query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str,
                         pse: Optional[Tensor] = None, padding_mask: Optional[Tensor] = None,
                         atten_mask: Optional[Tensor] = None, scale: float = 1., keep_prob: float = 1.,
                         pre_tockens: int = MAX_TOKENS, next_tockens: int = MAX_TOKENS, inner_precise: int = 0,
                         prefix=None, actual_seq_qlen: SeqLens = None, actual_seq_kvlen: SeqLens = None,
                         sparse_mode: int = 0, gen_mask_parallel: bool = True, sync: bool = False):
    """torch_npu.npu_fusion_attention with its exact signature and return tuple.

    Shapes by `input_layout`: BSH [B,S,N*D], SBH [S,B,N*D], BSND [B,S,N,D], BNSD [B,N,S,D], TND [T,N,D] (then
    `actual_seq_qlen`/`actual_seq_kvlen` are *cumulative* ends, e.g. lengths 3,5,2 -> [3, 8, 10]).
    dtypes fp32/fp16/bf16 (q, k, v alike); GQA when key has fewer heads; value may have a smaller head dim.
    `atten_mask`: bool/uint8, True = masked out, shapes [B,N,Sq,Skv], [B,1,Sq,Skv], [1,1,Sq,Skv], [Sq,Skv].
    `sparse_mode`: 0 mask + pre/next band, 1 all-mask, 2 top-left causal, 3 bottom-right causal, 4 band from the
    bottom-right; modes 2-4 need no mask (the compressed 2048x2048 CANN mask is accepted too).
    `scale` multiplies Q·Kᵀ (default 1.0 as in torch_npu — pass 1/sqrt(D) yourself).

    Returns (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels): softmax_max/sum are fp32
    [B,N,Sq,8] ([T,N,8] for TND); seed/offset are ints (0-d tensors under torch.compile).
    `gen_mask_parallel` and `sync` are accepted for compatibility and have no effect on CPU.
    """
    _check_fusion_args("npu_fusion_attention", padding_mask, prefix)
    seed, offset = _draw_seed(keep_prob, query.device)
    out, smax, ssum, sout, seed_t, offset_t = _OPS.flash_attention_score(
        query, key, value, head_num, input_layout, pse=pse, atten_mask=atten_mask,
        actual_seq_qlen=_args.int_tensor("npu_fusion_attention", "actual_seq_qlen", actual_seq_qlen, query.device),
        actual_seq_kvlen=_args.int_tensor("npu_fusion_attention", "actual_seq_kvlen", actual_seq_kvlen, query.device),
        scale=scale, keep_prob=keep_prob, pre_tokens=pre_tockens, next_tokens=next_tockens,
        inner_precise=inner_precise, sparse_mode=sparse_mode, seed=seed, offset=offset)
    d = attention_dims("npu_fusion_attention", query, key, value, head_num, input_layout)
    numels = d.batch * d.q_heads * d.q_len * d.kv_len if keep_prob < 1.0 else 0
    return out, smax, ssum, sout, _as_int(seed_t), _as_int(offset_t), numels


@_args.torch_npu_api
def npu_fusion_attention_grad(query: Tensor, key: Tensor, value: Tensor, dy: Tensor, head_num: int,
                              input_layout: str, *, pse: Optional[Tensor] = None,
                              padding_mask: Optional[Tensor] = None, atten_mask: Optional[Tensor] = None,
                              softmax_max: Optional[Tensor] = None, softmax_sum: Optional[Tensor] = None,
                              softmax_in: Optional[Tensor] = None, attention_in: Optional[Tensor] = None,
                              scale_value: float = 1., keep_prob: float = 1., pre_tockens: int = MAX_TOKENS,
                              next_tockens: int = MAX_TOKENS, inner_precise: int = 0, seed: int = 0, offset: int = 0,
                              numels: int = 0, prefix=None, actual_seq_qlen: SeqLens = None,
                              actual_seq_kvlen: SeqLens = None, sparse_mode: int = 0,
                              gen_mask_parallel: bool = True, sync: bool = False):
    """torch_npu.npu_fusion_attention_grad with its exact signature. Returns (dq, dk, dv, dpse).

    softmax_max, softmax_sum and attention_in are the forward's outputs and are required; seed/offset are the
    ints npu_fusion_attention returned (they regenerate the identical dropout mask).
    """
    op = "npu_fusion_attention_grad"
    _check_fusion_args(op, padding_mask, prefix)
    for name, t in (("softmax_max", softmax_max), ("softmax_sum", softmax_sum), ("attention_in", attention_in)):
        if t is None:
            raise ValueError(f"{op}: argument '{name}' is required (pass the forward's output)")

    def as_tensor(x):
        return x if isinstance(x, Tensor) else torch.tensor(int(x), dtype=torch.int64)

    return _OPS.flash_attention_score_grad(
        query, key, value, dy, head_num, input_layout, pse=pse, atten_mask=atten_mask, softmax_max=softmax_max,
        softmax_sum=softmax_sum, attention_in=attention_in,
        actual_seq_qlen=_args.int_tensor(op, "actual_seq_qlen", actual_seq_qlen, query.device),
        actual_seq_kvlen=_args.int_tensor(op, "actual_seq_kvlen", actual_seq_kvlen, query.device),
        scale=scale_value, keep_prob=keep_prob, pre_tokens=pre_tockens, next_tokens=next_tockens,
        inner_precise=inner_precise, sparse_mode=sparse_mode, seed=as_tensor(seed), offset=as_tensor(offset))


def _window_mode(op: str, causal: bool, window_size: Tuple[int, int]) -> Tuple[int, int, int]:
    """FlashAttention-2's (causal, window) -> (sparse_mode, pre_tokens, next_tokens); both are bottom-right aligned."""
    left, right = _args.window(op, "window_size", window_size)
    if causal:
        right = 0
    if left == -1 and right == -1:
        return 0, MAX_TOKENS, MAX_TOKENS
    if left == -1 and right == 0:
        return 3, MAX_TOKENS, 0
    return 4, MAX_TOKENS if left == -1 else left, MAX_TOKENS if right == -1 else right


def _lse(smax: Tensor, ssum: Tensor) -> Tensor:
    return smax[..., 0] + torch.log(ssum[..., 0])


def _check_fa_args(op: str, alibi_slopes, dropout_p):
    _args.not_implemented(op, "ALiBi (pass the bias through npu_fusion_attention(pse=...))", alibi_slopes=alibi_slopes)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: argument 'dropout_p' must be in [0, 1); got {dropout_p}")


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), alibi_slopes=None,
                    deterministic: bool = False, return_attn_probs: bool = False):
    """FlashAttention-2's flash_attn_func on q [B,Sq,N1,D], k/v [B,Skv,N2,D] (BSND).

    `causal` and `window_size` are aligned to the bottom-right corner (query i sees key j when
    j <= i + Skv - Sq), as in FlashAttention-2 — unlike SDPA's top-left `is_causal`. Backward is always
    deterministic. With `return_attn_probs` returns (out, softmax_lse [B,N1,Sq] fp32, None).
    """
    op = "flash_attn_func"
    _check_fa_args(op, alibi_slopes, dropout_p)
    mode, pre, nxt = _window_mode(op, causal, window_size)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    keep = 1.0 - dropout_p
    seed, offset = _draw_seed(keep, q.device)
    out, smax, ssum, _, _, _ = _OPS.flash_attention_score(
        q, k, v, q.shape[2], "BSND", scale=scale, keep_prob=keep, pre_tokens=pre, next_tokens=nxt,
        sparse_mode=mode, seed=seed, offset=offset)
    return (out, _lse(smax, ssum), None) if return_attn_probs else out


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), alibi_slopes=None, deterministic: bool = False,
                           return_attn_probs: bool = False):
    """FlashAttention-2's varlen function on packed q [T,N1,D], k/v [Tk,N2,D].

    `cu_seqlens_*` are int32/int64 tensors [batch+1] starting at 0 (FlashAttention convention; CANN's TND
    wants them without the leading 0). `max_seqlen_*` are accepted for compatibility (lengths come from
    cu_seqlens). With `return_attn_probs` returns (out, softmax_lse [N1,T] fp32, None).
    """
    op = "flash_attn_varlen_func"
    _check_fa_args(op, alibi_slopes, dropout_p)
    cumulative = (("cu_seqlens_q", cu_seqlens_q, q), ("cu_seqlens_k", cu_seqlens_k, k))
    for name, cu, _ in cumulative:
        if not isinstance(cu, Tensor) or cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"{op}: argument '{name}' must be a 1-D tensor [batch+1] of cumulative lengths "
                             f"starting at 0")
        if cu.dtype not in (torch.int32, torch.int64):  # a float or bool tensor would be truncated silently
            raise TypeError(f"{op}: argument '{name}' must be an int32 or int64 tensor; got {cu.dtype}")
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"{op}: arguments 'cu_seqlens_q' and 'cu_seqlens_k' must describe the same batch; got "
                         f"{cu_seqlens_q.numel() - 1} and {cu_seqlens_k.numel() - 1} sequences")
    mode, pre, nxt = _window_mode(op, causal, window_size)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    keep = 1.0 - dropout_p
    seed, offset = _draw_seed(keep, q.device)
    if not torch.compiler.is_compiling():
        # The op checks the ends too, but under its own argument names (actual_seq_qlen/kvlen, without the 0).
        for name, cu, packed in cumulative:
            ends = cu.tolist()
            if ends[0] != 0:
                raise ValueError(f"{op}: argument '{name}' must start at 0 (FlashAttention convention); "
                                 f"got {ends[0]}")
            if any(b < a for a, b in zip(ends, ends[1:])):
                raise ValueError(f"{op}: argument '{name}' must be non-decreasing (cumulative lengths); got {ends}")
            if ends[-1] != packed.shape[0]:
                raise ValueError(f"{op}: argument '{name}' must end at the {packed.shape[0]} tokens of the packed "
                                 f"tensor; got {ends[-1]}")
    out, smax, ssum, _, _, _ = _OPS.flash_attention_score(
        q, k, v, q.shape[1], "TND", actual_seq_qlen=cu_seqlens_q[1:].to(torch.int64),
        actual_seq_kvlen=cu_seqlens_k[1:].to(torch.int64), scale=scale, keep_prob=keep, pre_tokens=pre,
        next_tokens=nxt, sparse_mode=mode, seed=seed, offset=offset)
    return (out, _lse(smax, ssum).transpose(0, 1), None) if return_attn_probs else out


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


def attention_tiles(block_q: Optional[int] = None, block_kv: Optional[int] = None) -> Tuple[int, int]:
    """Reads, or overrides process-wide, the CPU FlashAttention tile sizes (query rows, key rows).

    None keeps a value, -1 restores the automatic choice (derived from the L2 cache, head dim and dtype).
    Returns the overrides in force; 0 means automatic.
    """
    q, kv = _OPS.attention_tile_config(block_q or 0, block_kv or 0)
    return int(q), int(kv)


@contextlib.contextmanager
def attention_tiles_override(block_q: Optional[int] = None, block_kv: Optional[int] = None):
    """Temporarily overrides the CPU tile sizes (block-size tuning); restores the previous
    overrides (or the automatic choice) on exit."""
    old_q, old_kv = attention_tiles()
    attention_tiles(block_q, block_kv)
    try:
        yield attention_tiles()
    finally:
        attention_tiles(old_q or -1, old_kv or -1)
