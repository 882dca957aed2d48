"""Adversarial index arguments of recurrent_gated_delta_rule (the property of test/properties/test_index_arguments.py):
a valid speculative-decoding call with actual_seq_lengths, ssm_state_indices or num_accepted_tokens replaced by a
mutation of it (out of range, negative, huge, duplicated, shuffled, wrong dtype or shape, strided) must raise an
error naming an index argument and leave the state cache untouched, or return what the float64 reference computes
from the mutated argument."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test.common.reference import check_tolerance
from test.linear_attention.recurrent_gated_delta_rule_reference import recurrent_reference
from test.linear_attention.test_recurrent_gated_delta_rule import make_inputs
from test.properties.strategies import examples, seeds
from test.properties.test_index_arguments import Invalid, expect, ints, mutated

OPS = torch.ops.npu_fa
ARGS = ("actual_seq_lengths", "ssm_state_indices", "num_accepted_tokens")


def _valid(kw, T, slots):
    """The model of the three index rules (native_functions.yaml): raises Invalid for a broken one."""
    lens = ints(kw["actual_seq_lengths"], "actual_seq_lengths")
    if lens.dim() != 1 or (lens < 1).any() or int(lens.sum()) != T:
        raise Invalid(f"actual_seq_lengths = {lens.tolist()}")
    idx = ints(kw["ssm_state_indices"], "ssm_state_indices")
    if idx.dim() != 1 or idx.numel() != T or ((idx < 0) | (idx >= slots)).any() or idx.unique().numel() != T:
        raise Invalid(f"ssm_state_indices = {idx.tolist()}")
    acc = ints(kw["num_accepted_tokens"], "num_accepted_tokens")
    if acc.dim() != 1 or acc.numel() != lens.numel() or (acc < 1).any() or (acc > lens).any():
        raise Invalid(f"num_accepted_tokens = {acc.tolist()}")


@settings(max_examples=examples(60))
@given(data=st.data(), seed=seeds)
def test_index_arguments(data, seed):
    draw = data.draw
    lens = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    accepted = [draw(st.integers(1, n)) for n in lens]
    T = sum(lens)
    slots = T + draw(st.integers(0, 2))
    (q, k, v, state), kw = make_inputs(torch.float32, lens=tuple(lens), Nk=1, Nv=2, Dk=5, Dv=3, slots=slots,
                                       accepted=tuple(accepted), seed=seed)
    name = draw(st.sampled_from(ARGS))
    valid = kw[name].tolist()
    hi = slots if name == "ssm_state_indices" else max(lens)
    kw[name] = draw(mutated(valid, 0, hi))
    cache = state.clone()

    def model():
        _valid(kw, T, slots)
        return recurrent_reference(q, k, v, state, **kw), recurrent_reference(q, k, v, state, **kw,
                                                                                dtype=torch.float32)

    def compare(got, want):
        (ref_out, ref_state), (same_out, same_state) = want
        check_tolerance("out", got, ref_out, same_out)
        check_tolerance("state", cache, ref_state, same_state)

    # a mutated length can break the accepted counts' rule instead: either name is a clean error
    names = [name, "num_accepted_tokens"] if name == "actual_seq_lengths" else [name]
    expect(lambda: OPS.recurrent_gated_delta_rule(q, k, v, cache, **kw), names, model, compare, untouched=(cache,))
