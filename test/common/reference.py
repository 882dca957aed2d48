"""An independent plain-PyTorch reference of flash_attention_score (CANN FlashAttentionScore semantics).

It shares no code with the package: layouts, masks, sparse modes, pse and dropout are re-derived here from the
semantics of CANN's FlashAttentionScore (ops-transformer documentation) and the op docs of native_functions.yaml.

`attention_reference(...)` computes in `compute_dtype`:
  - float64 (the default): the "ref64" result, exact up to float64 rounding for the given (rounded) inputs;
  - the inputs' own dtype: "torch_same_dtype", what a straightforward PyTorch implementation in that dtype gets.
Gradients come from autograd through this function (see `reference_with_grads`).

Conventions (from the spec):
  * atten_mask: bool / uint8, True = masked out; shapes [B,N,Sq,Skv], [B,1,Sq,Skv], [1,1,Sq,Skv], [Sq,Skv];
    TND takes a 2-D mask indexed by the position inside each sequence.
  * sparse_mode 0: mask and band i-pre <= j <= i+next; 1: mask only; 2: j <= i; 3: j <= i + Skv - Sq;
    4: i+d-pre <= j <= i+d+next with d = Skv - Sq. Modes 2-4 ignore atten_mask (it may only be the compressed one).
  * pse_type 1: scale*(QK^T + pse); pse_type 0: scale*QK^T + pse.
  * dropout: an explicit keep mask, read flattened (e.g. dropout_gen_mask's [rows, cols] matrix, or any shape):
    element (b, n, i, j) is element ((b*N1 + n)*Sq + i)*Skv + j (dense: the [B, N1, Sq, Skv] mask), and for TND
    sequence b takes the next N1*Sq_b*Skv_b elements as an [N1, Sq_b, Skv_b] block (torch_npu's order); kept entries
    are scaled by 1/keep_prob; the softmax statistics (logsumexp) use the undropped probabilities.
  * sink ([N1]): one more logit per head in every softmax row, whose value row is 0 (its probability is dropped
    before the product with V); the logsumexp includes it.
  * rows whose keys are all masked give output 0 and logsumexp -inf.
"""
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

MAX_TOKENS = 2147483647
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}  # case names -> dtypes
LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")


# ----------------------------------------------------------------------------------------------------------------
# layouts
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Heads:
    """Per-sequence views: lists of [N, S, D] tensors plus the numbers needed to rebuild a layout."""
    q: List[Tensor]
    k: List[Tensor]
    v: List[Tensor]
    batch: int
    q_heads: int
    kv_heads: int
    q_starts: List[int]  # first token of each sequence (TND), else 0
    q_lens: List[int]
    kv_lens: List[int]


