"""npu_chunk_gated_delta_rule's argument rules: one test per rule, each error naming the argument, what is expected
and what was given (ValueError for values and shapes, TypeError for dtypes and Python types)."""
import pytest
import torch

import torch_ops_transformer as tot
from test.linear_attention.chunk_gated_delta_rule_reference import make_inputs

OPS = torch.ops.npu_fa


def call(**over):
    inp = make_inputs([5, 3], Nk=1, Nv=2, Dk=8, Dv=4)
    inp.update(over)
    return tot.npu_chunk_gated_delta_rule(inp["query"], inp["key"], inp["value"], beta=inp["beta"],
                                          initial_state=inp["initial_state"],
                                          actual_seq_lengths=inp["actual_seq_lengths"], scale=inp["scale"],
                                          g=inp["g"])


def test_query_must_be_floating():
    with pytest.raises(TypeError, match="'query' must be float32, float16, bfloat16 or float64; got Int"):
        q = torch.ones(8, 1, 8, dtype=torch.int32)
        call(query=q, key=q, value=torch.ones(8, 2, 4, dtype=torch.int32))


def test_query_key_value_share_one_dtype():
    with pytest.raises(TypeError, match="'query', 'key' and 'value' must have one dtype; got Float, Float and Double"):
        call(value=torch.randn(8, 2, 4, dtype=torch.float64))


def test_query_must_be_tnd():
    with pytest.raises(ValueError, match=r"'query' must be 3-D \[T, Nk, Dk\] \(TND\); got shape \[1, 8, 1, 8\]"):
        call(query=torch.randn(1, 8, 1, 8))


def test_key_must_have_query_shape():
    with pytest.raises(ValueError, match=r"'key' must have query's shape \[8, 1, 8\]; got \[8, 1, 6\]"):
        call(key=torch.randn(8, 1, 6))


def test_value_must_have_query_tokens():
    with pytest.raises(ValueError, match=r"'value' must be 3-D \[T, Nv, Dv\] with query's T = 8; got shape \[7, 2, 4\]"):
        call(value=torch.randn(7, 2, 4))


def test_value_heads_are_a_multiple_of_key_heads():
    with pytest.raises(ValueError, match=r"value heads \(value.size\(1\) = 3\) must be a positive multiple of the key "
                                         r"heads \(query.size\(1\) = 2\)"):
        call(query=torch.randn(8, 2, 8), key=torch.randn(8, 2, 8), value=torch.randn(8, 3, 4), beta=None, g=None,
             initial_state=None)


@pytest.mark.parametrize("name", ["beta", "g"])
def test_beta_and_g_are_t_by_nv(name):
    with pytest.raises(ValueError, match=rf"'{name}' must be \[T, Nv\] = \[8, 2\]; got shape \[8, 1\]"):
        call(**{name: torch.rand(8, 1)})


@pytest.mark.parametrize("name", ["beta", "g"])
def test_beta_and_g_are_floating(name):
    with pytest.raises(TypeError, match=rf"'{name}' must be float32, float16, bfloat16 or float64; got Long"):
        call(**{name: torch.ones(8, 2, dtype=torch.long)})


def test_lengths_must_be_integers():
    with pytest.raises(TypeError, match="'actual_seq_lengths' must be int32 or int64; got Float"):
        call(actual_seq_lengths=torch.tensor([5.0, 3.0]))


def test_lengths_must_be_one_dimensional():
    with pytest.raises(ValueError, match=r"'actual_seq_lengths' must be 1-D \[B\] \(one length per sequence\); got "
                                         r"shape \[1, 2\]"):
        call(actual_seq_lengths=torch.tensor([[5, 3]]))


def test_lengths_must_not_be_negative():
    with pytest.raises(ValueError, match=r"'actual_seq_lengths' must hold lengths >= 0 summing to T = 8 "
                                         r"\(query.size\(0\)\); got -1 for sequence 0"):
        call(actual_seq_lengths=[-1, 9])


def test_lengths_must_sum_to_t():
    with pytest.raises(ValueError, match=r"'actual_seq_lengths' must sum to T = 8 \(query.size\(0\)\); got 7"):
        call(actual_seq_lengths=[5, 2])
    with pytest.raises(ValueError, match="'actual_seq_lengths' must hold lengths >= 0 summing to T = 8"):
        call(actual_seq_lengths=[5, 4])


def test_initial_state_shape():
    with pytest.raises(ValueError, match=r"'initial_state' must be \[B, Nv, Dv, Dk\] = \[2, 2, 4, 8\]; got shape "
                                         r"\[2, 2, 8, 4\]"):
        call(initial_state=torch.randn(2, 2, 8, 4))


def test_initial_state_is_floating():
    with pytest.raises(TypeError, match="'initial_state' must be float32, float16, bfloat16 or float64; got Int"):
        call(initial_state=torch.zeros(2, 2, 4, 8, dtype=torch.int32))


def test_scale_must_be_finite():
    with pytest.raises(ValueError, match="'scale' must be finite; got nan"):
        call(scale=float("nan"))


def test_scale_must_be_a_number():
    with pytest.raises(TypeError, match="npu_chunk_gated_delta_rule: argument 'scale' must be a float or None; got str"):
        call(scale="0.5")


@pytest.mark.parametrize("name", ["beta", "initial_state", "g"])
def test_optional_tensors_must_be_tensors(name):
    with pytest.raises(TypeError, match=rf"argument '{name}' must be a Tensor or None; got list"):
        call(**{name: [1.0]})


def test_query_must_be_a_tensor():
    with pytest.raises(TypeError, match="argument 'query' must be a Tensor; got list"):
        call(query=[1.0])


def _backward(**over):
    inp = make_inputs([5, 3], Nk=1, Nv=2, Dk=8, Dv=4)
    kw = dict(d_out=torch.randn(8, 2, 4), d_final_state=torch.randn(2, 2, 4, 8))
    kw.update(over)
    return OPS.chunk_gated_delta_rule_backward(kw["d_out"], kw["d_final_state"], inp["query"], inp["key"],
                                               inp["value"], inp["beta"], inp["initial_state"],
                                               inp["actual_seq_lengths"], inp["scale"], inp["g"])


def test_backward_d_out_shape():
    with pytest.raises(ValueError, match=r"'d_out' must have value's shape \[8, 2, 4\]; got \[8, 2, 3\]"):
        _backward(d_out=torch.randn(8, 2, 3))


def test_backward_d_out_dtype():
    with pytest.raises(TypeError, match="'d_out' must have value's dtype Float; got BFloat16"):
        _backward(d_out=torch.randn(8, 2, 4, dtype=torch.bfloat16))


def test_backward_d_final_state_shape():
    with pytest.raises(ValueError, match=r"'d_final_state' must be \[B, Nv, Dv, Dk\] = \[2, 2, 4, 8\]; got shape "
                                         r"\[1, 2, 4, 8\]"):
        _backward(d_final_state=torch.randn(1, 2, 4, 8))
