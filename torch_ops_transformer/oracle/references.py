"""float64 chains of the attention training ops, in plain PyTorch, for the oracle's FlashAttention rule.

The CPU kernels compute in fp32 at most, so for an fp32 call they give no more precise answer than the device; and
the backward op takes the forward's statistics and output as inputs, so a float64 run of it alone would still carry
the device forward's rounding. These functions recompute what the op means from its primary inputs only:

    flash_attention_score      q, k, v (+ mask, pse) -> float64 softmax(scale·QKᵀ …)·V, its row max and sum
    flash_attention_score_grad q, k, v, dy           -> float64 forward -> float64 dq, dk, dv, dpse

(the saved softmax_max / softmax_sum / attention_in of the call are not read). Each returns a list aligned with the
op's outputs, None where it has no float64 value (seeds, the unused softmax_out), or None altogether when the call
uses something these chains do not model (dropout, sinks, ALiBi, sparse modes 5-8): the oracle then
falls back to its next rule (docs/oracle.md). Semantics follow CANN's FlashAttentionScore documentation and this
package's op docs (native_functions.yaml): True in atten_mask hides a key; sparse_mode 0 is the band
i - pre_tokens <= j <= i + next_tokens plus the mask, 1 the mask alone, 2 causal from the top left, 3 causal from the
bottom right, 4 the band shifted by Skv - Sq (modes 2-4 ignore the mask); pse_type 1 adds pse before the scale, 0
after it (and after the softcap); a row that sees no key has output 0, max -inf, sum 0.
"""
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from ..integrations.sdpa import math_probabilities

F64 = torch.float64
NO_LIMIT = 2147483647


# ---- layouts -----------------------------------------------------------------------------------------------------
def _dense_to_bnsd(t: Tensor, layout: str, heads: int) -> Tensor:
    """[B, N, S, D] view of a BSH / SBH / BSND / BNSD tensor with `heads` heads."""
    if layout in ("BSH", "SBH"):
        t = t.unflatten(-1, (heads, -1))  # [B, S, N, D] or [S, B, N, D]
        return t.permute(1, 2, 0, 3) if layout == "SBH" else t.permute(0, 2, 1, 3)
    return t if layout == "BNSD" else t.permute(0, 2, 1, 3)


def _dense_from_bnsd(t: Tensor, layout: str) -> Tensor:
    if layout == "BNSD":
        return t
    t = t.permute(2, 0, 1, 3) if layout == "SBH" else t.permute(0, 2, 1, 3)
    return t if layout == "BSND" else t.flatten(-2)


def _cumulative_ends(x) -> List[int]:
    return [int(e) for e in (x.tolist() if isinstance(x, Tensor) else x)]


def _spans(ends: List[int]) -> List[Tuple[int, int]]:
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


class _Sequences:
    """The call's sequences as [N, S, D] float64 tensors (dense: one per batch entry; TND: one per span), and the
    way back to the op's output layout."""

    def __init__(self, layout: str, heads: int, kv_heads: int, q: Tensor, k: Tensor, v: Tensor,
                 qlen=None, kvlen=None):
        self.layout = layout
        if layout == "TND":
            self.q_spans = _spans(_cumulative_ends(qlen))
            self.kv_spans = _spans(_cumulative_ends(kvlen))
            self.q = [q[a:b].transpose(0, 1) for a, b in self.q_spans]
            self.k = [k[a:b].transpose(0, 1) for a, b in self.kv_spans]
            self.v = [v[a:b].transpose(0, 1) for a, b in self.kv_spans]
            self.total = q.shape[0]
        else:
            qb, kb, vb = (_dense_to_bnsd(t, layout, n) for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)))
            self.q, self.k, self.v = list(qb), list(kb), list(vb)

    def merge(self, per_seq: List[Tensor], like_shape, keys: bool = False) -> Tensor:
        """Per-sequence [N, S, D] back into the layout of a tensor of shape `like_shape` (a query-side tensor, or
        a key-side one with `keys`)."""
        if self.layout == "TND":
            out = torch.zeros(like_shape, dtype=F64)
            for (a, b), t in zip(self.kv_spans if keys else self.q_spans, per_seq):
                out[a:b] = t.transpose(0, 1)
            return out
        return _dense_from_bnsd(torch.stack(per_seq), self.layout).reshape(like_shape)

    def stats(self, per_seq: List[Tensor], n: int, tnd_order: bool = False) -> Tensor:
        """Per-sequence [N, Sq] row statistics as the op's [B, N, Sq, 8] (dense) or [T, N, 8] (TND: rows in NTD order
        inside that shape, as torch_npu, or in TND order with `tnd_order`)."""
        if self.layout == "TND":
            out = torch.zeros(self.total, n, dtype=F64)
            for (a, b), t in zip(self.q_spans, per_seq):
                out[a:b] = t.transpose(0, 1)
            if not tnd_order:
                out = out.transpose(0, 1).reshape(self.total, n)
            return out.unsqueeze(-1).expand(-1, -1, 8)
        return torch.stack(per_seq).unsqueeze(-1).expand(-1, -1, -1, 8)


