"""FlashAttention-2's Python API (flash_attn.flash_attn_interface) on our ops: the packed variants and
`flash_attn_with_kvcache`. Argument names, order, defaults, shapes and results are FlashAttention-2's, so code
written for it runs unchanged on the CPU (see docs/attention.md, "FlashAttention-2 API").

- The packed functions split the packed tensor into views and call `flash_attn_func` / `flash_attn_varlen_func`:
  autograd through those views gives the packed tensor its gradient.
- `flash_attn_with_kvcache` appends the new keys/values into the cache in place, rotates q and the new keys, and
  attends over each sequence's valid cache prefix. Plain calls (no softcap, ALiBi, window or left padding) run on
  the inference op `fused_infer_attention_score` reading the cache in place (paged or not); the others gather the
  valid keys and run `flash_attn_varlen_func`.

All of FlashAttention-2's API is here: `flash_attn_func` and `flash_attn_varlen_func` on flash_attention_score,
the packed variants, `flash_attn_with_kvcache`, and (last section) the S_dmask of `return_attn_probs`.
"""
import math
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from .._internal import args as _args
from .._internal.args import MAX_TOKENS, SeqLens, dropout_seed as _draw_seed

_OPS = torch.ops.npu_fa
_INT_DTYPES = (torch.int32, torch.int64)




# ================================================================================================================
# flash_attn_func, flash_attn_varlen_func
# ================================================================================================================

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
    """FlashAttention's softmax_lse from the op's statistics; a row that sees no key gets +inf, as FlashAttention-2
    returns it (the op's statistics give -inf there)."""
    lse = smax[..., 0] + torch.log(ssum[..., 0])
    return torch.where(lse == -math.inf, math.inf, lse)


def _check_fa2_args(op: str, dropout_p, softcap):
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"{op}: argument 'dropout_p' must be in [0, 1); got {dropout_p}")
    # Comparisons only (no math.isfinite): they trace under torch.compile(dynamic=True); NaN fails them too.
    if not isinstance(softcap, (int, float)) or isinstance(softcap, bool) or not 0.0 <= softcap < math.inf:
        raise ValueError(f"{op}: argument 'softcap' must be a finite number >= 0 (0.0 disables soft-capping); "
                         f"got {softcap!r}")


def _alibi(op: str, alibi_slopes: Optional[Tensor], batch: int, heads: int) -> Tuple[Optional[Tensor], int]:
    """FlashAttention-2's alibi_slopes (fp32 [N1] or [B, N1]) -> the op's (pse, pse_type): pse_type 2 generates the
    bias -slope * |distance| in the kernel (with alibi_bottom_right, FlashAttention-2's alignment)."""
    if alibi_slopes is None:
        return None, 1
    if not isinstance(alibi_slopes, Tensor):
        raise TypeError(f"{op}: argument 'alibi_slopes' must be a float32 tensor or None; got "
                        f"{type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"{op}: argument 'alibi_slopes' must be float32; got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"{op}: argument 'alibi_slopes' must have shape [nheads] = [{heads}] or [batch, nheads] = "
                         f"[{batch}, {heads}]; got {list(alibi_slopes.shape)}")
    return alibi_slopes, 2


