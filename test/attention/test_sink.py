"""sink: one extra logit per head in every softmax row, compared with the scaled scores, whose value row is 0.

Forward, softmax statistics and gradients (dq, dk, dv, dpse and dsink) against the float64 reference of
test/common/reference.py (which appends the sink column, takes the softmax and drops that column before the product
with V, as torch_npu's documentation example does), gradcheck, the edge values of the sink (-inf, huge, NaN), rows that
see no key, dropout, and the torch_npu wrappers (npu_fusion_attention(_grad)).
"""
import math

import pytest
import torch

from test.attention.attention_cases import OPS, Case, compare_with_reference, dy_like, make_inputs
from test.common.reference import attention_reference, check_tolerance
from torch_ops_transformer import npu_fusion_attention, npu_fusion_attention_grad

CASES = {
    "BSND_gqa": Case(sink="random"),
    "BNSD_fp16_causal": Case(layout="BNSD", dtype="fp16", sink="random", sparse_mode=3),
    "BSH_bf16_pse": Case(layout="BSH", dtype="bf16", sink="random", pse="BNSS"),
    "SBH_mask_fully_masked_row": Case(layout="SBH", sink="random", mask="B1SS"),
    "BSND_band_mode4": Case(sink="random", sparse_mode=4, pre_tokens=3, next_tokens=1),
    "TND_varlen_empty_sequences": Case(layout="TND", sink="random", seqlens=((5, 0, 3, 9), (4, 6, 0, 11)),
                                       sparse_mode=2),
    "TND_softmax_layout_TND": Case(layout="TND", sink="random", seqlens=((3, 7), (5, 7)), softmax_layout="TND"),
    "BSND_dropout": Case(sink="random", keep_prob=0.7),
    "TND_dropout": Case(layout="TND", sink="random", keep_prob=0.8, seqlens=((4, 6), (7, 2))),
    "BNSD_sink_minus_inf_head": Case(layout="BNSD", sink="-inf"),
    "BSND_dominant_sink_head": Case(sink="large"),
    "BSND_vd_mqa": Case(sink="random", kv_heads=1, head_dim=16, v_head_dim=8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_gradients_match_float64_reference(name):
    """out, logsumexp (the statistics include the sink), dq/dk/dv/dpse and dsink under the tolerance rule."""
    ours = compare_with_reference(CASES[name])
    assert "sink" in ours.grads and ours.grads["sink"].shape == (CASES[name].q_heads,)


def test_matches_the_documented_formula():
    """torch_npu's example: append the sink logit to the scaled scores, softmax, drop that column, multiply by V."""
    b, n, s, d = 1, 4, 16, 64
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, s, d, generator=g, dtype=torch.float64).half() for _ in range(3))
    sink = torch.linspace(-0.2, 0.2, steps=n, dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)
    out = npu_fusion_attention(q, k, v, n, "BNSD", sink=sink, scale=scale)[0]
    scores = q.double() @ k.double().transpose(2, 3) * scale
    probs = torch.softmax(torch.cat([scores, sink.double().view(1, n, 1, 1).expand(b, n, s, 1)], -1), -1)[..., :-1]
    ref = probs @ v.double()
    same = torch.softmax(torch.cat([(q @ k.transpose(2, 3)) * scale, sink.half().view(1, n, 1, 1).expand(b, n, s, 1)],
                                   -1), -1)[..., :-1] @ v
    check_tolerance("out", out, ref, same)


