"""recurrent_gated_delta_rule (+ _functional) and fused_causal_conv1d (+ _v2) on the simulated npu device (their
Ascend C kernels), run by test_linear_attention.py through runner_worker (sim enabled; tensors `.to("npu")`).

Each case builds a call with the CPU tests' input builder (unit-norm q and k, g < 0, beta in (0, 1), the written
slots a permutation of a larger cache), runs it on npu with the CPU fallback forbidden (TOT_NPU_SIM_NO_FALLBACK=1:
the kernel ran) and on CPU, and checks the npu results against the float64 reference by the project rule and
against the CPU op (both accumulate in fp32, in another order: a few units of the result's dtype). The default tier
covers ragged lengths, num_accepted_tokens, gk, GQA grouping, head dims not multiples of 16, the three dtypes and
fp32 caches next to 16-bit tokens; the full tier a Qwen3-Next-sized decode and speculative step.

The conv cases (`case_conv_*`) reuse the CPU tests' inputs and float64 reference (test_causal_conv1d.py,
causal_conv1d_reference.py): y by the project rule and within a few units of the CPU op, the cache equal to the CPU
op's exactly (the kernel only moves its values). Default tier: varlen prefill with and without cached rows,
speculative decode, mixed batches, lines longer than K-1, bias / SiLU / initial_state_mode, padded entries, pangu,
the in-place _v2, seeded random calls, no tokens, the float64 and prefix-caching fallbacks and the errors; the full
tier the remaining random calls and Qwen3-Next-sized decode and prefill.
"""
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.linear_attention import causal_conv1d_reference as conv_ref
from test.linear_attention.test_causal_conv1d import _inputs as conv_inputs
from test.linear_attention.test_causal_conv1d import _qsl, _random_call
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


# ---- fused_causal_conv1d (+ _v2): the Ascend C conv kernel ----

I32 = torch.int32


def _dev(kw, device="npu"):
    return {n: (v.to(device) if torch.is_tensor(v) else v) for n, v in kw.items()}


def _conv(name, x, w, st, kw, v2=False):
    """Runs the op on npu (the kernel: fallback forbidden) and on CPU; checks y by the project rule against the
    float64 reference and within a few units of the CPU op, and the new cache equal to the CPU op's."""
    cpu_states = st.clone()
    cpu_y = OPS.fused_causal_conv1d(x, w, cpu_states, **kw)
    npu_states = st.to("npu")
    with no_fallback(True):
        if v2:
            y = x.to("npu")
            assert OPS.fused_causal_conv1d_v2(y, w.to("npu"), npu_states, **_dev(kw)) is None
        else:
            y = OPS.fused_causal_conv1d(x.to("npu"), w.to("npu"), npu_states, **_dev(kw))
    assert y.device.type == "npu" and y.dtype == x.dtype and y.shape == x.shape, name
    y, new_states = y.cpu(), npu_states.cpu()
    rkw = {k: v for k, v in kw.items() if k not in ("max_query_len", "run_mode")}
    untouched = None if v2 else 0.0  # the rows no sequence computes: x's values (in place) or zeros
    y64, s64 = conv_ref.fused_causal_conv1d(x.double(), w.double(), st.double(), untouched=untouched, **rkw)
    same = conv_ref.fused_causal_conv1d(x, w, st, untouched=untouched, **rkw)[0]
    check_tolerance(name, y, y64, same)
    if v2:
        cpu_y = x.clone()
        OPS.fused_causal_conv1d_v2(cpu_y, w, st.clone(), **kw)
    _close_to_cpu(f"{name} y", y, cpu_y)
    assert torch.equal(new_states, cpu_states), f"{name}: conv_states differ from the CPU op's"
    assert torch.equal(new_states, s64.to(st.dtype)), f"{name}: conv_states differ from the reference"
    return y, new_states


def case_conv_varlen_prefill_all_dtypes():
    lens = [5, 3, 7, 4]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x, w, st = conv_inputs(lens, dtype=dtype)
        for computed in ([0, 0, 0, 0], [10, 0, 20, 8]):  # first chunks of every prompt; later chunks of some
            kw = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([0, 3, 1, 5], dtype=I32),
                      num_computed_tokens=torch.tensor(computed, dtype=I32), residual_connection=int(computed[0] > 0))
            _conv(f"prefill {dtype} {computed}", x, w, st, kw)


