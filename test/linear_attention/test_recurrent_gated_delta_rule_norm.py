"""rms_norm_gated (+ _grad): Qwen3-Next's gated RMSNorm against a float64 reference under the tolerance rule (with
transformers' Qwen3NextRMSNormGated as "torch in the same dtype"), its gradients (gradcheck in float64, the
reference's autograd for float32), thread count independence, zero sizes and one test per bad-input rule."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.linear_attention.recurrent_gated_delta_rule_reference import rms_norm_gated_reference

OPS = torch.ops.npu_fa


def _inputs(dtype, shape=(3, 5, 40), weight_dtype=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    w = (1 + 0.5 * torch.randn(shape[-1], generator=gen, dtype=torch.float64)).to(weight_dtype or dtype)
    z = (2 * torch.randn(*shape, generator=gen, dtype=torch.float64)).to(dtype)
    return x, w, z


def _transformers_module(w, eps):
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    m = qwen3_next.Qwen3NextRMSNormGated(w.shape[0], eps=eps)
    with torch.no_grad():
        m.weight = torch.nn.Parameter(w.clone())
    return m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_dtype", [None, torch.float32])
def test_matches_reference_and_transformers(dtype, weight_dtype):
    x, w, z = _inputs(dtype, weight_dtype=weight_dtype)
    y = tot.rms_norm_gated(x, w, z, epsilon=1e-6)
    same = _transformers_module(w, 1e-6)(x, z)
    assert y.dtype == dtype == same.dtype
    check_tolerance("rms_norm_gated", y, rms_norm_gated_reference(x, w, z, 1e-6), same)


def test_transformers_rounding_order_float32():
    """fp32: the model's own computation, which our kernel follows step by step, agrees to a few ulps."""
    x, w, z = _inputs(torch.float32)
    torch.testing.assert_close(tot.rms_norm_gated(x, w, z), _transformers_module(w, 1e-6)(x, z), rtol=2e-6, atol=2e-6)


def test_float64_and_no_gate():
    x, w, z = _inputs(torch.float64)
    torch.testing.assert_close(tot.rms_norm_gated(x, w, z), rms_norm_gated_reference(x, w, z))
    y, rstd = OPS.rms_norm_gated(x, w, None, 1e-5)
    torch.testing.assert_close(y, rms_norm_gated_reference(x, w, None, 1e-5))
    assert rstd.shape == (3, 5, 1) and rstd.dtype == torch.float64


def test_module_drop_in_for_transformers():
    x, w, z = _inputs(torch.bfloat16)
    ref = _transformers_module(w, 1e-6)
    ours = tot.RMSNormGated(40, eps=1e-6, dtype=torch.bfloat16)
    ours.load_state_dict(ref.state_dict())
    check_tolerance("RMSNormGated", ours(x, z), rms_norm_gated_reference(x, w, z), ref(x, z))


@pytest.mark.parametrize("gate", [True, False])
def test_gradcheck_float64(gate):
    x, w, z = _inputs(torch.float64, shape=(3, 7))
    inputs = (x.requires_grad_(), w.requires_grad_(), z.requires_grad_() if gate else None)
    assert torch.autograd.gradcheck(lambda a, b, c: tot.rms_norm_gated(a, b, c), inputs)


def test_gradients_match_reference_float32():
    x, w, z = _inputs(torch.float32, shape=(6, 33))
    dy = torch.randn_like(x)
    ours = torch.autograd.grad(tot.rms_norm_gated(*(t.requires_grad_() for t in (x, w, z))), (x, w, z), dy)
    leaves64 = [t.detach().double().requires_grad_() for t in (x, w, z)]
    ref = torch.autograd.grad(rms_norm_gated_reference(*leaves64), leaves64, dy.double())
    leaves32 = [t.detach().clone().requires_grad_() for t in (x, w, z)]
    same = torch.autograd.grad(rms_norm_gated_reference(*leaves32, dtype=torch.float32), leaves32, dy)
    for name, o, r, s in zip(("dx", "dweight", "dgate"), ours, ref, same):
        check_tolerance(name, o, r, s)


def test_thread_count_does_not_change_results():
    x, w, z = _inputs(torch.bfloat16, shape=(300, 64))
    dy = torch.randn_like(x)
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            y, rstd = OPS.rms_norm_gated(x, w, z)
            results.append((y, *OPS.rms_norm_gated_grad(dy, x, w, rstd, z)))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.asan
def test_zero_rows():
    x, w, z = _inputs(torch.float32, shape=(0, 8))
    y, rstd = OPS.rms_norm_gated(x, w, z)
    assert y.shape == (0, 8) and rstd.shape == (0, 1)
    dx, dw, dz = OPS.rms_norm_gated_grad(y, x, w, rstd, z)
    assert dx.shape == (0, 8) and torch.equal(dw, torch.zeros(8)) and dz.shape == (0, 8)


def _t(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype)


BAD = {
    "x_int": (lambda: OPS.rms_norm_gated(_t(2, 4, dtype=torch.int32), _t(4)), TypeError, "argument 'x' must be float"),
    "x_0d": (lambda: OPS.rms_norm_gated(torch.tensor(1.0), _t(1)), ValueError, "argument 'x' must have at least"),
    "weight_shape": (lambda: OPS.rms_norm_gated(_t(2, 4), _t(5)), ValueError, r"argument 'weight' must be 1-D \[n\]"),
    "weight_dtype": (lambda: OPS.rms_norm_gated(_t(2, 4, dtype=torch.bfloat16), _t(4, dtype=torch.float16)),
                     TypeError, "argument 'weight' must have x's dtype"),
    "gate_shape": (lambda: OPS.rms_norm_gated(_t(2, 4), _t(4), _t(2, 3)), ValueError,
                   "argument 'gate' must have shape"),
    "gate_dtype": (lambda: OPS.rms_norm_gated(_t(2, 4), _t(4), _t(2, 4, dtype=torch.float64)), TypeError,
                   "argument 'gate' must have x's dtype"),
    "epsilon": (lambda: OPS.rms_norm_gated(_t(2, 4), _t(4), None, 0.0), ValueError, "argument 'epsilon' must be"),
    "grad_dy_shape": (lambda: OPS.rms_norm_gated_grad(_t(2, 3), _t(2, 4), _t(4), _t(2, 1)), ValueError,
                      "argument 'dy' must have shape"),
    "grad_dy_dtype": (lambda: OPS.rms_norm_gated_grad(_t(2, 4, dtype=torch.float64), _t(2, 4), _t(4), _t(2, 1)),
                      TypeError, "argument 'dy' must have x's dtype"),
    "grad_rstd_shape": (lambda: OPS.rms_norm_gated_grad(_t(2, 4), _t(2, 4), _t(4), _t(2)), ValueError,
                        "argument 'rstd' must have shape"),
    "grad_rstd_dtype": (lambda: OPS.rms_norm_gated_grad(_t(2, 4, dtype=torch.bfloat16), _t(2, 4, dtype=torch.bfloat16),
                                                        _t(4), _t(2, 1, dtype=torch.bfloat16)),
                        TypeError, "argument 'rstd' must be Float"),
    "python_epsilon_type": (lambda: tot.rms_norm_gated(_t(2, 4), _t(4), None, "1e-6"), TypeError,
                            "argument 'epsilon' must be a float"),
}


@pytest.mark.asan
@pytest.mark.parametrize("rule", sorted(BAD))
def test_bad_input(rule):
    fn, exc, pattern = BAD[rule]
    with pytest.raises(exc, match=pattern):
        fn()
