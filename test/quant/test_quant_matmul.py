"""npu_trans_quant_param, npu_quantize, npu_quant_matmul and npu_weight_quant_batchmatmul against independent
references: the bit layout in numpy, torch.quantize_per_channel and float64 (integer paths exact, float outputs under
the tolerance rule), the int4 packings, torch.compile and every bad-input rule."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import torch_ops_transformer as tot
from test.common.checkout import pythonpath
from test.common.reference import check_tolerance

OPS = torch.ops.npu_fa


# ---- references --------------------------------------------------------------------------------------------------
def tqp_reference(scale, offset=None):
    """numpy: fp32 bits & 0xFFFFE000 | 1 << 46 | (clamp(round(offset), -256, 255) & 0x1FF) << 37."""
    bits = np.frombuffer(scale.numpy().astype(np.float32).tobytes(), np.uint32).astype(np.uint64)
    out = (bits & np.uint64(0xFFFFE000)) | np.uint64(1 << 46)
    if offset is not None:
        o = np.clip(np.round(offset.numpy().astype(np.float64)), -256, 255).astype(np.int64)
        out = np.broadcast_to(out, np.broadcast_shapes(out.shape, o.shape)) | (
            (o.astype(np.uint64) & np.uint64(0x1FF)) << np.uint64(37))
    return torch.from_numpy(out.astype(np.int64).reshape(-1))


def pack_int4(q, dim=-1):
    """int values in [-8, 7] -> int32 holding 8 along `dim` (element j in bits 4j..4j+3)."""
    q = q.movedim(dim, -1).long() & 0xF
    q = q.reshape(*q.shape[:-1], q.shape[-1] // 8, 8)
    words = (q << (torch.arange(8) * 4)).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim)


def unpack_int4(w, dim=-1):
    w = w.movedim(dim, -1).long()
    nib = (w[..., None] >> (torch.arange(8) * 4)) & 0xF
    nib = torch.where(nib >= 8, nib - 16, nib)
    return nib.reshape(*w.shape[:-1], w.shape[-1] * 8).movedim(-1, dim)


def qmm_reference(x1, x2, scale, offset=None, pertoken=None, bias=None, out=torch.int8):
    """float64: (x1·x2 [+ int bias]) * scale * pertoken (+ float bias) (+ offset), rounded half to even for int8."""
    acc = torch.matmul(x1.long(), x2.long())
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + bias.long()
    if out == torch.int32:
        return acc.to(torch.int32)
    f = acc.double() * scale.double().reshape(-1)
    if pertoken is not None:
        f = f * pertoken.double()[:, None]
    if bias is not None and bias.dtype != torch.int32:
        f = f + bias.double()
    if offset is not None:
        f = f + offset.double().reshape(-1)
    if out == torch.int8:
        return f.round().clamp(-128, 127)
    return f


def random_int8(shape, seed, lo=-128, hi=128):
    return torch.randint(lo, hi, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int8)


# ---- npu_trans_quant_param -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1,), (7,), (1, 9)])
def test_trans_quant_param_bits(shape):
    scale = torch.rand(shape) * 4 + 0.01
    out = tot.npu_trans_quant_param(scale)
    assert out.dtype == torch.int64 and out.shape == scale.shape
    assert torch.equal(out.reshape(-1), tqp_reference(scale))


def test_trans_quant_param_offset_broadcast():
    scale, offset = torch.rand(1) + 0.5, torch.tensor([-300.0, -2.5, 3.5, 17.2, 400.0])
    out = tot.npu_trans_quant_param(scale, offset)
    assert out.shape == (5,)
    assert torch.equal(out, tqp_reference(scale, offset))
    # the quant matmul reads back the offset, clamped to [-256, 255], rounded half to even
    bits = (out >> 37) & 0x1FF
    assert (torch.where(bits >= 256, bits - 512, bits)).tolist() == [-256, -2, 4, 17, 255]


def test_trans_quant_param_round_mode_1():
    scale = torch.tensor([1.0 + 2**-11 + 2**-13, 1.0 + 2**-12], dtype=torch.float32)
    trunc = tot.npu_trans_quant_param(scale, round_mode=0) & 0xFFFFFFFF
    rnd = tot.npu_trans_quant_param(scale, round_mode=1) & 0xFFFFFFFF
    as_float = lambda t: t.to(torch.int32).view(torch.float32)  # noqa: E731
    assert as_float(trunc).tolist() == [1.0, 1.0]  # FP19 keeps 10 mantissa bits
    assert as_float(rnd).tolist() == [1.0 + 2**-10, 1.0]


# ---- npu_quantize ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,axis,zp_dtype", [(torch.qint8, 1, torch.int8), (torch.quint8, 2, torch.uint8),
                                                 (torch.qint32, 0, torch.int32), (torch.qint8, -1, torch.int32)])
def test_quantize_per_channel_matches_torch(dtype, axis, zp_dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 6, generator=g) * 3
    c = x.shape[axis]
    scales = torch.rand(c, generator=g) * 0.05 + 0.01
    lo, hi = (0, 20) if dtype == torch.quint8 else (-10, 10)
    zp = torch.randint(lo, hi, (c,), generator=g).to(zp_dtype)
    ours = tot.npu_quantize(x, scales, zp, dtype, axis)
    ref = torch.quantize_per_channel(x, scales.double(), zp.long(), axis % x.dim(), dtype).int_repr()
    assert ours.dtype == ref.dtype and torch.equal(ours, ref)
    # and against float64 (the products in fp32 may differ only at an exact tie)
    view = [1] * x.dim()
    view[axis] = c
    ref64 = (x.double() / scales.double().view(view)).round() + zp.double().view(view)
    assert (ours.double() - ref64.clamp(torch.iinfo(ref.dtype).min, torch.iinfo(ref.dtype).max)).abs().max() <= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("axis,shape,view", [(-1, (12,), (12,)), (-2, (5,), (5, 1)), (-2, (1, 5, 1), (1, 5, 1)),
                                             (1, (1, 1, 12), (1, 1, 12)), (-1, (1,), (1,))])
def test_quantize_mul_mode(dtype, axis, shape, view):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 5, 12, generator=g) * 20).to(dtype)
    scales = (torch.rand(shape, generator=g) * 2 + 0.2).to(dtype)
    zp = torch.randn(shape, generator=g).to(dtype)
    ours = tot.npu_quantize(x, scales, zp, torch.qint8, axis, div_mode=False)
    v = x.double() * scales.double().reshape(view) + zp.double().reshape(view)
    ref = v.round().clamp(-128, 127)
    near_tie = ((v - v.floor()) - 0.5).abs() < 1e-3
    assert ours.dtype == torch.int8 and ours.shape == x.shape
    assert torch.equal(ours.double()[~near_tie], ref[~near_tie])
    assert (ours.double() - ref).abs().max() <= 1


def test_quantize_int4_packing():
    g = torch.Generator().manual_seed(2)
    q = torch.randint(-8, 8, (3, 16), generator=g)
    ones = torch.ones(1)
    out = tot.npu_quantize(q.float(), ones, None, torch.quint4x2, -1, False)
    assert out.dtype == torch.int32 and out.shape == (3, 2)
    assert torch.equal(out, pack_int4(q))
    assert torch.equal(unpack_int4(out), q)
    # saturation to [-8, 7]
    big = tot.npu_quantize(torch.full((1, 8), 100.0), ones, None, torch.quint4x2, -1, False)
    assert torch.equal(unpack_int4(big), torch.full((1, 8), 7))


# ---- npu_quant_matmul ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch1,batch2", [((), ()), ((3,), ()), ((2, 1), (3,)), ((2,), (2,))])
def test_quant_matmul_int32_exact(batch1, batch2):
    x1, x2 = random_int8((*batch1, 7, 40), 1), random_int8((*batch2, 40, 24), 2)
    bias = torch.randint(-5000, 5000, (24,), dtype=torch.int32)
    ours = tot.npu_quant_matmul(x1, x2, torch.ones(1), bias=bias, output_dtype=torch.int32)
    assert ours.dtype == torch.int32
    assert torch.equal(ours, qmm_reference(x1, x2, None, bias=bias, out=torch.int32))


@pytest.mark.parametrize("scale_kind", ["float32", "bfloat16", "int64"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quant_matmul_int8_output(scale_kind, per_channel):
    """Power-of-two scales: every product is exact, so the int8 result must equal the float64 reference."""
    x1, x2 = random_int8((9, 64), 3), random_int8((64, 20), 4)
    n = 20 if per_channel else 1
    scale = 2.0 ** -torch.randint(8, 13, (n,), generator=torch.Generator().manual_seed(5)).float()
    offset = torch.arange(n, dtype=torch.float32) - 3 if scale_kind == "float32" else None
    bias = torch.randint(-300, 300, (20,), dtype=torch.int32)
    arg = {"float32": scale, "bfloat16": scale.bfloat16(), "int64": tot.npu_trans_quant_param(scale)}[scale_kind]
    ours = tot.npu_quant_matmul(x1, x2, arg, offset=offset, bias=bias)
    assert ours.dtype == torch.int8
    assert torch.equal(ours.double(), qmm_reference(x1, x2, scale, offset, bias=bias))


def test_quant_matmul_int64_scale_offset_bits():
    """The offset packed by npu_trans_quant_param acts as `offset`."""
    x1, x2 = random_int8((4, 32), 6), random_int8((32, 8), 7)
    scale, offset = torch.full((8,), 2.0 ** -10), torch.arange(8.0) * 3 - 12
    ours = tot.npu_quant_matmul(x1, x2, tot.npu_trans_quant_param(scale, offset))
    assert torch.equal(ours.double(), qmm_reference(x1, x2, scale, offset))


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bias_dtype", [None, torch.int32, torch.float32, torch.bfloat16])
def test_quant_matmul_float_outputs(out_dtype, bias_dtype):
    g = torch.Generator().manual_seed(8)
    x1, x2 = random_int8((2, 6, 48), 9), random_int8((48, 16), 10)
    scale = torch.rand(16, generator=g) * 1e-3
    pertoken = torch.rand(6, generator=g) + 0.5 if out_dtype == torch.bfloat16 else None
    bias = None
    if bias_dtype == torch.int32:
        bias = torch.randint(-500, 500, (16,), dtype=torch.int32, generator=g)
    elif bias_dtype is not None:
        bias = torch.randn(16, generator=g).to(bias_dtype)
    ours = tot.npu_quant_matmul(x1, x2, scale, pertoken_scale=pertoken, bias=bias, output_dtype=out_dtype)
    ref64 = qmm_reference(x1, x2, scale, pertoken=pertoken, bias=bias, out=out_dtype)
    assert ours.dtype == out_dtype and ours.shape == (2, 6, 16)
    check_tolerance("quant_matmul", ours, ref64, ref64.to(out_dtype))


def test_quant_matmul_3d_bias():
    x1, x2 = random_int8((3, 5, 32), 11), random_int8((3, 32, 8), 12)
    bias = torch.randn(3, 1, 8)
    scale = torch.full((1,), 2.0 ** -8)
    ours = tot.npu_quant_matmul(x1, x2, scale, bias=bias, output_dtype=torch.bfloat16)
    ref64 = qmm_reference(x1, x2, scale, bias=bias, out=torch.bfloat16)
    check_tolerance("quant_matmul 3-D bias", ours, ref64, ref64.to(torch.bfloat16))


@pytest.mark.parametrize("x2_layout", ["k_n8", "transposed_n_k8"])
def test_quant_matmul_int4(x2_layout):
    g = torch.Generator().manual_seed(13)
    q1, q2 = torch.randint(-8, 8, (6, 64), generator=g), torch.randint(-8, 8, (64, 16), generator=g)
    x1 = pack_int4(q1)
    x2 = pack_int4(q2) if x2_layout == "k_n8" else pack_int4(q2.t().contiguous()).t()
    scale = torch.full((1,), 2.0 ** -6)
    ours = tot.npu_quant_matmul(x1, x2, tot.npu_trans_quant_param(scale), output_dtype=torch.float16)
    ref64 = qmm_reference(q1, q2, scale, out=torch.float16)
    assert ours.shape == (6, 16)
    check_tolerance("quant_matmul int4", ours, ref64, ref64.half())
    acc = tot.npu_quant_matmul(x1, x2, scale, output_dtype=torch.int32)
    assert torch.equal(acc, q1 @ q2)


def test_quant_matmul_compile_fullgraph():
    x1, x2 = random_int8((2, 5, 32), 14), random_int8((32, 16), 15)
    scale, pts = torch.rand(16) * 1e-3, torch.rand(5)

    def f(a, b, s, p):
        return tot.npu_quant_matmul(a, b, s, pertoken_scale=p, output_dtype=torch.bfloat16)

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x1, x2, scale, pts), f(x1, x2, scale, pts))
    x1b = random_int8((3, 5, 32), 16)
    assert torch.equal(compiled(x1b, x2, scale, pts), f(x1b, x2, scale, pts))


def test_quant_matmul_empty():
    out = tot.npu_quant_matmul(torch.zeros(0, 8, dtype=torch.int8), random_int8((8, 4), 1), torch.ones(1),
                               output_dtype=torch.float16)
    assert out.shape == (0, 4) and out.dtype == torch.float16
    out = tot.npu_quant_matmul(torch.zeros(3, 0, dtype=torch.int8), torch.zeros(0, 4, dtype=torch.int8),
                               torch.ones(1), output_dtype=torch.int32)
    assert torch.equal(out, torch.zeros(3, 4, dtype=torch.int32))


# ---- npu_quant_matmul per group (A8W4, A4W4) -------------------------------------------------------------------------
def fp19(packed):
    """The fp32 a trans_quant_param int64 carries in bits 0-31 (numpy, independent of the op's unpacking)."""
    low = (packed.numpy().astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)
    return torch.from_numpy(low.view(np.float32).copy()).reshape(packed.shape)


def a8w4_reference(x1, w, scale, y_offset, pertoken, group):
    """float64, the hardware's A8W4 result: (sum_g scale[g] * (x1 - 8) @ w over group g's K rows + y_offset)
    * pertoken. `w` holds the int4 values [K, N], `scale` fp32 [K / group, N]."""
    w_scaled = w.double() * scale.double().repeat_interleave(group, 0)
    return ((x1.double() - 8) @ w_scaled + y_offset.double()) * pertoken.double().reshape(-1, 1)


def a4w4_reference(x1, w, scale, zero, pertoken, group):
    """float64: pertoken * x1 @ ((w - zero) * scale), zero and scale [K / group, N] repeated over each group's rows."""
    dequant = (w.double() - zero.double().repeat_interleave(group, 0)) * scale.double().repeat_interleave(group, 0)
    return (x1.double() @ dequant) * pertoken.double().reshape(-1, 1)


def _a8w4_inputs(M=3, K=128, N=24, group=32, seed=20):
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randint(-128, 128, (M, K), dtype=torch.int8, generator=g)
    w = torch.randint(-8, 8, (K, N), dtype=torch.int32, generator=g)
    scale = torch.rand(K // group, N, generator=g) * 0.1
    y_offset = torch.randn(N, generator=g)
    pertoken = torch.rand(M, 1, generator=g) * 0.01
    return x1, w, scale, y_offset, pertoken


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale_kind", ["int64", "float32"])
def test_quant_matmul_a8w4(out_dtype, scale_kind):
    group = 32
    x1, w, scale, y_offset, pertoken = _a8w4_inputs()
    packed = tot.npu_trans_quant_param(scale.reshape(-1)).reshape(scale.shape)
    arg, used = (packed, fp19(packed)) if scale_kind == "int64" else (scale, scale)
    ours = tot.npu_quant_matmul(x1, tot.npu_convert_weight_to_int4pack(w), arg, offset=y_offset,
                                pertoken_scale=pertoken, output_dtype=out_dtype, group_sizes=[0, 0, group])
    ref64 = a8w4_reference(x1, w, used, y_offset, pertoken, group)
    assert ours.dtype == out_dtype and ours.shape == (3, 24)
    check_tolerance("quant_matmul a8w4", ours, ref64, ref64.to(out_dtype))


def test_quant_matmul_a8w4_compensated_offset_gives_the_plain_product():
    """With y_offset = 8 * sum_k w * scale (what the caller precomputes), the result is x1 @ (w * scale) * pertoken;
    group_sizes [1, 1, G] reads as [0, 0, G]; pertoken_scale [M] as [M, 1]."""
    group = 16
    x1, w, scale, _, pertoken = _a8w4_inputs(M=4, K=64, N=16, group=group, seed=21)
    w_scaled = w.double() * scale.double().repeat_interleave(group, 0)
    y_offset = (8 * w_scaled.sum(0)).float()
    ours = tot.npu_quant_matmul(x1, tot.npu_convert_weight_to_int4pack(w), scale, offset=y_offset,
                                pertoken_scale=pertoken.reshape(-1), output_dtype=torch.float16,
                                group_sizes=[1, 1, group])
    plain = (x1.double() @ w_scaled) * pertoken.double()
    check_tolerance("quant_matmul a8w4 compensated", ours, plain, plain.half(), floor=1e-4)


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("x2_layout", ["k_n8", "transposed_n_k8"])
def test_quant_matmul_a4w4_per_group(out_dtype, x2_layout):
    g = torch.Generator().manual_seed(22)
    M, K, N, group = 5, 128, 16, 32
    q1, q2 = torch.randint(-8, 8, (M, K), generator=g), torch.randint(-8, 8, (K, N), generator=g)
    x2 = pack_int4(q2) if x2_layout == "k_n8" else pack_int4(q2.t().contiguous()).t()
    scale = torch.rand(K // group, N, generator=g) * 0.05
    zero = (torch.randn(K // group, N, generator=g) * 2).half()            # non-integer zero points too
    pertoken = torch.rand(M, 1, generator=g)
    ours = tot.npu_quant_matmul(pack_int4(q1), x2, scale, offset=zero, pertoken_scale=pertoken,
                                output_dtype=out_dtype, group_sizes=[0, 0, group])
    ref64 = a4w4_reference(q1, q2, scale, zero, pertoken, group)
    assert ours.dtype == out_dtype and ours.shape == (M, N)
    check_tolerance("quant_matmul a4w4 per group", ours, ref64, ref64.to(out_dtype))


def test_quant_matmul_per_group_compile_fullgraph():
    x1, w, scale, y_offset, pertoken = _a8w4_inputs(M=2, K=64, N=16, group=16, seed=23)
    x2 = tot.npu_convert_weight_to_int4pack(w)

    def f(a, b, s, o, p):
        return tot.npu_quant_matmul(a, b, s, offset=o, pertoken_scale=p, output_dtype=torch.bfloat16,
                                    group_sizes=[0, 0, 16])

    compiled = torch.compile(f, fullgraph=True)
    assert torch.equal(compiled(x1, x2, scale, y_offset, pertoken), f(x1, x2, scale, y_offset, pertoken))


# ---- npu_weight_quant_batchmatmul ----------------------------------------------------------------------------------
def wqbmm_reference(x, w, scale, offset=None, group=0, bias=None):
    """(float64 result, the same in x's dtype with torch.matmul on the dequantised weight)."""
    K = w.shape[-2]
    s, o = scale.double(), offset.double() if offset is not None else None
    if group:
        s = s.repeat_interleave(group, 0)[:K]
        o = o.repeat_interleave(group, 0)[:K] if o is not None else None
    wf = w.double() + (o if o is not None else 0)
    wd = wf * s
    ref = x.double() @ wd
    same = x @ wd.to(x.dtype)
    if bias is not None:
        ref, same = ref + bias.double(), same + bias.to(x.dtype)
    return ref, same


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["tensor", "channel", "group"])
@pytest.mark.parametrize("int4", [False, True])
def test_weight_quant_batchmatmul(dtype, mode, int4):
    g = torch.Generator().manual_seed(20)
    M, K, N = 5, 128, 264  # N: two full column tiles and a tail
    x = torch.randn(2, M, K, generator=g).to(dtype)
    q = torch.randint(-8, 8, (K, N), generator=g) if int4 else torch.randint(-128, 128, (K, N), generator=g)
    w = pack_int4(q) if int4 else q.to(torch.int8)
    group = 32 if mode == "group" else 0
    shape = {"tensor": (1,), "channel": (1, N), "group": (K // 32, N)}[mode]
    scale = (torch.rand(shape, generator=g) * 0.02 + 0.001).to(dtype)
    offset = torch.randn(shape, generator=g).to(dtype)
    bias = torch.randn(N, generator=g).to(dtype)
    ours = tot.npu_weight_quant_batchmatmul(x, w, scale, offset, bias=bias, antiquant_group_size=group)
    ref64, same = wqbmm_reference(x, q, scale, offset, group, bias)
    assert ours.dtype == dtype and ours.shape == (2, M, N)
    check_tolerance("weight_quant_batchmatmul", ours, ref64, same)


def test_weight_quant_batchmatmul_transposed_weight_and_ragged_group():
    g = torch.Generator().manual_seed(21)
    M, K, N = 3, 80, 16  # K not a multiple of the group: the last group has 16 rows
    x = torch.randn(M, K, generator=g).bfloat16()
    q = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    w = q.t()  # a transposed view (upstream's recommended per-channel layout)
    scale = (torch.rand(3, N, generator=g) * 0.02).bfloat16()
    ours = tot.npu_weight_quant_batchmatmul(x, w, scale, antiquant_group_size=32)
    ref64, same = wqbmm_reference(x, w, scale, None, 32)
    check_tolerance("weight_quant_batchmatmul transposed", ours, ref64, same)
    # int4 packed along K, as the transpose of an [N, K/8] tensor
    q4 = torch.randint(-8, 8, (N, K), generator=g)
    ours4 = tot.npu_weight_quant_batchmatmul(x, pack_int4(q4).t(), scale, antiquant_group_size=32)
    ref64, same = wqbmm_reference(x, q4.t(), scale, None, 32)
    check_tolerance("weight_quant_batchmatmul int4 transposed", ours4, ref64, same)


def test_weight_quant_batchmatmul_batched_weight():
    """A weight with batch dimensions broadcast against x's (upstream's Atlas 300 case: [B, N, K, Nw])."""
    g = torch.Generator().manual_seed(23)
    x = torch.randn(2, 3, 5, 64, generator=g).half()
    q = torch.randint(-128, 128, (3, 64, 40), generator=g, dtype=torch.int8)
    scale, offset = (torch.rand(1, 40, generator=g) * 0.02).half(), torch.randn(1, 40, generator=g).half()
    ours = tot.npu_weight_quant_batchmatmul(x, q, scale, offset)
    ref64, same = wqbmm_reference(x, q, scale, offset)
    assert ours.shape == (2, 3, 5, 40)
    check_tolerance("weight_quant_batchmatmul batched", ours, ref64, same)


def test_weight_quant_batchmatmul_int64_scale_and_quant_output():
    g = torch.Generator().manual_seed(22)
    x = torch.randn(4, 64, generator=g).half()
    q = torch.randint(-128, 128, (64, 8), generator=g, dtype=torch.int8)
    scale = torch.rand(1, 8, generator=g) * 0.01
    offset = torch.randint(-5, 5, (1, 8), generator=g, dtype=torch.int32)
    packed = tot.npu_trans_quant_param(scale)  # FP19-truncated: the reference uses the truncated scale
    s19 = (packed & 0xFFFFFFFF).to(torch.int32).view(torch.float32)
    ours = tot.npu_weight_quant_batchmatmul(x, q, packed, offset)
    ref64, same = wqbmm_reference(x, q, s19, offset.double())
    check_tolerance("weight_quant_batchmatmul int64 scale", ours, ref64, same)
    qs, qo = torch.full((8,), 4.0), torch.arange(8.0) - 4
    y8 = tot.npu_weight_quant_batchmatmul(x, q, scale.half(), quant_scale=qs, quant_offset=qo)
    y = tot.npu_weight_quant_batchmatmul(x, q, scale.half())
    assert y8.dtype == torch.int8
    assert torch.equal(y8, (y.float() * qs + qo).round().clamp(-128, 127).to(torch.int8))


# ---- bad input: one test per rule -----------------------------------------------------------------------------------
def _x12():
    return random_int8((4, 32), 1), random_int8((32, 8), 2)


BAD_QMM = {
    "x_dtype": (lambda: (torch.zeros(4, 32), random_int8((32, 8), 2), torch.ones(1)), {}, "x1"),
    "k_mismatch": (lambda: (random_int8((4, 32), 1), random_int8((16, 8), 2), torch.ones(1)), {}, "agree on K"),
    "rank": (lambda: (random_int8((32,), 1), random_int8((32, 8), 2), torch.ones(1)), {}, "2 to 6 dimensions"),
    "batch": (lambda: (random_int8((2, 4, 32), 1), random_int8((3, 32, 8), 2), torch.ones(1)), {}, "broadcast"),
    "scale_shape": (lambda: (*_x12(), torch.ones(3)), {}, "'scale'"),
    "scale_dtype": (lambda: (*_x12(), torch.ones(1, dtype=torch.float16)), {}, "'scale'"),
    "pertoken_shape": (lambda: (*_x12(), torch.ones(1)), {"pertoken_scale": torch.ones(5)}, "'pertoken_scale'"),
    "offset_non_int8": (lambda: (*_x12(), torch.ones(1)), {"offset": torch.ones(1), "output_dtype": torch.float16},
                        "'offset'"),
    "bias_shape": (lambda: (*_x12(), torch.ones(1)), {"bias": torch.ones(7)}, "'bias'"),
    "output_dtype": (lambda: (*_x12(), torch.ones(1)), {"output_dtype": torch.float64}, "output_dtype"),
    "int4_x2_shape": (lambda: (torch.zeros(4, 4, dtype=torch.int32), torch.zeros(5, 2, dtype=torch.int32),
                               torch.ones(1)), {}, "'x2'"),
}


def _a8w4(**over):
    """Valid A8W4 arguments (M 2, K 64, N 16, group 16) with some replaced."""
    a = dict(x1=random_int8((2, 64), 1), x2=torch.zeros(64, 2, dtype=torch.int32), scale=torch.rand(4, 16),
             offset=torch.zeros(16), pertoken_scale=torch.ones(2, 1), output_dtype=torch.float16,
             group_sizes=[0, 0, 16])
    a.update(over)
    return a


def _a4w4(**over):
    """Valid per-group A4W4 arguments (M 2, K 64, N 16, group 16) with some replaced."""
    a = dict(x1=torch.zeros(2, 8, dtype=torch.int32), x2=torch.zeros(64, 2, dtype=torch.int32),
             scale=torch.rand(4, 16), offset=torch.zeros(4, 16, dtype=torch.float16),
             pertoken_scale=torch.ones(2), output_dtype=torch.bfloat16, group_sizes=[0, 0, 16])
    a.update(over)
    return a


BAD_QMM_GROUP = {
    "group_sizes_length": (_a8w4(group_sizes=[0, 16]), "'group_sizes'.*3 values"),
    "group_sizes_negative": (_a8w4(group_sizes=[0, 0, -16]), "'group_sizes'.*>= 0"),
    "group_sizes_type": (_a8w4(group_sizes=16), "'group_sizes'.*list"),
    "group_k_zero": (_a8w4(group_sizes=[1, 1, 0]), "group_k > 0"),
    "group_not_dividing_k": (_a8w4(group_sizes=[0, 0, 24], scale=torch.rand(2, 16)), "group_k = 24 must divide K"),
    "int4_x1_int8_x2": (_a4w4(x2=random_int8((64, 16), 2)), "int32 x2"),
    "x1_float": (_a8w4(x1=torch.zeros(2, 64)), "int32 x2 .* with an int8 x1 .*got x1 Float"),
    "x1_3d": (_a8w4(x1=random_int8((1, 2, 64), 1)), "2-D x1 and x2"),
    "a8w4_x2_transposed": (_a8w4(x2=torch.zeros(16, 8, dtype=torch.int32).t()), "'x2'.*\\[K, N/8\\]"),
    "a4w4_x2_shape": (_a4w4(x2=torch.zeros(9, 2, dtype=torch.int32)), "'x2'.*transpose"),
    "output_int8": (_a8w4(output_dtype=torch.int8), "'output_dtype'"),
    "bias": (_a8w4(bias=torch.zeros(16)), "'bias' must be None"),
    "scale_shape": (_a8w4(scale=torch.rand(16)), "'scale' must be \\[K / group_k, N\\] = \\[4, 16\\]"),
    "scale_dtype": (_a8w4(scale=torch.rand(4, 16).bfloat16()), "'scale' must be int64"),
    "a4w4_scale_int64": (_a4w4(scale=torch.ops.npu_fa.trans_quant_param(torch.rand(4, 16))), "'scale' must be float32"),
    "scale_offset_bits": (_a8w4(scale=torch.ops.npu_fa.trans_quant_param(torch.rand(64), torch.ones(64)).view(4, 16)),
                          "offset bits"),
    "a8w4_offset_missing": (_a8w4(offset=None), "'offset' is required"),
    "a8w4_offset_dtype": (_a8w4(offset=torch.zeros(16).half()), "'offset'.*float32"),
    "a8w4_offset_shape": (_a8w4(offset=torch.zeros(4, 16)), "'offset'.*\\[N\\] = \\[16\\]"),
    "a4w4_offset_missing": (_a4w4(offset=None), "'offset' is required"),
    "a4w4_offset_dtype": (_a4w4(offset=torch.zeros(4, 16)), "'offset'.*float16"),
    "a4w4_offset_shape": (_a4w4(offset=torch.zeros(16, dtype=torch.float16)), "'offset'.*scale's shape"),
    "pertoken_missing": (_a8w4(pertoken_scale=None), "'pertoken_scale'.*required"),
    "pertoken_dtype": (_a8w4(pertoken_scale=torch.ones(2, 1).half()), "'pertoken_scale' must be float32"),
    "pertoken_shape": (_a4w4(pertoken_scale=torch.ones(1, 2)), "'pertoken_scale' must be \\[M\\] or \\[M, 1\\]"),
}


@pytest.mark.parametrize("rule", sorted(BAD_QMM_GROUP))
def test_quant_matmul_per_group_rejects(rule):
    kwargs, words = BAD_QMM_GROUP[rule]
    kwargs = dict(kwargs)
    args = (kwargs.pop("x1"), kwargs.pop("x2"), kwargs.pop("scale"))
    with pytest.raises((ValueError, TypeError, RuntimeError), match=words):
        tot.npu_quant_matmul(*args, **kwargs)


def test_quant_matmul_int8_x2_int32_names_a8w4():
    """An int8 x1 with an int32 x2 and no group_sizes: the message says it is A8W4 and needs group_sizes."""
    with pytest.raises(TypeError, match="A8W4: it needs group_sizes"):
        tot.npu_quant_matmul(random_int8((2, 64), 1), torch.zeros(64, 2, dtype=torch.int32), torch.ones(1))


@pytest.mark.parametrize("rule", sorted(BAD_QMM))
def test_quant_matmul_rejects(rule):
    make, kwargs, words = BAD_QMM[rule]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=words):
        tot.npu_quant_matmul(*make(), **kwargs)


def test_quant_matmul_not_implemented_cases():
    x1, x2 = _x12()
    with pytest.raises(NotImplementedError, match="group_sizes"):          # int8 x int8 per block: Ascend 950
        tot.npu_quant_matmul(x1, x2, torch.ones(1), group_sizes=[1, 1, 32])
    with pytest.raises(NotImplementedError, match="group_m or group_n"):
        tot.npu_quant_matmul(**_a8w4(group_sizes=[1, 128, 16]))
    with pytest.raises(NotImplementedError, match="y_scale"):
        tot.npu_quant_matmul(x1, x2, torch.ones(1), y_scale=torch.ones(1))
    with pytest.raises(NotImplementedError, match="x1_dtype"):
        tot.npu_quant_matmul(x1, x2, torch.ones(1), x1_dtype=torch.float8_e4m3fn)


def _wq(**over):
    a = dict(x=torch.randn(3, 64).half(), weight=random_int8((64, 16), 1), antiquant_scale=torch.rand(16).half())
    a.update(over)
    return a


BAD_WQ = {
    "x_dtype": (_wq(x=torch.randn(3, 64).double()), "'x'"),
    "weight_dtype": (_wq(weight=torch.zeros(64, 16, dtype=torch.int16)), "'weight'"),
    "k_mismatch": (_wq(weight=random_int8((32, 16), 1)), "agree on K"),
    "scale_shape": (_wq(antiquant_scale=torch.rand(15).half()), "'antiquant_scale'"),
    "scale_dtype": (_wq(antiquant_scale=torch.rand(16).bfloat16()), "'antiquant_scale'"),
    "offset_shape": (_wq(antiquant_offset=torch.rand(1, 16).half()), "'antiquant_offset'"),
    "group_size_multiple": (_wq(antiquant_group_size=48, antiquant_scale=torch.rand(2, 16).half()),
                            "antiquant_group_size"),
    "group_shape": (_wq(antiquant_group_size=32, antiquant_scale=torch.rand(3, 16).half()), "'antiquant_scale'"),
    "bias_shape": (_wq(bias=torch.rand(8).half()), "'bias'"),
    "quant_offset_alone": (_wq(quant_offset=torch.ones(1)), "quant_offset"),
    "int4_shape": (_wq(weight=torch.zeros(10, 2, dtype=torch.int32)), "'weight'"),
    "inner_precise": (_wq(inner_precise=2), "inner_precise"),
}


@pytest.mark.parametrize("rule", sorted(BAD_WQ))
def test_weight_quant_batchmatmul_rejects(rule):
    kwargs, words = BAD_WQ[rule]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=words):
        tot.npu_weight_quant_batchmatmul(**kwargs)


BAD_QUANTIZE = {
    "input_dtype": ((torch.zeros(2, 3, dtype=torch.int32), torch.ones(3), None, torch.qint8, 1), {}, "'input'"),
    "dtype": ((torch.zeros(2, 3), torch.ones(3), None, torch.float16, 1), {}, "'dtype'"),
    "axis": ((torch.zeros(2, 3), torch.ones(3), None, torch.qint8, 2), {}, "'axis'"),
    "scales_shape": ((torch.zeros(2, 3), torch.ones(2), None, torch.qint8, 1), {}, "'scales'"),
    "zero_points_dtype": ((torch.zeros(2, 3), torch.ones(3), torch.zeros(3), torch.qint8, 1), {}, "'zero_points'"),
    "int4_div_mode": ((torch.zeros(2, 8), torch.ones(8), None, torch.quint4x2, 1), {}, "div_mode"),
    "int4_multiple_of_8": ((torch.zeros(2, 6), torch.ones(6), None, torch.quint4x2, -1), {"div_mode": False},
                           "multiple of 8"),
    "mul_scales_dtype": ((torch.zeros(2, 8), torch.ones(8).half(), None, torch.qint8, -1), {"div_mode": False},
                         "'scales'"),
    "mul_axis": ((torch.zeros(2, 8), torch.ones(8), None, torch.qint8, -3), {"div_mode": False}, "'axis'"),
}


@pytest.mark.parametrize("rule", sorted(BAD_QUANTIZE))
def test_quantize_rejects(rule):
    args, kwargs, words = BAD_QUANTIZE[rule]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=words):
        tot.npu_quantize(*args, **kwargs)


BAD_TQP = {
    "scale_dtype": ((torch.ones(3, dtype=torch.float16),), "'scale'"),
    "scale_rank": ((torch.ones(1, 2, 3),), "'scale'"),
    "scale_empty": ((torch.ones(0),), "'scale'"),
    "offset_dtype": ((torch.ones(3), torch.ones(3, dtype=torch.int32)), "'offset'"),
    "offset_length": ((torch.ones(3), torch.ones(2)), "'offset'"),
    "round_mode": ((torch.ones(3), None, 2), "round_mode"),
}


@pytest.mark.parametrize("rule", sorted(BAD_TQP))
def test_trans_quant_param_rejects(rule):
    args, words = BAD_TQP[rule]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=words):
        tot.npu_trans_quant_param(*args)


# ---- npu_convert_weight_to_int4pack, npu_clipped_swiglu, npu_transpose_batchmatmul --------------------------------
def test_convert_weight_to_int4pack_roundtrip_and_matmul():
    g = torch.Generator().manual_seed(30)
    q = torch.randint(-8, 8, (64, 32), generator=g, dtype=torch.int32)
    packed = tot.npu_convert_weight_to_int4pack(q)
    assert packed.shape == (64, 4) and torch.equal(packed, pack_int4(q))
    assert torch.equal(unpack_int4(packed), q.long())
    # the packing every int4 reader of this package takes: weight-only matmul and the grouped matmul
    x = torch.randn(3, 64, generator=g).half()
    scale = (torch.rand(32, generator=g) * 0.05).half()
    ref64, same = wqbmm_reference(x, q, scale)
    check_tolerance("int4pack -> weight_quant_batchmatmul", tot.npu_weight_quant_batchmatmul(x, packed, scale),
                    ref64, same)
    gmm = tot.npu_grouped_matmul([x], [packed], antiquant_scale=[scale], group_type=-1)[0]
    check_tolerance("int4pack -> grouped_matmul", gmm, ref64, same)


def clipped_swiglu_reference(x, group_index, dim, alpha, limit, bias, interleaved):
    d = dim % x.dim()
    pre = int(torch.tensor(x.shape[:d]).prod()) if d else 1
    v = x.double().reshape(pre, -1)
    rows = pre if group_index is None else min(int(group_index.sum()), pre)
    a, b = (v[:, ::2], v[:, 1::2]) if interleaved else v.chunk(2, -1)
    a, b = a.clamp(max=limit), b.clamp(-limit, limit)
    y = a * torch.sigmoid(alpha * a) * (b + bias)
    y[rows:] = 0
    shape = list(x.shape)
    shape[d] //= 2
    return y.reshape(shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved,dim,groups", [(True, -1, False), (False, -1, True), (True, 1, True),
                                                    (False, 0, False)])
def test_clipped_swiglu(dtype, interleaved, dim, groups):
    g = torch.Generator().manual_seed(31)
    x = (torch.randn(6, 4, 10, generator=g) * 6).to(dtype)
    gi = torch.tensor([2, 1, 1], dtype=torch.int64) if groups else None
    args = dict(group_index=gi, dim=dim, alpha=1.702, limit=7.0, bias=1.0, interleaved=interleaved)
    ours = tot.npu_clipped_swiglu(x, **args)
    ref64 = clipped_swiglu_reference(x, gi, dim, 1.702, 7.0, 1.0, interleaved)
    same = clipped_swiglu_reference(x.float(), gi, dim, 1.702, 7.0, 1.0, interleaved).to(dtype)
    assert ours.dtype == dtype and ours.shape == ref64.shape
    check_tolerance("clipped_swiglu", ours, ref64, same)


def test_clipped_swiglu_matches_gpt_oss_formula():
    """transformers' GptOssExperts: gate, up = h[..., ::2], h[..., 1::2]; gate.clamp(max=limit);
    up.clamp(-limit, limit); (up + 1) * gate * sigmoid(gate * alpha)."""
    h = torch.randn(5, 16) * 8
    gate, up = h[..., ::2].clamp(max=7.0), h[..., 1::2].clamp(-7.0, 7.0)
    expected = (up + 1) * gate * torch.sigmoid(gate * 1.702)
    torch.testing.assert_close(tot.npu_clipped_swiglu(h), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("perm_x1,split", [([1, 0, 2], 1), ([0, 1, 2], 1), ([1, 0, 2], 4)])
def test_transpose_batchmatmul(dtype, perm_x1, split):
    g = torch.Generator().manual_seed(32)
    M, B, K, N = 5, 3, 32, 16
    x = torch.randn(*((M, B, K) if perm_x1 == [1, 0, 2] else (B, M, K)), generator=g).to(dtype)
    w = torch.randn(B, K, N, generator=g).to(dtype)
    ours = tot.npu_transpose_batchmatmul(x, w, perm_x1=perm_x1, batch_split_factor=split)
    xb = x.permute(perm_x1)
    ref64 = (xb.double() @ w.double()).transpose(0, 1)
    same = (xb @ w).transpose(0, 1)
    if split > 1:
        ref64 = ref64.reshape(M, split, -1).transpose(0, 1)
        same = same.reshape(M, split, -1).transpose(0, 1)
    assert ours.shape == ref64.shape and ours.dtype == dtype
    check_tolerance("transpose_batchmatmul", ours, ref64, same)


def test_transpose_batchmatmul_int8_scale():
    g = torch.Generator().manual_seed(33)
    M, B, K, N = 4, 2, 16, 8
    x = torch.randint(-4, 5, (M, B, K), generator=g).half()
    w = torch.randint(-4, 5, (B, K, N), generator=g).half()
    scale = torch.full((B * N,), 0.25)
    ours = tot.npu_transpose_batchmatmul(x, w, scale=tot.npu_trans_quant_param(scale, round_mode=1),
                                         perm_x1=[1, 0, 2])
    ref = (x.double().transpose(0, 1) @ w.double()).transpose(0, 1).reshape(M, 1, B * N) * 0.25
    assert ours.dtype == torch.int8 and torch.equal(ours.double(), ref.round().clamp(-128, 127))


BAD_P4 = {
    "int4pack_range": (lambda: tot.npu_convert_weight_to_int4pack(torch.full((2, 8), 9, dtype=torch.int32)),
                       "\\[-8, 7\\]"),
    "int4pack_dtype": (lambda: tot.npu_convert_weight_to_int4pack(torch.zeros(2, 8, dtype=torch.int8)), "'weight'"),
    "int4pack_multiple": (lambda: tot.npu_convert_weight_to_int4pack(torch.zeros(2, 6, dtype=torch.int32)),
                          "multiple of 8"),
    "clipped_odd": (lambda: tot.npu_clipped_swiglu(torch.randn(3, 7)), "even"),
    "clipped_rank": (lambda: tot.npu_clipped_swiglu(torch.randn(8)), "at least 2"),
    "clipped_group_dtype": (lambda: tot.npu_clipped_swiglu(torch.randn(3, 8), group_index=torch.ones(2)),
                            "'group_index'"),
    "tbmm_perm": (lambda: tot.npu_transpose_batchmatmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5),
                                                        perm_x1=[1, 1, 2]), "perm_x1"),
    "tbmm_shape": (lambda: tot.npu_transpose_batchmatmul(torch.randn(2, 3, 4), torch.randn(3, 5, 5),
                                                         perm_x1=[1, 0, 2]), "\\[B, K, N\\]"),
    "tbmm_dtype": (lambda: tot.npu_transpose_batchmatmul(torch.randint(0, 2, (2, 3, 4)), torch.randn(3, 4, 5)),
                   "'input'"),
    "tbmm_split": (lambda: tot.npu_transpose_batchmatmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5),
                                                         perm_x1=[1, 0, 2], batch_split_factor=4),
                   "batch_split_factor"),
    "tbmm_scale_shape": (lambda: tot.npu_transpose_batchmatmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5),
                                                               scale=torch.ones(5, dtype=torch.int64),
                                                               perm_x1=[1, 0, 2]), "'scale'"),
}


