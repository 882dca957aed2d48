"""Port of op-plugin test/test_custom_ops/test_npu_rotary_mul_backward.py (the gradients of torch_npu.npu_rotary_mul
through autograd), extended to torch_npu.npu_rotary_mul_backward, the function behind them.

Golden: PyTorch autograd on the CPU through the upstream's formula x * r1 + rotate(x) * r2 in the input dtype, for an
all-ones output gradient; the gradients of x, r1 and r2 (r1 and r2 broadcast, so theirs are reduced) compared with
the default tolerances (1e-4, float16 1e-3).

Upstream cases:
- test_rotary_mul_backward: 'half', float32, x [2, 8192, 5, 128] / [8192, 2, 5, 128] / [2048, 4, 32, 64]. Ported.
- test_rotary_mul_mode_backward: 'interleave', float16 / float32, x [2, 2, 5, 128], [2, 24, 5, 128],
  [128, 4, 4, 256], [64, 8, 8, 512]. Ported.
- test_rotary_mul_backward_dim3 (skipped upstream: CANN version): 'half', float32, 3-D x with full-size or
  broadcast r1, r2, shapes down to [1, 1, 2]. Ported, with its two largest shapes [128, 256, 256] and
  [256, 512, 512] reduced to [32, 64, 256] and [32, 128, 512] (the latter needs gigabytes for autograd on the CPU).
Every case also calls npu_rotary_mul_backward(grad, x, r1, r2, rotary_mode) directly: the same three gradients.
"""
import pytest
import torch

from test.torch_npu.common import to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal
from test.torch_npu.test_npu_rotary_mul import HALF, INTERLEAVE, rotary_half, rotary_interleave

HALF_3D = [((2, 2, 4), (2, 2, 4), (2, 2, 4)), ((8, 16, 16), (8, 16, 16), (8, 16, 16)),
           ((16, 32, 32), (16, 32, 32), (16, 32, 32)), ((32, 64, 256), (32, 64, 256), (32, 64, 256)),
           ((2, 2, 4), (2, 1, 4), (2, 1, 4)), ((4, 8, 8), (4, 1, 8), (4, 1, 8)),
           ((32, 128, 512), (32, 1, 512), (32, 1, 512)), ((1, 1, 2), (1, 1, 2), (1, 1, 2)),
           ((1, 1, 894), (1, 1, 894), (1, 1, 894))]


def _check(shapes, dtype, mode, gen):
    x, r1, r2 = (torch.rand(s, generator=gen).to(dtype).requires_grad_(True) for s in shapes)
    golden = rotary_half(x, r1, r2) if mode == "half" else rotary_interleave(x, r1, r2)
    golden.backward(torch.ones_like(golden))
    xd, r1d, r2d = (to_device(t.detach()).requires_grad_(True) for t in (x, r1, r2))
    out = torch_npu.npu_rotary_mul(xd, r1d, r2d) if mode == "half" else torch_npu.npu_rotary_mul(xd, r1d, r2d, mode)
    out.backward(torch.ones_like(out))
    for want, got in zip((x.grad, r1.grad, r2.grad), (xd.grad, r1d.grad, r2d.grad)):
        assert_rtol_equal(want, got.cpu())
    direct = torch_npu.npu_rotary_mul_backward(torch.ones_like(out), xd.detach(), r1d.detach(), r2d.detach(), mode)
    for want, got in zip((x.grad, r1.grad, r2.grad), direct):
        assert_rtol_equal(want, got.cpu())


def test_rotary_mul_backward():
    gen = torch.Generator().manual_seed(0)
    for shapes in HALF:
        _check(shapes, torch.float32, "half", gen)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rotary_mul_mode_backward(dtype):
    gen = torch.Generator().manual_seed(1)
    for shapes in INTERLEAVE:
        _check(shapes, dtype, "interleave", gen)


def test_rotary_mul_backward_dim3():
    gen = torch.Generator().manual_seed(2)
    for shapes in HALF_3D:
        _check(shapes, torch.float32, "half", gen)
