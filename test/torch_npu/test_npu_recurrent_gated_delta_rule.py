"""Ported: op-plugin test/test_custom_ops/test_npu_recurrent_gated_delta_rule.py (torch_npu.npu_recurrent_gated_delta_rule
and _functional).

Upstream case (TestRecurrentGatedDeltaRule; skipped upstream until CANN has the operator):
- test_recurrent_gated_delta_rule_1: (B, mtp, Nk, Nv, Dk, Dv) = (64, 2, 4, 8, 128, 128), bf16 q / k / v / state /
  beta (rand; q, k l2-normalised), g fp32 rand (positive: the state grows), scale 0.5, actual_seq_lengths mtp each,
  ssm_state_indices arange(T), num_accepted_tokens randint [1, mtp]. Golden: the recurrence in fp32 from the slot
  of the last accepted token, every token's state written to its slot, out and state rounded to bf16; checks the
  in-place op's out and the functional op's (out, new_state) with assertRtolEqual(prec 0.001). -> ported (plus the
  float64 tolerance rule; full tier).
Also the example call of upstream's doc page (B 2, mtp 3, g negative, scale Dk^-0.5).
"""
import pytest
import torch

from test.common.reference import check_tolerance
from test.common.tiers import full_only
from test.linear_attention.recurrent_gated_delta_rule_reference import recurrent_reference
from test.torch_npu.common import on_cpu, to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def _inputs(b, mtp, nk, nv, dk, dv, g_sign, seed):
    gen = torch.Generator().manual_seed(seed)
    T = b * mtp
    bf = torch.bfloat16
    state = torch.rand(T, nv, dv, dk, generator=gen).to(bf)
    q = torch.nn.functional.normalize(torch.rand(T, nk, dk, generator=gen).to(bf), p=2, dim=-1)
    k = torch.nn.functional.normalize(torch.rand(T, nk, dk, generator=gen).to(bf), p=2, dim=-1)
    v = torch.rand(T, nv, dv, generator=gen).to(bf)
    g = g_sign * torch.rand(T, nv, generator=gen)
    beta = torch.rand(T, nv, generator=gen).to(bf)
    kw = dict(beta=beta, actual_seq_lengths=torch.full((b,), mtp, dtype=torch.int32),
              ssm_state_indices=torch.arange(T, dtype=torch.int32),
              num_accepted_tokens=torch.randint(1, mtp + 1, (b,), generator=gen, dtype=torch.int32), g=g)
    return (q, k, v, state), kw


# upstream's case computes the references over a 128-slot bf16 cache of 128 x 128 states (about 30 s): full tier
@pytest.mark.parametrize("case", ["doc_example", *full_only("upstream_1")])
def test_recurrent_gated_delta_rule(case):
    if case == "upstream_1":
        args, kw = _inputs(64, 2, 4, 8, 128, 128, 1.0, seed=1)
        kw["scale"] = 0.5
    else:
        args, kw = _inputs(2, 3, 4, 8, 128, 128, -1.0, seed=2)
        kw["scale"] = 128 ** -0.5
    golden_out, golden_state = recurrent_reference(*args, **kw, dtype=torch.float32)
    golden_out, golden_state = golden_out.to(torch.bfloat16), golden_state.to(torch.bfloat16)
    q, k, v, state = to_device(*args)
    dev_kw = {n: to_device(t) if n in ("beta", "g") else t for n, t in kw.items()}

    out = on_cpu(torch_npu.npu_recurrent_gated_delta_rule(q, k, v, state.clone(), **dev_kw))
    assert_rtol_equal(golden_out, out, 0.001)
    out_f, new_state = on_cpu(*torch_npu.npu_recurrent_gated_delta_rule_functional(q, k, v, state, **dev_kw))
    assert_rtol_equal(golden_out, out_f, 0.001)
    assert_rtol_equal(golden_state, new_state, 0.001)
    assert torch.equal(on_cpu(state), args[3])

    ref_out, ref_state = recurrent_reference(*args, **kw)
    same_out, same_state = recurrent_reference(*args, **kw, dtype=torch.bfloat16)
    check_tolerance("out", out_f, ref_out, same_out)
    check_tolerance("new_state", new_state, ref_state, same_state)