@pytest.mark.parametrize("rule", sorted(BAD_P4))
def test_int4pack_clipped_swiglu_transpose_bmm_reject(rule):
    call, words = BAD_P4[rule]
    with pytest.raises((ValueError, TypeError, RuntimeError), match=words):
        call()


def test_transpose_batchmatmul_bias_not_implemented():
    with pytest.raises(NotImplementedError, match="'bias'"):
        tot.npu_transpose_batchmatmul(torch.randn(2, 3, 4), torch.randn(3, 4, 5), bias=torch.ones(5))


# ---- docs/quant.md's examples run ----------------------------------------------------------------------------------
def _doc_examples():
    import pathlib
    import re
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "quant.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.mark.parametrize("index", range(len(_doc_examples())))
def test_doc_example_runs(index):
    exec(compile(_doc_examples()[index], f"docs/quant.md example {index}", "exec"), {})  # noqa: S102


def _extremes(K: int, M: int, N: int):
    """int8 operands with the largest products (all -128: 2^14 each), +127 rows/columns and random ones."""
    g = torch.Generator().manual_seed(K)
    x1 = torch.full((M, K), -128, dtype=torch.int8)
    x1[1] = 127
    x1[2] = torch.randint(-128, 128, (K,), generator=g, dtype=torch.int8)
    x2 = torch.full((K, N), -128, dtype=torch.int8)
    x2[:, 1] = 127
    x2[:, 2] = torch.randint(-128, 128, (K,), generator=g, dtype=torch.int8)
    return x1, x2


