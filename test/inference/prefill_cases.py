"""Inputs and an independent float64 reference for the prefill ops (prompt_flash_attention,
fused_infer_attention_score, attention_update), plus their opcheck cases.

The reference re-derives the semantics (docs/inference.md) without sharing code with the package: per-sequence
[N, S, D] heads, bands per sparse mode measured inside each sequence's actual lengths, CANN mask polarity
(True = masked out), pse_shift added after scaling, rows that see no key or lie past their sequence -> 0, lse -inf.
"""
import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from test.common.reference import DTYPES, visible_keys

MAX = 2147483647
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2.5e-2}


def to_layout(x: Tensor, layout: str) -> Tensor:
    """[B, N, S, D] -> layout (BNSD_BSND inputs are BNSD)."""
    if layout in ("BNSD", "BNSD_BSND"):
        return x.contiguous()
    if layout == "BSND":
        return x.transpose(1, 2).contiguous()
    if layout == "BSH":
        b, n, s, d = x.shape
        return x.transpose(1, 2).reshape(b, s, n * d).contiguous()
    raise ValueError(layout)


def pack_tnd(x: Tensor, lens: Sequence[int]) -> Tensor:
    """[B, N, S, D] -> [T, N, D] keeping the first lens[b] tokens of each batch."""
    return torch.cat([x[b, :, :L].transpose(0, 1) for b, L in enumerate(lens)], 0).contiguous()


