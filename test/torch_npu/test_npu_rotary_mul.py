"""Port of op-plugin test/test_custom_ops/test_npu_rotary_mul.py (torch_npu.npu_rotary_mul forward).

Golden (upstream's, computed on the CPU in the input dtype): x * r1 + rotate(x) * r2 with rotate_half(x) =
cat(-x2, x1) ('half') or the GPT-J pair rotation stack(-x[..., 1::2], x[..., ::2]) ('interleave'); inputs
torch.rand; default tolerances (1e-4, float16 1e-3).

Upstream cases:
- test_rotary_mul: 'half', float16 / float32, x [2, 8192, 5, 128] / [8192, 2, 5, 128] / [2048, 4, 32, 64] with
  r1, r2 broadcast over B and N. Ported.
- test_rotary_mul_mode: 'interleave', float16 / float32, x [2, 2, 5, 128], [2, 24, 5, 128], [128, 4, 4, 256],
  [64, 8, 8, 512]. Ported.
- test_rotary_mul_mode_matrix (skipped upstream: CANN version): 'half' through the rotate argument (the rotate_half
  matrix) in bfloat16, x [2, 24, 28800, 128]. Ported with S 28800 -> 288 and the golden computed in float32 and
  rounded once (the matrix product and the formula are then the same float32 arithmetic); also checks the
  interleave matrix and a block-diagonal matrix rotating two sub-vectors of D.
- test_rotary_mul_dim3, test_rotary_mul_mode_dim3 (skipped upstream: CANN version): 3-D x, 'half' / 'interleave',
  float16 / float32, shapes down to D = 2 and D = 894. Ported.
- test_rotary_mul_error_param: rotary_mode 'quarter' raises a RuntimeError with torch_npu's message "The
  rotary_mode of npu_rotary_mul should be half or interleave, but got ". Ported (ArgumentError, a RuntimeError).
"""
import pytest
import torch

from test.torch_npu.common import to_device, torch_npu
from test.torch_npu.rtol import assert_rtol_equal


def rotary_half(x, r1, r2):
    x1, x2 = torch.chunk(x, 2, -1)
    return r1 * x + r2 * torch.cat((-x2, x1), dim=-1)


def rotary_interleave(x, r1, r2):
    x_new = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).reshape(x.shape)
    return x * r1 + x_new * r2