@pytest.mark.parametrize("K", [1, 1024, 1025, 2500])
@pytest.mark.parametrize("M, N", [(5, 7), (7, 37)])
def test_w8a8_int32_product_is_exact_at_the_extremes(K, M, N):
    """The int32 product is exact on this CPU's path (oneDNN's int8 GEMM with AVX-512, the vpmaddwd kernel with AVX2:
    row blocks of 4/2/1 and 16 columns plus a tail at M=7, N=37), K odd and across the fp32 path's slice edge."""
    x1, x2 = _extremes(K, M, N)
    got = tot.npu_quant_matmul(x1, x2, torch.ones(N), output_dtype=torch.int32)
    assert torch.equal(got.long(), x1.long() @ x2.long())


def test_w8a8_int32_product_is_exact_without_simd():
    """The path of CPUs below AVX2 (fp32 GEMMs over slices of 1024 rows of K, summed in int32), chosen in a child
    process with ATEN_CPU_CAPABILITY=default: exact at the extremes across the slice edge."""
    code = ("import torch, torch_ops_transformer as tot\n"
            "from test.quant.test_quant_matmul import _extremes\n"
            "for K in (1024, 1025, 2500):\n"
            "    x1, x2 = _extremes(K, 7, 37)\n"
            "    got = tot.npu_quant_matmul(x1, x2, torch.ones(37), output_dtype=torch.int32)\n"
            "    assert torch.equal(got.long(), x1.long() @ x2.long()), K\n"
            "print('exact', torch.backends.cpu.get_cpu_capability())\n")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", PYTHONPATH=pythonpath())
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "exact DEFAULT" in res.stdout, res.stdout + res.stderr