def _fa2_causal(mode: int, pre: int, nxt: int, seqlen_k) -> bool:
    """Whether FlashAttention-2 runs its causal kernel: causal, or a window (left, 0) whose left reaches seqlen_k
    (it resets such a left side to -1)."""
    return mode == 3 or (mode == 4 and nxt == 0 and isinstance(seqlen_k, int) and pre >= seqlen_k)


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False):
    """FlashAttention-2's flash_attn_func on q [B,Sq,N1,D], k/v [B,Skv,N2,D] (BSND).

    `causal` and `window_size` are aligned to the bottom-right corner (query i sees key j when
    j <= i + Skv - Sq), as in FlashAttention-2 — unlike SDPA's top-left `is_causal`. `softcap` > 0 caps the scaled
    scores to softcap * tanh(score / softcap) before the ALiBi bias and the mask. `alibi_slopes` (fp32 [N1] or
    [B, N1]) adds -slope * |i + Skv - Sq - j| (no gradient for the slopes, as in FlashAttention-2). Backward is
    always deterministic. With `return_attn_probs` returns (out, softmax_lse [B,N1,Sq] fp32, S_dmask); rows that see
    no key have lse = +inf. S_dmask is None without dropout; with dropout it is FlashAttention-2's dropout pattern
    [B, N1, round128(Sq), round128(Skv)] (sign = kept / dropped, magnitude = un-normalised probability; see
    _dmask_dense) of the mask this call applied.
    """
    op = "flash_attn_func"
    _check_fa2_args(op, dropout_p, softcap)
    pse, pse_type = _alibi(op, alibi_slopes, q.shape[0], q.shape[2])
    mode, pre, nxt = _window_mode(op, causal, window_size)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    keep = 1.0 - dropout_p
    seed, offset = _draw_seed(keep, q.device)
    out, smax, ssum, _, seed, offset = _OPS.flash_attention_score(
        q, k, v, q.shape[2], "BSND", pse=pse, scale=scale, keep_prob=keep, pre_tokens=pre, next_tokens=nxt,
        sparse_mode=mode, pse_type=pse_type, seed=seed, offset=offset, softcap=float(softcap),
        alibi_bottom_right=True)
    if not return_attn_probs:
        return out
    # FlashAttention-2 returns the dropout pattern only with dropout (None without), from the seed/offset used.
    s_dmask = None if keep >= 1.0 else _dmask_dense(
        q, k, scale=scale, softcap=float(softcap), pse=pse, pre=pre, nxt=nxt, keep_prob=keep, seed=seed,
        offset=offset, causal=causal)
    lse = _lse(smax, ssum)
    if pse is not None and _fa2_causal(mode, pre, nxt, k.shape[1]):
        # FlashAttention-2's causal kernels add slope * j instead of -slope * |i + Skv - Sq - j| (the softmax cancels
        # the row constant slope * (i + Skv - Sq)); its softmax_lse carries that constant, so add it.
        row = torch.arange(q.shape[1], device=lse.device, dtype=lse.dtype) + (k.shape[1] - q.shape[1])
        lse = lse + pse.unsqueeze(-1) * row
    return out, lse, s_dmask


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None):
    """FlashAttention-2's varlen function on packed q [T,N1,D], k/v [Tk,N2,D].

    `cu_seqlens_*` are int32/int64 tensors [batch+1] starting at 0 (FlashAttention convention; CANN's TND
    wants them without the leading 0). `max_seqlen_*` are accepted for compatibility (lengths come from
    cu_seqlens). `softcap` and `alibi_slopes` ([N1] or [batch, N1] fp32; distance i + Skv_b - Sq_b - j within each
    sequence) as in flash_attn_func. With `return_attn_probs` returns (out, softmax_lse [N1,T] fp32, S_dmask); rows
    that see no key have lse = +inf; S_dmask as in flash_attn_func, [batch, N1, round128(max_seqlen_q),
    round128(max_seqlen_k)] with each sequence from row / column 0. With `block_table` (int32 [batch, max_blocks]) k/v are a paged cache
    [num_blocks, page_block_size, N2, D] and cu_seqlens_k gives each sequence's KV length.
    """
    op = "flash_attn_varlen_func"
    _check_fa2_args(op, dropout_p, softcap)
    if block_table is not None:  # paged k/v [num_blocks, block, N2, D]: pack the blocks in use (forward only)
        k, v = gather_paged_kv(op, k, v, block_table, cu_seqlens_k)
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
    pse, pse_type = _alibi(op, alibi_slopes, cu_seqlens_q.numel() - 1, q.shape[1])
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
    out, smax, ssum, _, seed, offset = _OPS.flash_attention_score(
        q, k, v, q.shape[1], "TND", pse=pse, actual_seq_qlen=cu_seqlens_q[1:].to(torch.int64),
        actual_seq_kvlen=cu_seqlens_k[1:].to(torch.int64), scale=scale, keep_prob=keep, pre_tokens=pre,
        next_tokens=nxt, sparse_mode=mode, pse_type=pse_type, seed=seed, offset=offset, softcap=float(softcap),
        alibi_bottom_right=True)
    if not return_attn_probs:
        return out
    s_dmask = None if keep >= 1.0 else _dmask_varlen(
        q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale=scale, softcap=float(softcap), pse=pse,
        pre=pre, nxt=nxt, keep_prob=keep, seed=seed, offset=offset, causal=causal)
    # The default softmax_layout keeps the [T, N1, 8] statistics in NTD order: viewed as [N1, T, 8] they give
    # FlashAttention's softmax_lse [N1, T] contiguous.
    n1, t = q.shape[1], q.shape[0]
    lse = _lse(smax.view(n1, t, 8), ssum.view(n1, t, 8))
    if pse is not None and _fa2_causal(mode, pre, nxt, max_seqlen_k):  # the causal lse constant, as flash_attn_func
        cu_q, cu_k = cu_seqlens_q.to(torch.int64), cu_seqlens_k.to(torch.int64)
        seq = torch.bucketize(torch.arange(t, device=cu_q.device), cu_q[1:], right=True)  # sequence of each token
        row = torch.arange(t, device=cu_q.device) - cu_q[seq]
        shift = (cu_k[1:] - cu_k[:-1] - cu_q[1:] + cu_q[:-1])[seq]
        slopes = pse if pse.dim() == 1 else pse[seq].transpose(0, 1)  # [N1] or [N1, T]
        lse = lse + (slopes if pse.dim() == 2 else slopes.unsqueeze(-1)) * (row + shift).to(lse.dtype)
    return out, lse, s_dmask


# ================================================================================================================
# The packed variants and flash_attn_with_kvcache
# ================================================================================================================

