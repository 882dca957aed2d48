"""opcheck cases of recurrent_gated_delta_rule (+ _functional) and rms_norm_gated (+ _grad)."""
import torch

from test.linear_attention.test_recurrent_gated_delta_rule import make_inputs


def _recurrent(dtype=torch.float32, **variant):
    def make():
        (q, k, v, state), kw = make_inputs(dtype, **variant)
        return (q, k, v, state), kw
    return make


def _norm(dtype=torch.float32, gate=True, weight_dtype=None):
    def make():
        x = torch.randn(3, 2, 16).to(dtype)
        w = torch.rand(16).to(weight_dtype or dtype)
        z = torch.randn(3, 2, 16).to(dtype) if gate else None
        return (x, w, z), {"epsilon": 1e-6}
    return make


def _norm_grad(dtype=torch.float32, gate=True):
    def make():
        (x, w, z), kw = _norm(dtype, gate)()
        y, rstd = torch.ops.npu_fa.rms_norm_gated(x, w, z, **kw)
        return (torch.randn_like(y), x, w, rstd, z), {}
    return make


OPCHECK_CASES = {
    "recurrent_gated_delta_rule": {
        "spec_decode": _recurrent(lens=(3, 1, 2), accepted=(2, 1, 1)),
        "kda_bf16": _recurrent(torch.bfloat16, lens=(2, 1), with_gk=True),
    },
    "recurrent_gated_delta_rule_functional": {
        "decode": _recurrent(lens=(1, 1)),
        "fp32_state_bf16": _recurrent(torch.bfloat16, lens=(2, 2), state_dtype=torch.float32),
    },
    "rms_norm_gated": {
        "gated": _norm(),
        "no_gate_bf16_fp32_weight": _norm(torch.bfloat16, gate=False, weight_dtype=torch.float32),
    },
    "rms_norm_gated_grad": {
        "gated": _norm_grad(),
        "no_gate": _norm_grad(gate=False),
    },
}
