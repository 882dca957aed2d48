"""Fused MoE expert FFN for inference (docs/moe.md, "Fused MoE FFN").

    out = moe_ffn(x, w13, w2, topk_weights, topk_ids)                 # w13 [E, 2F, H], w2 [E, H, F] (vLLM / HF)
    packed = MoeFfnWeights(w13, w2)                                   # pack once (brgemm layout), reuse
    out = packed(x, topk_weights, topk_ids)

One op call does the routing (sort of the (token, choice) pairs by expert), the gate/up product with SwiGLU (or a
plain activation) in its epilogue, the down product and the weighted combine: out[t] = sum_j topk_weights[t, j] *
FFN_{topk_ids[t, j]}(x[t]). Inference only (no autograd): MOELayer and the MoE blocks call it when no gradient is
needed and keep their differentiable path otherwise.
"""
from typing import Optional

import torch

_OPS = torch.ops.npu_fa
LAYOUTS = ("nk", "kn")
ACTIVATIONS = ("swiglu", "silu", "gelu_tanh", "fast_gelu", "relu", "none")


def moe_ffn(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
            topk_ids: torch.Tensor, bias13: Optional[torch.Tensor] = None, bias2: Optional[torch.Tensor] = None,
            activation: str = "swiglu", weight_layout: str = "nk") -> torch.Tensor:
    """sum_j topk_weights[t, j] * (act(x[t]·W13_e + bias13_e)·W2_e + bias2_e), e = topk_ids[t, j].

    x [T, H] (float32 / bfloat16 on the brgemm kernels; float16 / float64 work, slower); weight_layout "nk":
    w13 [E, N, H], w2 [E, H, F] (transformers / vLLM: out x in); "kn": w13 [E, H, N], w2 [E, F, H]
    (grouped_matmul); "packed": both from moe_ffn_prepack. activation "swiglu" (N = 2F: gate rows then up rows,
    silu(gate) * up) or a plain one (N = F). topk_weights [T, k] float, topk_ids [T, k] int32/int64 in [0, E);
    optional biases [E, N] and [E, H]. Returns [T, H] in x's dtype."""
    return _OPS.moe_ffn(x, w13, w2, topk_weights, topk_ids, bias13, bias2, activation, weight_layout)


def moe_ffn_prepack(weight: torch.Tensor, weight_layout: str = "nk", gated: bool = False) -> torch.Tensor:
    """The packed brgemm layout of one expert weight ([E, N, K] "nk" or [E, K, N] "kn") for moe_ffn(...,
    weight_layout="packed"): gated=True for a SwiGLU w13, False for w2 and plain activations."""
    return _OPS.moe_ffn_prepack(weight, weight_layout, gated)


class MoeFfnWeights:
    """Packed copies of (w13, w2) for moe_ffn, repacked when the source tensors change.

    The sources are remembered by identity, data pointer and version counter (an in-place update such as an
    optimizer step bumps the version), so a cached instance stays correct when the parameters are trained or
    reloaded between inference calls; `get(w13, w2)` returns the packed pair, packing only when needed."""

    def __init__(self, activation: str = "swiglu", weight_layout: str = "nk"):
        if activation not in ACTIVATIONS:
            raise ValueError(f"MoeFfnWeights: argument 'activation' must be one of {ACTIVATIONS}; got {activation!r}")
        if weight_layout not in LAYOUTS:
            raise ValueError(f"MoeFfnWeights: argument 'weight_layout' must be one of {LAYOUTS}; got "
                             f"{weight_layout!r}")
        self.activation, self.weight_layout = activation, weight_layout
        self._key = None
        self._packed = None

    @staticmethod
    def _state(t: torch.Tensor):
        return (id(t), t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), t.dtype)

    def get(self, w13: torch.Tensor, w2: torch.Tensor):
        key = (self._state(w13), self._state(w2))
        if key != self._key:
            with torch.no_grad():
                self._packed = (moe_ffn_prepack(w13.detach(), self.weight_layout, self.activation == "swiglu"),
                                moe_ffn_prepack(w2.detach(), self.weight_layout, False))
            self._key = key
        return self._packed

    def __call__(self, x, w13, w2, topk_weights, topk_ids, bias13=None, bias2=None) -> torch.Tensor:
        if torch.compiler.is_compiling():  # no cache inside a graph: the op packs the plain weights itself
            return moe_ffn(x, w13, w2, topk_weights, topk_ids, bias13, bias2, self.activation, self.weight_layout)
        p13, p2 = self.get(w13, w2)
        return moe_ffn(x, p13, p2, topk_weights, topk_ids, bias13, bias2, self.activation, "packed")


def needs_grad(*tensors) -> bool:
    """Whether autograd would record through these tensors now (the fused op is inference-only)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
