"""The differential oracle (torch_ops_transformer.oracle) on the simulated npu device. Run by test_oracle.py through
runner_worker.py (the device is already enabled here).

Fault injection (TOT_NPU_SIM_FAULT, read by the npu glue of the attention kernels on the simulated device only): in
the FlashAttention forward a wrong scale, an off-by-one window and a mask ignored past key 512, in its backward a
wrong scale and an off-by-one window, in the decode kernel a wrong scale and the last key of each sequence ignored,
must each be caught and reported with the op, its arguments and the worst element; correct kernels over the npu test grids of prefill, decode, the attention
backward, the SDPA route, RoPE and the MoE ops must produce no report; the modes, lists, saving and replay, the torch_npu route (an `npu::` op of
torch_npu's schema, mapped to the shim's function) and the calls that are not re-run behave as documented; ops
that write their arguments (state and conv caches) are re-run from the arguments as they were before the call.
"""
import importlib
import logging
import os
import subprocess
import sys

import torch

from torch_ops_transformer import oracle
from test.common.tiers import TIER
from test.inference.prefill_cases import to_layout
from test.npu.runner import env_var, no_fallback

OPS = torch.ops.npu_fa
NPU = "npu"


def fault(name):
    """TOT_NPU_SIM_FAULT: a broken variant of an attention kernel's arguments (simulated device only)."""
    return env_var("TOT_NPU_SIM_FAULT", name)


