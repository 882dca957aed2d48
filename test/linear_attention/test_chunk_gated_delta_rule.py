"""npu_chunk_gated_delta_rule (chunk_gated_delta_rule and its backward) against the float64 token-by-token
reference (chunk_gated_delta_rule_reference.py): outputs and final states of ragged varlen batches (chunk
boundaries, empty sequences, GQA), the tolerance rule for fp32 / bf16 / fp16, gradients (gradcheck in float64 and
against autograd through the reference), thread-count independence, zero sizes, agreement with transformers'
torch_chunk_gated_delta_rule, and an 8k-token sequence in the full tier."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.tiers import FULL
from test.linear_attention.chunk_gated_delta_rule_reference import chunk_gated_delta_rule_ref, make_inputs

OPS = torch.ops.npu_fa
NAMES = ("query", "key", "value", "beta", "initial_state", "g")


def call(inp, **over):
    kw = dict(beta=inp["beta"], initial_state=inp["initial_state"], actual_seq_lengths=inp["actual_seq_lengths"],
              scale=inp["scale"], g=inp["g"])
    kw.update(over)
    return tot.npu_chunk_gated_delta_rule(inp["query"], inp["key"], inp["value"], **kw)


def reference(inp, dtype=torch.float64):
    return chunk_gated_delta_rule_ref(inp["query"], inp["key"], inp["value"], inp["beta"], inp["initial_state"],
                                      inp["actual_seq_lengths"].tolist(), inp["scale"], inp["g"], dtype=dtype)


# lengths around the 64-token chunk: 1, 63, 64, 65, two full chunks and a tail, an empty sequence
@pytest.mark.asan  # sequence offsets, strides and empty tensors drive the kernel's indexing
@pytest.mark.parametrize("lens,Nk,Nv", [([1], 1, 1), ([63, 64, 65], 2, 4), ([130, 0, 7], 1, 3), ([200], 2, 2)])
def test_float64_matches_the_token_recurrence(lens, Nk, Nv):
    inp = make_inputs(lens, Nk=Nk, Nv=Nv, Dk=16, Dv=8, dtype=torch.float64)
    out, state = call(inp)
    ref_out, ref_state = reference(inp)
    assert out.dtype == torch.float64 and state.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(state, ref_state, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_meets_the_tolerance_rule(dtype):
    inp = make_inputs([70, 3, 129], Nk=2, Nv=4, Dk=32, Dv=16, dtype=dtype, state_dtype=dtype)
    out, state = call(inp)
    assert out.dtype == dtype and state.dtype == dtype
    ref_out, ref_state = reference(inp)
    same_out, same_state = reference(inp, dtype)
    check_tolerance("out", out, ref_out, same_out)
    check_tolerance("final_state", state, ref_state, same_state)


@pytest.mark.parametrize("beta,g,state", [(False, True, True), (True, False, True), (True, True, False),
                                          (False, False, False)])
def test_optional_arguments_take_their_documented_defaults(beta, g, state):
    inp = make_inputs([20, 45], dtype=torch.float64, state=state, with_g=g)
    if not beta:
        inp["beta"] = None
    out, fin = call(inp)
    ref_out, ref_state = reference(inp)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(fin, ref_state, rtol=0, atol=1e-12)


def test_defaults_one_sequence_and_scale_one():
    inp = make_inputs([37], dtype=torch.float64)
    out, fin = tot.npu_chunk_gated_delta_rule(inp["query"], inp["key"], inp["value"], beta=inp["beta"], g=inp["g"])
    ref_out, ref_state = chunk_gated_delta_rule_ref(inp["query"], inp["key"], inp["value"], inp["beta"], None, None,
                                                    None, inp["g"])
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(fin, ref_state, rtol=0, atol=1e-12)
    assert fin.shape == (1, 4, 8, 16)


def test_strong_decay_stays_finite_and_within_the_tolerance_rule():
    """g down to -20 per token: e^G underflows to 0 within a chunk in fp32; the chunk form must not produce inf/NaN
    from ratios of underflowed decays."""
    inp = make_inputs([140], dtype=torch.float32)
    inp["g"] = inp["g"] * 20
    out, state = call(inp)
    ref_out, ref_state = reference(inp)
    same_out, same_state = reference(inp, torch.float32)
    check_tolerance("out", out, ref_out, same_out)
    check_tolerance("final_state", state, ref_state, same_state)


@pytest.mark.asan  # sequence offsets, strides and empty tensors drive the kernel's indexing
def test_strided_inputs_from_a_fused_projection():
    """q, k, v sliced from one [T, 2*Nk*Dk + Nv*Dv] projection (as Qwen3-Next splits its mixed qkv)."""
    inp = make_inputs([50, 20], dtype=torch.float32)
    T = 70
    fused = torch.cat([inp["query"].reshape(T, -1), inp["key"].reshape(T, -1), inp["value"].reshape(T, -1)], dim=1)
    q, k, v = fused.split([32, 32, 32], dim=1)
    views = dict(inp, query=q.view(T, 2, 16), key=k.view(T, 2, 16), value=v.view(T, 4, 8))
    assert not views["query"].is_contiguous()
    for a, b in zip(call(views), call(inp)):
        assert torch.equal(a, b)


def test_state_dtypes():
    """final_state takes initial_state's dtype; without one, fp32 (fp64 for fp64 inputs). out: value's dtype."""
    inp = make_inputs([5], dtype=torch.bfloat16, state_dtype=torch.bfloat16)
    assert [t.dtype for t in call(inp)] == [torch.bfloat16, torch.bfloat16]
    assert [t.dtype for t in call(inp, initial_state=None)] == [torch.bfloat16, torch.float32]
    inp = make_inputs([5], dtype=torch.bfloat16, state_dtype=torch.float32)
    assert [t.dtype for t in call(inp)] == [torch.bfloat16, torch.float32]


def test_lengths_as_a_list_or_int64():
    inp = make_inputs([9, 4], dtype=torch.float64)
    expected = call(inp)
    for lengths in ([9, 4], torch.tensor([9, 4], dtype=torch.int64)):
        for a, b in zip(call(inp, actual_seq_lengths=lengths), expected):
            assert torch.equal(a, b)


def test_a_split_sequence_continues_from_its_final_state():
    """Two calls, the second starting from the first's final state, give one call's result (the state carry)."""
    inp = make_inputs([150], dtype=torch.float32)
    out, fin = call(inp)
    cut = 77
    first = {n: (t[:cut] if n not in ("initial_state", "scale", "actual_seq_lengths") and t is not None else t)
             for n, t in inp.items()}
    second = {n: (t[cut:] if n not in ("initial_state", "scale", "actual_seq_lengths") and t is not None else t)
              for n, t in inp.items()}
    o1, s1 = call(first, actual_seq_lengths=[cut])
    o2, s2 = call(second, actual_seq_lengths=[150 - cut], initial_state=s1)
    torch.testing.assert_close(torch.cat([o1, o2]), out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s2, fin, rtol=1e-5, atol=1e-5)


# ---- gradients ----

def _leaf(inp, dtype=None):
    out = dict(inp)
    for n in NAMES:
        if inp[n] is not None:
            out[n] = inp[n].detach().clone().to(dtype or inp[n].dtype).requires_grad_(True)
    return out


# Every input element (full mode) on a short batch; random directions (fast mode) across a chunk boundary, where
# full mode would take a minute.
@pytest.mark.parametrize("lens,fast", [([5, 0, 3], False), ([67, 3], True)])
def test_gradcheck_float64(lens, fast):
    inp = _leaf(make_inputs(lens, Nk=1, Nv=2, Dk=4, Dv=3, dtype=torch.float64))

    def f(q, k, v, beta, s0, g):
        return OPS.chunk_gated_delta_rule(q, k, v, beta, s0, inp["actual_seq_lengths"], inp["scale"], g)

    assert torch.autograd.gradcheck(f, tuple(inp[n] for n in NAMES), eps=1e-6, atol=1e-8, fast_mode=fast)


def _grads(out, state, d_out, d_state, leaves):
    return torch.autograd.grad((out * d_out).sum() + (state * d_state).sum(), [leaves[n] for n in NAMES])


@pytest.mark.asan  # sequence offsets, strides and empty tensors drive the kernel's indexing
@pytest.mark.parametrize("lens,Nk,Nv", [([100, 0, 37], 2, 4), ([64, 65], 1, 1)])
def test_gradients_match_autograd_through_the_reference(lens, Nk, Nv):
    base = make_inputs(lens, Nk=Nk, Nv=Nv, Dk=16, Dv=8, dtype=torch.float64)
    ours, ref = _leaf(base), _leaf(base)
    out, state = call(ours)
    d_out, d_state = torch.randn_like(out), torch.randn_like(state)
    got = _grads(out, state, d_out, d_state, ours)
    want = _grads(*reference(ref), d_out, d_state, ref)
    for name, a, b in zip(NAMES, got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11, msg=name)


def test_float32_gradients_meet_the_tolerance_rule():
    base = make_inputs([90, 41], Nk=1, Nv=2, Dk=16, Dv=8, dtype=torch.float32)
    ours, ref64, ref32 = _leaf(base), _leaf(base, torch.float64), _leaf(base)
    out, state = call(ours)
    d_out, d_state = torch.randn_like(out), torch.randn_like(state)
    got = _grads(out, state, d_out, d_state, ours)
    want = _grads(*reference(ref64), d_out.double(), d_state.double(), ref64)
    same = _grads(*reference(ref32, torch.float32), d_out, d_state, ref32)
    for name, a, b, c in zip(NAMES, got, want, same):
        check_tolerance(f"d_{name}", a, b, c)


def test_only_out_or_only_the_state_in_the_loss():
    inp = _leaf(make_inputs([30], dtype=torch.float64))
    out, state = call(inp)
    g_out = torch.autograd.grad(out.sum(), inp["value"], retain_graph=True)[0]
    ref = _leaf(make_inputs([30], dtype=torch.float64))
    torch.testing.assert_close(g_out, torch.autograd.grad(reference(ref)[0].sum(), ref["value"])[0], rtol=0,
                               atol=1e-11)
    g_state = torch.autograd.grad(state.sum(), inp["initial_state"])[0]
    ref = _leaf(make_inputs([30], dtype=torch.float64))
    torch.testing.assert_close(g_state, torch.autograd.grad(reference(ref)[1].sum(), ref["initial_state"])[0],
                               rtol=0, atol=1e-11)


def test_backward_op_returns_empty_gradients_for_absent_inputs():
    inp = make_inputs([10], dtype=torch.float32, state=False, with_g=False)
    grads = OPS.chunk_gated_delta_rule_backward(torch.randn(10, 4, 8), None, inp["query"], inp["key"], inp["value"],
                                                None, None, inp["actual_seq_lengths"], inp["scale"], None)
    assert [tuple(t.shape) for t in grads] == [(10, 2, 16), (10, 2, 16), (10, 4, 8), (0,), (0,), (0,)]


# ---- threads, zero size ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_results_do_not_depend_on_the_thread_count(dtype):
    base = make_inputs([150, 7, 80], Nk=2, Nv=4, Dk=32, Dv=16, dtype=dtype)
    d_out = torch.randn(237, 4, 16).to(dtype)
    d_state = torch.randn(3, 4, 16, 32)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            out, state = call(base)
            grads = OPS.chunk_gated_delta_rule_backward(
                d_out, d_state, base["query"], base["key"], base["value"], base["beta"], base["initial_state"],
                base["actual_seq_lengths"], base["scale"], base["g"])
            results.append((out, state, *grads))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.asan  # sequence offsets, strides and empty tensors drive the kernel's indexing
def test_zero_tokens_return_the_initial_state():
    inp = make_inputs([0, 0], dtype=torch.float32)
    out, state = call(inp)
    assert out.shape == (0, 4, 8)
    assert torch.equal(state, inp["initial_state"])
    grads = OPS.chunk_gated_delta_rule_backward(out, torch.ones_like(state), inp["query"], inp["key"], inp["value"],
                                                inp["beta"], inp["initial_state"], inp["actual_seq_lengths"],
                                                inp["scale"], inp["g"])
    assert torch.equal(grads[4], torch.ones_like(state))


@pytest.mark.asan  # sequence offsets, strides and empty tensors drive the kernel's indexing
def test_zero_width_heads():
    q = torch.zeros(5, 1, 0)
    out, state = tot.npu_chunk_gated_delta_rule(q, q, torch.randn(5, 2, 3), actual_seq_lengths=[5])
    assert out.shape == (5, 2, 3) and not out.any() and state.shape == (1, 2, 3, 0)


# ---- the model's convention ----

def test_matches_transformers_torch_chunk_gated_delta_rule():
    """Qwen3-Next's reference: [B, S, H, D] inputs, state [B, H, Dk, Dv], scale Dk^-0.5, q/k used as given."""
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    B, S, Nk, Nv, Dk, Dv = 2, 90, 2, 4, 32, 16
    inp = make_inputs([S] * B, Nk=Nk, Nv=Nv, Dk=Dk, Dv=Dv, dtype=torch.float32)
    out, state = call(inp)
    hf_out, hf_state = modeling.torch_chunk_gated_delta_rule(
        inp["query"].view(B, S, Nk, Dk), inp["key"].view(B, S, Nk, Dk), inp["value"].view(B, S, Nv, Dv),
        g=inp["g"].view(B, S, Nv), beta=inp["beta"].view(B, S, Nv),
        initial_state=inp["initial_state"].transpose(-1, -2), output_final_state=True)
    ref_out, ref_state = reference(inp)
    same_out, same_state = reference(inp, torch.float32)
    check_tolerance("out", out, ref_out, same_out)
    check_tolerance("transformers' out", hf_out.reshape(B * S, Nv, Dv), ref_out, same_out, floor=1e-4)
    torch.testing.assert_close(out, hf_out.reshape(B * S, Nv, Dv), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, hf_state.transpose(-1, -2), rtol=1e-4, atol=1e-4)



