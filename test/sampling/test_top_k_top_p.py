"""npu_top_k_top_p: per-row top-k and top-p filtering of logits, against a float64 reference of upstream's
definition (ascending stable sort; k-th largest threshold with ties kept; nucleus from cumulative softmax sums of
the smallest). The reference's float64 sums decide every position except those whose sum lies within 1e-5 of the
bound 1 - p, where fp32 rounding may decide either way; kept logits are returned bit-exactly."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.doc_examples import run_examples
from test.common.tiers import pairwise

OPS = torch.ops.npu_fa
NEG = float("-inf")


def ref_top_k_top_p(logits, p, k, dtype=torch.float64):
    """(kept mask, distance of each position's cumulative sum from 1 - p) in `dtype`."""
    x = logits.to(dtype)
    srt, idx = x.sort(dim=-1, stable=True)
    keep = torch.ones_like(srt, dtype=torch.bool)
    margin = torch.full_like(srt, float("inf"))
    if k is not None:
        kth = srt.gather(1, (x.shape[1] - k.long())[:, None])
        keep &= srt >= kth
    if p is not None:
        masked = srt.masked_fill(~keep, NEG)
        cums = masked.softmax(-1).cumsum(-1)
        bound = (1 - p).to(dtype)[:, None]
        drop = cums <= bound
        drop[:, -1] = False
        keep &= ~drop
        margin = (cums - bound).abs()
        margin[:, -1] = float("inf")
    out_keep = torch.empty_like(keep).scatter_(1, idx, keep)
    out_margin = torch.empty_like(margin).scatter_(1, idx, margin)
    return out_keep, out_margin


def check(logits, p, k, ours):
    keep, margin = ref_top_k_top_p(logits, p, k)
    assert ours.shape == logits.shape and ours.dtype == logits.dtype
    decided = margin > 1e-5
    ours_keep = ours != NEG
    assert torch.equal(ours_keep[decided], keep[decided])
    assert torch.equal(ours[ours_keep], logits[ours_keep])  # kept logits untouched


AXES = {"dtype": {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16},
        "filters": ("k", "p", "k+p"), "vocab": (1, 37, 3000), "ties": (False, True)}


@pytest.mark.asan
@pytest.mark.parametrize("dtype,filters,vocab,ties", pairwise(**AXES))
def test_top_k_top_p_matches_reference(dtype, filters, vocab, ties):
    g = torch.Generator().manual_seed(vocab)
    B = 6
    logits = torch.randn(B, vocab, generator=g, dtype=torch.float64) * 3
    if ties:
        logits = logits.round()  # many equal logits: thresholds and the stable order matter
    logits = logits.to(dtype)
    k = torch.randint(1, vocab + 1, (B,), generator=g, dtype=torch.int32) if "k" in filters else None
    p = torch.rand(B, generator=g).to(dtype) if "p" in filters else None
    if p is not None:
        p[0], p[-1] = 0.0, 1.0
    if k is not None:
        k[0], k[-1] = 1, vocab
    check(logits, p, k, tot.npu_top_k_top_p(logits, p, k))


def test_noncontiguous_logits_and_int64_k():
    logits = torch.randn(50, 8).t()
    k = torch.tensor([1, 3, 50, 7, 2, 9, 4, 11])
    p = torch.rand(16)[::2]
    check(logits, p, k, tot.npu_top_k_top_p(logits, p, k))


def test_p_zero_keeps_the_last_maximum_in_stable_order():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    out = tot.npu_top_k_top_p(logits, torch.tensor([0.0]), None)
    assert out.tolist() == [[NEG, NEG, 3.0, NEG]]


def test_k_keeps_ties_with_the_kth_largest():
    logits = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.5]])
    out = tot.npu_top_k_top_p(logits, None, torch.tensor([2], dtype=torch.int32))
    assert out.tolist() == [[NEG, 2.0, 2.0, 2.0, NEG]]


def test_no_filter_is_a_copy():
    logits = torch.randn(2, 5)
    out = tot.npu_top_k_top_p(logits)
    assert torch.equal(out, logits) and out.data_ptr() != logits.data_ptr()


def test_sampling_step_compiles_fullgraph():
    """A serving loop's sampling step: filter, softmax, draw; one graph, no recompiles for new k and p."""
    def step(logits, p, k):
        return torch.softmax(tot.npu_top_k_top_p(logits, p, k), -1)

    f = torch.compile(step, fullgraph=True, dynamic=True)
    for B in (3, 5):
        logits = torch.randn(B, 64)
        p, k = torch.rand(B), torch.randint(1, 64, (B,), dtype=torch.int32)
        torch.testing.assert_close(f(logits, p, k), step(logits, p, k))


# ---- bad inputs: one test per rule --------------------------------------------------------------------------------
def test_bad_logits_rank():
    with pytest.raises(ValueError, match="argument 'logits' must be 2-D"):
        tot.npu_top_k_top_p(torch.randn(5), None, torch.tensor([1], dtype=torch.int32))


def test_bad_logits_dtype():
    with pytest.raises(TypeError, match="argument 'logits' must be float32"):
        tot.npu_top_k_top_p(torch.ones(2, 5, dtype=torch.int32), None, torch.tensor([1, 1], dtype=torch.int32))


def test_bad_k_shape():
    with pytest.raises(ValueError, match=r"argument 'k' must be 1-D \[batch\] = \[2\]"):
        tot.npu_top_k_top_p(torch.randn(2, 5), None, torch.tensor([1, 2, 3], dtype=torch.int32))


def test_bad_k_dtype():
    with pytest.raises(TypeError, match="argument 'k' must be int32 or int64"):
        tot.npu_top_k_top_p(torch.randn(2, 5), None, torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("value", [0, 6])
def test_bad_k_range(value):
    with pytest.raises(ValueError, match=r"argument 'k' must lie in \[1, vocab=5\]"):
        tot.npu_top_k_top_p(torch.randn(2, 5), None, torch.tensor([1, value], dtype=torch.int32))


def test_bad_p_shape():
    with pytest.raises(ValueError, match=r"argument 'p' must be 1-D \[batch\] = \[2\]"):
        tot.npu_top_k_top_p(torch.randn(2, 5), torch.rand(3), None)


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_bad_p_range(value):
    with pytest.raises(ValueError, match=r"argument 'p' must lie in \[0, 1\]"):
        tot.npu_top_k_top_p(torch.randn(2, 5), torch.tensor([0.5, value]), None)


def test_bad_p_dtype():
    with pytest.raises(TypeError, match="argument 'p' .* must have the dtype of 'logits'"):
        tot.npu_top_k_top_p(torch.randn(2, 5), torch.rand(2, dtype=torch.float64), None)


def test_doc_example_npu_top_k_top_p():
    run_examples("sampling.md", "npu_top_k_top_p")
