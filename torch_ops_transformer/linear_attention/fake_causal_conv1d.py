"""Fake (meta) kernels of the causal conv1d ops: outputs like the C++ kernels, plus the shape checks that need no
data (so a bad call fails at trace time, as it does in eager mode)."""
import torch


def _check_fused(op, a):
    torch._check(a.x.dim() in (2, 3),
                 lambda: f"{op}: argument 'x' must be 2-D [tokens, dim] or 3-D [batch, seq_len, dim]; got shape "
                         f"{tuple(a.x.shape)}")
    dim = a.x.shape[-1]
    torch._check(a.weight.dim() == 2 and a.weight.shape[1] == dim,
                 lambda: f"{op}: argument 'weight' must be 2-D [K, dim] with dim = {dim}; got shape "
                         f"{tuple(a.weight.shape)}")
    torch._check(a.conv_states.dim() == 3 and a.conv_states.shape[2] == dim,
                 lambda: f"{op}: argument 'conv_states' must be 3-D [slots, state_len, dim] with dim = {dim}; got "
                         f"shape {tuple(a.conv_states.shape)}")
    torch._check(a.x.dim() == 3 or a.query_start_loc is not None,
                 lambda: f"{op}: argument 'query_start_loc' is required when x is 2-D [tokens, dim]")


def fused_causal_conv1d(a):
    _check_fused("fused_causal_conv1d", a)
    return a.x.new_empty(a.x.shape)


def fused_causal_conv1d_v2(a):
    _check_fused("fused_causal_conv1d_v2", a)
    return None


def _check_masked(op, a):
    torch._check(a.input.dim() == 3,
                 lambda: f"{op}: argument 'input' must be 3-D [S, B, H]; got shape {tuple(a.input.shape)}")
    torch._check(a.weight.dim() == 2 and a.weight.shape[1] == a.input.shape[2],
                 lambda: f"{op}: argument 'weight' must be 2-D [W, H]; got shape {tuple(a.weight.shape)}")


def masked_causal_conv1d(a):
    _check_masked("masked_causal_conv1d", a)
    return a.input.new_empty(a.input.shape)


def masked_causal_conv1d_backward(a):
    _check_masked("masked_causal_conv1d_backward", a)
    return a.input.new_empty(a.input.shape), a.weight.new_empty(a.weight.shape)
