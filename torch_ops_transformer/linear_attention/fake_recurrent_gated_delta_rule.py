"""Fake (meta) kernels of recurrent_gated_delta_rule (+ _functional) and rms_norm_gated (+ _grad): contiguous
outputs like the C++ kernels, plus the shape checks that need no data (a bad call fails at trace time, as in eager
mode). The checks that read the index tensors (lengths, slots) run in the kernels only."""
import torch


def _recurrent_shapes(op, a):
    q, v, s = a.query, a.value, a.state
    torch._check(q.dim() == 3, lambda: f"{op}: argument 'query' must be 3-D [T, Nk, Dk]; got shape {tuple(q.shape)}")
    torch._check(v.dim() == 3 and v.shape[0] == q.shape[0],
                 lambda: f"{op}: argument 'value' must be 3-D [T, Nv, Dv] with T = query.size(0); got shape "
                         f"{tuple(v.shape)}")
    torch._check(s.dim() == 4 and s.shape[1] == v.shape[1] and s.shape[2] == v.shape[2] and s.shape[3] == q.shape[2],
                 lambda: f"{op}: argument 'state' must be 4-D [slots, Nv, Dv, Dk]; got shape {tuple(s.shape)}")
    return q.new_empty((q.shape[0], v.shape[1], v.shape[2]))


def recurrent_gated_delta_rule(a):
    return _recurrent_shapes("recurrent_gated_delta_rule", a)


def recurrent_gated_delta_rule_functional(a):
    out = _recurrent_shapes("recurrent_gated_delta_rule_functional", a)
    return out, a.state.new_empty(a.state.shape)


def _rstd(x):
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return x.new_empty(tuple(x.shape[:-1]) + (1,), dtype=acc)


def rms_norm_gated(a):
    x = a.x
    torch._check(x.dim() >= 1, lambda: "rms_norm_gated: argument 'x' must have at least one dimension")
    torch._check(a.weight.dim() == 1 and a.weight.shape[0] == x.shape[-1],
                 lambda: f"rms_norm_gated: argument 'weight' must be 1-D [n] with n = x.size(-1); got shape "
                         f"{tuple(a.weight.shape)}")
    return x.new_empty(x.shape), _rstd(x)


def rms_norm_gated_grad(a):
    x = a.x
    dgate = a.gate.new_empty(x.shape) if a.gate is not None else x.new_empty((0,))
    return x.new_empty(x.shape), a.weight.new_empty(a.weight.shape), dgate