def _packed(op: str, name: str, t: Tensor, dim: int, count: int, layout: str) -> Tuple[Tensor, ...]:
    if not isinstance(t, Tensor) or t.dim() != len(layout.split(",")) or t.shape[dim] != count:
        got = list(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(f"{op}: argument '{name}' must be a tensor of shape [{layout}] with {count} at dim {dim}; "
                         f"got {got}")
    return t.unbind(dim)


def flash_attn_qkvpacked_func(qkv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                              causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                              return_attn_probs: bool = False):
    """FlashAttention-2's flash_attn_qkvpacked_func: qkv [B, S, 3, N, D] -> out [B, S, N, D]
    (with return_attn_probs: (out, softmax_lse [B, N, S] fp32, S_dmask), S_dmask None without dropout)."""
    op = "flash_attn_qkvpacked_func"
    q, k, v = _packed(op, "qkv", qkv, 2, 3, "B,S,3,N,D")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
                           deterministic=deterministic, return_attn_probs=return_attn_probs,
                           softcap=softcap, alibi_slopes=alibi_slopes)


def flash_attn_kvpacked_func(q: Tensor, kv: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                             causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                             return_attn_probs: bool = False):
    """FlashAttention-2's flash_attn_kvpacked_func: q [B, Sq, N, D], kv [B, Skv, 2, N2, D] (GQA when N2 < N)."""
    op = "flash_attn_kvpacked_func"
    k, v = _packed(op, "kv", kv, 2, 2, "B,S,2,N2,D")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size,
                           deterministic=deterministic, return_attn_probs=return_attn_probs,
                           softcap=softcap, alibi_slopes=alibi_slopes)


def flash_attn_varlen_qkvpacked_func(qkv: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float = 0.0,
                                     softmax_scale: Optional[float] = None, causal: bool = False,
                                     window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                     alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                     return_attn_probs: bool = False):
    """FlashAttention-2's flash_attn_varlen_qkvpacked_func: qkv [T, 3, N, D], cu_seqlens [B+1] starting at 0."""
    op = "flash_attn_varlen_qkvpacked_func"
    q, k, v = _packed(op, "qkv", qkv, 1, 3, "T,3,N,D")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, deterministic=deterministic,
                                  return_attn_probs=return_attn_probs,
                                  softcap=softcap, alibi_slopes=alibi_slopes)


def flash_attn_varlen_kvpacked_func(q: Tensor, kv: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                    max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                                    softmax_scale: Optional[float] = None, causal: bool = False,
                                    window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                                    return_attn_probs: bool = False):
    """FlashAttention-2's flash_attn_varlen_kvpacked_func: q [Tq, N, D], kv [Tk, 2, N2, D]."""
    op = "flash_attn_varlen_kvpacked_func"
    k, v = _packed(op, "kv", kv, 1, 2, "T,2,N2,D")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, deterministic=deterministic,
                                  return_attn_probs=return_attn_probs,
                                  softcap=softcap, alibi_slopes=alibi_slopes)


# ---- paged K/V for flash_attn_varlen_func(block_table=...) ----

