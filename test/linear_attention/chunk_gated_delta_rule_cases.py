"""opcheck cases of chunk_gated_delta_rule and its backward (collected by test/ops/test_opcheck.py)."""
import torch

from test.linear_attention.chunk_gated_delta_rule_reference import make_inputs


def _args(inp):
    return (inp["query"], inp["key"], inp["value"], inp["beta"], inp["initial_state"], inp["actual_seq_lengths"],
            inp["scale"], inp["g"])


def _forward(dtype=torch.float32, lens=(5, 70), **kw):
    def make():
        inp = make_inputs(list(lens), Nk=1, Nv=2, Dk=8, Dv=4, dtype=dtype, **kw)
        for name in ("query", "key", "value", "beta", "initial_state", "g"):
            if inp[name] is not None and inp[name].is_floating_point():
                inp[name].requires_grad_(True)
        return _args(inp), {}
    return make


def _backward(dtype=torch.float32):
    def make():
        inp = make_inputs([3, 66], Nk=1, Nv=2, Dk=8, Dv=4, dtype=dtype)
        T = inp["query"].shape[0]
        return (torch.randn(T, 2, 4).to(dtype), torch.randn(2, 2, 4, 8), *_args(inp)), {}
    return make


OPCHECK_CASES = {
    "chunk_gated_delta_rule": {
        "varlen_fp32": _forward(),
        "bf16": _forward(torch.bfloat16, lens=(9,)),
        "no_state_no_g": _forward(lens=(4, 3), state=False, with_g=False),
    },
    "chunk_gated_delta_rule_backward": {
        "fp32": _backward(),
    },
}