def test_statistics_include_the_sink():
    args = make_inputs(Case(layout="BNSD", sink="random", q_heads=2, kv_heads=2))
    out, smax, ssum = OPS.flash_attention_score(**args)[:3]
    q, k = args["query"].double(), args["key"].double()
    scores = q @ k.transpose(-1, -2) * args["scale"]
    sink = args["sink"].double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
    ext = torch.cat([scores, sink], -1)
    torch.testing.assert_close(smax[..., 0].double(), ext.amax(-1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ssum[..., 0].double(), torch.exp(ext - ext.amax(-1, keepdim=True)).sum(-1),
                               rtol=1e-5, atol=1e-6)


def test_row_that_sees_no_key_gives_zero_with_the_sink_statistics():
    """A fully masked row (or an empty key sequence) has only the sink: output 0, max = sink, sum = 1, and zero
    gradients everywhere (its dsink term is -P_sink * rowsum(dy * 0) = 0)."""
    n = 2
    q = torch.randn(1, n, 3, 8, requires_grad=True)
    k = torch.randn(1, n, 5, 8, requires_grad=True)
    v = torch.randn(1, n, 5, 8, requires_grad=True)
    sink = torch.tensor([0.5, -1.5], requires_grad=True)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[1] = True
    out, smax, ssum = OPS.flash_attention_score(q, k, v, n, "BNSD", atten_mask=mask, scale=0.3, sink=sink)[:3]
    assert torch.equal(out[0, :, 1], torch.zeros(n, 8))
    assert torch.equal(smax[0, :, 1, 0], sink.detach()) and torch.equal(ssum[0, :, 1], torch.ones(n, 8))
    dy = torch.zeros_like(out)
    dy[0, :, 1] = 1.0  # only the dead row gets a gradient
    grads = torch.autograd.grad(out, (q, k, v, sink), dy)
    for name, gr in zip(("dq", "dk", "dv", "dsink"), grads):
        assert torch.equal(gr, torch.zeros_like(gr)), name
    empty = OPS.flash_attention_score(q, k[:, :, :0], v[:, :, :0], n, "BNSD", sink=sink)
    assert torch.equal(empty[0], torch.zeros(1, n, 3, 8))
    assert torch.equal(empty[1][..., 0], sink.detach().view(1, n, 1).expand(1, n, 3))


def test_sink_edge_values():
    """-inf adds nothing (the result without sink); NaN or +inf make every row of that head NaN (exp(inf - inf) and
    NaN in the math), the other heads stay finite and unchanged."""
    args = make_inputs(Case(layout="BNSD", q_heads=3, kv_heads=3))
    plain = OPS.flash_attention_score(**args)
    sink = torch.tensor([float("-inf"), float("nan"), float("inf")])
    out, smax, ssum = OPS.flash_attention_score(**args, sink=sink)[:3]
    assert torch.equal(out[:, 0], plain[0][:, 0]) and torch.equal(smax[:, 0], plain[1][:, 0])
    for h in (1, 2):
        assert out[:, h].isnan().all() and smax[:, h].isnan().all() and ssum[:, h].isnan().all()


def test_huge_sink_takes_all_the_weight():
    """A sink far above every score: the rows' weights underflow, output 0 (the one-hot softmax of the math)."""
    args = make_inputs(Case(layout="BNSD", q_heads=2, kv_heads=2))
    out, smax, _ = OPS.flash_attention_score(**args, sink=torch.tensor([1e30, 1e4]))[:3]
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(smax[:, 0], torch.full_like(smax[:, 0], 1e30))


def test_dsink_formula():
    """dsink_n = -sum over the rows of head n of exp(sink_n - lse) * rowsum(dy * out)."""
    args = make_inputs(Case(layout="BNSD", sink="random", q_heads=2, kv_heads=1))
    out, smax, ssum = OPS.flash_attention_score(**args)[:3]
    dy = dy_like(out)
    grads = OPS.flash_attention_score_grad(
        args["query"], args["key"], args["value"], dy, args["head_num"], "BNSD", softmax_max=smax, softmax_sum=ssum,
        attention_in=out, scale=args["scale"], sink=args["sink"])
    assert len(grads) == 5 and grads[4].dtype == torch.float32
    lse = smax[..., 0].double() + ssum[..., 0].double().log()
    d = (dy.double() * out.double()).sum(-1)
    want = -(torch.exp(args["sink"].double().view(1, -1, 1) - lse) * d).sum((0, 2))
    torch.testing.assert_close(grads[4].double(), want, rtol=1e-5, atol=1e-6)


def test_without_sink_dsink_is_an_empty_float32_tensor():
    args = make_inputs(Case(layout="BNSD"))
    out, smax, ssum = OPS.flash_attention_score(**args)[:3]
    grads = OPS.flash_attention_score_grad(args["query"], args["key"], args["value"], out, args["head_num"], "BNSD",
                                           softmax_max=smax, softmax_sum=ssum, attention_in=out, scale=args["scale"])
    assert grads[4].shape == (0,) and grads[4].dtype == torch.float32


GRADCHECK_CASES = {
    "BNSD": Case(layout="BNSD", batch=1, q_heads=2, kv_heads=1, q_len=3, kv_len=4, head_dim=4, sink="random"),
    "TND_causal": Case(layout="TND", q_heads=2, kv_heads=2, head_dim=4, seqlens=((2, 0, 3), (3, 1, 2)),
                       sparse_mode=2, sink="random"),
    "mask_dropout": Case(batch=1, q_heads=2, kv_heads=2, q_len=3, kv_len=5, head_dim=4, mask="11SS", keep_prob=0.8,
                         sink="random"),
}


@pytest.mark.parametrize("name", list(GRADCHECK_CASES))
def test_gradcheck_with_sink(name):
    """gradcheck of the registered backward in q, k, v and sink (float64 leaves, the op runs in float32, so the
    tolerances are those of test_gradcheck.py)."""
    args = make_inputs(GRADCHECK_CASES[name])
    diff = ("query", "key", "value", "sink")
    leaves = [args[n].double().requires_grad_() for n in diff]

    def fn(*xs):
        kw = dict(args, **{n: x.float() for n, x in zip(diff, xs)})
        return OPS.flash_attention_score(**kw)[0].double()

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-3, atol=2e-3, rtol=2e-2)