# ---- one sequence --------------------------------------------------------------------------------------------------
def _visible(sq: int, skv: int, mode: int, pre: int, nxt: int, mask: Optional[Tensor]) -> Tensor:
    """Bool [N or 1, Sq, Skv]: may row i see key j. `mask` this sequence's [N or 1, Sq, Skv], True = hidden."""
    i = torch.arange(sq).view(sq, 1)
    j = torch.arange(skv).view(1, skv)
    shift = skv - sq
    band = {0: (j >= i - pre) & (j <= i + nxt),
            1: torch.ones(sq, skv, dtype=torch.bool),
            2: j <= i,
            3: j <= i + shift,
            4: (j >= i + shift - pre) & (j <= i + shift + nxt)}[mode].unsqueeze(0)
    if mask is not None and mode in (0, 1):
        band = band & ~mask.bool()
    return band


class _Forward:
    """softmax(s)·V of one sequence in float64, with what its backward needs."""

    def __init__(self, q, k, v, vis, pse, pse_type, scale, softcap):
        n1, n2 = q.shape[0], k.shape[0]
        self.group = n1 // n2
        self.k, self.v = k.repeat_interleave(self.group, 0), v.repeat_interleave(self.group, 0)
        self.q, self.pse_type, self.scale, self.softcap = q, pse_type, scale, softcap
        x = q @ self.k.transpose(-1, -2)
        x = (x + pse) * scale if pse is not None and pse_type == 1 else x * scale
        self.tanh = torch.tanh(x / softcap) if softcap > 0 else None
        s = softcap * self.tanh if softcap > 0 else x
        if pse is not None and pse_type == 0:
            s = s + pse
        self.vis = vis.expand_as(s)
        s = s.masked_fill(~self.vis, float("-inf"))
        self.max = s.amax(-1)
        seen = self.vis.any(-1)
        e = torch.exp(s - torch.where(seen, self.max, torch.zeros_like(self.max)).unsqueeze(-1))
        self.sum = e.sum(-1)
        self.p = torch.where(seen.unsqueeze(-1), e / self.sum.clamp_min(1e-300).unsqueeze(-1), torch.zeros_like(e))
        self.out = self.p @ self.v

    def backward(self, dy: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """dq, dk, dv (per KV head) and the gradient of the pse as applied (before broadcasting)."""
        dv = self.p.transpose(-1, -2) @ dy
        ds = self.p * (dy @ self.v.transpose(-1, -2) - (dy * self.out).sum(-1, keepdim=True))
        dpse_after = ds                                  # pse_type 0: added after the softcap
        dx = ds * (1 - self.tanh ** 2) if self.tanh is not None else ds
        dq = self.scale * dx @ self.k
        dk = self.scale * dx.transpose(-1, -2) @ self.q
        dpse = dpse_after if self.pse_type == 0 else self.scale * dx
        per_kv = lambda g: g.reshape(g.shape[0] // self.group, self.group, *g.shape[1:]).sum(1)  # noqa: E731
        return dq, per_kv(dk), per_kv(dv), dpse


def _sequence_part(t: Optional[Tensor], b: int, sq: int, skv: int, tnd: bool) -> Optional[Tensor]:
    """Sequence b's [N or 1, Sq, Skv] slice of a mask or pse given as [Sq, Skv] or [B or 1, N or 1, Sq or 1, Skv]."""
    if t is None:
        return None
    if t.dim() == 2:
        return t[:sq, :skv].unsqueeze(0) if tnd else t.unsqueeze(0)
    return t[b if t.shape[0] > 1 else 0]


# ---- flash_attention_score and its grad ----------------------------------------------------------------------------
def _fa_applies(a: Dict[str, Any]) -> bool:
    """The calls whose semantics the chain models."""
    pse = a.get("pse")
    if a.get("keep_prob", 1.0) < 1.0 or a.get("sink") is not None or a.get("softmax_layout", "") not in ("", "TND"):
        return False
    if a.get("sparse_mode", 0) not in (0, 1, 2, 3, 4) or a.get("pse_type", 1) not in (0, 1):
        return False
    if pse is not None and (a["input_layout"] == "TND" or pse.dim() != 4):
        return False
    mask = a.get("atten_mask")
    return mask is None or mask.dim() in (2, 4)


def _kv_heads(a: Dict[str, Any]) -> int:
    q, k, layout = a["query"], a["key"], a["input_layout"]
    if layout in ("BSH", "SBH"):  # H = N·D: the key's N2 from its width at the query's head dim
        return k.shape[-1] // (q.shape[-1] // a["head_num"])
    return k.shape[{"BNSD": 1, "BSND": 2, "TND": 1}[layout]]


def _fa_sequences(a: Dict[str, Any]) -> Tuple[_Sequences, List[_Forward]]:
    q, k, v = (a[n].to(F64) for n in ("query", "key", "value"))
    layout, n1 = a["input_layout"], a["head_num"]
    n2 = _kv_heads(a)
    seqs = _Sequences(layout, n1, n2, q, k, v, a.get("actual_seq_qlen"), a.get("actual_seq_kvlen"))
    pse = a.get("pse")
    pse = pse.to(F64) if pse is not None else None
    tnd = layout == "TND"
    fwds = []
    for b, (qs, ks, vs) in enumerate(zip(seqs.q, seqs.k, seqs.v)):
        sq, skv = qs.shape[1], ks.shape[1]
        vis = _visible(sq, skv, a.get("sparse_mode", 0), a.get("pre_tokens", NO_LIMIT), a.get("next_tokens", NO_LIMIT),
                       _sequence_part(a.get("atten_mask"), b, sq, skv, tnd))
        fwds.append(_Forward(qs, ks, vs, vis, _sequence_part(pse, b, sq, skv, tnd), a.get("pse_type", 1),
                             float(a.get("scale", 1.0)), float(a.get("softcap", 0.0))))
    return seqs, fwds


def flash_attention_score(a: Dict[str, Any]) -> Optional[List[Optional[Tensor]]]:
    """[attention_out, softmax_max, softmax_sum, None, None, None] in float64, or None."""
    if not _fa_applies(a):
        return None
    seqs, fwds = _fa_sequences(a)
    q, v = a["query"], a["value"]
    n1 = a["head_num"]
    v_head_dim = v.shape[-1] // _kv_heads(a) if a["input_layout"] in ("BSH", "SBH") else v.shape[-1]
    out_shape = q.shape[:-1] + (n1 * v_head_dim if a["input_layout"] in ("BSH", "SBH") else v_head_dim,)
    out = seqs.merge([f.out for f in fwds], out_shape) if fwds else torch.zeros(out_shape, dtype=F64)
    if not fwds:
        return [out, None, None, None, None, None]
    tnd_order = a.get("softmax_layout", "") == "TND"
    return [out, seqs.stats([f.max for f in fwds], n1, tnd_order), seqs.stats([f.sum for f in fwds], n1, tnd_order),
            None, None, None]


def flash_attention_score_grad(a: Dict[str, Any]) -> Optional[List[Optional[Tensor]]]:
    """[dq, dk, dv, dpse, None] in float64 from q, k, v, dy (the saved statistics and output are not read)."""
    if not _fa_applies(a) or not a["query"].numel():
        return None
    seqs, fwds = _fa_sequences(a)
    n1 = a["head_num"]
    dys = _Sequences(a["input_layout"], n1, n1, a["dy"].to(F64), a["dy"].to(F64), a["dy"].to(F64),
                     a.get("actual_seq_qlen"), a.get("actual_seq_qlen")).q
    grads = [f.backward(dy) for f, dy in zip(fwds, dys)]
    dq = seqs.merge([g[0] for g in grads], a["query"].shape)
    dk = seqs.merge([g[1] for g in grads], a["key"].shape, keys=True)
    dv = seqs.merge([g[2] for g in grads], a["value"].shape, keys=True)
    pse = a.get("pse")
    dpse = None
    if pse is not None:
        full = torch.stack([g[3] for g in grads])  # [B, N1, Sq, Skv]
        dims = [d for d in range(4) if pse.shape[d] == 1 and full.shape[d] != 1]
        dpse = full.sum(dims, keepdim=True) if dims else full
    return [dq, dk, dv, dpse, None]


CHAINS: Dict[str, Callable[[Dict[str, Any]], Optional[List[Optional[Tensor]]]]] = {
    "npu_fa::flash_attention_score": flash_attention_score,
    "npu_fa::flash_attention_score_grad": flash_attention_score_grad,
}


# ---- the same chains on the CPU kernels at the call's dtype --------------------------------------------------------
_FORWARD_STATE = ("dy", "softmax_max", "softmax_sum", "attention_in")


def flash_attention_score_grad_cpu(a: Dict[str, Any]) -> List[Tensor]:
    """The CPU kernels' own chain at the call's dtype: forward from q, k, v (and the call's mask, pse, dropout seed,
    ...), then the backward with that forward's statistics and output — what the FA2 rule's `cpu` term must be for
    a backward: judged against the CPU backward fed the device's statistics, a wrong device forward would pass as
    the CPU's own error."""
    ops = torch.ops.npu_fa
    names = {arg.name for arg in ops.flash_attention_score.default._schema.arguments}
    forward = {k: v for k, v in a.items() if k in names and k not in _FORWARD_STATE}
    out, smax, ssum = ops.flash_attention_score(**forward)[:3]
    return list(ops.flash_attention_score_grad(**dict(a, softmax_max=smax, softmax_sum=ssum, attention_in=out)))


CPU_CHAINS: Dict[str, Callable[[Dict[str, Any]], List[Tensor]]] = {
    "npu_fa::flash_attention_score_grad": flash_attention_score_grad_cpu,
}


# ---- magnitudes of cancelling outputs (compare.py: the eps terms use max(max|ref|, magnitude)) --------------------
def sdpa_probabilities(query, key, attn_bias, is_causal, scale):
    """softmax(scale * Q Kᵀ + bias) of PyTorch's SDPA semantics in plain PyTorch (math), with its logsumexp and the
    GQA group (keys repeated over the query heads of their group): the SDPA hook's reference and its magnitudes.
    (Also used for the backward: inside a dispatch mode the autograd keys are excluded, so the reference computes
    gradients by the formulas, not by autograd.)"""
    group = query.shape[-3] // key.shape[-3]
    mask = attn_bias if attn_bias is not None and attn_bias.numel() else None
    p, lse = math_probabilities(query, key.repeat_interleave(group, -3), mask, is_causal, scale)
    return p, lse, group


def per_kv_head(g, group: int):
    """A per-query-head gradient summed into its key/value head (the query heads of a GQA group share it)."""
    return g.reshape(g.shape[:-3] + (g.shape[-3] // group, group) + g.shape[-2:]).sum(-3)


def _sdpa_rows(query, key, attn_bias, is_causal, scale):
    """P in float64 and the GQA group, for the magnitudes."""
    p, _, group = sdpa_probabilities(query.double(), key.double(), attn_bias, is_causal, scale)
    return p, group


def sdpa_forward_magnitudes(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                            return_debug_mask=False, *, scale=None) -> List[Optional[float]]:
    """out = P·V rounds P (or its products) to the call's dtype: the rows of P·|V| bound what that costs."""
    p, group = _sdpa_rows(query, key, attn_bias, is_causal, scale)
    return [float((p @ value.double().abs().repeat_interleave(group, -3)).max()) if p.numel() else 0.0, None]


def sdpa_backward_magnitudes(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, *rest,
                             scale=None) -> List[Optional[float]]:
    """A FlashAttention backward computes D = rowsum(dO∘O) from the output rounded to the call's dtype, and dS =
    P∘(dP − D) cancels where P·V is close to V (a row seeing one key gives dS = 0 exactly): D's rounding reaches
    dq = c·dS·K and dk = c·dSᵀ·Q through |D|-sized terms; dv = Pᵀ·dO rounds P."""
    is_causal = bool(rest[5]) if len(rest) > 5 else False
    p, group = _sdpa_rows(query, key, attn_bias, is_causal, scale)
    if not p.numel():
        return [0.0, 0.0, 0.0]
    c = scale if scale is not None else query.shape[-1] ** -0.5
    d_abs = (grad_out.double().abs() * out.double().abs()).sum(-1, keepdim=True)  # |D| bound per row
    ds_abs = p * d_abs
    dq = c * ds_abs @ key.double().abs().repeat_interleave(group, -3)
    dk = c * ds_abs.transpose(-1, -2) @ query.double().abs()
    dv = p.transpose(-1, -2) @ grad_out.double().abs()
    return [float(dq.max()), float(per_kv_head(dk, group).max()), float(per_kv_head(dv, group).max())]


MAGNITUDES: Dict[str, Callable[..., List[Optional[float]]]] = {
    "aten::_scaled_dot_product_fused_attention_overrideable": sdpa_forward_magnitudes,
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": sdpa_backward_magnitudes,
}