def half_matrix(n, dtype):
    m = torch.zeros(n, n, dtype=dtype)
    m[:n // 2, n // 2:] = torch.eye(n // 2)
    m[n // 2:, :n // 2] = -torch.eye(n // 2)
    return m


def interleave_matrix(n, dtype):
    m = torch.zeros(n, n, dtype=dtype)
    for i in range(0, n, 2):
        m[i, i + 1] = 1
        m[i + 1, i] = -1
    return m


def _check(shapes, dtype, mode, gen):
    x, r1, r2 = (torch.rand(s, generator=gen).to(dtype) for s in shapes)
    golden = rotary_half(x, r1, r2) if mode == "half" else rotary_interleave(x, r1, r2)
    if mode == "half":
        out = torch_npu.npu_rotary_mul(to_device(x), to_device(r1), to_device(r2))
    else:
        out = torch_npu.npu_rotary_mul(to_device(x), to_device(r1), to_device(r2), rotary_mode=mode)
    assert_rtol_equal(golden, out.cpu())


HALF = [([2, 8192, 5, 128], [1, 8192, 1, 128], [1, 8192, 1, 128]),
        ([8192, 2, 5, 128], [8192, 1, 1, 128], [8192, 1, 1, 128]),
        ([2048, 4, 32, 64], [2048, 4, 1, 64], [2048, 4, 1, 64])]
INTERLEAVE = [([2, 2, 5, 128], [1, 2, 1, 128], [1, 2, 1, 128]),
              ([2, 24, 5, 128], [1, 1, 5, 128], [1, 1, 5, 128]),
              ([128, 4, 4, 256], [1, 1, 4, 256], [1, 1, 4, 256]),
              ([64, 8, 8, 512], [1, 1, 8, 512], [1, 1, 8, 512])]
HALF_3D = [((2, 2, 4), (2, 2, 4), (2, 2, 4)), ((4, 8, 8), (4, 8, 8), (4, 8, 8)), ((5, 10, 32), (1, 1, 32), (1, 1, 32)),
           ((8, 4, 64), (1, 1, 64), (1, 1, 64)), ((16, 8, 256), (1, 1, 256), (1, 1, 256)),
           ((1, 128, 894), (1, 1, 894), (1, 1, 894)), ((1, 256, 512), (1, 1, 512), (1, 1, 512))]
INTERLEAVE_3D = [((1, 1, 2), (1, 1, 2), (1, 1, 2)), ((1, 1, 4), (1, 1, 4), (1, 1, 4)),
                 ((1, 8, 2), (1, 1, 2), (1, 1, 2)), ((1, 8, 4), (1, 8, 4), (1, 8, 4)), ((16, 1, 2), (1, 1, 2), (1, 1, 2)),
                 ((8, 1, 4), (8, 1, 4), (8, 1, 4)), ((16, 8, 2), (1, 1, 2), (1, 1, 2))]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rotary_mul(dtype):
    gen = torch.Generator().manual_seed(0)
    for shapes in HALF:
        _check(shapes, dtype, "half", gen)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rotary_mul_mode(dtype):
    gen = torch.Generator().manual_seed(1)
    for shapes in INTERLEAVE:
        _check(shapes, dtype, "interleave", gen)


def test_rotary_mul_mode_matrix():
    gen = torch.Generator().manual_seed(2)
    x, r1, r2 = (torch.rand(s, generator=gen).to(torch.bfloat16)
                 for s in ([2, 24, 288, 128], [1, 1, 288, 128], [1, 1, 288, 128]))
    xf, r1f, r2f = x.float(), r1.float(), r2.float()
    for mode, matrix, golden in (("half", half_matrix(128, torch.bfloat16), rotary_half(xf, r1f, r2f)),
                                 ("interleave", interleave_matrix(128, torch.bfloat16),
                                  rotary_interleave(xf, r1f, r2f))):
        out = torch_npu.npu_rotary_mul(to_device(x), to_device(r1), to_device(r2), rotary_mode=mode,
                                       rotate=to_device(matrix))
        assert_rtol_equal(golden.to(torch.bfloat16), out.cpu())
    # one call rotating x = [x1 | x2] (D 64 + 64) by a block-diagonal matrix, as torch_npu's documentation suggests
    block = torch.block_diag(half_matrix(64, torch.float32), half_matrix(64, torch.float32)).to(torch.bfloat16)
    out = torch_npu.npu_rotary_mul(to_device(x), to_device(r1), to_device(r2), rotate=to_device(block))
    parts = [rotary_half(xf[..., i:i + 64], r1f[..., i:i + 64], r2f[..., i:i + 64]) for i in (0, 64)]
    assert_rtol_equal(torch.cat(parts, -1).to(torch.bfloat16), out.cpu())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rotary_mul_dim3(dtype):
    gen = torch.Generator().manual_seed(3)
    for shapes in HALF_3D:
        _check(shapes, dtype, "half", gen)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rotary_mul_mode_dim3(dtype):
    gen = torch.Generator().manual_seed(4)
    for shapes in INTERLEAVE_3D:
        _check(shapes, dtype, "interleave", gen)


def test_rotary_mul_error_param():
    x, r1, r2 = to_device(torch.rand(2, 2, 5, 128), torch.rand(1, 2, 1, 128), torch.rand(1, 2, 1, 128))
    with pytest.raises(RuntimeError, match="The rotary_mode of npu_rotary_mul should be half or interleave, but got "):
        torch_npu.npu_rotary_mul(x, r1, r2, "quarter")
