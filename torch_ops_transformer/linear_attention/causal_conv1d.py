"""The causal depthwise conv1d of Gated DeltaNet / Mamba layers with torch_npu's Python signatures, on top of
`torch.ops.npu_fa`.

- `npu_fused_causal_conv1d(x, weight, conv_states, *, ...)` — the serving op: variable-length prefill, decode and
  speculative decode over a conv-state cache updated in place (optionally with prefix caching), + residual;
- `npu_fused_causal_conv1d_v2(...)` — the same, the result written into x;
- `npu_masked_causal_conv1d(input, weight, *, mask=None)` — the training op over [S, B, H] with an output mask,
  differentiable; `npu_masked_causal_conv1d_backward` its gradients.
"""
from typing import Optional

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa

# upstream's optional integers and strings: None means the default
_INT_DEFAULTS = {"pad_slot_id": -1, "run_mode": 0, "residual_connection": 0, "max_query_len": -1, "block_size": 128}


def _fused_args(op, x, weight, conv_states, tensors, ints, activation, conv_mode):
    for name, t in (("x", x), ("weight", weight), ("conv_states", conv_states)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    for name, t in tensors.items():
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor or None; got {type(t).__name__}")
    values = {}
    for name, v in ints.items():
        if v is None:
            v = _INT_DEFAULTS[name]
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{op}: argument '{name}' must be an int or None; got {type(v).__name__}")
        values[name] = v
    for name, s in (("activation", activation), ("conv_mode", conv_mode)):
        if s is not None and not isinstance(s, str):
            raise TypeError(f"{op}: argument '{name}' must be a str or None; got {type(s).__name__}")
    values["activation"] = "None" if activation is None else activation
    values["conv_mode"] = "default" if conv_mode is None else conv_mode
    return dict(tensors, **values)


@_args.torch_npu_api
def npu_fused_causal_conv1d(x: Tensor, weight: Tensor, conv_states: Tensor, *,
                            query_start_loc: Optional[Tensor] = None, cache_indices: Optional[Tensor] = None,
                            initial_state_mode: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                            num_accepted_tokens: Optional[Tensor] = None, activation: Optional[str] = "None",
                            pad_slot_id: Optional[int] = -1, run_mode: Optional[int] = 0,
                            residual_connection: Optional[int] = 0, max_query_len: Optional[int] = -1,
                            num_computed_tokens: Optional[Tensor] = None,
                            block_idx_first_scheduled_token: Optional[Tensor] = None,
                            block_idx_last_scheduled_token: Optional[Tensor] = None,
                            initial_state_idx: Optional[Tensor] = None, block_size: Optional[int] = 128,
                            conv_mode: Optional[str] = "default") -> Tensor:
    """torch_npu.npu_fused_causal_conv1d: y = causal depthwise conv1d of each sequence of x ([T, dim] cut by
    query_start_loc, or [batch, L, dim]) with weight [K, dim], each sequence preceded by its cached rows of
    conv_states [slots, state_len, dim] (line cache_indices[b], or b), whose line is then updated in place with the
    sequence's last state_len padded rows. num_accepted_tokens (speculative decoding) picks the cached rows that
    precede the sequence; num_computed_tokens[b] == 0 (or initial_state_mode[b] == 0) starts from zeros;
    residual_connection=1 adds x; conv_mode="pangu" zeroes the first K-1-num_computed_tokens outputs. A 2-D
    cache_indices with block_idx_first/last_scheduled_token, initial_state_idx and block_size is prefix caching.
    Sequences whose line is pad_slot_id are skipped (zeros). bias and activation="silu" are applied to the conv
    (upstream's kernel documents them as without effect; the defaults compute exactly its result). run_mode has no
    effect, as upstream. Not differentiable. docs/linear_attention.md has the formulas."""
    op = "npu_fused_causal_conv1d"
    a = _fused_args(op, x, weight, conv_states,
                    dict(query_start_loc=query_start_loc, cache_indices=cache_indices,
                         initial_state_mode=initial_state_mode, bias=bias, num_accepted_tokens=num_accepted_tokens,
                         num_computed_tokens=num_computed_tokens,
                         block_idx_first_scheduled_token=block_idx_first_scheduled_token,
                         block_idx_last_scheduled_token=block_idx_last_scheduled_token,
                         initial_state_idx=initial_state_idx),
                    dict(pad_slot_id=pad_slot_id, run_mode=run_mode, residual_connection=residual_connection,
                         max_query_len=max_query_len, block_size=block_size), activation, conv_mode)
    return _OPS.fused_causal_conv1d(x, weight, conv_states, **a)


@_args.torch_npu_api
def npu_fused_causal_conv1d_v2(x: Tensor, weight: Tensor, conv_states: Tensor, *,
                               query_start_loc: Optional[Tensor] = None, cache_indices: Optional[Tensor] = None,
                               initial_state_mode: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                               num_accepted_tokens: Optional[Tensor] = None, activation: Optional[str] = "None",
                               pad_slot_id: Optional[int] = -1, run_mode: Optional[int] = 0,
                               residual_connection: Optional[int] = 0, max_query_len: Optional[int] = -1,
                               num_computed_tokens: Optional[Tensor] = None,
                               block_idx_first_scheduled_token: Optional[Tensor] = None,
                               block_idx_last_scheduled_token: Optional[Tensor] = None,
                               initial_state_idx: Optional[Tensor] = None, block_size: Optional[int] = 128,
                               conv_mode: Optional[str] = "default") -> None:
    """torch_npu.npu_fused_causal_conv1d_v2: npu_fused_causal_conv1d with y written into x in place (rows of skipped
    sequences keep their values); conv_states is updated in place as well. Returns None."""
    op = "npu_fused_causal_conv1d_v2"
    a = _fused_args(op, x, weight, conv_states,
                    dict(query_start_loc=query_start_loc, cache_indices=cache_indices,
                         initial_state_mode=initial_state_mode, bias=bias, num_accepted_tokens=num_accepted_tokens,
                         num_computed_tokens=num_computed_tokens,
                         block_idx_first_scheduled_token=block_idx_first_scheduled_token,
                         block_idx_last_scheduled_token=block_idx_last_scheduled_token,
                         initial_state_idx=initial_state_idx),
                    dict(pad_slot_id=pad_slot_id, run_mode=run_mode, residual_connection=residual_connection,
                         max_query_len=max_query_len, block_size=block_size), activation, conv_mode)
    _OPS.fused_causal_conv1d_v2(x, weight, conv_states, **a)


def _masked_args(op, named, mask):
    for name, t in named:
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    if mask is not None and not isinstance(mask, Tensor):
        raise TypeError(f"{op}: argument 'mask' must be a Tensor or None; got {type(mask).__name__}")


@_args.torch_npu_api
def npu_masked_causal_conv1d(input: Tensor, weight: Tensor, *, mask: Optional[Tensor] = None) -> Tensor:
    """torch_npu.npu_masked_causal_conv1d: out[s, b, h] = sum_k weight[k, h] * input[s-(W-1-k), b, h] over input
    [S, B, H] (zeros before the start), weight [W, H] (W = 3 upstream; any W >= 1 here), set to 0 where mask [B, S]
    (bool) is False. Differentiable in input and weight."""
    _masked_args("npu_masked_causal_conv1d", (("input", input), ("weight", weight)), mask)
    return _OPS.masked_causal_conv1d(input, weight, mask)


@_args.torch_npu_api
def npu_masked_causal_conv1d_backward(grad_output: Tensor, input: Tensor, weight: Tensor, *,
                                      mask: Optional[Tensor] = None):
    """torch_npu.npu_masked_causal_conv1d_backward: (grad_input, grad_weight) of npu_masked_causal_conv1d for
    grad_output [S, B, H], in input's dtype."""
    _masked_args("npu_masked_causal_conv1d_backward",
                 (("grad_output", grad_output), ("input", input), ("weight", weight)), mask)
    return _OPS.masked_causal_conv1d_backward(grad_output, input, weight, mask=mask)
