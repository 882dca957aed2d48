"""The recurrent gated delta rule (Gated DeltaNet decode and speculative steps, Kimi Delta Attention) with torch_npu's
Python signatures, and Qwen3-Next's gated RMSNorm, on top of `torch.ops.npu_fa`.

- `npu_recurrent_gated_delta_rule(query, key, value, state, *, ...)` — token-by-token steps over a state cache
  [slots, Nv, Dv, Dk], updated in place; returns the attention output [T, Nv, Dv];
- `npu_recurrent_gated_delta_rule_functional(...)` — the same on a copy: returns (out, new_state);
- `rms_norm_gated(x, weight, gate=None, epsilon=1e-6)` and the module `RMSNormGated` — transformers'
  Qwen3NextRMSNormGated (norm before gate), differentiable.

The recurrent ops are inference only (torch_npu documents them so): a call that autograd would record raises.
"""
from typing import Optional

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa


def _check_tensors(op: str, **tensors) -> None:
    for name, t in tensors.items():
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor or None; got {type(t).__name__}")


def _refuse_grad(op: str, **tensors) -> None:
    """The ops have no backward (upstream's are inference only): refuse rather than return a result without one."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise RuntimeError(f"{op}: argument '{name}' requires grad, but {op} is inference only (no gradient); "
                               f"pass {name}.detach() or call it under torch.no_grad()")


def _host(op: str, name: str, value, device):
    return _args.host_int_tensor(op, name, value, device)


def _prepare(op, query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices, num_accepted_tokens,
             g, gk):
    _check_tensors(op, query=query, key=key, value=value, state=state, beta=beta, g=g, gk=gk)
    for name, t in (("query", query), ("key", key), ("value", value), ("state", state)):
        if t is None:
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got None")
    _refuse_grad(op, query=query, key=key, value=value, state=state, beta=beta, g=g, gk=gk)
    if scale is not None and not isinstance(scale, (int, float)):
        raise TypeError(f"{op}: argument 'scale' must be a float or None; got {type(scale).__name__}")
    dev = query.device
    return dict(beta=beta, scale=None if scale is None else float(scale),
                actual_seq_lengths=_host(op, "actual_seq_lengths", actual_seq_lengths, dev),
                ssm_state_indices=_host(op, "ssm_state_indices", ssm_state_indices, dev),
                num_accepted_tokens=_host(op, "num_accepted_tokens", num_accepted_tokens, dev), g=g, gk=gk)


@_args.torch_npu_api
def npu_recurrent_gated_delta_rule(query: Tensor, key: Tensor, value: Tensor, state: Tensor, *,
                                   beta: Optional[Tensor] = None, scale: Optional[float] = None,
                                   actual_seq_lengths=None, ssm_state_indices=None, num_accepted_tokens=None,
                                   g: Optional[Tensor] = None, gk: Optional[Tensor] = None) -> Tensor:
    """torch_npu.npu_recurrent_gated_delta_rule: query, key [T, Nk, Dk], value [T, Nv, Dv], state [slots, Nv, Dv,
    Dk] (contiguous, query's dtype or float32; updated in place). The T tokens are sequences of actual_seq_lengths
    (int [B], each >= 1; None: one token each); token t reads and writes slot ssm_state_indices[t] (distinct;
    None: t); sequence i starts from the slot of its token num_accepted_tokens[i] - 1 (None: its first). Per token
    S = exp(g) S diag(exp(gk)); S += beta (v - S k) kᵀ; o = scale S q (scale None: Dk^-0.5; g, gk, beta None: 0,
    0, 1). Lengths and indices may be lists or int tensors. Returns o [T, Nv, Dv] in query's dtype."""
    op = "npu_recurrent_gated_delta_rule"
    kw = _prepare(op, query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
                  num_accepted_tokens, g, gk)
    return _OPS.recurrent_gated_delta_rule(query, key, value, state, **kw)


@_args.torch_npu_api
def npu_recurrent_gated_delta_rule_functional(query: Tensor, key: Tensor, value: Tensor, state: Tensor, *,
                                              beta: Optional[Tensor] = None, scale: Optional[float] = None,
                                              actual_seq_lengths=None, ssm_state_indices=None,
                                              num_accepted_tokens=None, g: Optional[Tensor] = None,
                                              gk: Optional[Tensor] = None):
    """torch_npu.npu_recurrent_gated_delta_rule_functional: npu_recurrent_gated_delta_rule on a copy of state;
    returns (out, new_state), state unchanged."""
    op = "npu_recurrent_gated_delta_rule_functional"
    kw = _prepare(op, query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
                  num_accepted_tokens, g, gk)
    return _OPS.recurrent_gated_delta_rule_functional(query, key, value, state, **kw)


def rms_norm_gated(x: Tensor, weight: Tensor, gate: Optional[Tensor] = None, epsilon: float = 1e-6) -> Tensor:
    """Qwen3-Next's gated RMSNorm (transformers' Qwen3NextRMSNormGated): weight * rmsnorm(x) * silu(gate) over the
    last dimension, norm before gate, with the model's roundings (the normalised row rounded to x's dtype before the
    weight; the gate applied in fp32). Differentiable in x, weight and gate. Returns y of x's shape and dtype."""
    op = "rms_norm_gated"
    _check_tensors(op, x=x, weight=weight, gate=gate)
    if not isinstance(epsilon, (int, float)):
        raise TypeError(f"{op}: argument 'epsilon' must be a float; got {type(epsilon).__name__}")
    return _OPS.rms_norm_gated(x, weight, gate, float(epsilon))[0]


class RMSNormGated(torch.nn.Module):
    """Drop-in for transformers' Qwen3NextRMSNormGated (same parameter name `weight`, `variance_epsilon`, and
    forward(hidden_states, gate)) on rms_norm_gated."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, dtype=None, device=None, **kwargs) -> None:
        super().__init__()  # (other keyword arguments are ignored, as transformers' module ignores them)
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype, device=device))
        self.variance_epsilon = eps

    def forward(self, hidden_states: Tensor, gate: Optional[Tensor] = None) -> Tensor:
        return rms_norm_gated(hidden_states, self.weight, gate, self.variance_epsilon)
