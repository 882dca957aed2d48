"""recurrent_gated_delta_rule (+ _functional) on the simulated npu device (the Ascend C recurrent gated delta rule
kernel), run by test_linear_attention.py through runner_worker (sim enabled; tensors `.to("npu")`).

Each case builds a call with the CPU tests' input builder (unit-norm q and k, g < 0, beta in (0, 1), the written
slots a permutation of a larger cache), runs it on npu with the CPU fallback forbidden (TOT_NPU_SIM_NO_FALLBACK=1:
the kernel ran) and on CPU, and checks the npu results against the float64 reference by the project rule and
against the CPU op (both accumulate in fp32, in another order: a few units of the result's dtype). The default tier
covers ragged lengths, num_accepted_tokens, gk, GQA grouping, head dims not multiples of 16, the three dtypes and
fp32 caches next to 16-bit tokens; the full tier a Qwen3-Next-sized decode and speculative step.
"""
import torch

import torch_ops_transformer as tot
from test.linear_attention.test_recurrent_gated_delta_rule import check_against_reference, make_inputs
from test.npu.runner import assert_same_error, full_case, no_fallback

OPS = torch.ops.npu_fa
HOST = ("actual_seq_lengths", "ssm_state_indices", "num_accepted_tokens")


def _npu(kw, indices_on_npu=False):
    return {n: (v.to("npu") if torch.is_tensor(v) and (indices_on_npu or n not in HOST) else v)
            for n, v in kw.items()}


def _close_to_cpu(name, ours, cpu):
    """Both backends accumulate in fp32: equal up to a few units of the dtype at the result's magnitude."""
    eps = torch.finfo(cpu.dtype).eps
    scale = max(1.0, float(cpu.abs().max())) if cpu.numel() else 1.0
    err = float((ours.double() - cpu.double()).abs().max()) if cpu.numel() else 0.0
    limit = (64 if cpu.dtype == torch.float32 else 4) * eps * scale
    assert err <= limit, f"{name}: npu vs CPU max |diff| {err:.3g} > {limit:.3g}"


def _run(name, dtype, indices_on_npu=False, **make):
    args, kw = make_inputs(dtype, **make)
    q, k, v, state = args
    cpu_state = state.clone()
    cpu_out = tot.npu_recurrent_gated_delta_rule(q, k, v, cpu_state, **kw)
    npu_state = state.to("npu")
    with no_fallback(True):
        out = tot.npu_recurrent_gated_delta_rule(q.to("npu"), k.to("npu"), v.to("npu"), npu_state,
                                                 **_npu(kw, indices_on_npu))
    assert out.device.type == "npu" and out.dtype == dtype and npu_state.dtype == state.dtype, name
    out, new_state = out.cpu(), npu_state.cpu()
    check_against_reference(name, args, kw, out, new_state)
    _close_to_cpu(f"{name} out", out, cpu_out)
    _close_to_cpu(f"{name} state", new_state, cpu_state)
    untouched = torch.ones(state.shape[0], dtype=torch.bool)
    untouched[kw["ssm_state_indices"].long()] = False
    assert torch.equal(new_state[untouched], state[untouched]), f"{name}: a slot no token writes changed"


# ---- default tier ----

def case_fp32_decode():
    _run("fp32 decode", torch.float32, lens=(1, 1, 1, 1))


def case_bf16_ragged_multi_token():
    _run("bf16 ragged", torch.bfloat16, lens=(3, 1, 2))


def case_fp16_speculative_accepted():
    _run("fp16 accepted", torch.float16, lens=(3, 2, 4), accepted=(2, 1, 4))


def case_fp32_gk_kimi():
    _run("fp32 gk", torch.float32, lens=(2, 3), with_gk=True)


def case_bf16_mha_and_gk():
    _run("bf16 mha gk", torch.bfloat16, lens=(2, 1), Nk=3, Nv=3, with_gk=True)


def case_fp16_wide_gqa4():
    _run("fp16 wide", torch.float16, lens=(2, 1), Nk=1, Nv=4, Dk=64, Dv=40)


def case_fp32_state_cache_next_to_16_bit_tokens():
    for dtype in (torch.bfloat16, torch.float16):
        _run(f"{dtype} fp32 state", dtype, lens=(2, 3), accepted=(1, 2), state_dtype=torch.float32)


