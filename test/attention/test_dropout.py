"""Dropout: the keep mask of dropout_gen_mask (statistics, counter-based addressing), forward and backward against
the reference built from that mask, reproducibility from seed/offset, and the torch_npu interface: an explicit
dropout_mask made by _npu_dropout_gen_mask, the seed/offset ints of npu_fusion_attention(_grad)."""
import math

import numpy as np
import pytest
import torch

from test.attention.attention_cases import OPS, Case, compare_with_reference, make_inputs, run_ours
from test.common.reference import attention_reference, check_tolerance, reference_with_grads
from torch_ops_transformer import npu_fusion_attention, npu_fusion_attention_grad
from torch_ops_transformer.attention import _npu_dropout_gen_mask


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


def test_mask_is_a_function_of_seed_offset_and_element_index():
    base = _gen(99, 0, 40, 70, 0.5)
    assert torch.equal(base, _gen(99, 0, 40, 70, 0.5))
    assert not torch.equal(base, _gen(100, 0, 40, 70, 0.5))
    # element (r, c) is element r*cols + c of one flattened stream: the matrix shape does not matter
    assert torch.equal(_gen(99, 0, 1, 40 * 70, 0.5).view(40, 70), base)
    assert torch.equal(_gen(99, 0, 40 * 70, 1, 0.5).view(40, 70), base)
    assert torch.equal(_gen(99, 0, 3, 70, 0.5), base[:3])
    # the offset selects another, independent subsequence (no shifted copy of the same stream)
    other = _gen(99, 4, 40, 70, 0.5)
    assert not torch.equal(other.view(-1)[:-4], base.view(-1)[4:]) and not torch.equal(other, base)
    assert (other == base).float().mean().item() < 0.6
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