def _fia_inputs(skv=600, sq=4, seed=0):
    """A fused prefill call with an explicit [B, 1, Sq, Skv] mask that hides keys past 512 (serving's padded
    mask), fp32 so that small errors show."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, sq, 32, generator=g)
    k = torch.randn(2, 2, skv, 32, generator=g)
    v = torch.randn(2, 2, skv, 32, generator=g)
    mask = torch.zeros(2, 1, sq, skv, dtype=torch.bool)
    mask[..., skv - 60:] = True  # the tail the "mask_tail" fault drops
    kw = dict(num_heads=4, num_key_value_heads=2, scale=0.2, input_layout="BNSD", sparse_mode=0)
    return (q, k, v), mask, kw


def _fia(device, inputs, mask, kw):
    q, k, v = (t.to(device) for t in inputs)
    return OPS.fused_infer_attention_score(q, k, v, atten_mask=mask.to(device), **kw)


def _expect_caught(what, call):
    try:
        with oracle.check(mode="raise"):
            call()
    except oracle.OracleMismatch as e:
        rep = e.report
        assert rep.op.startswith("npu_fa::") and rep.mismatch.where is not None, (what, rep.text())
        assert "@npu" in rep.arguments, rep.arguments
        return rep
    raise AssertionError(f"{what}: the oracle did not catch the fault")


def case_injected_faults_are_caught():
    inputs, mask, kw = _fia_inputs()
    with no_fallback(True):
        with fault("scale"):
            rep = _expect_caught("scale", lambda: _fia(NPU, inputs, mask, kw))
        assert "fused_infer_attention_score" in rep.op and rep.mismatch.error > rep.mismatch.allowed, rep.text()
        with fault("mask_tail"):
            _expect_caught("mask_tail", lambda: _fia(NPU, inputs, mask, kw))
        # The off-by-one window: a causal band (sparse mode 3) shows each row one key too many.
        q, k, v = (torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
        causal = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
        call = (lambda: OPS.prompt_flash_attention(q.to(NPU), k.to(NPU), v.to(NPU), atten_mask=causal.to(NPU),
                                                   num_heads=2, scale_value=0.25, input_layout="BNSD",
                                                   sparse_mode=3))
        with fault("window"):
            _expect_caught("window", call)
        # The same calls without a fault: no report.
        before = len(oracle.reports())
        with oracle.check(mode="raise"):
            _fia(NPU, inputs, mask, kw)
            call()
        assert len(oracle.reports()) == before


def _causal_backward(mode):
    """An fp32 flash_attention_score forward + backward on npu with a causal band (sparse mode 2 or 3, the
    compressed mask), through autograd."""
    g = torch.Generator().manual_seed(mode)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).to(NPU).requires_grad_() for _ in range(3))
    causal = torch.ones(2048, 2048, dtype=torch.bool).triu(1).to(NPU)
    out = OPS.flash_attention_score(q, k, v, 2, "BNSD", scale=0.25, sparse_mode=mode, atten_mask=causal)[0]
    out.square().sum().backward()


def _decode_calls():
    """One-token calls that reach the Ascend C decode kernel — incre_flash_attention on a contiguous and on a
    paged cache, fused_infer_attention_score (Sq = 1) on a paged cache — as (name, call) pairs (fp32, sequences of
    different lengths)."""
    from test.inference import test_fia_paged as P
    from test.inference.decode_cases import Case, build

    def incre(case):
        args = [a.to(NPU) if isinstance(a, torch.Tensor) else a for a in build(case, 0).args]
        return lambda: OPS.incre_flash_attention(*args)

    contiguous = Case(layout="BSH", batch=2, q_heads=4, kv_heads=2, head_dim=16, kv_len=40, lens=(37, 9),
                      dtype="fp32")
    paged = Case(layout="BSND", batch=2, q_heads=4, kv_heads=2, head_dim=16, kv_len=48, block=16, lens=(20, 41),
                 dtype="fp32")
    q, k, v = P._inputs(1)
    caches = [P._paged(t, "BSH", P.TABLE).to(NPU) for t in (k, v)]
    qn = to_layout(q, "BSH").to(NPU)
    fia = (lambda: OPS.fused_infer_attention_score(qn, caches[0], caches[1], num_heads=P.N1,
                                                   num_key_value_heads=P.N2, scale=P.SCALE, input_layout="BSH",
                                                   block_table=P.TABLE.to(NPU), block_size=P.BS,
                                                   actual_seq_lengths_kv=torch.tensor([20, 37]).to(NPU)))
    return [("incre contiguous", incre(contiguous)), ("incre paged", incre(paged)), ("fia paged Sq=1", fia)]


def case_backward_and_decode_faults_are_caught():
    """The faults of the FlashAttention backward kernel (bwd_scale, bwd_window: caught in the gradient op, not in the
    forward) and of the decode kernel (decode_scale, decode_tail: in incre_flash_attention and the paged one-token
    fused call) are each caught; the same calls without a fault give no report."""
    with no_fallback(True):
        for name, mode in (("bwd_scale", 2), ("bwd_window", 3)):
            with fault(name):
                rep = _expect_caught(name, lambda: _causal_backward(mode))
            assert rep.op == "npu_fa::flash_attention_score_grad", (name, rep.text())
        for name in ("decode_scale", "decode_tail"):
            for what, call in _decode_calls():
                with fault(name):
                    rep = _expect_caught(f"{name} {what}", call)
                op = "npu_fa::fused_infer_attention_score" if what.startswith("fia") else "npu_fa::incre_flash_attention"
                assert rep.op == op, (name, what, rep.text())
        before = len(oracle.reports())
        with oracle.check(mode="raise"):
            for mode in (2, 3):
                _causal_backward(mode)
            for _, call in _decode_calls():
                call()
        assert len(oracle.reports()) == before


def _run_cases(module_name):
    """Every case of a worker module, but those that read the profiler (the oracle's CPU runs would appear in it)
    and, outside the full tier, its @full_case ones."""
    module = importlib.import_module(module_name)
    for name in sorted(n for n in dir(module) if n.startswith("case_")):
        case = getattr(module, name)
        if "profiler" not in name and (TIER == "full" or not getattr(case, "full_tier", False)):
            case()


def case_correct_kernels_produce_no_report_over_the_test_grids():
    """Every npu call of these test grids is re-run on CPU and judged: no report (raise mode would stop)."""
    before = oracle.stats().checked
    with oracle.check(mode="raise"):
        for m in ("test.npu.prefill_worker", "test.npu.inference_worker", "test.npu.attention_grad_worker",
                  "test.npu.sdpa_worker", "test.npu.moe_dispatch_worker", "test.npu.moe_routing_worker",
                  "test.npu.moe_worker", "test.npu.rope_worker", "test.npu.grouped_matmul_worker",
                  "test.npu.linear_attention_worker"):
            _run_cases(m)
    assert oracle.stats().checked - before > 200, oracle.stats()


def case_compiled_code_runs_and_its_extern_calls_are_checked():
    """torch.compile(fullgraph=True) traces as if the oracle were off; the compiled artifact's calls of our ops
    (extern kernels, forward and backward) are checked when it runs."""
    q, k, v = (torch.randn(1, 2, 24, 16, generator=torch.Generator().manual_seed(i)).to(NPU).requires_grad_()
               for i in range(3))
    f = torch.compile(lambda q, k, v: OPS.flash_attention_score(q, k, v, 2, "BNSD", scale=0.25)[0], fullgraph=True)
    seen = oracle.stats().checked
    with oracle.check(mode="raise"):
        f(q, k, v).sum().backward()
    assert oracle.stats().checked - seen == 2, oracle.stats()


def case_attention_forward_and_backward_are_checked():
    """Autograd's backward op (flash_attention_score_grad) is checked like the forward."""
    q, k, v = (torch.randn(1, 2, 24, 16, generator=torch.Generator().manual_seed(i)).to(NPU).requires_grad_()
               for i in range(3))
    seen = oracle.stats().checked
    with oracle.check(mode="raise", ops=["flash_attention_score", "npu_fa::flash_attention_score_grad"]):
        out = OPS.flash_attention_score(q, k, v, 2, "BNSD", scale=0.25, sparse_mode=2,
                                        atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1).to(NPU))[0]
        out.square().sum().backward()
    assert oracle.stats().checked - seen == 2, oracle.stats()


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def case_modes_lists_and_summary():
    inputs, mask, kw = _fia_inputs(skv=80)
    handler = _Capture()
    oracle.log.addHandler(handler)
    try:
        with no_fallback(True), fault("scale"):
            with oracle.check(mode="warn"):  # logs and continues: both calls return
                a = _fia(NPU, inputs, mask, kw)
                b = _fia(NPU, inputs, mask, kw)
            assert a[0].shape == b[0].shape and len(handler.messages) == 2, handler.messages
            assert "fused_infer_attention_score" in handler.messages[0]
            s0 = oracle.stats()
            checked, sampled = s0.checked, s0.sampled_out
            with oracle.check(mode="sample", every=3):  # calls 0 and 3 of the op are checked
                for _ in range(5):
                    _fia(NPU, inputs, mask, kw)
            assert oracle.stats().checked - checked == 2 and oracle.stats().sampled_out - sampled == 3
            assert len(handler.messages) == 4
            with oracle.check(mode="raise", skip=["fused_infer_attention_score"]):  # denied: not checked
                _fia(NPU, inputs, mask, kw)
            with oracle.check(mode="raise", ops=["torch.ops.npu_fa.rotary_position_embedding"]):  # not allowed
                _fia(NPU, inputs, mask, kw)
    finally:
        oracle.log.removeHandler(handler)
    for bad in (dict(mode="loud"), dict(mode="sample", every=0)):
        try:
            with oracle.check(**bad):
                pass
        except ValueError as e:
            assert "oracle" in str(e)
        else:
            raise AssertionError(f"{bad} accepted")


