"""FlashAttention-2 semantics in plain PyTorch, independent of our kernels: one sequence's attention with
bottom-right causal / window, softcap and ALiBi, and rotary embedding. Run it in float64 for the reference and in the
tested dtype for the "torch_same_dtype" error of the tolerance rule."""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor


def attend(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool = False,
           window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
           alibi: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """q [Sq, N, D], k [L, N2, D], v [L, N2, Dv] in one dtype -> (out [Sq, N, Dv], lse [N, Sq] float64).

    Query i sees key j when i + L - Sq - left <= j <= i + L - Sq + right (left/right -1 = unbounded; causal sets
    right = 0); a row that sees no key gives zeros and lse +inf (FlashAttention-2's convention). With ALiBi and a
    plain causal mask, FlashAttention-2's kernels add slope * j rather than -slope * (i + L - Sq - j): the output is
    the same (a constant per row) but its lse carries slope * (i + L - Sq); so does this one's."""
    sq, n, _ = q.shape
    length, n2 = k.shape[0], k.shape[1]
    g = n // n2
    kk = k.repeat_interleave(g, dim=1)
    vv = v.repeat_interleave(g, dim=1)
    s = torch.einsum("qnd,knd->nqk", q, kk) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(sq).view(-1, 1)
    j = torch.arange(length).view(1, -1)
    diag = i + length - sq  # the key aligned with query i (bottom-right)
    if alibi is not None:
        s = s - alibi.to(s.dtype).view(n, 1, 1) * (diag - j).abs().to(s.dtype)
    left, right = window
    if causal:
        right = 0
    visible = torch.ones(sq, length, dtype=torch.bool)
    if right >= 0:
        visible &= j <= diag + right
    if left >= 0:
        visible &= j >= diag - left
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s.double(), dim=-1)
    if alibi is not None and causal and left < 0:
        lse = lse + alibi.double().view(n, 1) * (i.view(1, -1) + length - sq).double()
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows without keys: softmax of all -inf is NaN -> zeros
    out = torch.einsum("nqk,knd->qnd", p, vv)
    return out, lse.masked_fill(torch.isneginf(lse), math.inf)


def rotary(x: Tensor, cos: Tensor, sin: Tensor, positions: Tensor, interleaved: bool) -> Tensor:
    """x [..., T, N, D] rotated at positions [T] by cos/sin [S_ro, rot/2]: pairs (2i, 2i+1) when interleaved,
    else (i, i + rot/2); values past rot are unchanged."""
    half = cos.shape[1]
    rot = 2 * half
    c = cos[positions].to(x.dtype).unsqueeze(-2)  # [T, 1, half]
    s = sin[positions].to(x.dtype).unsqueeze(-2)
    x_rot, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        a, b = x_rot[..., 0::2], x_rot[..., 1::2]
        out = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    else:
        a, b = x_rot[..., :half], x_rot[..., half:]
        out = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    return torch.cat([out, rest], dim=-1)
