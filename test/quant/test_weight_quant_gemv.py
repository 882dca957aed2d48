"""npu_weight_quant_batchmatmul's small-M path (the fused dequantise-and-multiply for up to GEMV_ROWS rows of x per
product, aten_ops/cpu/quant/wq_gemv_isa.cpp) against the float64 reference of test_quant_matmul.py: every weight
form (int8 [K, N] and its transposed view, int4 packed along N and along K) x scale form (per tensor, channel,
group) x offset / bias / quant_scale, rows around the threshold (where the GEMM path takes over), batch dimensions,
float16 and bfloat16, thread-count independence and a non-contiguous x."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.tiers import FULL, pairwise
from test.quant.test_quant_matmul import pack_int4, wqbmm_reference

GEMV_ROWS = 32  # kGemvRows in aten_ops/cpu/quant/quant_matmul.cpp: rows per product of the fused path


def make_weight(form, K, N, g):
    """(the weight as the op takes it, its int values [K, N] for the reference)."""
    if form.startswith("int8"):
        q = torch.randint(-128, 128, (K, N), generator=g)
        w = q.to(torch.int8) if form == "int8" else q.t().contiguous().to(torch.int8).t()
        return w, q
    q = torch.randint(-8, 8, (K, N), generator=g)
    return (pack_int4(q) if form == "int4" else pack_int4(q.t().contiguous()).t()), q


def make_params(mode, K, N, dtype, g, offset):
    group = 32 if mode == "group" else 0
    shape = {"tensor": (1,), "channel": (N,), "group": ((K + 31) // 32, N)}[mode]
    scale = (torch.rand(shape, generator=g) * 0.02 + 0.001).to(dtype)
    off = torch.randn(shape, generator=g).to(dtype) if offset else None
    return scale, off, group


def run(x, form, mode, offset, bias, quant, seed=0, N=72):
    """Our result and the reference's for x [.., K]; N = 72: a full 64-column micro-block and a ragged tail."""
    g = torch.Generator().manual_seed(seed)
    K, dtype = x.shape[-1], x.dtype
    w, q = make_weight(form, K, N, g)
    scale, off, group = make_params(mode, K, N, dtype, g, offset)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    qs = torch.rand(N, generator=g) * 4 + 1 if quant else None
    ours = tot.npu_weight_quant_batchmatmul(x, w, scale, off, bias=b, quant_scale=qs, antiquant_group_size=group)
    ref64, same = wqbmm_reference(x, q, scale, off, group, b)
    return ours, ref64, same, qs


FORMS = ["int8", "int8_t", "int4", "int4_t"]  # _t: the transposed view (K-major)


@pytest.mark.parametrize("form,mode,offset,bias,dtype", pairwise(
    form=FORMS, mode=["tensor", "channel", "group"], offset=[False, True], bias=[False, True],
    dtype={"fp16": torch.float16, "bf16": torch.bfloat16}))
def test_weight_forms_and_parameters(form, mode, offset, bias, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 96, generator=g).to(dtype)  # K = 96: three groups of 32
    ours, ref64, same, _ = run(x, form, mode, offset, bias, quant=False)
    assert ours.dtype == dtype and ours.shape == (3, 72)
    check_tolerance(f"wq gemv {form} {mode}", ours, ref64, same)


@pytest.mark.parametrize("rows", [1, 3, GEMV_ROWS, GEMV_ROWS + 1])
@pytest.mark.parametrize("form", FORMS)
def test_rows_around_the_threshold(rows, form):
    """GEMV_ROWS rows take the fused path, one more the GEMM path: both agree with the reference."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(rows, 64, generator=g).bfloat16()
    ours, ref64, same, _ = run(x, form, "group", True, True, quant=False, seed=rows)
    check_tolerance(f"wq gemv rows={rows} {form}", ours, ref64, same)


@pytest.mark.parametrize("form", FORMS)
def test_batch_dims_flatten_into_rows(form):
    """x [2, 3, 2, K] with a 2-D weight: 12 rows, one fused product."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 2, 64, generator=g).half()
    ours, ref64, same, _ = run(x, form, "channel", True, False, quant=False)
    assert ours.shape == (2, 3, 2, 72)
    check_tolerance(f"wq gemv batch {form}", ours, ref64, same)