def case_not_rerun_calls():
    """Generator-drawn dropout is not re-run (the CPU run would draw another mask): counted, never reported."""
    q = torch.randn(1, 2, 16, 8).to(NPU)
    s = oracle.stats().not_rerun
    with oracle.check(mode="raise"):
        OPS.flash_attention_score(q, q, q, 2, "BNSD", keep_prob=0.9)
    assert oracle.stats().not_rerun - s == 1
    # A CPU call is never checked (nothing to compare).
    c = oracle.stats().calls_seen
    with oracle.check(mode="raise"):
        OPS.flash_attention_score(q.cpu(), q.cpu(), q.cpu(), 2, "BNSD")
    assert oracle.stats().calls_seen == c


def case_saved_inputs_replay_on_cpu_alone(tmp=None):
    import tempfile

    inputs, mask, kw = _fia_inputs(skv=64)
    with tempfile.TemporaryDirectory() as d:
        with no_fallback(True), fault("scale"):
            with oracle.check(mode="warn", save_dir=d):
                _fia(NPU, inputs, mask, kw)
        files = sorted(os.listdir(d))
        assert len(files) == 1 and files[0].endswith("fused_infer_attention_score.pt"), files
        path = os.path.join(d, files[0])
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOT_NPU_SIM")}
        proc = subprocess.run([sys.executable, "-m", "torch_ops_transformer", "oracle", "replay", path],
                              capture_output=True, text=True, env=env)
        assert proc.returncode == 1 and "reproduced on CPU" in proc.stdout, (proc.stdout, proc.stderr)
        saved = torch.load(path, weights_only=False)
        assert all(t.device.type == "cpu" for t in saved["args"] if isinstance(t, torch.Tensor))