# ---------------------------------------------------------------- the torch_npu interface: dropout_mask, seed, offset
def _qkv(layout="BSH", b=2, n=4, sq=9, skv=14, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = {"BSH": lambda s: (b, s, n * d), "BNSD": lambda s: (b, n, s, d)}[layout]
    return (torch.randn(shape(sq), generator=g), torch.randn(shape(skv), generator=g),
            torch.randn(shape(skv), generator=g))


def test_npu_dropout_gen_mask_packs_the_stream_lsb_first():
    """_npu_dropout_gen_mask(p) = the op's keep mask for keep_prob = 1 - p, bit e of byte e // 8 (LSB first),
    padded with zero bits to a multiple of 128, on self's device; every size shape of the same element count gives
    the same bytes."""
    mask = _npu_dropout_gen_mask(torch.empty(1), [2, 4, 9, 14], p=0.3, seed=123, offset=8)
    numel = 2 * 4 * 9 * 14
    assert mask.dtype == torch.uint8 and mask.shape == ((numel + 127) // 128 * 16,)
    bits = ((mask.view(-1, 1) >> torch.arange(8)) & 1).view(-1)
    keep = _gen(123, 8, 1, numel, 0.7).view(-1)
    assert torch.equal(bits[:numel].bool(), keep) and not bits[numel:].any()
    assert torch.equal(mask, _npu_dropout_gen_mask(torch.empty(3), [numel], 0.3, 123, 8, parallel=False, sync=True))
    # int[] as torch's bindings parse it: 0-d integer tensors and numpy integers count as ints
    assert torch.equal(mask, _npu_dropout_gen_mask(torch.empty(1), [torch.tensor(numel)], 0.3, 123, 8))
    assert torch.equal(mask, _npu_dropout_gen_mask(torch.empty(1), (np.int64(2), 4, 9, 14), 0.3, 123, 8))
    assert not _npu_dropout_gen_mask(torch.empty(1), [5, 7], 1.0, 1, 0).any()
    assert _npu_dropout_gen_mask(torch.empty(1), [5, 7], 0.0, 1, 0).view(-1)[:4].eq(255).all()


@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
def test_external_dropout_mask_is_the_internal_mask_of_the_same_seed(layout):
    """A mask from _npu_dropout_gen_mask(seed, offset) gives exactly the output of the internal generation with that
    seed/offset; the returned seed/offset echo the ones given, numels is B*N*Sq*Skv."""
    q, k, v = _qkv(layout)
    mask = _npu_dropout_gen_mask(q, [2, 4, 9, 14], p=0.25, seed=77, offset=12)
    ext = npu_fusion_attention(q, k, v, 4, layout, scale=0.25, keep_prob=0.75, dropout_mask=mask, seed=77, offset=12)
    internal = npu_fusion_attention(q, k, v, 4, layout, scale=0.25, keep_prob=0.75, seed=77, offset=12)
    assert torch.equal(ext[0], internal[0])
    assert ext[4:] == internal[4:] == (77, 12, 2 * 4 * 9 * 14)
    # the mask really is used: another mask gives another output, all-ones gives no dropout but the 1/keep_prob scale
    other = npu_fusion_attention(q, k, v, 4, layout, scale=0.25, keep_prob=0.75,
                                 dropout_mask=_npu_dropout_gen_mask(q, [2, 4, 9, 14], 0.25, 78, 12))
    assert not torch.allclose(other[0], ext[0])
    ones = torch.full_like(mask, 255)
    scaled = npu_fusion_attention(q, k, v, 4, layout, scale=0.25, keep_prob=0.75, dropout_mask=ones)[0]
    plain = npu_fusion_attention(q, k, v, 4, layout, scale=0.25)[0]
    torch.testing.assert_close(scaled, plain / 0.75)


def test_external_dropout_mask_forward_and_backward_match_reference():
    """Forward and autograd backward with an external mask against the float64 reference built from its bits; the
    torch_npu grad with the mask's seed/offset regenerates the same mask."""
    q, k, v = (t.requires_grad_() for t in _qkv("BNSD", seed=3))
    mask = _npu_dropout_gen_mask(q, [2, 4, 9, 14], p=0.4, seed=5, offset=0)
    out, smax, ssum, _, seed, offset, numels = npu_fusion_attention(q, k, v, 4, "BNSD", scale=0.25, keep_prob=0.6,
                                                                    dropout_mask=mask, seed=5)
    keep = ((mask.view(-1, 1) >> torch.arange(8)) & 1).view(-1)[:numels]
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    ref = reference_with_grads({"query": q, "key": k, "value": v}, dy, torch.float64, head_num=4,
                               input_layout="BNSD", scale=0.25, keep_prob=0.6, dropout_keep=keep)
    same = reference_with_grads({"query": q, "key": k, "value": v}, dy, None, head_num=4, input_layout="BNSD",
                                scale=0.25, keep_prob=0.6, dropout_keep=keep)
    check_tolerance("out", out, ref[0], same[0])
    got = torch.autograd.grad(out, (q, k, v), dy)
    for name, g in zip(("query", "key", "value"), got):
        check_tolerance(f"d{name}", g, ref[2][name], same[2][name])
    again = npu_fusion_attention_grad(q.detach(), k.detach(), v.detach(), dy, 4, "BNSD", softmax_max=smax,
                                      softmax_sum=ssum, attention_in=out.detach(), scale_value=0.25, keep_prob=0.6,
                                      seed=seed, offset=offset, numels=numels)
    for g, w in zip(again[:3], got):
        assert torch.equal(g, w)


def test_tnd_mask_order_is_per_sequence_head_major():
    """TND: sequence b uses the next N*Sq_b*Skv_b elements of the flattened mask as an [N, Sq_b, Skv_b] block
    (torch_npu's order, numels = N * sum(Sq_b * Skv_b))."""
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(7, 2, 8, generator=g), torch.randn(9, 2, 8, generator=g), torch.randn(9, 2, 8, generator=g)
    lens = dict(actual_seq_qlen=[3, 7], actual_seq_kvlen=[4, 9])
    numels = 2 * (3 * 4 + 4 * 5)
    keep = torch.rand(numels, generator=g) < 0.6
    packed = torch.zeros((numels + 127) // 128 * 16, dtype=torch.uint8)
    for e in keep.nonzero().view(-1).tolist():
        packed[e // 8] |= 1 << (e % 8)
    res = npu_fusion_attention(q, k, v, 2, "TND", scale=0.3, keep_prob=0.6, dropout_mask=packed, **lens)
    assert res[6] == numels
    ref, _ = attention_reference(q, k, v, 2, "TND", scale=0.3, keep_prob=0.6, dropout_keep=keep, **lens)
    torch.testing.assert_close(res[0].double(), ref, rtol=1e-5, atol=1e-5)
    # the same bits as the internal stream: _npu_dropout_gen_mask over [numels] with the seed used
    gen = _npu_dropout_gen_mask(q, [numels], 0.4, 31, 4)
    assert torch.equal(npu_fusion_attention(q, k, v, 2, "TND", keep_prob=0.6, dropout_mask=gen, **lens)[0],
                       npu_fusion_attention(q, k, v, 2, "TND", keep_prob=0.6, seed=31, offset=4, **lens)[0])


def test_seed_and_offset_ints():
    """seed 0 draws a seed from torch's default generator (offset as given); a nonzero seed is used as given and the
    result is reproducible; keep_prob 1 echoes the given seed/offset; numels is B*N*Sq*Skv whatever keep_prob is."""
    q, k, v = _qkv()
    a = npu_fusion_attention(q, k, v, 4, "BSH", keep_prob=0.7, seed=1234, offset=40)
    b = npu_fusion_attention(q, k, v, 4, "BSH", keep_prob=0.7, seed=1234, offset=40)
    assert a[4:] == (1234, 40, 2 * 4 * 9 * 14) and torch.equal(a[0], b[0])
    assert not torch.allclose(a[0], npu_fusion_attention(q, k, v, 4, "BSH", keep_prob=0.7, seed=1234, offset=44)[0])
    drawn = npu_fusion_attention(q, k, v, 4, "BSH", keep_prob=0.7, offset=8)
    assert drawn[4] != 0 and drawn[5] == 8
    assert torch.equal(drawn[0], npu_fusion_attention(q, k, v, 4, "BSH", keep_prob=0.7, seed=drawn[4], offset=8)[0])
    assert npu_fusion_attention(q, k, v, 4, "BSH", seed=5, offset=6)[4:] == (5, 6, 2 * 4 * 9 * 14)
    assert npu_fusion_attention(q, k, v, 4, "BSH")[4:] == (0, 0, 2 * 4 * 9 * 14)


def test_grad_with_the_same_seed_regenerates_the_mask():
    q, k, v = (t.requires_grad_() for t in _qkv(seed=2))
    out, smax, ssum, _, seed, offset, numels = npu_fusion_attention(q, k, v, 4, "BSH", scale=0.25, keep_prob=0.5,
                                                                    seed=99, offset=3)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    want = torch.autograd.grad(out, (q, k, v), dy)
    got = npu_fusion_attention_grad(q.detach(), k.detach(), v.detach(), dy, 4, "BSH", softmax_max=smax,
                                    softmax_sum=ssum, attention_in=out.detach(), scale_value=0.25, keep_prob=0.5,
                                    seed=99, offset=3)
    for g, w in zip(got[:3], want):
        assert torch.equal(g, w)
    wrong = npu_fusion_attention_grad(q.detach(), k.detach(), v.detach(), dy, 4, "BSH", softmax_max=smax,
                                      softmax_sum=ssum, attention_in=out.detach(), scale_value=0.25, keep_prob=0.5,
                                      seed=99, offset=4)
    assert not torch.allclose(wrong[0], want[0])


@pytest.mark.parametrize("kw, exc, words", [
    (dict(dropout_mask=torch.zeros(10, dtype=torch.uint8)), ValueError, ("'dropout_mask'", "bits")),
    (dict(dropout_mask=torch.zeros(1008, dtype=torch.bool)), TypeError, ("'dropout_mask'", "uint8")),
    (dict(seed=1.5), TypeError, ("'seed'",)),
    (dict(offset=2**63), ValueError, ("'offset'", "int64")),
    (dict(gen_mask_parallel=1), TypeError, ("'gen_mask_parallel'",)),
    (dict(sync=None), TypeError, ("'sync'",)),
])
def test_bad_dropout_arguments_are_rejected(kw, exc, words):
    q, k, v = _qkv()
    with pytest.raises(exc) as e:
        npu_fusion_attention(q, k, v, 4, "BSH", keep_prob=0.7, **kw)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("kw, exc, words", [
    (dict(size=[2, -1], p=0.5), ValueError, ("'size'",)),
    (dict(size=[2.0], p=0.5), TypeError, ("'size'",)),
    (dict(size=[torch.tensor(2.0)], p=0.5), TypeError, ("'size'",)),
    (dict(size=[True], p=0.5), TypeError, ("'size'",)),
    (dict(size=[4], p=1.5), ValueError, ("'p'", "[0, 1]")),
    (dict(size=[4], p=0.5, parallel="yes"), TypeError, ("'parallel'",)),
])
def test_bad_npu_dropout_gen_mask_arguments_are_rejected(kw, exc, words):
    with pytest.raises(exc) as e:
        _npu_dropout_gen_mask(torch.empty(1), seed=1, offset=0, **kw)
    assert all(w in str(e.value) for w in words), str(e.value)