def test_large_states_are_as_accurate_as_the_models_chunked_fp32():
    """With states of magnitude ~50 (v and S0 scaled by 100) and Dk = 128, the chunked form's fp32 state error is a few
    times the token loop's (the U - W H cancellation; transformers' chunked fp32 has the same error). Held to the
    tolerance rule with transformers' chunked fp32 as the same-dtype PyTorch result."""
    modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    T, D = 300, 128
    inp = make_inputs([T], Nk=1, Nv=2, Dk=D, Dv=D, dtype=torch.float32, seed=3)
    inp["value"], inp["initial_state"] = inp["value"] * 100, inp["initial_state"] * 100
    out, state = call(inp)
    ref_out, ref_state = reference(inp)
    hf_out, hf_state = modeling.torch_chunk_gated_delta_rule(
        inp["query"][None], inp["key"][None], inp["value"][None], g=inp["g"][None], beta=inp["beta"][None],
        initial_state=inp["initial_state"].transpose(-1, -2), output_final_state=True)
    check_tolerance("out", out, ref_out, hf_out[0])
    check_tolerance("final_state", state, ref_state, hf_state.transpose(-1, -2))


# ---- long sequence ----

@FULL
def test_an_8k_token_sequence_does_not_drift():
    """128 chunks carried one into the next: the fp32 state must stay within the tolerance rule of the reference."""
    inp = make_inputs([8192], Nk=1, Nv=2, Dk=64, Dv=64, dtype=torch.float32, seed=3)
    out, state = call(inp)
    ref_out, ref_state = reference(inp)
    same_out, same_state = reference(inp, torch.float32)
    check_tolerance("out", out, ref_out, same_out)
    check_tolerance("final_state", state, ref_state, same_state)