def test_wrappers_forward_autograd_and_grad_agree():
    """npu_fusion_attention(sink=...) is differentiable in sink; npu_fusion_attention_grad returns the same dsink
    (and dq/dk/dv) as autograd, and dpse None without pse, as torch_npu."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 9, 4, 16, generator=g).requires_grad_() for _ in range(3))
    sink = torch.randn(4, generator=g).requires_grad_()
    out, smax, ssum, _, seed, offset, numels = npu_fusion_attention(q, k, v, 4, "BSND", scale=0.25, sink=sink,
                                                                    keep_prob=0.9)
    dy = torch.randn(out.shape, generator=g)
    want = torch.autograd.grad(out, (q, k, v, sink), dy)
    got = npu_fusion_attention_grad(q.detach(), k.detach(), v.detach(), dy, 4, "BSND", softmax_max=smax,
                                    softmax_sum=ssum, attention_in=out.detach(), scale_value=0.25, keep_prob=0.9,
                                    seed=seed, offset=offset, numels=numels, sink=sink.detach())
    assert got[3] is None
    for name, a, b in zip(("dq", "dk", "dv", "dsink"), (got[0], got[1], got[2], got[4]), want):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")
    ref, _ = attention_reference(q.detach(), k.detach(), v.detach(), 4, "BSND", scale=0.25, sink=sink.detach(),
                                 keep_prob=0.9, dropout_keep=OPS.dropout_gen_mask(torch.tensor(seed),
                                                                                  torch.tensor(offset), 1, numels,
                                                                                  0.9))
    torch.testing.assert_close(out.detach().double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad, exc, words", [
    (torch.zeros(4, dtype=torch.float16), TypeError, ("'sink'", "float32")),
    (torch.zeros(3), ValueError, ("'sink'", "[head_num] = [4]")),
    (torch.zeros(1, 4), ValueError, ("'sink'", "[head_num]")),
])
def test_bad_sink_is_rejected(bad, exc, words):
    args = make_inputs(Case())
    with pytest.raises(exc) as e:
        OPS.flash_attention_score(**args, sink=bad)
    assert all(w in str(e.value) for w in words), str(e.value)
    with pytest.raises(exc):  # the fake kernel (torch.compile) gives the same error
        with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
            fake = {n: (mode.from_tensor(t) if isinstance(t, torch.Tensor) else t) for n, t in args.items()}
            OPS.flash_attention_score(**fake, sink=mode.from_tensor(bad))