def test_batched_weight():
    """A weight [3, K, N] broadcast against x [2, 3, M, K]: one fused product per batch entry."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 2, 64, generator=g).bfloat16()
    q = torch.randint(-128, 128, (3, 64, 40), generator=g)
    scale = (torch.rand(2, 40, generator=g) * 0.02).bfloat16()
    ours = tot.npu_weight_quant_batchmatmul(x, q.to(torch.int8), scale, antiquant_group_size=32)
    ref64, same = wqbmm_reference(x, q, scale, None, 32)
    check_tolerance("wq gemv batched weight", ours, ref64, same)


@pytest.mark.parametrize("form", FORMS)
def test_quant_scale_int8_output(form):
    """quant_scale requantises the result already rounded to x's dtype, as the GEMM path does."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 64, generator=g).half()
    y8, _, _, qs = run(x, form, "channel", False, True, quant=True, seed=6)
    y, _, _, _ = run(x, form, "channel", False, True, quant=False, seed=6)
    assert y8.dtype == torch.int8
    assert torch.equal(y8, (y.float() * qs).round().clamp(-128, 127).to(torch.int8))


@pytest.mark.parametrize("rows", [2, 5])  # 2: the register path, 5: the panel path
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("form", FORMS)
def test_dequantised_weight_rounded_to_x_dtype(form, dtype, rows):
    """The op's numerics: the dequantised weight is rounded to x's dtype before the product. With two-hot rows of x
    every output is round(wd[i] + wd[j]), whose fp32 sum is exact: ours must equal the float64 product of the
    rounded weight bit for bit, and differs from the product of the unrounded one."""
    g = torch.Generator().manual_seed(11)
    K, N = 64, 72
    w, q = make_weight(form, K, N, g)
    scale, off, group = make_params("group", K, N, dtype, g, True)
    x = torch.zeros(rows, K, dtype=dtype)
    for r in range(rows):
        x[r, torch.randperm(K, generator=g)[:2]] = 1
    ours = tot.npu_weight_quant_batchmatmul(x, w, scale, off, antiquant_group_size=group)
    s = scale.double().repeat_interleave(32, 0)
    wd = (q.double() + off.double().repeat_interleave(32, 0)) * s
    rounded = (x.double() @ wd.to(dtype).double()).to(dtype)
    assert torch.equal(ours, rounded)
    assert not torch.equal(rounded, (x.double() @ wd).to(dtype))  # the check can tell the two apart


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("form", FORMS)
def test_thread_count_independent(form, rows):
    """Parallel over column blocks only, each column summed over K in one fixed order: bit-equal on 1 and 2
    threads (N = 1040: blocks of different widths on 1 and 2 threads)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(rows, 256, generator=g).bfloat16()
    w, _ = make_weight(form, 256, 1040, g)
    scale, off, group = make_params("group", 256, 1040, torch.bfloat16, g, True)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(tot.npu_weight_quant_batchmatmul(x, w, scale, off, antiquant_group_size=group))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])


def test_non_contiguous_x():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(64, 4, generator=g).bfloat16().t()  # [4, 64] with strides (1, 4)
    assert not x.is_contiguous()
    ours, ref64, same, _ = run(x, "int4", "group", True, False, quant=False)
    check_tolerance("wq gemv strided x", ours, ref64, same)
    assert torch.equal(ours, run(x.contiguous(), "int4", "group", True, False, quant=False)[0])


def test_float32_x_and_ragged_group():
    """float32 x (no rounding of the dequantised weight) and K = 80: the last group has 16 rows."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 80, generator=g)
    for form in FORMS:
        ours, ref64, same, _ = run(x, form, "group", True, True, quant=False)
        check_tolerance(f"wq gemv fp32 {form}", ours, ref64, same)


@FULL
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("rows", [1, 8])
def test_serving_shape(form, rows):
    """A 4096 x 4096 layer (per group of 128), the shape of the benchmark."""
    g = torch.Generator().manual_seed(10)
    x = torch.randn(rows, 4096, generator=g).bfloat16()
    w, q = make_weight(form, 4096, 4096, g)
    scale = (torch.rand(32, 4096, generator=g) * 0.02).bfloat16()
    ours = tot.npu_weight_quant_batchmatmul(x, w, scale, antiquant_group_size=128)
    ref64, same = wqbmm_reference(x, q, scale, None, 128)
    check_tolerance(f"wq gemv 4096 {form}", ours, ref64, same)
