"""Dropout: the keep mask of dropout_gen_mask (statistics, counter-based addressing), forward and backward against
the reference built from that mask, and reproducibility from seed/offset."""
import math

import pytest
import torch

from test.attention.attention_cases import OPS, Case, compare_with_reference, make_inputs, run_ours
from torch_ops_transformer import npu_fusion_attention


def _gen(seed, offset, rows, cols, keep_prob):
    return OPS.dropout_gen_mask(torch.tensor(seed), torch.tensor(offset), rows, cols, keep_prob)


@pytest.mark.parametrize("keep_prob", [0.1, 0.5, 0.9])
def test_keep_fraction(keep_prob):
    keep = _gen(123, 0, 400, 500, keep_prob)
    assert keep.dtype == torch.bool and keep.shape == (400, 500)
    n = keep.numel()
    sigma = math.sqrt(keep_prob * (1 - keep_prob) / n)
    frac = keep.float().mean().item()
    assert abs(frac - keep_prob) < 5 * sigma, f"kept fraction {frac} for keep_prob {keep_prob}"
    # no structure by row or column: each row's and column's fraction stays within 6 sigma of its own size
    for axis, size in ((1, 500), (0, 400)):
        dev = (keep.float().mean(axis) - keep_prob).abs().max().item()
        assert dev < 6 * math.sqrt(keep_prob * (1 - keep_prob) / size)


def test_keep_prob_one_keeps_everything():
    assert _gen(5, 0, 17, 33, 1.0).all()


def test_mask_is_a_function_of_seed_offset_row_and_column():
    base = _gen(99, 0, 40, 70, 0.5)
    assert torch.equal(base, _gen(99, 0, 40, 70, 0.5))
    assert not torch.equal(base, _gen(100, 0, 40, 70, 0.5))
    # row r draws from stream offset + r; column c does not depend on how many columns are asked for
    assert torch.equal(_gen(99, 3, 37, 70, 0.5), base[3:])
    assert torch.equal(_gen(99, 0, 40, 13, 0.5), base[:, :13])
    assert _gen(99, 0, 0, 5, 0.5).shape == (0, 5)


DROPOUT_CASES = {
    "BSND_gqa": Case(layout="BSND", keep_prob=0.7),
    "BNSD_causal_offset": Case(layout="BNSD", keep_prob=0.6, sparse_mode=3, dropout_offset=12345),
    "BSH_pse": Case(layout="BSH", keep_prob=0.8, pse="BN1S", dtype="bf16"),
    "SBH_mask": Case(layout="SBH", keep_prob=0.5, mask="B1SS", dtype="fp16"),
    "TND_varlen": Case(layout="TND", keep_prob=0.75, seqlens=((5, 0, 1, 70, 9), (7, 3, 1, 65, 0)), sparse_mode=3),
    "BSND_vd": Case(layout="BSND", keep_prob=0.9, head_dim=16, v_head_dim=8, kv_heads=1),
}


@pytest.mark.parametrize("name", list(DROPOUT_CASES))
def test_forward_and_backward_match_reference_with_the_generated_mask(name):
    """The forward equals the reference built with dropout_gen_mask(seed_out, offset_out); the backward regenerates
    the same mask (its gradients match the reference's with that mask)."""
    compare_with_reference(DROPOUT_CASES[name])


def test_drawn_seed_is_returned_and_used():
    """Without a seed the op draws one from the default generator and returns it; the result equals a call with
    that seed passed explicitly."""
    args = make_inputs(Case(keep_prob=0.7))
    args.pop("seed")
    args.pop("offset")
    first = OPS.flash_attention_score(**args)
    again = OPS.flash_attention_score(**args, seed=first[4], offset=first[5])
    assert torch.equal(first[0], again[0])
    torch.manual_seed(42)
    a = OPS.flash_attention_score(**args)
    torch.manual_seed(42)
    b = OPS.flash_attention_score(**args)
    assert torch.equal(a[4], b[4]) and torch.equal(a[0], b[0])


def _dropout_call(seed, offset=0):
    args = make_inputs(Case(keep_prob=0.7))
    args["seed"], args["offset"] = torch.tensor(seed), torch.tensor(offset)
    return run_ours(args)


def test_same_seed_identical_different_seed_different():
    a, b = _dropout_call(11), _dropout_call(11)
    assert torch.equal(a.out, b.out)
    for name in a.grads:
        assert torch.equal(a.grads[name], b.grads[name]), name
    assert not torch.allclose(a.out, _dropout_call(12).out)
    assert not torch.allclose(a.out, _dropout_call(11, offset=1).out)


def test_wrapper_seed_follows_torch_manual_seed():
    q, k, v = (torch.randn(2, 9, 4, 16) for _ in range(3))

    def run(seed):
        torch.manual_seed(seed)
        return npu_fusion_attention(q, k, v, 4, "BSND", keep_prob=0.6, scale=0.25)

    a, b, c = run(1), run(1), run(2)
    assert a[4] == b[4] and torch.equal(a[0], b[0])
    assert a[4] != c[4] and not torch.allclose(a[0], c[0])


def test_statistics_ignore_dropout():
    """softmax_max/sum describe the undropped probabilities: equal with and without dropout."""
    args = make_inputs(Case(keep_prob=0.5))
    with_dropout = OPS.flash_attention_score(**args)
    args.update(keep_prob=1.0, seed=None, offset=None)
    without = OPS.flash_attention_score(**args)
    torch.testing.assert_close(with_dropout[1], without[1])
    torch.testing.assert_close(with_dropout[2], without[2])
