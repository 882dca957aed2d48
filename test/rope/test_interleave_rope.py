"""interleave_rope (torch_npu's npu_interleave_rope): float64 references (the formula of upstream's doc written
plainly, and Hugging Face DeepSeek-V3's apply_rotary_pos_emb_interleave), shapes x broadcast x dtypes, gradients
(gradcheck in float64, fp32 against autograd through the reference), the torch_npu wrapper, torch.compile and bad
inputs."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import DTYPES, check_tolerance

OPS = torch.ops.npu_fa


def ref_interleave_rope(x, cos, sin, dtype=torch.float64):
    """Upstream's formula: q = reshape(x, [..., D/2, 2]).transpose(-1, -2).reshape([..., D]);
    out = q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q[D/2:], q[:D/2])."""
    x, cos, sin = x.to(dtype), cos.to(dtype), sin.to(dtype)
    d = x.shape[-1]
    q = x.reshape(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(x.shape)
    rot = torch.cat((-q[..., d // 2:], q[..., :d // 2]), dim=-1)
    return q * cos + rot * sin


def tables(shape, dtype, gen):
    """cos/sin of a rope table shape: angles per position plus noise, so every element matters."""
    ang = torch.rand(shape, generator=gen, dtype=torch.float64) * 6.0
    return ((ang.cos() + 0.05 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype),
            (ang.sin() + 0.05 * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype))


SHAPES = {
    # name: (x shape, cos/sin shape)
    "decode_b1sd": ((3, 8, 1, 64), (3, 1, 1, 64)),          # DeepSeek q_pe in decode, upstream's shapes
    "prefill_b1sd": ((2, 4, 7, 64), (2, 1, 7, 64)),
    "s_broadcast": ((2, 4, 5, 64), (2, 1, 1, 64)),
    "full_table": ((2, 3, 5, 32), (2, 3, 5, 32)),
    "d16_tnd": ((9, 4, 16), (9, 1, 16)),                     # other rope widths, other ranks
    "sd_table": ((2, 3, 6, 8), (6, 8)),
}


@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_forward_matches_float64_reference(shape, dname):
    dtype = DTYPES[dname]
    gen = torch.Generator().manual_seed(hash((shape, dname)) % 2**31)
    xs, cs = SHAPES[shape]
    x = torch.randn(xs, generator=gen).to(dtype)
    cos, sin = tables(cs, dtype, gen)
    out = OPS.interleave_rope(x, cos, sin)
    assert out.dtype == dtype and out.shape == x.shape and out.is_contiguous()
    ref = ref_interleave_rope(x, cos, sin)
    same = ref_interleave_rope(x, cos, sin, dtype)
    check_tolerance(f"interleave_rope {shape} {dname}", out, ref, same)


def test_fp64_exact_and_noncontiguous_x():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 4, 64, dtype=torch.float64, generator=gen).transpose(1, 2)  # [2, 4, 5, 64], strided
    cos, sin = tables((2, 1, 5, 64), torch.float64, gen)
    out = OPS.interleave_rope(x, cos, sin)
    torch.testing.assert_close(out, ref_interleave_rope(x, cos, sin), rtol=0, atol=1e-13)


def test_matches_hugging_face_deepseek_v3():
    hf = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 6, 64, generator=gen), torch.randn(2, 1, 6, 64, generator=gen)
    ang = torch.rand(2, 6, 32, generator=gen) * 6
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()  # HF's tables: cat(freqs, freqs)
    q_hf, k_hf = hf.apply_rotary_pos_emb_interleave(q, k, cos, sin)
    torch.testing.assert_close(tot.npu_interleave_rope(q, cos[:, None], sin[:, None]), q_hf, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(tot.npu_interleave_rope(k, cos[:, None], sin[:, None]), k_hf, rtol=1e-6, atol=1e-6)


def test_example_of_the_doc():
    # cos = 1, sin = 0 gives the de-interleaved q; cos = 0, sin = 1 gives rotate_half(q)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 1, 1, 4)
    one, zero = torch.ones(1, 1, 1, 4), torch.zeros(1, 1, 1, 4)
    assert OPS.interleave_rope(x, one, zero).flatten().tolist() == [1.0, 3.0, 2.0, 4.0]
    assert OPS.interleave_rope(x, zero, one).flatten().tolist() == [-2.0, -4.0, 1.0, 3.0]


# ---- gradients ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("xs,cs", [((2, 3, 1, 8), (2, 1, 1, 8)), ((2, 2, 3, 8), (2, 1, 1, 8)),
                                   ((2, 2, 3, 4), (2, 2, 3, 4)), ((2, 3, 4), (3, 4))])
def test_gradcheck_float64(xs, cs):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(xs, dtype=torch.float64, generator=gen, requires_grad=True)
    cos, sin = (t.requires_grad_() for t in tables(cs, torch.float64, gen))
    assert torch.autograd.gradcheck(OPS.interleave_rope, (x, cos, sin))


@pytest.mark.parametrize("dname", list(DTYPES))
def test_gradients_match_reference(dname):
    dtype = DTYPES[dname]
    gen = torch.Generator().manual_seed(4)
    x0 = torch.randn(2, 4, 5, 64, generator=gen).to(dtype)
    c0, s0 = tables((2, 1, 5, 64), dtype, gen)
    dy = torch.randn(2, 4, 5, 64, generator=gen).to(dtype)

    def grads(fn, dt):
        x, c, s = (t.detach().to(dt).requires_grad_() for t in (x0, c0, s0))
        fn(x, c, s).backward(dy.to(dt))
        return x.grad, c.grad, s.grad

    ours = grads(tot.npu_interleave_rope, dtype)
    ref = grads(ref_interleave_rope, torch.float64)
    same = grads(lambda x, c, s: ref_interleave_rope(x, c, s, dtype), dtype)
    for name, o, r, m in zip(("dx", "dcos", "dsin"), ours, ref, same):
        assert o.dtype == dtype
        check_tolerance(f"interleave_rope {name} {dname}", o, r, m, floor=1e-4 * (r.abs().max().item() + 1))


def test_grad_op_directly():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 4, 16, dtype=torch.float64, generator=gen)
    cos, sin = tables((1, 1, 4, 16), torch.float64, gen)
    g = torch.randn(2, 3, 4, 16, dtype=torch.float64, generator=gen)
    dx, dc, ds = OPS.interleave_rope_grad(g, x, cos, sin)
    xr, cr, sr = (t.clone().requires_grad_() for t in (x, cos, sin))
    ref_interleave_rope(xr, cr, sr).backward(g)
    for o, r in ((dx, xr.grad), (dc, cr.grad), (ds, sr.grad)):
        assert o.shape == r.shape
        torch.testing.assert_close(o, r, rtol=0, atol=1e-12)


# ---- torch.compile ---------------------------------------------------------------------------------------------
def test_torch_compile_fullgraph_forward_and_backward():
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 4, 3, 64, generator=gen, requires_grad=True)
    cos, sin = tables((2, 1, 3, 64), torch.float32, gen)

    def f(x, c, s):
        return tot.npu_interleave_rope(x, c, s) * 2.0

    torch._dynamo.reset()
    out = torch.compile(f, fullgraph=True)(x, cos, sin)
    out.sum().backward()
    eager_x = x.detach().clone().requires_grad_()
    f(eager_x, cos, sin).sum().backward()
    torch.testing.assert_close(out, f(x.detach(), cos, sin))
    torch.testing.assert_close(x.grad, eager_x.grad)


# ---- bad inputs ------------------------------------------------------------------------------------------------
def test_bad_inputs():
    x, c = torch.randn(2, 4, 3, 64), torch.randn(2, 1, 3, 64)
    with pytest.raises(ValueError, match=r"interleave_rope: argument 'x' must end in an even, positive head "
                                         r"dimension D; got shape \[2, 4, 3, 7\]"):
        OPS.interleave_rope(torch.randn(2, 4, 3, 7), torch.randn(2, 1, 3, 7), torch.randn(2, 1, 3, 7))
    with pytest.raises(ValueError, match=r"'cos' \[2, 1, 3, 64\] and 'sin' \[2, 1, 1, 64\] must have the same shape"):
        OPS.interleave_rope(x, c, torch.randn(2, 1, 1, 64))
    with pytest.raises(RuntimeError, match=r"cos of shape \[2, 1, 3, 32\] must end in the head dimension D=64"):
        OPS.interleave_rope(x, torch.randn(2, 1, 3, 32), torch.randn(2, 1, 3, 32))
    with pytest.raises(RuntimeError, match=r"not broadcastable to x of shape \[2, 4, 3, 64\]"):
        OPS.interleave_rope(x, torch.randn(2, 2, 3, 64), torch.randn(2, 2, 3, 64))
    with pytest.raises(RuntimeError, match=r"x must be float32, float16, bfloat16 or float64; got Int"):
        OPS.interleave_rope(x.int(), c, c)
    with pytest.raises(RuntimeError, match=r"grad of shape \[2, 4, 3\] must match x of shape \[2, 4, 3, 64\]"):
        OPS.interleave_rope_grad(torch.randn(2, 4, 3), x, c, c)
    with pytest.raises(TypeError, match=r"npu_interleave_rope: argument 'cos' \(torch.float16\) must have the dtype "
                                        r"of 'x' \(torch.float32\)"):
        tot.npu_interleave_rope(x, c.half(), c)
    with pytest.raises(RuntimeError, match=r"interleave_rope.*even"):  # the wrapper passes the op's errors through
        tot.npu_interleave_rope(torch.randn(1, 1, 1, 3), torch.randn(1, 1, 1, 3), torch.randn(1, 1, 1, 3))