def case_torch_npu_ops_map_to_the_shim():
    """A torch_npu op (namespace npu, torch_npu's schema) is judged against the shim's function of that name: a
    broken implementation is caught, a correct one passes. (A stand-in for the real torch_npu, absent here.)"""
    from torch_ops_transformer import compat

    lib = torch.library.Library("npu", "DEF")
    lib.define("npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) "
               "-> Tensor")
    broken = {"on": True}

    def impl(x, r1, r2, rotary_mode="half", rotate=None):
        shim = compat.module()
        out = shim.npu_rotary_mul(x.cpu(), r1.cpu(), r2.cpu(), rotary_mode).to(x.device)
        return out * 1.01 if broken["on"] else out

    lib.impl("npu_rotary_mul", impl, "PrivateUse1")
    g = torch.Generator().manual_seed(3)
    x, c, s = (torch.randn(1, 6, 2, 16, generator=g).to(NPU) for _ in range(3))
    try:
        with oracle.check(mode="raise"):
            torch.ops.npu.npu_rotary_mul(x, c, s)
    except oracle.OracleMismatch as e:
        assert e.report.op == "npu::npu_rotary_mul", e.report.text()
    else:
        raise AssertionError("the broken torch_npu op was not caught")
    broken["on"] = False
    with oracle.check(mode="raise"):
        torch.ops.npu.npu_rotary_mul(x, c, s)


def case_environment_switch():
    """TOT_ORACLE turns the oracle on for a whole program; the counters are printed at exit."""
    code = ("import torch, torch_ops_transformer as tot\n"
            "q = torch.randn(1, 2, 16, 8).to('npu')\n"
            "torch.ops.npu_fa.flash_attention_score(q, q, q, 2, 'BNSD', scale=0.3)\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOT_")}
    base.update(TOT_NPU_SIM="1", TOT_ORACLE="raise", TOT_NPU_SIM_FAULT="scale")
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=base)
    assert bad.returncode != 0 and "OracleMismatch" in bad.stderr, bad.stderr[-2000:]
    base.update(TOT_ORACLE="warn", TOT_NPU_SIM_FAULT="")
    good = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=base)
    assert good.returncode == 0 and "oracle: 1 calls checked (0 mismatches)" in good.stderr, good.stderr[-2000:]


def case_hugging_face_llama_on_npu_is_checked():
    """A tiny Hugging Face Llama on npu, eager: with attn_implementation="npu_fa" (our attention) and "sdpa" (the
    SDPA drop-in reaches our ops): a training step runs under raise mode, its attention calls forward and backward
    are checked, no report."""
    from transformers import LlamaConfig, LlamaForCausalLM

    for impl in ("npu_fa", "sdpa"):
        cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          attn_implementation=impl)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).npu()
        ids = torch.randint(0, 128, (2, 17)).npu()
        seen = oracle.stats().checked
        with oracle.check(mode="raise"):
            model(ids, labels=ids).loss.backward()
        assert oracle.stats().checked - seen >= 4, (impl, oracle.stats())  # 2 layers x (forward + backward)


