"""npu_recurrent_gated_delta_rule (+ _functional): the gated delta rule over a state cache against a float64
token-by-token reference (test/linear_attention/recurrent_gated_delta_rule_reference.py) under the tolerance rule,
transformers' torch_recurrent_gated_delta_rule (Qwen3-Next's convention), the in-place and functional forms, thread
count independence, zero sizes, the NaN policy and one test per bad-input rule."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.linear_attention.recurrent_gated_delta_rule_reference import recurrent_reference, unit_rows

OPS = torch.ops.npu_fa
I32 = torch.int32


def make_inputs(dtype=torch.float32, lens=(3, 1, 2), Nk=2, Nv=4, Dk=19, Dv=12, slots=None, with_gk=False,
                state_dtype=None, accepted=None, seed=0):
    """A call of B = len(lens) sequences: unit-norm q, k (the model's l2norm), g < 0, beta in (0, 1), slots a
    permutation of a larger cache so the written and untouched slots are both exercised."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(lens)
    slots = slots or T + 3
    q = unit_rows((T, Nk, Dk), dtype, gen)
    k = unit_rows((T, Nk, Dk), dtype, gen)
    v = torch.randn(T, Nv, Dv, generator=gen, dtype=torch.float64).to(dtype)
    state = (0.5 * torch.randn(slots, Nv, Dv, Dk, generator=gen, dtype=torch.float64)).to(state_dtype or dtype)
    beta = torch.rand(T, Nv, generator=gen, dtype=torch.float64).to(dtype)
    g = -torch.rand(T, Nv, generator=gen, dtype=torch.float64).to(torch.float32 if dtype != torch.float64 else dtype)
    kw = dict(beta=beta, g=g, actual_seq_lengths=torch.tensor(lens, dtype=I32),
              ssm_state_indices=torch.randperm(slots, generator=gen)[:T].to(I32))
    if accepted is not None:
        kw["num_accepted_tokens"] = torch.tensor(accepted, dtype=I32)
    if with_gk:
        kw["gk"] = -0.3 * torch.rand(T, Nv, Dk, generator=gen, dtype=torch.float64).to(g.dtype)
    return (q, k, v, state), kw


def check_against_reference(name, args, kw, out, new_state):
    q, k, v, state = args
    ref_out, ref_state = recurrent_reference(q, k, v, state, **kw)
    if q.dtype == torch.float64:
        torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(new_state, ref_state, rtol=1e-12, atol=1e-12)
        return
    same_out, same_state = recurrent_reference(q, k, v, state, **kw, dtype=q.dtype)
    check_tolerance(f"{name} out", out, ref_out, same_out)
    # the state the reference stores in the cache's dtype (float32 caches: the fp32 run's)
    same_state = same_state if state.dtype == q.dtype else recurrent_reference(
        q, k, v, state, **kw, dtype=torch.float32)[1]
    check_tolerance(f"{name} state", new_state, ref_state, same_state.to(state.dtype))


VARIANTS = {
    "decode": dict(lens=(1, 1, 1, 1)),
    "multi_token": dict(lens=(3, 1, 2)),
    "spec_accepted": dict(lens=(3, 2, 4), accepted=(2, 1, 4)),
    "kda_gk": dict(lens=(2, 3), with_gk=True),
    "mha": dict(Nk=3, Nv=3),
    "wide": dict(lens=(2, 1), Dk=64, Dv=40),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_matches_reference(dtype, variant):
    args, kw = make_inputs(dtype, **VARIANTS[variant])
    state = args[3].clone()
    out = tot.npu_recurrent_gated_delta_rule(*args[:3], state, **kw)
    assert out.dtype == dtype and out.shape == (args[0].shape[0], args[2].shape[1], args[2].shape[2])
    check_against_reference(variant, args, kw, out, state)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_state_cache(dtype):
    """vLLM-Ascend keeps the state cache in float32 next to 16-bit activations."""
    args, kw = make_inputs(dtype, lens=(2, 3), accepted=(1, 2), state_dtype=torch.float32)
    state = args[3].clone()
    out = tot.npu_recurrent_gated_delta_rule(*args[:3], state, **kw)
    assert state.dtype == torch.float32
    check_against_reference("fp32 state", args, kw, out, state)


def test_defaults_are_decode_steps_on_slot_t():
    """No lengths, indices or gates: every token is a one-token sequence on slot t, beta 1, no decay, scale Dk^-0.5."""
    (q, k, v, state), _ = make_inputs(torch.float64, lens=(1, 1, 1), slots=5)
    new = state.clone()
    out = tot.npu_recurrent_gated_delta_rule(q, k, v, new)
    ref_out, ref_state = recurrent_reference(q, k, v, state)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(new, ref_state)
    assert torch.equal(new[3:], state[3:])


def test_functional_leaves_state_and_matches_in_place():
    args, kw = make_inputs(torch.float32, lens=(3, 2), accepted=(2, 1))
    state = args[3].clone()
    out_f, new_state = tot.npu_recurrent_gated_delta_rule_functional(*args, **kw)
    assert torch.equal(state, args[3])
    out_i = tot.npu_recurrent_gated_delta_rule(*args[:3], state, **kw)
    assert torch.equal(out_f, out_i) and torch.equal(new_state, state)
    untouched = torch.ones(state.shape[0], dtype=torch.bool)
    untouched[kw["ssm_state_indices"].long()] = False
    assert torch.equal(state[untouched], args[3][untouched])


def test_lists_and_int64_indices():
    args, kw = make_inputs(torch.float32, lens=(2, 2), accepted=(2, 1))
    expected = tot.npu_recurrent_gated_delta_rule_functional(*args, **kw)
    kw2 = dict(kw, actual_seq_lengths=[2, 2], ssm_state_indices=kw["ssm_state_indices"].long(),
               num_accepted_tokens=kw["num_accepted_tokens"].tolist())
    got = tot.npu_recurrent_gated_delta_rule_functional(*args, **kw2)
    assert torch.equal(expected[0], got[0]) and torch.equal(expected[1], got[1])


def test_non_contiguous_token_inputs():
    args, kw = make_inputs(torch.float32, lens=(2, 3))
    q, k, v, state = args
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    vt = v.transpose(1, 2).contiguous().transpose(1, 2)
    expected = tot.npu_recurrent_gated_delta_rule_functional(q, k, v, state, **kw)
    got = tot.npu_recurrent_gated_delta_rule_functional(qt, k, vt, state, **kw)
    assert torch.equal(expected[0], got[0]) and torch.equal(expected[1], got[1])


def test_thread_count_does_not_change_results():
    args, kw = make_inputs(torch.bfloat16, lens=(3, 2, 1, 4), Dk=64, Dv=64, accepted=(2, 1, 1, 3), with_gk=True)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(tot.npu_recurrent_gated_delta_rule_functional(*args, **kw))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_matches_transformers_torch_recurrent_gated_delta_rule():
    """Qwen3-Next's convention: transformers' recurrence (state [B, Nv, Dk, Dv], q / sqrt(Dk), GQA by
    repeat_interleave) gives our result for B sequences of L tokens, each starting from its first slot."""
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    B, L, Nk, Nv, Dk, Dv = 2, 3, 2, 4, 16, 8
    args, kw = make_inputs(torch.float32, lens=(L,) * B, Nk=Nk, Nv=Nv, Dk=Dk, Dv=Dv, slots=B * L,
                           accepted=(1,) * B)
    q, k, v, state = args
    kw["ssm_state_indices"] = torch.arange(B * L, dtype=I32)
    out, new_state = tot.npu_recurrent_gated_delta_rule_functional(q, k, v, state, **kw)

    def split(t):
        return t.reshape(B, L, *t.shape[1:])

    first = state[torch.arange(B) * L]
    hf_out, hf_state = qwen3_next.torch_recurrent_gated_delta_rule(
        split(q), split(k), split(v), split(kw["g"]), split(kw["beta"]), initial_state=first.transpose(-1, -2),
        output_final_state=True)
    ref_out, ref_state = recurrent_reference(q, k, v, state, **kw)
    # the same convention: transformers' fp32 result is the float64 reference up to fp32 rounding
    torch.testing.assert_close(hf_out.reshape(B * L, Nv, Dv).double(), ref_out, rtol=1e-5, atol=1e-5)
    check_tolerance("vs transformers out", out, ref_out, hf_out.reshape(B * L, Nv, Dv))
    last = torch.arange(1, B + 1) * L - 1
    check_tolerance("vs transformers state", new_state[last], ref_state[last], hf_state.transpose(-1, -2))


def test_nan_gate_propagates_to_its_sequence_and_head_only():
    """The NaN policy: no check on the values; a NaN g poisons the outputs of that sequence and head from that token
    on, and the states it writes; every other (sequence, head) is unchanged."""
    args, kw = make_inputs(torch.float32, lens=(3, 2), accepted=(1, 1))
    clean_out, clean_state = tot.npu_recurrent_gated_delta_rule_functional(*args, **kw)
    g = kw["g"].clone()
    g[1, 2] = float("nan")  # sequence 0, token 1, head 2
    out, new_state = tot.npu_recurrent_gated_delta_rule_functional(*args, **dict(kw, g=g))
    assert torch.isnan(out[1:3, 2]).all() and not torch.isnan(out[0]).any()
    poisoned = torch.zeros_like(out, dtype=torch.bool)
    poisoned[1:3, 2] = True
    assert torch.equal(out[~poisoned], clean_out[~poisoned])
    slots = kw["ssm_state_indices"].long()
    assert torch.isnan(new_state[slots[1:3], 2]).all()
    assert not torch.isnan(new_state[:, [0, 1, 3]]).any() and not torch.isnan(new_state[slots[3:], 2]).any()


@pytest.mark.asan
@pytest.mark.parametrize("shape", ["no_tokens", "no_value_dim", "no_key_dim"])
def test_zero_size(shape):
    lens = {"no_tokens": (), "no_value_dim": (2, 1), "no_key_dim": (2, 1)}[shape]
    Dv = 0 if shape == "no_value_dim" else 5
    Dk = 0 if shape == "no_key_dim" else 7
    args, kw = make_inputs(torch.float32, lens=lens, Dk=Dk, Dv=Dv, slots=4)
    state = args[3].clone()
    out = tot.npu_recurrent_gated_delta_rule(*args[:3], state, **kw)
    assert out.shape == (sum(lens), 4, Dv)
    ref_out, ref_state = recurrent_reference(*args, **kw)
    torch.testing.assert_close(out.double(), ref_out)
    torch.testing.assert_close(state.double(), ref_state)


def test_inference_only_refuses_grad():
    args, kw = make_inputs(torch.float32)
    q = args[0].clone().requires_grad_()
    with pytest.raises(RuntimeError, match="argument 'query' requires grad.*inference only"):
        tot.npu_recurrent_gated_delta_rule_functional(q, *args[1:], **kw)
    with torch.no_grad():
        tot.npu_recurrent_gated_delta_rule_functional(q, *args[1:], **kw)


# ---- bad inputs: one test per rule --------------------------------------------------------------------------------

def _call(**change):
    args, kw = make_inputs(torch.float32, lens=(2, 1), accepted=(1, 1))
    names = ("query", "key", "value", "state")
    pos = {n: change.pop(n, a) for n, a in zip(names, args)}
    kw.update(change)
    return tot.npu_recurrent_gated_delta_rule(*(pos[n] for n in names), **kw)


def _t(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


BAD = {
    "query_not_3d": (dict(query=_t(3, 38)), ValueError, "argument 'query' must be 3-D"),
    "query_int": (dict(query=_t(3, 2, 19, dtype=torch.int32)), TypeError, "argument 'query' must be float16"),
    "query_no_heads": (dict(query=_t(3, 0, 19), key=_t(3, 0, 19)), ValueError, "at least one head"),
    "key_shape": (dict(key=_t(3, 2, 18)), ValueError, "argument 'key' must have shape"),
    "key_dtype": (dict(key=_t(3, 2, 19, dtype=torch.float64)), TypeError, "argument 'key' must have query's dtype"),
    "value_tokens": (dict(value=_t(4, 4, 12)), ValueError, "argument 'value' must be 3-D"),
    "value_heads": (dict(value=_t(3, 3, 12)), ValueError, "multiple of query's Nk"),
    "value_dtype": (dict(value=_t(3, 4, 12, dtype=torch.bfloat16)), TypeError, "argument 'value' must have query's"),
    "state_shape": (dict(state=_t(6, 4, 12, 18)), ValueError, r"argument 'state' must be 4-D \[slots, Nv, Dv, Dk\]"),
    "state_dtype": (dict(state=_t(6, 4, 12, 19, dtype=torch.float64)), TypeError, "argument 'state' must have"),
    "state_not_contiguous": (dict(state=_t(6, 4, 19, 12).transpose(2, 3)), ValueError,
                             "argument 'state' must be contiguous"),
    "beta_shape": (dict(beta=_t(3, 3)), ValueError, r"argument 'beta' must have shape \[3, 4\]"),
    "beta_dtype": (dict(beta=_t(3, 4, dtype=torch.int32)), TypeError, "argument 'beta' must be float16"),
    "g_shape": (dict(g=_t(3, 4, 1)), ValueError, r"argument 'g' must have shape \[3, 4\]"),
    "gk_shape": (dict(gk=_t(3, 4, 18)), ValueError, r"argument 'gk' must have shape \[3, 4, 19\]"),
    "scale_not_finite": (dict(scale=float("inf")), ValueError, "argument 'scale' must be finite"),
    "lengths_dtype": (dict(actual_seq_lengths=torch.tensor([2.0, 1.0])), TypeError,
                      "argument 'actual_seq_lengths' must be int32 or int64"),
    "lengths_not_1d": (dict(actual_seq_lengths=torch.tensor([[2, 1]])), ValueError,
                       "argument 'actual_seq_lengths' must be 1-D"),
    "length_zero": (dict(actual_seq_lengths=torch.tensor([3, 0]), num_accepted_tokens=None), ValueError,
                    "lengths >= 1"),
    "lengths_sum_short": (dict(actual_seq_lengths=torch.tensor([1, 1])), ValueError, "must sum to the token count"),
    "lengths_sum_long": (dict(actual_seq_lengths=torch.tensor([2, 2])), ValueError, "must sum to the token count"),
    "indices_length": (dict(ssm_state_indices=torch.tensor([0, 1])), ValueError,
                       r"argument 'ssm_state_indices' must be 1-D \[T\]"),
    "indices_out_of_range": (dict(ssm_state_indices=torch.tensor([0, 6, 1])), ValueError,
                             r"argument 'ssm_state_indices' must lie in \[0, state.size\(0\) = 6\)"),
    "indices_negative": (dict(ssm_state_indices=torch.tensor([0, -1, 1])), ValueError,
                         "argument 'ssm_state_indices' must lie in"),
    "indices_repeated": (dict(ssm_state_indices=torch.tensor([4, 2, 4])), ValueError,
                         "must hold distinct slots.*slot 4"),
    "default_indices_beyond_cache": (dict(state=_t(2, 4, 12, 19), ssm_state_indices=None), ValueError,
                                     "the default is the token's position"),
    "accepted_length": (dict(num_accepted_tokens=torch.tensor([1])), ValueError,
                        r"argument 'num_accepted_tokens' must be 1-D \[B\]"),
    "accepted_zero": (dict(num_accepted_tokens=torch.tensor([0, 1])), ValueError,
                      r"must lie in \[1, actual_seq_lengths\[i\]\]"),
    "accepted_beyond_length": (dict(num_accepted_tokens=torch.tensor([1, 2])), ValueError,
                               r"got 2 for sequence 1 of length 1"),
    "tensor_argument_type": (dict(beta=[0.5] * 3), TypeError, "argument 'beta' must be a Tensor or None"),
}


@pytest.mark.asan
@pytest.mark.parametrize("rule", sorted(BAD))
def test_bad_input(rule):
    change, exc, pattern = BAD[rule]
    with pytest.raises(exc, match=pattern):
        _call(**change)


def test_bad_input_functional_names_its_op():
    with pytest.raises(ValueError, match="recurrent_gated_delta_rule_functional: argument 'ssm_state_indices'"):
        args, kw = make_inputs(torch.float32, lens=(2, 1))
        tot.npu_recurrent_gated_delta_rule_functional(*args, **dict(kw, ssm_state_indices=torch.tensor([1, 1, 0])))
