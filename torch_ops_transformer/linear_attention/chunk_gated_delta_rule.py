"""The chunked gated delta rule with torch_npu's Python signature, on top of `torch.ops.npu_fa`.

- `npu_chunk_gated_delta_rule(query, key, value, *, beta, initial_state, actual_seq_lengths, scale, g)` — the
  Gated DeltaNet recurrence over whole TND sequences (prefill and training): returns (out, final_state).
"""
from typing import Optional

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa


@_args.torch_npu_api
def npu_chunk_gated_delta_rule(query: Tensor, key: Tensor, value: Tensor, *, beta: Optional[Tensor] = None,
                               initial_state: Optional[Tensor] = None, actual_seq_lengths=None,
                               scale: Optional[float] = None, g: Optional[Tensor] = None):
    """torch_npu.npu_chunk_gated_delta_rule: per sequence (actual_seq_lengths [B], int32/int64 tensor or list,
    summing to T) and value head, S_t = e^{g_t} S_{t-1} + beta_t (v_t - e^{g_t} S_{t-1} k_t) k_tᵀ and
    o_t = S_t (scale q_t), S in R^{Dv x Dk} starting at initial_state. query, key [T, Nk, Dk], value [T, Nv, Dv]
    (Nv a multiple of Nk), beta and g [T, Nv] (g: log decay), initial_state [B, Nv, Dv, Dk]. q and k are used as
    given (upstream expects L2-normalised rows). Absent: beta 1, g 0, scale 1.0, initial_state zeros,
    actual_seq_lengths one sequence. Returns (out [T, Nv, Dv] in value's dtype, final_state [B, Nv, Dv, Dk] in
    initial_state's dtype). Differentiable (also in beta, g and initial_state)."""
    op = "npu_chunk_gated_delta_rule"
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    for name, t in (("beta", beta), ("initial_state", initial_state), ("g", g)):
        if t is not None and not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor or None; got {type(t).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"{op}: argument 'scale' must be a float or None; got {type(scale).__name__}")
    lengths = _args.host_int_tensor(op, "actual_seq_lengths", actual_seq_lengths, query.device)
    return _OPS.chunk_gated_delta_rule(query, key, value, beta, initial_state, lengths,
                                       None if scale is None else float(scale), g)