def case_index_tensors_on_the_device():
    _run("indices on npu", torch.float32, indices_on_npu=True, lens=(2, 2), accepted=(2, 1))


def case_defaults_and_no_gates():
    # no lengths, indices, gates: every token a decode step on slot t, S += (v - S k) kᵀ
    args, _ = make_inputs(torch.float32, lens=(1, 1, 1))
    q, k, v, state = args
    cpu_state = state.clone()
    cpu_out = OPS.recurrent_gated_delta_rule(q, k, v, cpu_state)
    npu_state = state.to("npu")
    with no_fallback(True):
        out = OPS.recurrent_gated_delta_rule(q.to("npu"), k.to("npu"), v.to("npu"), npu_state)
    _close_to_cpu("defaults out", out.cpu(), cpu_out)
    _close_to_cpu("defaults state", npu_state.cpu(), cpu_state)


def case_functional_leaves_state():
    args, kw = make_inputs(torch.bfloat16, lens=(2, 1), accepted=(2, 1))
    q, k, v, state = (t.to("npu") for t in args)
    before = state.clone()
    with no_fallback(True):
        out, new_state = tot.npu_recurrent_gated_delta_rule_functional(q, k, v, state, **_npu(kw))
        in_place = state.clone()
        out2 = tot.npu_recurrent_gated_delta_rule(q, k, v, in_place, **_npu(kw))
    assert torch.equal(state.cpu(), before.cpu()) and new_state.device.type == "npu"
    assert torch.equal(out.cpu(), out2.cpu()) and torch.equal(new_state.cpu(), in_place.cpu())
    check_against_reference("functional", args, kw, out.cpu(), new_state.cpu())


def case_float64_falls_back_to_cpu():
    args, kw = make_inputs(torch.float64, lens=(2, 1))
    npu_args = [t.to("npu") for t in args]
    with no_fallback(True):
        try:
            tot.npu_recurrent_gated_delta_rule(*npu_args, **_npu(kw))
            raise AssertionError("float64 ran without the fallback")
        except RuntimeError as e:
            assert "does not handle float64 inputs" in str(e), e
    with no_fallback(False):
        out = tot.npu_recurrent_gated_delta_rule(*npu_args, **_npu(kw))
    check_against_reference("float64 fallback", args, kw, out.cpu(), npu_args[3].cpu())


def case_zero_size_and_errors_match_cpu():
    args, kw = make_inputs(torch.float32, lens=(2, 1))
    q, k, v, state = args
    with no_fallback(True):  # no value dims: an empty output, nothing launched
        out = tot.npu_recurrent_gated_delta_rule(q.to("npu"), k.to("npu"), v[..., :0].to("npu"),
                                                 state[:, :, :0].contiguous().to("npu"), **_npu(kw))
    assert out.shape == (3, 4, 0) and out.device.type == "npu"
    bad = [dict(ssm_state_indices=torch.tensor([1, 1, 0])), dict(num_accepted_tokens=torch.tensor([3, 1])),
           dict(beta=torch.zeros(3, 3)), dict(gk=torch.zeros(3, 4, 18)), dict(scale=float("nan"))]

    def call(device, change):
        kw2 = dict(kw, **change)
        kw2 = _npu(kw2) if device == "npu" else kw2
        tot.npu_recurrent_gated_delta_rule(*(t.to(device) for t in args), **kw2)

    for change in bad:
        assert_same_error(lambda device: call(device, change), str(change))
    strided = state.transpose(2, 3).contiguous().transpose(2, 3)
    assert_same_error(lambda device: tot.npu_recurrent_gated_delta_rule(
        q.to(device), k.to(device), v.to(device), strided.to(device), **(_npu(kw) if device == "npu" else kw)),
        "state not contiguous")


# ---- full tier: Qwen3-Next-sized calls ----

@full_case
def case_full_qwen3_next_decode():
    # Qwen3-Next-80B's linear attention: 16 key heads, 32 value heads of 128 x 128, a float32 cache
    _run("qwen3-next decode", torch.bfloat16, lens=(1,) * 4, Nk=16, Nv=32, Dk=128, Dv=128,
         state_dtype=torch.float32, seed=1)


@full_case
def case_full_qwen3_next_speculative():
    _run("qwen3-next MTP", torch.bfloat16, lens=(3, 2), accepted=(2, 1), Nk=4, Nv=8, Dk=128, Dv=128, with_gk=True,
         seed=2)