def gather_paged_kv(op: str, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
                    cu_seqlens_k: Tensor) -> Tuple[Tensor, Tensor]:
    """FlashAttention-2's paged varlen K/V: caches [num_blocks, page_block_size, N2, D], block_table int32
    [B, max_blocks], cu_seqlens_k the cumulative KV lengths. Returns the packed [sum(len), N2, D] keys and values
    (sequence after sequence, matching cu_seqlens_k) gathered by gather_pa_kv_cache."""
    _check_block_table(op, block_table, cu_seqlens_k.numel() - 1 if isinstance(cu_seqlens_k, Tensor) else None)
    for name, t in (("k", k_cache), ("v", v_cache)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            got = list(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{op}: argument '{name}' must be a paged cache [num_blocks, page_block_size, N2, D] "
                             f"when block_table is given; got {got}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"{op}: arguments 'k' and 'v' must share [num_blocks, page_block_size, N2]; got "
                         f"{list(k_cache.shape)} and {list(v_cache.shape)}")
    if not isinstance(cu_seqlens_k, Tensor) or cu_seqlens_k.dim() != 1 or cu_seqlens_k.numel() < 2:
        raise ValueError(f"{op}: argument 'cu_seqlens_k' must be a 1-D tensor [batch+1] of cumulative lengths "
                         f"starting at 0")
    lens = cu_seqlens_k.to(torch.int64).diff()
    if not torch.compiler.is_compiling():
        capacity = block_table.shape[1] * k_cache.shape[1]
        bad = [(b, n) for b, n in enumerate(lens.tolist()) if n < 0 or n > capacity]
        if bad and bad[0][1] < 0:
            b, n = bad[0]
            raise ValueError(f"{op}: argument 'cu_seqlens_k' must give each sequence a length in [0, {capacity}] "
                             f"(block_table.shape[1] * page_block_size); got {n} for sequence {b}")
        if bad:  # the table is too short for the lengths: FlashAttention-2 names block_table (a RuntimeError there)
            b, n = bad[0]
            raise _args.ArgumentError(
                f"{op}: argument 'block_table' holds {block_table.shape[1]} blocks of {k_cache.shape[1]} = "
                f"{capacity} slots per sequence, fewer than the {n} keys cu_seqlens_k gives sequence {b}")
    return _OPS.gather_pa_kv_cache(k_cache.contiguous(), v_cache.contiguous(), block_table,
                                   lens.to(block_table.device))


def _check_block_table(op: str, block_table, batch: Optional[int]) -> None:
    if not isinstance(block_table, Tensor):
        raise TypeError(f"{op}: argument 'block_table' must be an int32 tensor [batch, max_blocks_per_seq]; got "
                        f"{type(block_table).__name__}")
    if block_table.dtype not in _INT_DTYPES:
        raise TypeError(f"{op}: argument 'block_table' must be an int32 tensor (int64 accepted); got "
                        f"{block_table.dtype}")
    if block_table.dim() != 2 or (batch is not None and block_table.shape[0] != batch):
        raise ValueError(f"{op}: argument 'block_table' must have shape [batch, max_blocks_per_seq] with batch = "
                         f"{batch}; got {list(block_table.shape)}")


# ---- flash_attn_with_kvcache ----

def _per_batch(op: str, name: str, value, batch: int, default: Optional[int]) -> List[int]:
    """An int (broadcast) or an int tensor [batch] (FlashAttention-2 wants int32; int64 is accepted) as a list."""
    if value is None:
        return [default] * batch
    if isinstance(value, bool) or not isinstance(value, (int, Tensor)):
        raise TypeError(f"{op}: argument '{name}' must be an int or an int32 tensor [batch]; got "
                        f"{type(value).__name__}")
    if isinstance(value, int):
        return [value] * batch
    if value.dtype not in _INT_DTYPES:
        raise TypeError(f"{op}: argument '{name}' must be an int32 tensor [batch] (int64 accepted); got {value.dtype}")
    if value.dim() != 1 or value.shape[0] != batch:
        raise ValueError(f"{op}: argument '{name}' must have shape [batch] = [{batch}]; got {list(value.shape)}")
    return value.tolist()


def _shape(op: str, name: str, t, want: Tuple[Optional[int], ...], meaning: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a tensor {meaning}; got {type(t).__name__}")
    if t.dim() != len(want) or any(w is not None and s != w for s, w in zip(t.shape, want)):
        spelled = ", ".join("*" if w is None else str(w) for w in want)
        raise ValueError(f"{op}: argument '{name}' must have shape {meaning} = [{spelled}]; got {list(t.shape)}")


def _rotate(x: Tensor, positions: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """RoPE of the first rotary_dim values of each head of x [T, N, D] at `positions`, through rope_with_sin_cos_cache
    (which rotates a query and a key: x is passed as both) on the T rows of cos/sin in use, not the whole table."""
    t, n, d = x.shape
    if t == 0:
        return x
    rows = torch.cat([cos[positions], sin[positions]], dim=1).to(x.dtype)
    out, _ = _OPS.rope_with_sin_cos_cache(torch.arange(t, device=x.device), x, x[:, :1], rows, d, not interleaved)
    return out.view(t, n, d)


def flash_attn_with_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor] = None,
                            v: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                            rotary_sin: Optional[Tensor] = None,
                            cache_seqlens: Optional[Union[int, Tensor]] = None,
                            cache_batch_idx: Optional[Tensor] = None, cache_leftpad: Optional[Tensor] = None,
                            block_table: Optional[Tensor] = None, softmax_scale: Optional[float] = None,
                            causal: bool = False, window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Optional[Tensor] = None,
                            num_splits: int = 0, return_softmax_lse: bool = False):
    """FlashAttention-2's flash_attn_with_kvcache (inference: no backward).

    q [B, Sq, N, D]; k_cache/v_cache [B_cache, S_cache, N2, D], or with block_table (int32 [B, max_blocks]) a paged
    cache [num_blocks, page_block_size, N2, D]. Sequence b uses cache row cache_batch_idx[b] (default b) and the
    positions [cache_leftpad[b], cache_seqlens[b] + S_new) (cache_seqlens default: the whole cache). When k/v
    [B, S_new, N2, D] are given they are written into the cache **in place** at positions cache_seqlens[b] + i.
    rotary_cos/sin [S_ro, rotary_dim / 2] rotate the new keys at those positions and q at cache_seqlens[b] + i
    (causal or local) or all at cache_seqlens[b]; rotary_interleaved pairs (0,1), (2,3)... else (i, i + rotary_dim/2).
    causal / window_size are bottom-right aligned to each sequence's keys. num_splits is accepted (no effect).
    Returns out [B, Sq, N, Dv], or (out, softmax_lse [B, N, Sq] fp32; +inf for a row that sees no key).
    """
    op = "flash_attn_with_kvcache"
    _shape(op, "q", q, (None, None, None, None), "[batch, seqlen_q, nheads, headdim]")
    b, sq, n, d = q.shape
    paged = block_table is not None
    meaning = ("[num_blocks, page_block_size, nheads_k, headdim] (paged, block_table given)" if paged
               else "[batch_cache, seqlen_cache, nheads_k, headdim]")
    _shape(op, "k_cache", k_cache, (None, None, None, d), meaning)
    _shape(op, "v_cache", v_cache, (k_cache.shape[0], k_cache.shape[1], k_cache.shape[2], None), meaning)
    n2, dv = k_cache.shape[2], v_cache.shape[3]
    if n2 == 0 or n % n2 != 0:
        raise ValueError(f"{op}: the number of heads of 'q' ({n}) must be a multiple of that of 'k_cache' ({n2})")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise TypeError(f"{op}: argument '{name}' must have the dtype of 'q' ({q.dtype}); got {t.dtype}")
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{op}: argument '{name}' must have a contiguous last dimension (it is updated in "
                             f"place); got strides {t.stride()}")
    if not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"{op}: argument 'num_splits' must be an int >= 0 (0 = heuristic); got {num_splits!r}")
    left, right = _args.window(op, "window_size", window_size)
    if paged:
        _check_block_table(op, block_table, b)
        if cache_batch_idx is not None:
            raise ValueError(f"{op}: argument 'cache_batch_idx' must be None with a paged cache (block_table "
                             f"already maps each sequence to its blocks), as in FlashAttention-2")
        block_size = k_cache.shape[1]
        capacity = block_table.shape[1] * block_size
    else:
        capacity = k_cache.shape[1]
    rows = _per_batch(op, "cache_batch_idx", cache_batch_idx, b, None) if cache_batch_idx is not None \
        else list(range(b))
    if not paged and cache_batch_idx is None and b > k_cache.shape[0]:
        raise ValueError(f"{op}: argument 'k_cache' must have at least batch = {b} rows without cache_batch_idx; "
                         f"got {k_cache.shape[0]}")
    if not paged:
        bad = [r for r in rows if not 0 <= r < k_cache.shape[0]]
        if bad:
            raise ValueError(f"{op}: argument 'cache_batch_idx' entries must be in [0, {k_cache.shape[0]}) (rows of "
                             f"k_cache); got {bad[0]}")
    seqlens = _per_batch(op, "cache_seqlens", cache_seqlens, b, capacity)
    leftpad = _per_batch(op, "cache_leftpad", cache_leftpad, b, 0)
    new = 0
    if (k is None) != (v is None):
        raise ValueError(f"{op}: arguments 'k' and 'v' must be given together (new tokens to append); got "
                         f"k={'a tensor' if k is not None else None}, v={'a tensor' if v is not None else None}")
    if k is not None:
        if cache_seqlens is None:
            raise ValueError(f"{op}: argument 'cache_seqlens' must be given with new keys/values 'k' and 'v' (where "
                             f"to append them), as in FlashAttention-2; got None")
        _shape(op, "k", k, (b, None, n2, d), "[batch, seqlen_new, nheads_k, headdim]")
        new = k.shape[1]
        _shape(op, "v", v, (b, new, n2, dv), "[batch, seqlen_new, nheads_k, headdim_v]")
        for name, t in (("k", k), ("v", v)):
            if t.dtype != q.dtype:
                raise TypeError(f"{op}: argument '{name}' must have the dtype of 'q' ({q.dtype}); got {t.dtype}")
    for i, (s, lp) in enumerate(zip(seqlens, leftpad)):
        if paged and s >= 0 and s + new > capacity:
            # FlashAttention-2 blames the block table here (a RuntimeError naming it): its columns are what bound a
            # paged sequence, the pool of blocks may be far larger.
            raise _args.ArgumentError(
                f"{op}: argument 'block_table' must have enough columns for cache_seqlens[b] + the {new} new tokens: "
                f"its {block_table.shape[1]} blocks per sequence of page_block_size {block_size} hold {capacity} "
                f"tokens; got cache_seqlens {s} (+ {new} new = {s + new}) for sequence {i}")
        if s < 0 or s + new > capacity:
            raise ValueError(f"{op}: argument 'cache_seqlens' must be in [0, {capacity - new}] (cache length "
                             f"{capacity} minus the {new} new tokens); got {s} for sequence {i}")
        if not 0 <= lp <= s:
            raise ValueError(f"{op}: argument 'cache_leftpad' must be in [0, cache_seqlens[b]] = [0, {s}]; got "
                             f"{lp} for sequence {i}")
    totals = [s + new for s in seqlens]
    if paged:
        num_blocks = k_cache.shape[0]
        for i, t in enumerate(totals):
            used = block_table[i, :-(-t // block_size)].tolist()
            bad = [blk for blk in used if not 0 <= blk < num_blocks]
            if bad:
                raise ValueError(f"{op}: argument 'block_table' entries of the blocks in use must be in [0, "
                                 f"{num_blocks}) (blocks of k_cache); got {bad[0]} for sequence {i}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0.0 <= softcap < math.inf:
        raise ValueError(f"{op}: argument 'softcap' must be a finite number >= 0 (0.0 disables it); got {softcap!r}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, Tensor) or alibi_slopes.dtype != torch.float32:
            got = alibi_slopes.dtype if isinstance(alibi_slopes, Tensor) else type(alibi_slopes).__name__
            raise TypeError(f"{op}: argument 'alibi_slopes' must be a float32 tensor [nheads] or [batch, nheads]; "
                            f"got {got}")
        if tuple(alibi_slopes.shape) not in ((n,), (b, n)):
            raise ValueError(f"{op}: argument 'alibi_slopes' must have shape [nheads] = [{n}] or [batch, nheads] = "
                             f"[{b}, {n}]; got {list(alibi_slopes.shape)}")
    # As FlashAttention-2: a window side reaching past the cache is unbounded, and only a window that remains makes
    # the call "local" (q then rotates at consecutive positions, as with causal).
    left, right = (-1 if w >= capacity else w for w in (left, right))
    local = left >= 0 or (right >= 0 and not causal)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    device = q.device

    if rotary_cos is not None or rotary_sin is not None:
        if rotary_cos is None or rotary_sin is None:
            raise ValueError(f"{op}: arguments 'rotary_cos' and 'rotary_sin' must be given together")
        if k is None:
            raise ValueError(f"{op}: arguments 'rotary_cos'/'rotary_sin' need the new keys 'k' and 'v' (rotary "
                             f"embedding is applied to q and the appended keys, as in FlashAttention-2)")
        _shape(op, "rotary_cos", rotary_cos, (None, None), "[seqlen_ro, rotary_dim / 2]")
        _shape(op, "rotary_sin", rotary_sin, tuple(rotary_cos.shape), "[seqlen_ro, rotary_dim / 2]")
        rot = 2 * rotary_cos.shape[1]
        if rot == 0 or rot > d:
            raise ValueError(f"{op}: argument 'rotary_cos' must have rotary_dim / 2 columns with 0 < rotary_dim <= "
                             f"headdim = {d}; got rotary_dim {rot}")
        q_positions = [[s + (i if causal or local else 0) for i in range(sq)] for s in seqlens]
        k_positions = [[s + i for i in range(new)] for s in seqlens]
        need = max([p[-1] + 1 for p in q_positions + k_positions if p], default=0)
        if rotary_cos.shape[0] < need:
            raise ValueError(f"{op}: argument 'rotary_cos' must have at least {need} rows (the largest rotated "
                             f"position + 1); got {rotary_cos.shape[0]}")
        qp = torch.tensor(q_positions, dtype=torch.int64, device=rotary_cos.device).view(-1)
        kp = torch.tensor(k_positions, dtype=torch.int64, device=rotary_cos.device).view(-1)
        q = _rotate(q.reshape(b * sq, n, d), qp, rotary_cos, rotary_sin, rotary_interleaved).view(b, sq, n, d)
        k = _rotate(k.reshape(b * new, n2, d), kp, rotary_cos, rotary_sin, rotary_interleaved).view(b, new, n2, d)

    with torch.no_grad():
        if new:
            pos = torch.tensor(seqlens, dtype=torch.int64, device=k_cache.device).view(b, 1) + \
                torch.arange(new, device=k_cache.device)
            first, second = _cache_index(k_cache, rows, pos, block_table)
            # In place, like FlashAttention-2 (with repeated cache_batch_idx, one of the writes wins).
            _write(k_cache, first, second, k.to(k_cache.device))
            _write(v_cache, first, second, v.to(v_cache.device))

        plain = softcap == 0.0 and alibi_slopes is None and not local and not any(leftpad) and \
            cache_batch_idx is None and (not paged or (block_size % 16 == 0 and block_size <= 512))
        if b == 0 or sq == 0:
            out, lse = q.new_zeros(b, sq, n, dv), torch.full((b, n, sq), -math.inf, device=device)
        elif plain:
            out, lse = _fused_infer(q, k_cache, v_cache, totals, block_table, scale, causal, return_softmax_lse)
        else:
            out, lse = _gathered(op, q, k_cache, v_cache, rows, leftpad, totals, block_table, scale, causal,
                                 (left, right), softcap, alibi_slopes, return_softmax_lse)
    if not return_softmax_lse:
        return out
    # FlashAttention-2 reports +inf for a row without keys.
    return out, lse.masked_fill(torch.isneginf(lse), math.inf)


def _cache_index(cache: Tensor, rows: List[int], pos: Tensor, block_table: Optional[Tensor]):
    """Index pair into cache[first, second] of the logical positions pos [B, L] of each sequence."""
    if block_table is None:
        return torch.tensor(rows, dtype=torch.int64, device=cache.device).view(-1, 1).expand_as(pos), pos
    block_size = cache.shape[1]
    table = block_table.to(device=cache.device, dtype=torch.int64)
    blocks = table.gather(1, pos // block_size)
    return blocks, pos % block_size


def _flat(cache: Tensor) -> Optional[Tensor]:
    """cache [R, S, N2, D] as [R*S, N2, D] without a copy, or None when its strides do not allow it."""
    try:
        return cache.view(-1, *cache.shape[2:])
    except RuntimeError:
        return None


def _write(cache: Tensor, first: Tensor, second: Tensor, values: Tensor) -> None:
    """cache[first, second] = values; index_copy_ on the flattened cache is far cheaper than an indexed put."""
    flat = _flat(cache)
    if flat is None:
        cache[first, second] = values
    else:
        flat.index_copy_(0, (first * cache.shape[1] + second).reshape(-1), values.reshape(-1, *cache.shape[2:]))


def _read(cache: Tensor, first: Tensor, second: Tensor) -> Tensor:
    flat = _flat(cache)
    return cache[first, second] if flat is None else flat.index_select(0, first * cache.shape[1] + second)


def _fused_infer(q, k_cache, v_cache, totals, block_table, scale, causal, want_lse):
    """fused_infer_attention_score on the cache in place: BSND, sparse mode 3 (bottom-right causal) when causal."""
    b, sq, n, _ = q.shape
    n2 = k_cache.shape[2]
    lens = torch.tensor(totals, dtype=torch.int64)
    if block_table is None:
        key, value, block_size = k_cache[:b], v_cache[:b], 0
    else:
        nb, block_size = k_cache.shape[:2]
        key, value = k_cache.reshape(nb, block_size, -1), v_cache.reshape(nb, block_size, -1)
    out, lse = _OPS.fused_infer_attention_score(
        q.contiguous(), key, value, actual_seq_lengths_kv=lens, block_table=block_table, num_heads=n, scale=scale,
        input_layout="BSND", num_key_value_heads=n2, sparse_mode=3 if causal and sq > 1 else 0,
        block_size=block_size, softmax_lse_flag=want_lse)
    return out, (lse.squeeze(-1) if want_lse else None)


def _gathered(op, q, k_cache, v_cache, rows, leftpad, totals, block_table, scale, causal, window, softcap,
              alibi_slopes, want_lse):
    """The general path: each sequence's valid keys [leftpad, total) packed, then flash_attn_varlen_func."""
    b, sq, n, d = q.shape
    lens = [t - lp for t, lp in zip(totals, leftpad)]
    dev = k_cache.device
    pos = torch.cat([torch.arange(lp, t, device=dev) for lp, t in zip(leftpad, totals)]) if b else \
        torch.zeros(0, dtype=torch.int64, device=dev)
    seq = torch.repeat_interleave(torch.arange(b, device=dev), torch.tensor(lens, dtype=torch.int64, device=dev))
    if block_table is None:
        first, second = torch.tensor(rows, dtype=torch.int64, device=dev)[seq], pos
    else:
        block_size = k_cache.shape[1]
        first = block_table.to(device=dev, dtype=torch.int64)[seq, pos // block_size]
        second = pos % block_size
    key, value = _read(k_cache, first, second), _read(v_cache, first, second)
    cu_q = torch.arange(b + 1, dtype=torch.int32, device=q.device) * sq
    cu_k = torch.tensor([0] + lens, dtype=torch.int64, device=q.device).cumsum(0).to(torch.int32)
    res = flash_attn_varlen_func(q.reshape(b * sq, n, d), key, value, cu_q, cu_k, sq, max(lens, default=0), 0.0,
                                 scale, causal, window, return_attn_probs=want_lse,
                                 softcap=softcap, alibi_slopes=alibi_slopes)
    if not want_lse:
        return res.view(b, sq, n, -1), None
    out, lse = res[0], res[1]
    return out.view(b, sq, n, -1), lse.view(n, b, sq).permute(1, 0, 2)


# ================================================================================================================
# S_dmask (return_attn_probs with dropout)
# ================================================================================================================

# FlashAttention-2's `S_dmask`: what `return_attn_probs=True` returns as third value when dropout_p > 0 (its
# documented encoding, rebuilt here from the inputs and the dropout mask our kernel applied):
#
# - shape [batch, nheads, round128(seqlen_q), round128(seqlen_k)] (varlen: the rounded max_seqlen_q / max_seqlen_k,
#   sequence b's queries and keys from row / column 0), in q's dtype; entries outside a sequence are 0;
# - magnitude: the un-normalised probability exp(s - m) of score s (scaled, soft-capped, ALiBi-biased and masked as
#   the kernel does), where m is the running row maximum FlashAttention-2's forward kernel holds when it reaches the
#   score's key block: it walks the key blocks of `get_block_size_n` columns from the last one back, so m is the
#   maximum over the score's own block and every block after it (masked scores count as -inf; a row without keys
#   gives 0);
# - sign: negative where the element was dropped, non-negative where it was kept.
#
# So `S_dmask >= 0` is the keep mask, and exp(s - m) * exp(m - lse) recovers the softmax: out equals
# dropout(softmax) @ v / (1 - dropout_p) with that mask, as FlashAttention-2's tests check. Without dropout
# FlashAttention-2 returns None, and so do we (the callers do not come here).
#
# Not differentiable (built under no_grad) and meant for checking: it materialises the whole score matrix, one
# sequence at a time, on the CPU.
_DMASK_ROUND = 128  # FlashAttention-2 rounds both sequence dims of S_dmask up to a multiple of 128


def get_block_size_n(device, head_dim: int, is_dropout: bool, is_causal: bool) -> int:
    """The key-block width FlashAttention-2's forward kernel uses for `head_dim` (its
    flash_attn_interface._get_block_size_n), as on an A100 (sm80), whose values we follow everywhere: S_dmask's
    running maxima are taken over blocks of this many keys. `device` and `is_causal` do not change it here."""
    if head_dim <= 32:
        return 128
    if head_dim <= 64:
        return 64 if is_dropout else 128
    if head_dim <= 96:
        return 64
    if head_dim <= 128:
        return 32 if is_dropout else 64
    return 64


def _round(n: int) -> int:
    return (n + _DMASK_ROUND - 1) // _DMASK_ROUND * _DMASK_ROUND


def _running_max(s: Tensor, block: int) -> Tensor:
    """Per score of s [N, Sq, Sk]: the maximum of its row over its key block and all later blocks (-inf -> 0)."""
    parts = s.split(block, dim=-1)
    block_max = torch.stack([part.amax(-1) for part in parts], dim=-1)
    after = block_max.flip(-1).cummax(-1).values.flip(-1)
    m = after.repeat_interleave(torch.tensor([part.shape[-1] for part in parts]), dim=-1)
    return m.masked_fill(torch.isneginf(m), 0.0)


def _encode(q: Tensor, k: Tensor, keep: Tensor, scale: float, softcap: float, slopes: Optional[Tensor],
            pre: int, nxt: int, block: int) -> Tensor:
    """One sequence: q [Sq, N, D], k [Sk, N2, D], keep [N, Sq, Sk] bool -> the signed S entries [N, Sq, Sk] (float32).
    Visibility and ALiBi are bottom-right aligned, as in the kernel: query i sees key j when
    -pre <= j - (i + Sk - Sq) <= nxt."""
    sq, n, _ = q.shape
    sk, n2 = k.shape[0], k.shape[1]
    kk = k.float().repeat_interleave(n // n2, dim=1)
    s = torch.einsum("qnd,knd->nqk", q.float(), kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    diag = torch.arange(sq).view(-1, 1) + (sk - sq)
    j = torch.arange(sk).view(1, -1)
    if slopes is not None:
        s = s - slopes.float().view(n, 1, 1) * (diag - j).abs()
    visible = (j - diag <= nxt) & (diag - j <= pre)
    s = s.masked_fill(~visible, -math.inf)
    p = torch.exp(s - _running_max(s, block))
    return torch.where(keep, p, -p)


def _slopes_of(pse: Optional[Tensor], b: int) -> Optional[Tensor]:
    if pse is None:
        return None
    pse = pse.detach().cpu()
    return pse[b] if pse.dim() == 2 else pse


def _keep_mask(seed: Tensor, offset: Tensor, numel: int, keep_prob: float) -> Tensor:
    """The kernel's keep flags of the flattened dropout index space (the op's own generator: same seed/offset)."""
    return _OPS.dropout_gen_mask(seed.detach().cpu(), offset.detach().cpu(), 1, numel, keep_prob).view(-1)


@torch.no_grad()
def _dmask_dense(q: Tensor, k: Tensor, *, scale: float, softcap: float, pse: Optional[Tensor], pre: int, nxt: int,
          keep_prob: float, seed: Tensor, offset: Tensor, causal: bool) -> Tensor:
    """S_dmask of flash_attn_func: q [B, Sq, N, D], k [B, Sk, N2, D]; dropout element (b, n, i, j) has flat index
    ((b * N + n) * Sq + i) * Sk + j."""
    b, sq, n, d = q.shape
    sk = k.shape[1]
    block = get_block_size_n(q.device, d, True, causal)
    keep = _keep_mask(seed, offset, b * n * sq * sk, keep_prob).view(b, n, sq, sk)
    out = torch.zeros(b, n, _round(sq), _round(sk), dtype=q.dtype)
    qc, kc = q.detach().cpu(), k.detach().cpu()
    for i in range(b if sq and sk else 0):
        out[i, :, :sq, :sk] = _encode(qc[i], kc[i], keep[i], scale, softcap, _slopes_of(pse, i), pre, nxt, block)
    return out.to(q.device)


@torch.no_grad()
def _dmask_varlen(q: Tensor, k: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
           *, scale: float, softcap: float, pse: Optional[Tensor], pre: int, nxt: int, keep_prob: float,
           seed: Tensor, offset: Tensor, causal: bool) -> Tensor:
    """S_dmask of flash_attn_varlen_func: packed q [Tq, N, D], k [Tk, N2, D]; the dropout elements of sequence b are
    the block [N, Sq_b, Sk_b] after those of the sequences before it."""
    cu_q, cu_k = cu_seqlens_q.detach().cpu().tolist(), cu_seqlens_k.detach().cpu().tolist()
    lens = [(cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]) for i in range(len(cu_q) - 1)]
    n, d = q.shape[1], q.shape[2]
    block = get_block_size_n(q.device, d, True, causal)
    keep = _keep_mask(seed, offset, n * sum(lq * lk for lq, lk in lens), keep_prob)
    rows = _round(max([max_seqlen_q] + [lq for lq, _ in lens]))
    cols = _round(max([max_seqlen_k] + [lk for _, lk in lens]))
    out = torch.zeros(len(lens), n, rows, cols, dtype=q.dtype)
    qc, kc = q.detach().cpu(), k.detach().cpu()
    base = 0
    for i, (lq, lk) in enumerate(lens):
        count = n * lq * lk
        if count:
            flags = keep[base:base + count].view(n, lq, lk)
            out[i, :, :lq, :lk] = _encode(qc[cu_q[i]:cu_q[i] + lq], kc[cu_k[i]:cu_k[i] + lk], flags, scale, softcap,
                                          _slopes_of(pse, i), pre, nxt, block)
        base += count
    return out.to(q.device)
