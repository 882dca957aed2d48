"""npu_rms_norm, npu_gemma_rms_norm, npu_rms_norm_backward and npu_add_rms_norm (+ _v2, _v2_functional, _cast)
against independent float64 references (tolerance rule: max|ours - ref64| <= 2 * max|torch_same_dtype - ref64| +
1e-5, gradients too), gradcheck in float64, torch.compile, and every bad-input rule."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance

OPS = torch.ops.npu_fa
# (x dtype, gamma dtype): upstream's pairs, and float64 (gradcheck).
DTYPES = {"fp32": (torch.float32, torch.float32), "fp16": (torch.float16, torch.float16),
          "bf16": (torch.bfloat16, torch.bfloat16), "bf16_fp32_gamma": (torch.bfloat16, torch.float32),
          "fp16_fp32_gamma": (torch.float16, torch.float32)}
# (x shape, gamma dimensions)
SHAPES = {"rows": ((2, 32, 256), 1), "odd": ((7, 5), 1), "two_dims": ((3, 4, 6), 2), "one_row": ((5,), 1),
          "long_row": ((2, 4099), 1)}


# ---- references --------------------------------------------------------------------------------------------------
def rms_reference(x, gamma, eps=1e-6, gemma=False, dtype=torch.float64):
    """(y, rstd) computed in `dtype` from the formula: rstd = 1 / sqrt(mean(x^2) + eps) over gamma's dimensions."""
    k = gamma.dim()
    xd = x.to(dtype)
    dims = tuple(range(x.dim() - k, x.dim()))
    rstd = torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + eps)
    w = gamma.to(dtype) + 1 if gemma else gamma.to(dtype)
    return xd * rstd * w, rstd


def added(x1, x2):
    """x1 + x2 rounded to x1's dtype (the x output of add_rms_norm)."""
    return (x1.double() + x2.double()).to(x1.dtype)


def _inputs(shape, k, dtypes, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * scale).to(dtypes[0])
    gamma = (torch.randn(shape[len(shape) - k:], generator=g)).to(dtypes[1])
    return x, gamma


def _grads(fn, leaves, dy):
    leaves = [t.detach().requires_grad_() for t in leaves]
    out = fn(*leaves)
    return torch.autograd.grad(out, leaves, dy.to(out.dtype))


