"""Plain PyTorch references of recurrent_gated_delta_rule and rms_norm_gated, written from the formulas (token by
token, head by head, no vectorisation across tokens), run in any dtype: float64 for the reference the tolerance
rule measures against, the inputs' dtype for "torch in the same dtype"."""
import torch


def _ints(value, default):
    if value is None:
        return list(default)
    return [int(x) for x in (value.tolist() if isinstance(value, torch.Tensor) else value)]


def recurrent_reference(query, key, value, state, *, beta=None, scale=None, actual_seq_lengths=None,
                        ssm_state_indices=None, num_accepted_tokens=None, g=None, gk=None, dtype=torch.float64):
    """(out [T, Nv, Dv], new_state) of the gated delta rule computed in `dtype`: per sequence and value head, S
    starts from the slot of the sequence's token num_accepted_tokens - 1, and per token S <- exp(g) S diag(exp(gk)),
    S <- S + beta (v - S k) kᵀ, o = scale S q; S is stored in the token's slot. state is [slots, Nv, Dv, Dk]."""
    T, Nk, Dk = query.shape
    Nv, Dv = value.shape[1:]
    q, k, v = (x.to(dtype) for x in (query, key, value))
    states = state.to(dtype).clone()
    lens = _ints(actual_seq_lengths, [1] * T)
    slots = _ints(ssm_state_indices, range(T))
    accepted = _ints(num_accepted_tokens, [1] * len(lens))
    if scale is None:
        scale = Dk ** -0.5 if Dk > 0 else 1.0  # (Dk = 0: S q is empty, any scale gives 0)
    out = torch.zeros(T, Nv, Dv, dtype=dtype)
    start = 0
    for i, length in enumerate(lens):
        first = slots[start + accepted[i] - 1]
        for h in range(Nv):
            hk = h // (Nv // Nk)
            S = states[first, h].clone()
            for t in range(start, start + length):
                decay = torch.ones(Dk, dtype=dtype)
                if g is not None:
                    decay = decay * torch.exp(g[t, h].to(dtype))
                if gk is not None:
                    decay = decay * torch.exp(gk[t, h].to(dtype))
                b = beta[t, h].to(dtype) if beta is not None else torch.ones((), dtype=dtype)
                S = S * decay[None, :]
                S = S + b * torch.outer(v[t, h] - S @ k[t, hk], k[t, hk])
                out[t, h] = scale * (S @ q[t, hk])
                states[slots[t], h] = S
        start += length
    return out, states


def rms_norm_gated_reference(x, weight, gate=None, eps=1e-6, dtype=torch.float64):
    """weight * (x / sqrt(mean(x^2) + eps)) * silu(gate) over the last dimension, every step in `dtype`."""
    xd = x.to(dtype)
    h = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps)
    y = weight.to(dtype) * h
    if gate is not None:
        gd = gate.to(dtype)
        y = y * gd * torch.sigmoid(gd)
    return y


def unit_rows(shape, dtype, generator=None):
    """Rows of norm 1 along the last dimension (the model l2-normalises q and k before the recurrence)."""
    x = torch.randn(*shape, generator=generator, dtype=torch.float64)
    return (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)).to(dtype)

