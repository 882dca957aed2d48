"""opcheck cases of the RMSNorm ops (test/ops/test_opcheck.py)."""
import torch


def _x(shape, dtype, seed, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype).requires_grad_(grad)


def _rms(shape, k, dtype=torch.float32, gamma_dtype=None, gemma=False, grad=True):
    def make():
        x = _x(shape, dtype, 1, grad)
        gamma = _x(shape[len(shape) - k:], gamma_dtype or dtype, 2, grad)
        return (x, gamma, 1e-5, gemma), {}
    return make


def _rms_grad(shape, k, dtype=torch.float32, gemma=False, residual=False):
    def make():
        x = _x(shape, dtype, 1)
        gamma = _x(shape[len(shape) - k:], dtype, 2)
        _, rstd = torch.ops.npu_fa.rms_norm(x, gamma, 1e-6, gemma)
        kwargs = {"dx_residual": _x(shape, dtype, 4)} if residual else {}
        return (_x(shape, dtype, 3), x, gamma, rstd, gemma), kwargs
    return make


def _add(shape, k, dtype=torch.float32, grad=True):
    def make():
        return (_x(shape, dtype, 1, grad), _x(shape, dtype, 2, grad), _x(shape[len(shape) - k:], dtype, 3, grad),
                1e-6), {}
    return make


def _add_quant(dtype=torch.float16, second=False, beta=False, gamma_dims=1, div_mode=True):
    def make():
        shape = (2, 3, 16)
        w = shape[len(shape) - gamma_dims:]
        x1, x2 = _x(shape, dtype, 1), _x(shape, dtype, 2)
        gamma = _x(w, dtype, 3)
        s1 = torch.rand(w, generator=torch.Generator().manual_seed(4)) + 0.1
        z1 = torch.randint(-4, 4, w, dtype=torch.int32, generator=torch.Generator().manual_seed(5))
        b = _x(w, dtype, 6) if beta else None
        s2 = (s1 * 2) if second else None
        return (x1, x2, gamma, s1, z1, b, s2, None, -1, 1e-6, div_mode), {}
    return make


def _dyn_quant(dtype=torch.bfloat16, smooth=0, out=(True, False), beta=False):
    def make():
        shape = (2, 3, 16)
        x1, x2, gamma = _x(shape, dtype, 1), _x(shape, dtype, 2), _x((16,), dtype, 3)
        s1 = _x((16,), dtype, 4) if smooth >= 1 else None
        s2 = _x((16,), dtype, 5) if smooth >= 2 else None
        b = _x((16,), dtype, 6) if beta else None
        return (x1, x2, gamma, s1, s2, b, 1e-6, *out), {}
    return make


def _rms_quant(dtype=torch.float16, gamma_2d=False):
    def make():
        x = _x((4, 16), dtype, 1)
        shape = (1, 16) if gamma_2d else (16,)
        return (x, _x(shape, dtype, 2), _x(shape, dtype, 3), torch.tensor([30.0], dtype=dtype),
                torch.tensor([2], dtype=torch.int8), 1e-6), {}
    return make


OPCHECK_CASES = {
    "rms_norm": {"fp32": _rms((3, 16), 1), "bf16_fp32_gamma": _rms((2, 3, 8), 1, torch.bfloat16, torch.float32),
                 "two_dims_gemma": _rms((2, 3, 8), 2, gemma=True), "fp16": _rms((4, 8), 1, torch.float16)},
    "rms_norm_grad": {"fp32": _rms_grad((3, 16), 1), "bf16_gemma": _rms_grad((2, 3, 8), 1, torch.bfloat16, True),
                      "residual": _rms_grad((2, 3, 8), 2, residual=True)},
    "add_rms_norm": {"fp32": _add((3, 16), 1), "fp16": _add((2, 3, 8), 2, torch.float16)},
    "add_rms_norm_cast": {"bf16": _add((3, 16), 1, torch.bfloat16, grad=False),
                          "fp32": _add((2, 3, 8), 1, grad=False)},
    "add_rms_norm_quant": {"fp16": _add_quant(), "bf16_two_outputs_beta": _add_quant(torch.bfloat16, True, True),
                           "two_dims_multiply": _add_quant(gamma_dims=2, div_mode=False)},
    "add_rms_norm_dynamic_quant": {"y1": _dyn_quant(), "both_smooth_beta": _dyn_quant(torch.float16, 2, (True, True), True),
                                   "y2_only": _dyn_quant(out=(False, True))},
    "rms_norm_quant": {"fp16": _rms_quant(), "bf16_gamma_2d": _rms_quant(torch.bfloat16, True)},
}
