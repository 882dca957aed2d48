"""An independent plain-PyTorch reference of chunk_gated_delta_rule: the gated delta rule token by token.

Semantics (CANN ChunkGatedDeltaRule, torch_npu npu_chunk_gated_delta_rule), re-derived from the operator's formula:
per sequence b (actual_seq_lengths[b] consecutive tokens of the TND inputs) and value head h, with key head
h // (Nv // Nk) and the state S in R^{Dv x Dk} starting at initial_state[b, h] (zeros when absent):

    S_t = exp(g_t) S_{t-1} + beta_t (v_t - exp(g_t) S_{t-1} k_t) k_t^T
    o_t = S_t (scale q_t)

q and k are used as given (no normalisation inside); beta absent = 1, g absent = 0, scale absent = 1. Returns
(out [T, Nv, Dv], final_state [B, Nv, Dv, Dk]) computed in `dtype` (float64: the "ref64"; the inputs' own dtype:
what a straightforward PyTorch implementation in that dtype gets). Differentiable through autograd.
"""
from typing import Optional, Sequence

import torch
from torch import Tensor


def chunk_gated_delta_rule_ref(query: Tensor, key: Tensor, value: Tensor, beta: Optional[Tensor] = None,
                               initial_state: Optional[Tensor] = None, actual_seq_lengths: Sequence[int] = None,
                               scale: Optional[float] = None, g: Optional[Tensor] = None,
                               dtype: torch.dtype = torch.float64):
    T, Nk, Dk = query.shape
    Nv, Dv = value.shape[1], value.shape[2]
    lens = [T] if actual_seq_lengths is None else [int(x) for x in actual_seq_lengths]
    group = Nv // Nk
    q = query.to(dtype).repeat_interleave(group, dim=1) * (1.0 if scale is None else scale)
    k = key.to(dtype).repeat_interleave(group, dim=1)
    v = value.to(dtype)
    b_ = torch.ones(T, Nv, dtype=dtype) if beta is None else beta.to(dtype)
    alpha = torch.ones(T, Nv, dtype=dtype) if g is None else g.to(dtype).exp()
    outs, finals = [], []
    start = 0
    for b, n in enumerate(lens):
        S = (torch.zeros(Nv, Dv, Dk, dtype=dtype) if initial_state is None else initial_state[b].to(dtype))
        for t in range(start, start + n):
            S = alpha[t, :, None, None] * S
            pred = (S @ k[t, :, :, None])[..., 0]                       # [Nv, Dv]: the decayed state's prediction
            S = S + b_[t, :, None, None] * (v[t] - pred)[:, :, None] * k[t, :, None, :]
            outs.append((S @ q[t, :, :, None])[..., 0])
        finals.append(S)
        start += n
    out = torch.stack(outs) if outs else v.new_zeros(0, Nv, Dv)
    return out, torch.stack(finals)


def make_inputs(lens, Nk=2, Nv=4, Dk=16, Dv=8, dtype=torch.float32, seed=0, state=True, with_g=True,
                state_dtype=None):
    """Inputs in upstream's value ranges: q, k L2-normalised rows, beta in (0, 1), g in [-1, 0]."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    q = torch.nn.functional.normalize(torch.randn(T, Nk, Dk, generator=gen, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(T, Nk, Dk, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(T, Nv, Dv, generator=gen, dtype=torch.float64)
    beta = torch.rand(T, Nv, generator=gen, dtype=torch.float64)
    g = -torch.rand(T, Nv, generator=gen, dtype=torch.float64) if with_g else None
    s0 = torch.randn(len(lens), Nv, Dv, Dk, generator=gen, dtype=torch.float64) * 0.5 if state else None
    cast = lambda t, dt=dtype: None if t is None else t.to(dt)
    return dict(query=cast(q), key=cast(k), value=cast(v), beta=cast(beta),
                initial_state=cast(s0, state_dtype or (torch.float64 if dtype == torch.float64 else torch.float32)),
                actual_seq_lengths=torch.tensor(lens, dtype=torch.int32), scale=Dk ** -0.5,
                g=cast(g, torch.float64 if dtype == torch.float64 else torch.float32))