def case_conv_speculative_decode_3d():
    m = 2  # draft tokens: state_len K-1+m, num_accepted_tokens picks where the window starts
    for dtype in (torch.bfloat16, torch.float16):
        x, w, st = conv_inputs([m + 1] * 4, state_len=2 + m, dtype=dtype, three_d=True)
        kw = dict(cache_indices=torch.tensor([0, 2, 4, 6], dtype=I32),
                  num_accepted_tokens=torch.tensor([1, 2, 1, 3], dtype=I32),
                  num_computed_tokens=torch.tensor([5, 3, 7, 4], dtype=I32))
        _conv(f"spec decode {dtype}", x, w, st, kw)


def case_conv_mixed_batch_and_long_lines():
    lens = [12, 9, 2, 1]
    x, w, st = conv_inputs(lens, state_len=4)
    kw = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([0, 3, 1, 5], dtype=I32),
              num_computed_tokens=torch.tensor([0, 20, 50, 30], dtype=I32),
              num_accepted_tokens=torch.tensor([1, 1, 2, 1], dtype=I32), max_query_len=12)
    _conv("mixed", x, w, st, kw)
    # without num_accepted_tokens the window starts state_len-(K-1) rows in; a longer line keeps its older rows
    x, w, st = conv_inputs([1, 2], state_len=5, K=4)
    _conv("offset", x, w, st, dict(query_start_loc=_qsl([1, 2])))


def case_conv_bias_silu_initial_state_mode_pangu():
    lens = [4, 6]
    x, w, st = conv_inputs(lens, dtype=torch.bfloat16)
    kw = dict(query_start_loc=_qsl(lens), bias=torch.randn(x.shape[1]).to(torch.bfloat16), activation="silu",
              initial_state_mode=torch.tensor([0, 1], dtype=I32))
    _conv("bias silu", x, w, st, kw)
    lens = [5, 3, 4]
    x, w, st = conv_inputs(lens)
    kw = dict(query_start_loc=_qsl(lens), num_computed_tokens=torch.tensor([0, 1, 6], dtype=I32),
              conv_mode="pangu", residual_connection=1)
    y, _ = _conv("pangu", x, w, st, kw)
    assert torch.equal(y[0:2], x[0:2]) and torch.equal(y[5:6], x[5:6])  # conv zeroed: the residual alone


def case_conv_pad_slots_and_tail_rows():
    lens = [3, 2, 4]
    x, w, st = conv_inputs(lens + [2])  # two rows past the last sequence
    kw = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([2, -1, 0], dtype=I32))
    y, new = _conv("pad", x, w, st, kw)
    assert torch.equal(y[3:5], torch.zeros(2, x.shape[1])) and torch.equal(y[9:], torch.zeros(2, x.shape[1]))
    assert torch.equal(new[1], st[1]) and torch.equal(new[3:], st[3:])


def case_conv_v2_in_place():
    lens = [5, 2, 4]
    for dtype in (torch.float32, torch.bfloat16):
        x, w, st = conv_inputs(lens, dtype=dtype, state_len=3)
        kw = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([1, -1, 4], dtype=I32),
                  residual_connection=1, num_computed_tokens=torch.tensor([3, 0, 0], dtype=I32))
        y, _ = _conv(f"v2 {dtype}", x, w, st, kw, v2=True)
        assert torch.equal(y[5:7], x[5:7])  # the skipped sequence keeps its input
    # strided x and conv_states: computed in contiguous copies, written back
    x, w, st = conv_inputs([4, 3], dim=24)
    xs = torch.randn(7, 48).to("npu")[:, ::2]
    xs.copy_(x.to("npu"))
    ss = torch.randn(8, 2, 48).to("npu")[:, :, ::2]
    ss.copy_(st.to("npu"))
    s_ref = st.clone()
    y = OPS.fused_causal_conv1d(x, w, s_ref, query_start_loc=_qsl([4, 3]))
    with no_fallback(True):
        OPS.fused_causal_conv1d_v2(xs, w.to("npu"), ss, query_start_loc=_qsl([4, 3]).to("npu"))
    _close_to_cpu("v2 strided y", xs.cpu(), y)
    assert torch.equal(ss.cpu(), s_ref)


def case_conv_random_calls():
    for seed in range(4):
        x, w, st, kw = _random_call(seed)
        _conv(f"random {seed}", x, w, st, kw)


def case_conv_no_tokens_shifts_the_lines():
    # empty sequences still write their lines (the cached rows move); nothing to compute
    x, w, st = conv_inputs([1], state_len=4, K=3)
    x = x[:0]
    kw = dict(query_start_loc=torch.zeros(3, dtype=I32), cache_indices=torch.tensor([2, 5], dtype=I32),
              num_accepted_tokens=torch.tensor([1, 1], dtype=I32))
    _conv("no tokens", x, w, st, kw)