# ---- npu_rms_norm / npu_gemma_rms_norm -----------------------------------------------------------------------------
@pytest.mark.parametrize("gemma", [False, True], ids=["rms", "gemma"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtypes", DTYPES.values(), ids=DTYPES.keys())
def test_forward(dtypes, shape, gemma):
    shape, k = shape
    x, gamma = _inputs(shape, k, dtypes)
    fn = tot.npu_gemma_rms_norm if gemma else tot.npu_rms_norm
    y, rstd = fn(x, gamma, 1e-5)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert rstd.dtype == torch.float32 and rstd.shape == (*shape[:len(shape) - k], *([1] * k))
    y64, r64 = rms_reference(x, gamma, 1e-5, gemma)
    y_same, _ = rms_reference(x, gamma, 1e-5, gemma, dtype=x.dtype)
    _, r32 = rms_reference(x, gamma, 1e-5, gemma, dtype=torch.float32)
    check_tolerance("y", y, y64, y_same)
    check_tolerance("rstd", rstd, r64, r32)


def test_matches_the_fp32_formula_of_upstream():
    """upstream's golden (fp32 x, fp32 gamma): y = x * (1 / sqrt(mean(x^2) + eps)) * gamma in fp32."""
    x, gamma = _inputs((64, 384), 1, DTYPES["fp32"], scale=50.0)
    y, rstd = tot.npu_rms_norm(x, gamma)
    r = 1 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(rstd, r, rtol=1e-6, atol=0)
    torch.testing.assert_close(y, x * r * gamma, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gemma", [False, True], ids=["rms", "gemma"])
@pytest.mark.parametrize("shape", [SHAPES["rows"], SHAPES["two_dims"], SHAPES["odd"]], ids=["rows", "two_dims", "odd"])
@pytest.mark.parametrize("dtypes", DTYPES.values(), ids=DTYPES.keys())
def test_backward(dtypes, shape, gemma):
    shape, k = shape
    x, gamma = _inputs(shape, k, dtypes, seed=1)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(x.dtype)
    fn = tot.npu_gemma_rms_norm if gemma else tot.npu_rms_norm
    dx, dgamma = _grads(lambda a, b: fn(a, b)[0], [x, gamma], dy)
    assert dx.dtype == x.dtype and dgamma.dtype == gamma.dtype
    ref64 = _grads(lambda a, b: rms_reference(a, b, gemma=gemma)[0], [x.double(), gamma.double()], dy)
    same = _grads(lambda a, b: rms_reference(a, b, gemma=gemma, dtype=x.dtype)[0], [x, gamma.to(x.dtype)], dy)
    check_tolerance("dx", dx, ref64[0], same[0])
    check_tolerance("dgamma", dgamma, ref64[1], same[1])


def test_backward_function_is_the_autograd_formula():
    x, gamma = _inputs((6, 40), 1, DTYPES["bf16_fp32_gamma"])
    dy = torch.randn(6, 40).to(torch.bfloat16)
    y, rstd = tot.npu_rms_norm(x, gamma)
    dx, dgamma = tot.npu_rms_norm_backward(dy, x, gamma, rstd)
    assert dx.dtype == torch.bfloat16 and dgamma.dtype == torch.float32 and dgamma.shape == gamma.shape
    ax, ag = _grads(lambda a, b: tot.npu_rms_norm(a, b)[0], [x, gamma], dy)
    assert torch.equal(dx, ax) and torch.equal(dgamma, ag)


def test_dgamma_does_not_depend_on_the_thread_count():
    x, gamma = _inputs((333, 64), 1, DTYPES["fp32"])
    dy = torch.randn(333, 64)
    _, rstd = tot.npu_rms_norm(x, gamma)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = tot.npu_rms_norm_backward(dy, x, gamma, rstd)
        torch.set_num_threads(max(2, threads))
        many = tot.npu_rms_norm_backward(dy, x, gamma, rstd)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


def test_gradcheck_float64():
    x, gamma = _inputs((3, 2, 5), 1, (torch.float64, torch.float64))
    x.requires_grad_()
    gamma.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: tot.npu_rms_norm(a, b, 1e-3)[0], (x, gamma))
    assert torch.autograd.gradcheck(lambda a, b: tot.npu_gemma_rms_norm(a, b, 1e-3)[0], (x, gamma))
    g2 = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: tot.npu_rms_norm(a, b)[0], (x, g2))


def test_float64_rstd_is_float64():
    x, gamma = _inputs((3, 8), 1, (torch.float64, torch.float64))
    y, rstd = tot.npu_rms_norm(x, gamma)
    assert rstd.dtype == torch.float64
    y64, r64 = rms_reference(x, gamma)
    torch.testing.assert_close(y, y64, rtol=1e-12, atol=1e-12)


def test_noncontiguous_inputs():
    x, gamma = _inputs((16, 8, 64), 1, DTYPES["fp32"])
    xt = x.transpose(0, 1)
    g = torch.randn(128)[::2]
    y, rstd = tot.npu_rms_norm(xt, g)
    y_ref, r_ref = tot.npu_rms_norm(xt.contiguous(), g.contiguous())
    assert torch.equal(y, y_ref) and torch.equal(rstd, r_ref)


@pytest.mark.asan
def test_zero_sizes():
    y, rstd = tot.npu_rms_norm(torch.ones(0, 8), torch.ones(8))
    assert y.shape == (0, 8) and rstd.shape == (0, 1)
    y, rstd = tot.npu_rms_norm(torch.ones(3, 0), torch.ones(0))
    assert y.shape == (3, 0) and rstd.shape == (3, 1) and torch.allclose(rstd, torch.full((3, 1), 1e3))
    x = torch.ones(0, 8, requires_grad=True)
    tot.npu_rms_norm(x, torch.ones(8))[0].sum().backward()
    assert x.grad.shape == (0, 8)


def test_zero_row_is_finite():
    y, rstd = tot.npu_rms_norm(torch.zeros(2, 16), torch.ones(16))
    assert torch.equal(y, torch.zeros(2, 16)) and torch.allclose(rstd, torch.full((2, 1), 1e3))


def test_compile_fullgraph_forward_backward():
    torch._dynamo.reset()
    x, gamma = _inputs((4, 8, 32), 1, DTYPES["fp32"])

    def f(a, b):
        y, rstd = tot.npu_rms_norm(a, b)
        return (y * 2).sum() + rstd.sum()

    xs = [x.clone().requires_grad_(), gamma.clone().requires_grad_()]
    xc = [x.clone().requires_grad_(), gamma.clone().requires_grad_()]
    f(*xs).backward()
    out = torch.compile(f, fullgraph=True)(*xc)
    out.backward()
    torch.testing.assert_close(out, f(*xs).detach())
    for a, b in zip(xs, xc):
        torch.testing.assert_close(a.grad, b.grad)


# ---- npu_add_rms_norm (+ _v2, _v2_functional, _cast) ---------------------------------------------------------------
ADD_DTYPES = {k: DTYPES[k] for k in ("fp32", "fp16", "bf16", "bf16_fp32_gamma")}


@pytest.mark.parametrize("shape", [SHAPES["rows"], SHAPES["two_dims"], SHAPES["odd"]], ids=["rows", "two_dims", "odd"])
@pytest.mark.parametrize("dtypes", ADD_DTYPES.values(), ids=ADD_DTYPES.keys())
def test_add_rms_norm_forward_backward(dtypes, shape):
    shape, k = shape
    x1, gamma = _inputs(shape, k, dtypes, seed=3)
    x2, _ = _inputs(shape, k, dtypes, seed=4)
    y, rstd, x = tot.npu_add_rms_norm(x1, x2, gamma, 1e-5)
    assert torch.equal(x, (x1.float() + x2.float()).to(x1.dtype))
    assert rstd.dtype == torch.float32 and rstd.shape == (*shape[:len(shape) - k], *([1] * k))
    # y normalises the x it returns (rounded to x1's dtype)
    y64, r64 = rms_reference(x, gamma, 1e-5)
    check_tolerance("y", y, y64, rms_reference(x, gamma, 1e-5, dtype=x.dtype)[0])
    check_tolerance("rstd", rstd, r64, rms_reference(x, gamma, 1e-5, dtype=torch.float32)[1])
    # gradients through y and x
    g = torch.Generator().manual_seed(5)
    dy, dx_out = torch.randn(shape, generator=g).to(x1.dtype), torch.randn(shape, generator=g).to(x1.dtype)

    def loss(fn, a, b, w):
        yy, _, xx = fn(a, b, w)
        return (yy.double() * dy.double()).sum() + (xx.double() * dx_out.double()).sum()

    leaves = [t.clone().requires_grad_() for t in (x1, x2, gamma)]
    ours = torch.autograd.grad(loss(lambda a, b, w: tot.npu_add_rms_norm(a, b, w, 1e-5), *leaves), leaves)

    def ref(a, b, w, dtype):
        s = a.to(dtype) + b.to(dtype)
        return rms_reference(s, w, 1e-5, dtype=dtype)[0], None, s

    l64 = [t.double().requires_grad_() for t in (x1, x2, gamma)]
    r64 = torch.autograd.grad(loss(lambda a, b, w: ref(a, b, w, torch.float64), *l64), l64)
    ls = [t.clone().to(x1.dtype).requires_grad_() for t in (x1, x2, gamma)]
    rs = torch.autograd.grad(loss(lambda a, b, w: ref(a, b, w, x1.dtype), *ls), ls)
    for name, o, r, s in zip(("dx1", "dx2", "dgamma"), ours, r64, rs):
        check_tolerance(name, o, r, s)
    assert torch.equal(ours[0], ours[1])


def test_add_rms_norm_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    x1, x2 = (torch.randn(3, 6, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2))
    gamma = torch.randn(6, dtype=torch.float64, generator=g, requires_grad=True)

    def f(a, b, w):
        y, _, x = tot.npu_add_rms_norm(a, b, w, 1e-3)
        return y, x

    assert torch.autograd.gradcheck(f, (x1, x2, gamma))


def test_add_rms_norm_compile_fullgraph():
    torch._dynamo.reset()
    x1, gamma = _inputs((4, 32), 1, DTYPES["fp32"])
    x2, _ = _inputs((4, 32), 1, DTYPES["fp32"], seed=1)

    def f(a, b, w):
        y, rstd, x = tot.npu_add_rms_norm(a, b, w)
        return y.sum() + (x * x).sum()

    eager = [t.clone().requires_grad_() for t in (x1, x2, gamma)]
    comp = [t.clone().requires_grad_() for t in (x1, x2, gamma)]
    f(*eager).backward()
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(*comp)
    out.backward()
    torch.testing.assert_close(out, f(*eager).detach())
    for a, b in zip(eager, comp):
        torch.testing.assert_close(a.grad, b.grad)


def test_add_rms_norm_v2_writes_in_place():
    x1, gamma = _inputs((5, 48), 1, DTYPES["fp16"])
    x2, _ = _inputs((5, 48), 1, DTYPES["fp16"], seed=1)
    y, rstd, x = tot.npu_add_rms_norm(x1, x2, gamma)
    r_f, y_f, x_f = tot.npu_add_rms_norm_v2_functional(x1, x2, gamma)
    assert torch.equal(r_f, rstd) and torch.equal(y_f, y) and torch.equal(x_f, x)
    a, b = x1.clone(), x2.clone()
    r = tot.npu_add_rms_norm_v2(a, b, gamma)
    assert torch.equal(r, rstd) and torch.equal(a, y) and torch.equal(b, x)


@pytest.mark.parametrize("dtypes", [DTYPES["fp16"], DTYPES["bf16"], DTYPES["fp32"]], ids=["fp16", "bf16", "fp32"])
def test_add_rms_norm_cast(dtypes):
    x1, gamma = _inputs((6, 72), 1, dtypes)
    x2, _ = _inputs((6, 72), 1, dtypes, seed=1)
    y32, y, rstd, x = tot.npu_add_rms_norm_cast(x1, x2, gamma)
    ya, ra, xa = tot.npu_add_rms_norm(x1, x2, gamma)
    assert y32.dtype == torch.float32 and torch.equal(y, ya) and torch.equal(rstd, ra) and torch.equal(x, xa)
    assert torch.equal(y32.to(x1.dtype), y)
    check_tolerance("y1", y32, rms_reference(x, gamma)[0], rms_reference(x, gamma, dtype=torch.float32)[0])


# ---- bad input -----------------------------------------------------------------------------------------------------
F16, BF16 = torch.float16, torch.bfloat16


@pytest.mark.parametrize("call,exc,match", [
    (lambda: tot.npu_rms_norm(torch.ones(2, 8), torch.ones(4)), ValueError,
     r"'gamma' must have the shape of the trailing dimensions of x .*got gamma shape \[4\] for x shape \[2, 8\]"),
    (lambda: tot.npu_rms_norm(torch.ones(8), torch.ones(2, 8)), ValueError, "'gamma' must have the shape"),
    (lambda: tot.npu_rms_norm(torch.ones(2, 8), torch.tensor(1.0)), ValueError, "at least one dimension"),
    (lambda: tot.npu_rms_norm(torch.ones(2, 8, dtype=torch.int32), torch.ones(8)), TypeError,
     "'x' must be float16, bfloat16, float32 or float64; got Int"),
    (lambda: tot.npu_rms_norm(torch.ones(2, 8, dtype=F16), torch.ones(8, dtype=BF16)), TypeError,
     r"'gamma' must have x's dtype \(Half\) or float32; got BFloat16"),
    (lambda: tot.npu_rms_norm(torch.ones(2, 8), torch.ones(8, dtype=F16)), TypeError,
     r"'gamma' must have x's dtype \(Float\); got Half"),
    (lambda: tot.npu_rms_norm(torch.ones(2, 8), torch.ones(8), 0.0), ValueError,
     "'epsilon' must be a finite number > 0; got 0"),
    (lambda: tot.npu_rms_norm(torch.ones(2, 8), torch.ones(8), -1e-6), ValueError, "'epsilon' must be"),
    (lambda: tot.npu_rms_norm(torch.ones(2, 8), torch.ones(8), float("nan")), ValueError, "'epsilon' must be"),
    (lambda: tot.npu_gemma_rms_norm(torch.ones(2, 8), torch.ones(3)), ValueError, "gemma_rms_norm: argument 'gamma'"),
    (lambda: tot.npu_rms_norm_backward(torch.ones(2, 4), torch.ones(2, 8), torch.ones(8), torch.ones(2, 1)),
     ValueError, r"'dy' must have x's shape \[2, 8\]; got \[2, 4\]"),
    (lambda: tot.npu_rms_norm_backward(torch.ones(2, 8, dtype=F16), torch.ones(2, 8), torch.ones(8),
                                       torch.ones(2, 1)), TypeError, "'dy' must have x's dtype"),
    (lambda: tot.npu_rms_norm_backward(torch.ones(2, 8), torch.ones(2, 8), torch.ones(8), torch.ones(3, 1)),
     ValueError, r"'rstd' must hold one value per row of x .*2 rows\); got shape \[3, 1\]"),
    (lambda: tot.npu_rms_norm_backward(torch.ones(2, 8, dtype=F16), torch.ones(2, 8, dtype=F16),
                                       torch.ones(8, dtype=F16), torch.ones(2, 1, dtype=F16)), TypeError,
     "'rstd' must be Float"),
    (lambda: tot.npu_add_rms_norm(torch.ones(2, 8), torch.ones(3, 8), torch.ones(8)), ValueError,
     r"add_rms_norm: argument 'x2' must have x1's shape \[2, 8\]; got \[3, 8\]"),
    (lambda: tot.npu_add_rms_norm(torch.ones(2, 8), torch.ones(2, 8, dtype=F16), torch.ones(8)), TypeError,
     "'x2' must have x1's dtype"),
    (lambda: tot.npu_add_rms_norm(torch.ones(2, 8), torch.ones(2, 8), torch.ones(2)), ValueError,
     "'gamma' must have the shape of the trailing dimensions of x1"),
    (lambda: tot.npu_add_rms_norm(torch.ones(2, 8), torch.ones(2, 8), torch.ones(8), 0.0), ValueError,
     "'epsilon' must be"),
    (lambda: tot.npu_add_rms_norm_cast(torch.ones(2, 8, dtype=torch.float64), torch.ones(2, 8, dtype=torch.float64),
                                       torch.ones(8, dtype=torch.float64)), TypeError, "add_rms_norm_cast: argument 'x1'"),
])
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_errors_are_also_runtime_errors():
    """torch_npu raises RuntimeError for bad values: the wrappers' ValueErrors are both."""
    with pytest.raises(RuntimeError):
        tot.npu_rms_norm(torch.ones(2, 8), torch.ones(4))
