"""Fake (meta) kernels of chunk_gated_delta_rule and its backward: the outputs' shapes and dtypes as the C++ kernels
make them, plus the shape checks that need no data (so a bad call fails at trace time, as it does in eager mode)."""
import torch


def _acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(op, a):
    T, Nk, Dk = a.query.shape if a.query.dim() == 3 else (None, None, None)
    torch._check(a.query.dim() == 3,
                 lambda: f"{op}: argument 'query' must be 3-D [T, Nk, Dk] (TND); got shape {tuple(a.query.shape)}")
    torch._check(a.key.shape == a.query.shape,
                 lambda: f"{op}: argument 'key' must have query's shape {tuple(a.query.shape)}; got "
                         f"{tuple(a.key.shape)}")
    torch._check(a.value.dim() == 3 and a.value.shape[0] == T,
                 lambda: f"{op}: argument 'value' must be 3-D [T, Nv, Dv] with query's T = {T}; got shape "
                         f"{tuple(a.value.shape)}")
    Nv = a.value.shape[1]
    torch._check(Nk > 0 and Nv > 0 and Nv % Nk == 0,
                 lambda: f"{op}: the value heads (value.size(1) = {Nv}) must be a positive multiple of the key heads "
                         f"(query.size(1) = {Nk})")
    B = 1 if a.actual_seq_lengths is None else a.actual_seq_lengths.shape[0]
    return B, Nv, a.value.shape[2], Dk


def chunk_gated_delta_rule(a):
    B, Nv, Dv, Dk = _check("chunk_gated_delta_rule", a)
    state_dtype = a.initial_state.dtype if a.initial_state is not None else _acc(a.query.dtype)
    out = a.value.new_empty(a.value.shape)
    return out, a.value.new_empty((B, Nv, Dv, Dk), dtype=state_dtype)


def chunk_gated_delta_rule_backward(a):
    _check("chunk_gated_delta_rule_backward", a)

    def like(t):
        return torch.empty_like(t, memory_format=torch.contiguous_format) if t is not None else a.value.new_empty((0,))

    return (like(a.query), like(a.key), like(a.value), like(a.beta), like(a.initial_state), like(a.g))
