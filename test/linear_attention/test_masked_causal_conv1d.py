"""npu_masked_causal_conv1d and npu_masked_causal_conv1d_backward against the token-by-token reference
(causal_conv1d_reference.py) under the project's tolerance rule; the autograd wiring, gradcheck in float64,
torch.compile, thread-count independence, zero sizes and one test per bad-input rule."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.tiers import pairwise
from test.linear_attention import causal_conv1d_reference as ref

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(S=37, B=3, H=136, W=3, dtype=torch.float32, seed=0, with_mask=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(S, B, H, generator=g).to(dtype)
    w = (torch.randn(W, H, generator=g) * 0.5).to(dtype)
    mask = (torch.rand(B, S, generator=g) > 0.3) if with_mask else None
    return x, w, mask


@pytest.mark.parametrize("dtype,with_mask,W", pairwise(dtype=DTYPES, with_mask=[True, False], W=[3, 4]))
def test_forward_matches_reference(dtype, with_mask, W):
    x, w, mask = _inputs(dtype=dtype, with_mask=with_mask, W=W)
    ours = tot.npu_masked_causal_conv1d(x, w, mask=mask)
    check_tolerance(f"masked_fwd_{dtype}", ours, ref.masked_causal_conv1d(x.double(), w.double(), mask),
                    ref.masked_causal_conv1d(x, w, mask))
    if mask is not None:
        assert torch.all(ours.permute(1, 0, 2)[~mask] == 0)


@pytest.mark.parametrize("dtype,with_mask", pairwise(dtype=DTYPES, with_mask=[True, False]))
def test_backward_matches_reference(dtype, with_mask):
    x, w, mask = _inputs(S=29, dtype=dtype, with_mask=with_mask, seed=1)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(x.dtype)
    gi, gw = tot.npu_masked_causal_conv1d_backward(g, x, w, mask=mask)
    gi64, gw64 = ref.masked_causal_conv1d_backward(g, x, w, mask)
    # torch in the same dtype: autograd through the reference run in that dtype
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    gi_same, gw_same = torch.autograd.grad(ref.masked_causal_conv1d(xs, ws, mask), (xs, ws), g)
    check_tolerance(f"grad_input_{dtype}", gi, gi64, gi_same)
    check_tolerance(f"grad_weight_{dtype}", gw, gw64, gw_same)
    assert gi.dtype == x.dtype and gw.dtype == w.dtype


def test_autograd_uses_the_backward_op():
    x, w, mask = _inputs(S=11, H=20, seed=2)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = tot.npu_masked_causal_conv1d(xs, ws, mask=mask)
    g = torch.randn_like(out)
    out.backward(g)
    gi, gw = tot.npu_masked_causal_conv1d_backward(g, x, w, mask=mask)
    assert torch.equal(xs.grad, gi) and torch.equal(ws.grad, gw)


@pytest.mark.parametrize("with_mask", [True, False])
def test_gradcheck_float64(with_mask):
    x, w, mask = _inputs(S=7, B=2, H=5, dtype=torch.float64, with_mask=with_mask, seed=3)
    torch.autograd.gradcheck(lambda a, b: tot.npu_masked_causal_conv1d(a, b, mask=mask),
                             (x.requires_grad_(), w.requires_grad_()))


def test_torch_compile_fullgraph_forward_and_backward():
    x, w, mask = _inputs(S=6, B=2, H=16, seed=7)
    x.requires_grad_()
    w.requires_grad_()

    def f(x, w, m):
        return (tot.npu_masked_causal_conv1d(x, w, mask=m) ** 2).sum()

    eager = torch.autograd.grad(f(x, w, mask), (x, w))
    compiled = torch.autograd.grad(torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, mask), (x, w))
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))

def test_thread_count_does_not_change_the_result():
    x, w, mask = _inputs(S=64, B=4, H=300, dtype=torch.bfloat16, seed=4)
    g = torch.randn(x.shape).to(x.dtype)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append((tot.npu_masked_causal_conv1d(x, w, mask=mask),
                            *tot.npu_masked_causal_conv1d_backward(g, x, w, mask=mask)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_noncontiguous_inputs():
    x, w, mask = _inputs(S=9, B=2, H=16, seed=6)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)  # same values, [S, B, H] strides of a [B, S, H] tensor
    assert not xt.is_contiguous()
    assert torch.equal(tot.npu_masked_causal_conv1d(xt, w, mask=mask), tot.npu_masked_causal_conv1d(x, w, mask=mask))


@pytest.mark.asan
@pytest.mark.parametrize("shape", [(0, 2, 8), (5, 0, 8), (5, 2, 0)])
def test_zero_sizes(shape):
    S, B, H = shape
    x, w = torch.randn(S, B, H), torch.randn(3, H)
    mask = torch.ones(B, S, dtype=torch.bool)
    assert tot.npu_masked_causal_conv1d(x, w, mask=mask).shape == shape
    gi, gw = tot.npu_masked_causal_conv1d_backward(torch.randn(S, B, H), x, w, mask=mask)
    assert gi.shape == shape and torch.equal(gw, torch.zeros(3, H))


# ---- bad input: one test per rule -------------------------------------------------------------------------------

def _bad(match, backward=False, **kw):
    x, w, mask = _inputs(S=5, B=2, H=8)
    args = dict(input=x, weight=w, mask=mask)
    args.update(kw)
    with pytest.raises((ValueError, TypeError), match=match):
        if backward:
            g = args.pop("grad_output", torch.randn(5, 2, 8))
            tot.npu_masked_causal_conv1d_backward(g, args.pop("input"), args.pop("weight"), **args)
        else:
            tot.npu_masked_causal_conv1d(args.pop("input"), args.pop("weight"), **args)


def test_bad_input_rank():
    _bad("argument 'input' must be 3-D", input=torch.zeros(5, 8))


def test_bad_input_dtype():
    _bad("argument 'input' must be float16", input=torch.zeros(5, 2, 8, dtype=torch.int64))


def test_bad_weight_shape():
    _bad("argument 'weight' must be 2-D \\[W, H\\]", weight=torch.zeros(3, 7))


def test_weight_needs_a_tap():
    _bad("argument 'weight' must be 2-D \\[W, H\\] with W >= 1", weight=torch.zeros(0, 8))

def test_bad_weight_dtype():
    _bad("argument 'weight' must have the dtype of 'input'", weight=torch.zeros(3, 8, dtype=torch.float16))


def test_bad_mask_dtype():
    _bad("argument 'mask' must be bool", mask=torch.ones(2, 5))


def test_bad_mask_shape():
    _bad("argument 'mask' must be 2-D \\[B, S\\] = \\[2, 5\\]", mask=torch.ones(5, 2, dtype=torch.bool))


def test_bad_grad_output_shape():
    _bad("argument 'grad_output' must have input's shape", backward=True, grad_output=torch.zeros(4, 2, 8))


def test_bad_grad_output_dtype():
    _bad("argument 'grad_output' must have the dtype of 'input'", backward=True,
         grad_output=torch.zeros(5, 2, 8, dtype=torch.float64))


def test_wrapper_rejects_non_tensor():
    _bad("argument 'weight' must be a Tensor", weight=[1.0, 2.0])