def _to_bnsd(t: Tensor, layout: str, heads: int) -> Tensor:
    """A dense-layout tensor as [B, N, S, D]."""
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "SBH":
        t = t.transpose(0, 1)
    b, s, h = t.shape
    return t.reshape(b, s, heads, h // heads).transpose(1, 2)


def _from_bnsd(t: Tensor, layout: str) -> Tensor:
    """[B, N, S, D] back to a dense layout."""
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    b, n, s, d = t.shape
    bsh = t.transpose(1, 2).reshape(b, s, n * d)
    return bsh.transpose(0, 1) if layout == "SBH" else bsh


def _ends(x: Union[None, Sequence[int], Tensor]) -> List[int]:
    if x is None:
        raise ValueError("TND needs actual_seq_qlen and actual_seq_kvlen (cumulative ends)")
    return [int(e) for e in (x.tolist() if isinstance(x, Tensor) else x)]


def _lengths(ends: List[int]) -> Tuple[List[int], List[int]]:
    starts = [0] + ends[:-1]
    return starts, [e - s for s, e in zip(starts, ends)]


def split_heads(q: Tensor, k: Tensor, v: Tensor, head_num: int, layout: str,
                actual_seq_qlen=None, actual_seq_kvlen=None) -> Heads:
    """Splits q/k/v of any layout into per-sequence [N, S, D] tensors (views that keep autograd)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout}")
    if layout == "TND":
        q_starts, q_lens = _lengths(_ends(actual_seq_qlen))
        kv_starts, kv_lens = _lengths(_ends(actual_seq_kvlen))
        qs = [q[s:s + n].transpose(0, 1) for s, n in zip(q_starts, q_lens)]
        ks = [k[s:s + n].transpose(0, 1) for s, n in zip(kv_starts, kv_lens)]
        vs = [v[s:s + n].transpose(0, 1) for s, n in zip(kv_starts, kv_lens)]
        return Heads(qs, ks, vs, len(q_lens), q.shape[1], k.shape[1], q_starts, q_lens, kv_lens)
    if layout in ("BSH", "SBH"):
        d = q.shape[-1] // head_num
        kv_heads = k.shape[-1] // d
    else:
        kv_heads = k.shape[2] if layout == "BSND" else k.shape[1]
    qb, kb, vb = _to_bnsd(q, layout, head_num), _to_bnsd(k, layout, kv_heads), _to_bnsd(v, layout, kv_heads)
    batch = qb.shape[0]
    return Heads(list(qb.unbind(0)), list(kb.unbind(0)), list(vb.unbind(0)), batch, head_num, kv_heads,
                 [0] * batch, [qb.shape[2]] * batch, [kb.shape[2]] * batch)


def merge_heads(outs: List[Tensor], layout: str, like: Tensor) -> Tensor:
    """Per-sequence [N, S, vD] outputs back to q's layout."""
    if layout == "TND":
        if not outs:
            return like.new_zeros((0,) + tuple(like.shape[1:]))
        return torch.cat([o.transpose(0, 1) for o in outs], dim=0)
    return _from_bnsd(torch.stack(outs, 0), layout)


def lse_layout(lses: List[Tensor], layout: str, n_heads: int, like: Tensor) -> Tensor:
    """Per-sequence [N, S] logsumexp as [B, N, Sq] (dense) or [T, N] (TND)."""
    if layout == "TND":
        if not lses:
            return like.new_zeros((0, n_heads))
        return torch.cat([l.transpose(0, 1) for l in lses], dim=0)
    return torch.stack(lses, 0)


# ----------------------------------------------------------------------------------------------------------------
# masks, bias, dropout per sequence
# ----------------------------------------------------------------------------------------------------------------
def visible_keys(sq: int, skv: int, sparse_mode: int, pre_tokens: int, next_tokens: int,
                 mask: Optional[Tensor]) -> Tensor:
    """Bool [.., Sq, Skv]: True where query i may attend key j. `mask` is this sequence's [N or 1, Sq, Skv]
    (True = masked out) or None."""
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(skv).unsqueeze(0)
    d = skv - sq
    if sparse_mode == 0:
        vis = (j >= i - pre_tokens) & (j <= i + next_tokens)
    elif sparse_mode == 1:
        vis = torch.ones(sq, skv, dtype=torch.bool)
    elif sparse_mode == 2:
        vis = j <= i
    elif sparse_mode == 3:
        vis = j <= i + d
    elif sparse_mode == 4:
        vis = (j >= i + d - pre_tokens) & (j <= i + d + next_tokens)
    else:
        raise ValueError(f"sparse_mode {sparse_mode} is not modelled by the reference")
    vis = vis.unsqueeze(0)
    if mask is not None and sparse_mode in (0, 1):
        vis = vis & ~mask.bool()
    return vis


def _sequence_mask(atten_mask: Optional[Tensor], b: int, sq: int, skv: int, tnd: bool) -> Optional[Tensor]:
    if atten_mask is None:
        return None
    if atten_mask.dim() == 2:
        m = atten_mask[:sq, :skv] if tnd else atten_mask
        return m.unsqueeze(0)
    return atten_mask[b if atten_mask.shape[0] > 1 else 0]


def _sequence_pse(pse: Optional[Tensor], b: int) -> Optional[Tensor]:
    if pse is None:
        return None
    return pse[b if pse.shape[0] > 1 else 0]


def _sequence_keep(keep: Optional[Tensor], heads: Heads, b: int) -> Optional[Tensor]:
    """This sequence's [N1, Sq, Skv] block of the flattened keep mask."""
    if keep is None:
        return None
    n1, sq, skv = heads.q_heads, heads.q_lens[b], heads.kv_lens[b]
    if sq == 0 or skv == 0:  # nothing to drop
        return None
    start = n1 * sum(heads.q_lens[x] * heads.kv_lens[x] for x in range(b))
    return keep.reshape(-1)[start:start + n1 * sq * skv].view(n1, sq, skv)


def dropout_numel(query: Tensor, key: Tensor, head_num: int, layout: str, actual_seq_qlen=None,
                  actual_seq_kvlen=None) -> int:
    """Elements of a call's dropout mask: B*N1*Sq*Skv (dense) or N1 * sum(Sq_b * Skv_b) (TND)."""
    if layout == "TND":
        _, ql = _lengths(_ends(actual_seq_qlen))
        _, kl = _lengths(_ends(actual_seq_kvlen))
        return head_num * sum(a * b for a, b in zip(ql, kl))
    seq = {"BNSD": 2, "SBH": 0}.get(layout, 1)
    batch = query.shape[1] if layout == "SBH" else query.shape[0]
    return batch * head_num * query.shape[seq] * key.shape[seq]


# ----------------------------------------------------------------------------------------------------------------
# the math of one sequence
# ----------------------------------------------------------------------------------------------------------------
def _attend(q: Tensor, k: Tensor, v: Tensor, vis: Tensor, bias: Optional[Tensor], scale: float, pse_type: int,
            keep: Optional[Tensor], keep_prob: float, sink: Optional[Tensor] = None, softcap: float = 0.0,
            alibi_shift: int = 0) -> Tuple[Tensor, Tensor]:
    """q [N1,Sq,D], k [N2,Skv,D], v [N2,Skv,vD] -> out [N1,Sq,vD], lse [N1,Sq]. pse_type 2/3: bias holds the N1
    ALiBi slopes, the bias of (i, j) is -slope * |j - i + alibi_shift| (sqrt of the distance for 3). softcap > 0:
    scaled scores (with a pse_type 1 bias) -> softcap * tanh(x / softcap), before the other biases."""
    n1, sq, _ = q.shape
    n2, skv, vd = v.shape
    if skv == 0 or sq == 0:
        out = q.new_zeros(n1, sq, vd) + 0 * q.sum() + 0 * v.sum() + 0 * k.sum()  # keeps the autograd graph
        if sink is not None:  # the sink alone: weight 1 on a zero value row
            return out + 0 * sink.sum(), sink.detach().view(n1, 1).expand(n1, sq).clone()
        return out, q.new_full((n1, sq), float("-inf"))
    group = n1 // n2
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    s = q @ k.transpose(-1, -2)
    if bias is not None and pse_type == 1:
        s = (s + bias) * scale
    else:
        s = s * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None and pse_type == 0:
        s = s + bias
    elif bias is not None and pse_type >= 2:
        dist = (torch.arange(skv, dtype=torch.float64).view(1, skv) - torch.arange(sq, dtype=torch.float64).view(sq, 1)
                + alibi_shift).abs().to(s.dtype)
        s = s - bias.view(n1, 1, 1) * (dist.sqrt() if pse_type == 3 else dist)
    vis = vis.expand(n1, sq, skv)
    s = s.masked_fill(~vis, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.view(n1, 1, 1).expand(n1, sq, 1)], dim=-1)
        vis = torch.cat([vis, (sink != float("-inf")).view(n1, 1, 1).expand(n1, sq, 1)], dim=-1)
    empty = ~vis.any(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    lse = torch.logsumexp(s.detach(), dim=-1)
    if sink is not None:
        p = p[..., :-1]  # the sink's probability multiplies a zero value row
    if keep is not None:
        p = p * keep.to(p.dtype) / keep_prob
    return p @ v, lse


def attention_reference(query: Tensor, key: Tensor, value: Tensor, head_num: int, input_layout: str, *,
                        pse: Optional[Tensor] = None, atten_mask: Optional[Tensor] = None,
                        actual_seq_qlen=None, actual_seq_kvlen=None, scale: float = 1.0,
                        keep_prob: float = 1.0, dropout_keep: Optional[Tensor] = None,
                        pre_tokens: int = MAX_TOKENS, next_tokens: int = MAX_TOKENS, sparse_mode: int = 0,
                        pse_type: int = 1, sink: Optional[Tensor] = None, softcap: float = 0.0,
                        q_start_idx=None, kv_start_idx=None, alibi_bottom_right: bool = False,
                        compute_dtype: Optional[torch.dtype] = torch.float64) -> Tuple[Tensor, Tensor]:
    """Returns (attention_out in q's layout, logsumexp [B,N1,Sq] or [T,N1]), both in `compute_dtype`
    (None = the inputs' dtype). `dropout_keep` is the keep mask (read flattened, see the module doc) and is
    required when keep_prob < 1. pse_type 2/3: pse holds ALiBi slopes [N1] or [B, N1]; the distance of (i, j) in
    sequence b is (j + kv_start_idx) - (i + q_start_idx) (one value or one per sequence), minus Skv_b - Sq_b with
    alibi_bottom_right."""
    if keep_prob < 1.0 and dropout_keep is None:
        raise ValueError("the reference needs the explicit dropout keep matrix when keep_prob < 1")
    cd = compute_dtype or query.dtype
    q, k, v = query.to(cd), key.to(cd), value.to(cd)
    bias = pse.to(cd) if pse is not None else None
    sink = sink.to(cd) if sink is not None else None
    tnd = input_layout == "TND"
    heads = split_heads(q, k, v, head_num, input_layout, actual_seq_qlen, actual_seq_kvlen)
    keep = dropout_keep if keep_prob < 1.0 else None
    outs, lses = [], []
    for b in range(heads.batch):
        sq, skv = heads.q_lens[b], heads.kv_lens[b]
        vis = visible_keys(sq, skv, sparse_mode, pre_tokens, next_tokens, _sequence_mask(atten_mask, b, sq, skv, tnd))
        if pse_type >= 2:
            seq_bias = None if bias is None else bias if bias.dim() == 1 else bias[b]
            start = lambda idx: 0 if not idx else idx[0] if len(idx) == 1 else idx[b]  # noqa: E731
            shift = start(kv_start_idx) - start(q_start_idx) - ((skv - sq) if alibi_bottom_right else 0)
        else:
            seq_bias, shift = _sequence_pse(bias, b), 0
        out, lse = _attend(heads.q[b], heads.k[b], heads.v[b], vis, seq_bias, scale, pse_type,
                           _sequence_keep(keep, heads, b), keep_prob, sink, softcap, shift)
        outs.append(out)
        lses.append(lse)
    if not outs:  # B == 0: shapes from the inputs
        n2 = heads.kv_heads
        vd = value.shape[-1] // n2 if input_layout in ("BSH", "SBH") else value.shape[-1]
        shape = list(query.shape)
        shape[-1] = head_num * vd if input_layout in ("BSH", "SBH") else vd
        out = q.new_zeros(shape) + 0 * q.sum() + 0 * k.sum() + 0 * v.sum()
        lse_shape = (query.shape[0], head_num) if tnd else (0, head_num, _to_bnsd(query, input_layout, head_num).shape[2])
        return out, q.new_zeros(lse_shape)
    return merge_heads(outs, input_layout, q), lse_layout(lses, input_layout, head_num, q)


# ----------------------------------------------------------------------------------------------------------------
# gradients and the tolerance rule
# ----------------------------------------------------------------------------------------------------------------
GRAD_NAMES = ("query", "key", "value", "pse", "sink")


def reference_with_grads(inputs: Dict[str, Optional[Tensor]], dy: Optional[Tensor], compute_dtype, **kwargs
                         ) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
    """Runs the reference on detached copies of inputs['query'/'key'/'value'/'pse'/'sink'] (cast to compute_dtype, or
    kept in their dtype when compute_dtype is None) and back-propagates dy. Returns (out, lse, {name: grad})."""
    leaves = {}
    for name in GRAD_NAMES:
        t = inputs.get(name)
        if t is not None:
            t = t.detach().to(compute_dtype or t.dtype)
            leaves[name] = t.requires_grad_(dy is not None)
    out, lse = attention_reference(leaves["query"], leaves["key"], leaves["value"], pse=leaves.get("pse"),
                                   sink=leaves.get("sink"), compute_dtype=compute_dtype, **kwargs)
    grads = {}
    if dy is not None:
        order = list(leaves)
        got = torch.autograd.grad(out, [leaves[n] for n in order], dy.to(out.dtype), allow_unused=True)
        grads = {n: (g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(order, got)}
    return out.detach(), lse.detach(), grads


def max_abs_err(a: Tensor, ref: Tensor) -> float:
    """max |a - ref| over the entries where ref is finite (float64); entries with a non-finite ref must match it."""
    a = a.detach().double()
    ref = ref.detach().double()
    if a.shape != ref.shape:
        raise AssertionError(f"shape {list(a.shape)} != reference shape {list(ref.shape)}")
    finite = torch.isfinite(ref)
    if a.numel() == 0 or not finite.any():
        return 0.0
    return float((a[finite] - ref[finite]).abs().max())


def _ulp(x: float, dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(x)) if x > 0 else 0.0


def same_dtype_floor(ref64: Tensor, dtype: torch.dtype, value_scale: Optional[float] = None) -> float:
    """The least error any same-dtype attention makes: half an ulp of `dtype` at the largest finite |ref64| for
    rounding the output, and half an ulp at the largest |value| for rounding the probabilities P to the input dtype
    before the P.V product (as FlashAttention and PyTorch's fused kernels do; the error is <= eps/2 * sum_j p_j|v_j|
    <= eps/2 * max|v|). Without `value_scale` the values are taken as large as the output (one ulp in all); with
    it, an output that cancels (values of both signs, |out| << |v|) keeps the rounding of P at the values' scale.
    On tensors of realistic size PyTorch's same-dtype error is above this floor (measured over 64..256 keys,
    head_dim 32..128: plain math 1.1-3.0 ulps, PyTorch's fused CPU SDPA 0.6-1.8 ulps), so it only matters for
    outputs of a handful of elements. Zero for float64 and integer outputs."""
    if not dtype.is_floating_point or dtype == torch.float64:
        return 0.0
    finite = ref64[torch.isfinite(ref64)].abs()
    top = float(finite.max()) if finite.numel() else 0.0
    values = top if value_scale is None else float(value_scale)
    return (_ulp(top, dtype) + _ulp(values, dtype)) / 2


def check_tolerance(name: str, ours: Tensor, ref64: Tensor, same: Tensor, floor: float = 1e-5,
                    value_scale: Optional[float] = None) -> None:
    """The project's tolerance rule: max|ours - ref64| <= 2 * max|torch_same_dtype - ref64| + floor.

    PyTorch's error counts as at least same_dtype_floor (an ulp of the output; for attention outputs given their
    `value_scale` = max|v|, half an ulp of the output and half of the values): over a tensor of thousands of elements
    it always is, but over a handful (a 1x1 output, a 2x5 output of three keys, two outputs that cancel) PyTorch's
    result can land next to the exact value by luck, and a kernel that rounds P to the input dtype as FlashAttention
    does would then fail by about one unit in the last place."""
    assert not torch.isnan(ours.detach().float()).any(), f"{name}: NaN in our result"
    err = max_abs_err(ours, ref64)
    base = max(max_abs_err(same, ref64), same_dtype_floor(ref64, ours.dtype, value_scale))
    tol = 2.0 * base + floor
    assert err <= tol, (f"{name}: max|ours - ref64| = {err:.3e} exceeds 2*max|torch_same_dtype - ref64| + {floor:g} "
                        f"= {tol:.3e} (torch_same_dtype error {base:.3e})")
