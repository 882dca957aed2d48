"""FlashAttention-2's `S_dmask`: what `return_attn_probs=True` returns as third value when dropout_p > 0 (its
documented encoding, rebuilt here from the inputs and the dropout mask our kernel applied):

- shape [batch, nheads, round128(seqlen_q), round128(seqlen_k)] (varlen: the rounded max_seqlen_q / max_seqlen_k,
  sequence b's queries and keys from row / column 0), in q's dtype; entries outside a sequence are 0;
- magnitude: the un-normalised probability exp(s - m) of score s (scaled, soft-capped, ALiBi-biased and masked as
  the kernel does), where m is the running row maximum FlashAttention-2's forward kernel holds when it reaches the
  score's key block: it walks the key blocks of `get_block_size_n` columns from the last one back, so m is the
  maximum over the score's own block and every block after it (masked scores count as -inf; a row without keys
  gives 0);
- sign: negative where the element was dropped, non-negative where it was kept.

So `S_dmask >= 0` is the keep mask, and exp(s - m) * exp(m - lse) recovers the softmax: out equals
dropout(softmax) @ v / (1 - dropout_p) with that mask, as FlashAttention-2's tests check. Without dropout
FlashAttention-2 returns None, and so do we (the callers do not come here).

Not differentiable (built under no_grad) and meant for checking: it materialises the whole score matrix, one
sequence at a time, on the CPU.
"""
import math
from typing import Optional

import torch
from torch import Tensor

_OPS = torch.ops.npu_fa
ROUND = 128  # FlashAttention-2 rounds both sequence dims of S_dmask up to a multiple of 128


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
    return (n + ROUND - 1) // ROUND * ROUND


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
def dense(q: Tensor, k: Tensor, *, scale: float, softcap: float, pse: Optional[Tensor], pre: int, nxt: int,
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
def varlen(q: Tensor, k: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
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