def make_inputs(layout="BSND", B=3, N1=4, N2=2, Sq=9, Skv=11, D=16, dtype=torch.float32, q_lens=None,
                kv_lens=None, seed=0):
    """q/k/v as [B,N,S,D] float values rounded to dtype; returns dict with the op inputs and the bnsd copies."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N1, Sq, D, generator=g).to(dtype)
    k = torch.randn(B, N2, Skv, D, generator=g).to(dtype)
    v = torch.randn(B, N2, Skv, D, generator=g).to(dtype)
    if layout == "TND":
        q_lens = list(q_lens if q_lens is not None else [Sq] * B)
        kv_lens = list(kv_lens if kv_lens is not None else [Skv] * B)
        args = dict(query=pack_tnd(q, q_lens), key=pack_tnd(k, kv_lens), value=pack_tnd(v, kv_lens),
                    actual_seq_lengths=torch.tensor(q_lens).cumsum(0),
                    actual_seq_lengths_kv=torch.tensor(kv_lens).cumsum(0))
    else:
        args = dict(query=to_layout(q, layout), key=to_layout(k, layout), value=to_layout(v, layout))
        if q_lens is not None:
            args["actual_seq_lengths"] = torch.tensor(q_lens, dtype=torch.int64)
        if kv_lens is not None:
            args["actual_seq_lengths_kv"] = torch.tensor(kv_lens, dtype=torch.int64)
    return args, (q, k, v), (q_lens or [Sq] * B, kv_lens or [Skv] * B)


def reference(bnsd, lens, layout, scale, mask=None, pse=None, pre=MAX, nxt=0, mode=0, dtype=torch.float64):
    """(out in the op's output layout, lse [B, N1, Sq]) of prefill attention, computed in `dtype` (float64: ref64;
    the inputs' dtype: what plain PyTorch gets in that precision)."""
    q, k, v = (t.to(dtype) for t in bnsd)
    B, N1, Sq, D = q.shape
    N2, Skv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(N1 // N2, 1)
    v = v.repeat_interleave(N1 // N2, 1)
    out = torch.zeros(B, N1, Sq, v.shape[-1], dtype=dtype)
    lse = torch.full((B, N1, Sq), -math.inf, dtype=dtype)
    if mode == 0 and mask is None:
        pre = nxt = MAX
    for b in range(B):
        Lq, Lk = lens[0][b], lens[1][b]
        if Lq == 0:
            continue
        vis = visible_keys(Lq, Lk, mode, pre, nxt, None).expand(N1, Lq, Lk)
        if mask is not None and mode in (0, 1):
            m = mask.bool()
            if m.dim() == 2:
                m = m[:Lq, :Lk]
            else:
                if m.dim() == 3:
                    m = m[:, None]
                m = m[b if m.shape[0] > 1 else 0][:, :Lq, :Lk]
            vis = vis & ~m
        s = scale * q[b, :, :Lq] @ k[b, :, :Lk].transpose(-1, -2)
        if pse is not None:
            p = pse.to(dtype)[b if pse.shape[0] > 1 else 0]
            s = s + (p[:, :Lq, :Lk] if p.shape[1] > 1 else p[:, :, :Lk])
        s = s.masked_fill(~vis, -math.inf)
        l = torch.logsumexp(s, -1)
        w = torch.exp(s - l[..., None]).nan_to_num(0.0)
        out[b, :, :Lq] = w @ v[b, :, :Lk]
        lse[b, :, :Lq] = l
    if layout == "TND":
        return pack_tnd(out, lens[0]), lse
    if layout == "BNSD_BSND":
        return out.transpose(1, 2).contiguous(), lse
    return to_layout(out, layout), lse


OPS = torch.ops.npu_fa


def _pfa_case(layout="BSND", **kw):
    lens = kw.pop("lens", None)
    args, _, _ = make_inputs(layout, B=2, N1=2, N2=1, Sq=5, Skv=6, D=8,
                             q_lens=lens[0] if lens else None, kv_lens=lens[1] if lens else None)
    q, k, v = args.pop("query"), args.pop("key"), args.pop("value")
    return (q, k, v), dict(args, num_heads=2, scale_value=0.3, input_layout=layout, **kw)


def _fia_case(layout="BSND", **kw):
    (q, k, v), a = _pfa_case(layout, **kw)
    a["scale"] = a.pop("scale_value")
    return (q, k, v), a


def _update_case(K=3, rows=(2, 3), D=4, dtype=torch.float32, lse_dtype=torch.float32, grad=True):
    g = torch.Generator().manual_seed(1)
    lse = torch.randn(K, *rows, generator=g).to(lse_dtype)
    lse[0, 0, 0] = -math.inf
    out = torch.randn(K, *rows, D, generator=g).to(dtype)
    return lse.requires_grad_(grad), out.requires_grad_(grad)


def _update_grad_case():
    lse, out = _update_case(grad=False)
    res, L = OPS.attention_update(lse, out)
    return (lse, out, L, res, torch.randn_like(res), torch.randn_like(L)), {}


def _fia_paged_lse_case():
    g = torch.Generator().manual_seed(2)
    cache = torch.randn(3, 16, 16, generator=g)
    q = torch.randn(2, 1, 32, generator=g)
    bt = torch.tensor([[2, 0], [1, -1]], dtype=torch.int32)
    return (q, cache, cache), dict(block_table=bt, actual_seq_lengths_kv=torch.tensor([20, 9]), num_heads=4,
                                   num_key_value_heads=2, scale=0.3, input_layout="BSH", block_size=16,
                                   softmax_lse_flag=True)


def _fia_mla_case(paged: bool, layout: str = "BSND", rope_heads: int = 1, sink: bool = False):
    """MLA: query_rope / key_rope with one latent KV head (the kernel route) or rope_heads KV heads (rope parts
    appended to the heads)."""
    g = torch.Generator().manual_seed(5)
    N, D, Dr, S = 4, 32, 8, 20
    n2 = rope_heads
    if layout == "TND":
        q, qr = torch.randn(5, N, D, generator=g), torch.randn(5, N, Dr, generator=g)
        lens = dict(actual_seq_lengths=torch.tensor([3, 5]))
    else:
        q, qr = torch.randn(2, 2, N, D, generator=g), torch.randn(2, 2, N, Dr, generator=g)
        lens = {}
    if paged:
        c, kr = torch.randn(4, 16, n2, D, generator=g), torch.randn(4, 16, n2, Dr, generator=g)
        extra = dict(block_table=torch.tensor([[3, 0], [1, 2]], dtype=torch.int32), block_size=16,
                     actual_seq_lengths_kv=torch.tensor([20, 9]))
    elif layout == "TND":
        c, kr = torch.randn(S, n2, D, generator=g), torch.randn(S, n2, Dr, generator=g)
        extra = dict(actual_seq_lengths_kv=torch.tensor([12, 20]))
    else:
        c, kr = torch.randn(2, S, n2, D, generator=g), torch.randn(2, S, n2, Dr, generator=g)
        extra = {}
    if sink:
        extra["learnable_sink"] = torch.randn(N, generator=g).requires_grad_()
    return (q, c, c), dict(query_rope=qr, key_rope=kr, num_heads=N, num_key_value_heads=n2, scale=0.2,
                           input_layout=layout, sparse_mode=3, softmax_lse_flag=True, **lens, **extra)


def _fia_sink_case(lse=True, grad=True):
    """TND with learnable_sink (differentiable: opcheck runs the backward through fused_infer_attention_score_grad)."""
    sink = torch.tensor([0.5, -1.0]).requires_grad_(grad)
    return _fia_case("TND", lens=([3, 1], [4, 2]), sparse_mode=3, learnable_sink=sink, softmax_lse_flag=lse)


def _fia_paged_decode_sink_case():
    (q, k, v), kw = _fia_paged_lse_case()
    kw.update(softmax_lse_flag=False, learnable_sink=torch.tensor([0.5, -1.0, 2.0, 0.0]).requires_grad_())
    return (q, k, v), kw


def _fia_grad_case(lse):
    (q, k, v), kw = _fia_sink_case(lse, grad=False)
    out, softmax_lse = OPS.fused_infer_attention_score(q, k, v, **kw)
    g = torch.Generator().manual_seed(3)
    grads = dict(grad_attention_out=torch.randn(out.shape, generator=g))
    if lse:
        grads["grad_softmax_lse"] = torch.randn(softmax_lse.shape, generator=g)
    return (q, k, v), dict(kw, attention_out=out, softmax_lse=softmax_lse, **grads)


OPCHECK_CASES = {
    "prompt_flash_attention": {
        "BSND_lengths": lambda: _pfa_case("BSND", lens=([5, 2], [6, 0])),
        "BNSD_BSND_causal": lambda: _pfa_case("BNSD_BSND", sparse_mode=3),
        "TND_pse_free": lambda: _pfa_case("TND", lens=([3, 1], [4, 2]), sparse_mode=2),
    },
    "fused_infer_attention_score": {
        "lse_BSH": lambda: _fia_case("BSH", softmax_lse_flag=True),
        "no_lse_lengths": lambda: _fia_case("BNSD", lens=([4, 1], [6, 3])),
        "paged_lse": _fia_paged_lse_case,
        "mla_paged_latent": lambda: _fia_mla_case(True),
        "mla_tnd_contiguous": lambda: _fia_mla_case(False, "TND"),
        "mla_rope_appended_gqa": lambda: _fia_mla_case(False, "BSND", rope_heads=2),
        "sink_tnd_lse": _fia_sink_case,
        "sink_tnd_no_lse": lambda: _fia_sink_case(lse=False),
        "sink_paged_decode": _fia_paged_decode_sink_case,
        "sink_mla": lambda: _fia_mla_case(True, "TND", sink=True),
    },
    "fused_infer_attention_score_grad": {
        "lse": lambda: _fia_grad_case(True),
        "recomputed_lse": lambda: _fia_grad_case(False),
    },
    "attention_update": {
        "fp32": lambda: (_update_case(), {}),
        "bf16_out": lambda: (_update_case(dtype=torch.bfloat16, grad=False), {}),
    },
    "attention_update_grad": {
        "fp32": _update_grad_case,
    },
}