def case_conv_fallbacks():
    # float64 and prefix caching (a 2-D cache_indices) run the CPU kernel: refused without the fallback
    lens = [9, 3, 7, 4]  # test_causal_conv1d.py's prefix-caching prefill
    x, w, st = conv_inputs(lens, state_len=2, slots=12)
    kw = dict(query_start_loc=_qsl(lens))
    apc = dict(cache_indices=torch.arange(12, dtype=I32).view(4, 3),
               num_computed_tokens=torch.tensor([0, 2, 0, 1], dtype=I32),
               block_idx_first_scheduled_token=torch.zeros(4, dtype=I32),
               block_idx_last_scheduled_token=torch.tensor([2, 1, 1, 1], dtype=I32),
               initial_state_idx=torch.zeros(4, dtype=I32), block_size=4)
    for dtype, extra, why in ((torch.float64, {}, "float64 inputs"), (torch.float32, apc, "prefix caching")):
        xd, wd, sd = x.to(dtype), w.to(dtype), st.to(dtype)
        kw2 = dict(kw, **extra)
        with no_fallback(True):
            try:
                OPS.fused_causal_conv1d(xd.to("npu"), wd.to("npu"), sd.to("npu"), **_dev(kw2))
                raise AssertionError(f"{why}: ran without the fallback")
            except RuntimeError as e:
                assert f"does not handle {why}" in str(e), e
        cpu_states = sd.clone()
        cpu_y = OPS.fused_causal_conv1d(xd, wd, cpu_states, **kw2)
        npu_states = sd.to("npu")
        with no_fallback(False):
            y = OPS.fused_causal_conv1d(xd.to("npu"), wd.to("npu"), npu_states, **_dev(kw2))
            xv2 = xd.to("npu")
            OPS.fused_causal_conv1d_v2(xv2, wd.to("npu"), sd.to("npu"), **_dev(kw2))
        assert torch.equal(y.cpu(), cpu_y) and torch.equal(npu_states.cpu(), cpu_states), why
        xc = xd.clone()
        OPS.fused_causal_conv1d_v2(xc, wd, sd.clone(), **kw2)
        assert torch.equal(xv2.cpu(), xc), why


def case_conv_errors_match_cpu():
    lens = [3, 2]
    x, w, st = conv_inputs(lens, dim=8, slots=4)
    base = dict(query_start_loc=_qsl(lens), cache_indices=torch.tensor([0, 1], dtype=I32))
    bad = [dict(cache_indices=torch.tensor([0, 0], dtype=I32)), dict(cache_indices=torch.tensor([0, 9], dtype=I32)),
           dict(num_accepted_tokens=torch.tensor([4, 1], dtype=I32)), dict(activation="gelu"),
           dict(residual_connection=2), dict(bias=torch.zeros(7)), dict(query_start_loc=torch.tensor([0, 3, 2])),
           dict(initial_state_mode=torch.tensor([1], dtype=I32))]
    for change in bad:
        kw = dict(base, **change)
        assert_same_error(lambda device: OPS.fused_causal_conv1d(
            x.to(device), w.to(device), st.clone().to(device), **_dev(kw, device)), str(change))
        assert_same_error(lambda device: OPS.fused_causal_conv1d_v2(
            x.clone().to(device), w.to(device), st.clone().to(device), **_dev(kw, device)), str(change))


@full_case
def case_full_conv_random_calls():
    for seed in range(4, 12):
        x, w, st, kw = _random_call(seed)
        _conv(f"random {seed}", x, w, st, kw)


@full_case
def case_full_conv_qwen3_next_decode_and_prefill():
    # Qwen3-Next-80B's conv: K 4 over 2*16*128 + 32*128 = 8192 channels (here 2048: a quarter of the heads), bf16
    x, w, st = conv_inputs([1] * 16, dim=2048, K=4, slots=20, dtype=torch.bfloat16, seed=3)
    kw = dict(query_start_loc=_qsl([1] * 16), cache_indices=torch.randperm(20)[:16].to(I32), activation="silu")
    _conv("qwen3-next decode", x, w, st, kw)
    x, w, st = conv_inputs([300, 45], dim=2048, K=4, slots=4, dtype=torch.bfloat16, seed=4)
    kw = dict(query_start_loc=_qsl([300, 45]), cache_indices=torch.tensor([3, 1], dtype=I32), activation="silu",
              num_computed_tokens=torch.tensor([0, 0], dtype=I32))
    _conv("qwen3-next prefill", x, w, st, kw)