def case_in_place_caches_are_judged_from_the_pre_call_state():
    """Ops that write their arguments (the recurrent rule's state cache, on its Ascend C kernel; fused_causal_conv1d
    _v2's x and conv_states, on the CPU kernel through the device's generic path): the oracle's CPU re-run starts
    from copies taken before the device call, and the written arguments are judged like outputs. The calls are
    chosen so that the pre-call state matters: a speculative step whose first read slot is written by the same
    call, a conv whose result overwrites its input — re-run from the written tensors, the CPU would disagree."""
    from test.linear_attention.test_recurrent_gated_delta_rule import make_inputs as recurrent_inputs

    # sequence 0 starts from the slot its second token writes in this very call
    (q, k, v, state), kw = recurrent_inputs(lens=(3, 2), accepted=(2, 1), slots=8, seed=11)
    args = [t.to(NPU) for t in (q, k, v)]
    floats = {n: t.to(NPU) for n, t in kw.items() if t.is_floating_point()}
    hosts = {n: t for n, t in kw.items() if not t.is_floating_point()}
    cache = state.to(NPU)
    before = oracle.stats().checked
    with oracle.check(mode="raise"):
        out = OPS.recurrent_gated_delta_rule(*args, cache, **floats, **hosts)
    assert oracle.stats().checked - before == 1
    assert not torch.equal(cache.cpu(), state), "the call did not write the cache"
    from_written = OPS.recurrent_gated_delta_rule(q, k, v, cache.cpu().clone(), **kw)
    assert (from_written - out.cpu()).abs().max() > 1e-3, "the pre-call cache does not matter for this call"
    # a fault in the written cache only (the outputs are right) is reported on the written argument
    with fault("gdr_slot"):
        rep = _expect_caught("gdr_slot", lambda: OPS.recurrent_gated_delta_rule(*args, state.to(NPU), **floats,
                                                                                **hosts))
    assert rep.mismatch.output == 1 and "state=float32" in rep.arguments, rep.text()

    # fused_causal_conv1d_v2: y over x and the conv-state lines, both written (the generic path)
    g = torch.Generator().manual_seed(3)
    x, w, states = torch.randn(9, 24, generator=g), torch.randn(3, 24, generator=g), torch.randn(4, 2, 24, generator=g)
    conv_kw = dict(query_start_loc=torch.tensor([0, 4, 9], dtype=torch.int32),
                   cache_indices=torch.tensor([2, 0], dtype=torch.int32), activation="silu")
    xd, sd = x.to(NPU), states.to(NPU)
    before = oracle.stats().checked
    with oracle.check(mode="raise"):
        OPS.fused_causal_conv1d_v2(xd, w.to(NPU), sd, **{n: (t.to(NPU) if isinstance(t, torch.Tensor) else t)
                                                           for n, t in conv_kw.items()})
    assert oracle.stats().checked - before == 1
    assert not torch.equal(xd.cpu(), x) and not torch.equal(sd.cpu(), states)


def case_nz_caches_and_prefix_mode_are_checked():
    """The quantised-serving paths on the npu device: FIA decode over 5-D NZ int8 caches (vLLM-Ascend's C8 form), a TND
    paged prefill over NZ bf16 caches, the NZ write of npu_scatter_pa_kv_cache and npu_fusion_attention's prefix mode
    are each re-run on CPU and judged; correct kernels give no report."""
    import torch_ops_transformer as tot
    from test.inference.test_nz_cache import _paged_case
    from torch_ops_transformer.inference.api import optimised_causal_mask
    from torch_ops_transformer.kv_cache import to_nz

    before = oracle.stats().checked
    with oracle.check(mode="raise"):
        for dtype in ("int8", "bf16"):
            c = _paged_case(dtype, lens=(70, 33, 96))
            nz_k, nz_v = (to_nz(t).to(NPU) for t in (c["kc"], c["vc"]))
            quant = {n: (t.to(NPU) if isinstance(t, torch.Tensor) else t) for n, t in c["quant"].items()}
            q = torch.randn(3, c["N1"], 1, c["D"], generator=c["g"]).to(c["qdt"]).to(NPU)
            tot.npu_fused_infer_attention_score(q, nz_k, nz_v, block_table=c["table"].to(NPU),
                                                actual_seq_lengths_kv=c["lens"], num_heads=c["N1"],
                                                scale=c["D"] ** -0.5, input_layout="BNSD",
                                                num_key_value_heads=c["N2"], block_size=c["block"], **quant)
            qt = torch.randn(18, c["N1"], c["D"], generator=c["g"]).to(c["qdt"]).to(NPU)
            tot.npu_fused_infer_attention_score(qt, nz_k, nz_v, block_table=c["table"].to(NPU),
                                                actual_seq_lengths=[5, 6, 18], actual_seq_lengths_kv=c["lens"],
                                                num_heads=c["N1"], scale=c["D"] ** -0.5, input_layout="TND",
                                                num_key_value_heads=c["N2"], block_size=c["block"], sparse_mode=3,
                                                atten_mask=optimised_causal_mask(NPU), **quant)
        k = torch.randn(6, 2, 32).half().to(NPU)
        cache = torch.zeros(2, 2, 2, 16, 16).half().to(NPU)
        tot.npu_scatter_pa_kv_cache(k, k, cache, cache.clone(), torch.tensor([0, 5, 9, 17, 30, 31]).int().to(NPU))
        q = torch.randn(2, 4, 24, 32).to(NPU)
        tot.npu_fusion_attention(q, q, q, 4, "BNSD", sparse_mode=5, prefix=[3, 9], scale=0.2)
    assert oracle.stats().checked - before >= 6, oracle.stats()
