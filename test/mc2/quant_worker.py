"""One rank of the quantised MC2 tests (launched by test/mc2/test_quant.py, repository root on PYTHONPATH).

    python test/mc2/quant_worker.py <rank> <world_size> <port> <scenario,...>

Every rank builds the same seeded tensors of all ranks, so the references need no communication:
- `exact`: each rank's fp32 value computed as the kernels define it (int32 product, one fp32 dequantisation in
  quant_matmul's order: product * scale[n] * pertoken[m]), summed in float64, rounded once: our results must equal
  it bit for bit;
- `ref64`: plain float64 (dequantise, matmul, sum over ranks), with the tolerance rule against `same`, the
  computation in the output dtype as the hardware reduces (each rank's result rounded, summed in that dtype).
With TOT_NPU_SIM=1 the inputs live on the simulated npu device (the group communicates host copies).
Prints MC2-OK <scenario> when a scenario passes.
"""
import datetime
import os
import sys
import warnings

import torch
import torch.distributed as dist

import torch_ops_transformer as tot  # noqa: F401 (enables the simulated npu device under TOT_NPU_SIM=1)
from test.common.reference import check_tolerance
from torch_ops_transformer.mc2 import ops
from torch_ops_transformer.quant.api import npu_trans_quant_param

warnings.filterwarnings("ignore", category=FutureWarning)
RANK, W = int(sys.argv[1]), int(sys.argv[2])
DEV = "npu" if os.environ.get("TOT_NPU_SIM") == "1" else "cpu"
GROUP = ""


def gen(seed):
    return torch.Generator().manual_seed(seed)


def int8(seed, *shape):
    return torch.randint(-128, 128, shape, generator=gen(seed), dtype=torch.int8)


def uniform(seed, *shape, lo=0.5, hi=1.5):
    return lo + (hi - lo) * torch.rand(*shape, generator=gen(seed))


def dev(t):
    return None if t is None else t.to(DEV)


def host(t):
    return t.cpu()


def fp19(scale):
    """The fp32 scale an npu_trans_quant_param int64 carries (its fp32 bits truncated to FP19)."""
    return (scale.view(torch.int32) & -8192).view(torch.float32)


def int_product(x1, x2, bias=None):
    acc = x1.to(torch.int64).reshape(-1, x1.shape[-1]) @ x2.to(torch.int64)  # exact; fits int32 for these sizes
    return (acc if bias is None else acc + bias).to(torch.int32)


def round_sum(parts, dtype):
    return sum(p.double() for p in parts).to(dtype)


def same_dtype_sum(parts, dtype):
    """The hardware's reduction: every rank's value rounded to the output dtype, summed in it (rank order)."""
    total = parts[0].to(dtype)
    for p in parts[1:]:
        total = total + p.to(dtype)
    return total


# ---------------------------------------------------------------- npu_mm_all_reduce_base, int8 x1 and x2

def check_all_reduce(lead, k, n, scale_kind, with_pertoken, with_bias, with_x3, chunks, seed=1):
    tag = f"all_reduce {lead} k={k} n={n} {scale_kind} pertoken={with_pertoken} bias={with_bias} x3={with_x3} " \
          f"chunks={chunks}"
    m = 1
    for d in lead:
        m *= d
    X1 = [int8(seed + 10 * r, *lead, k) for r in range(W)]
    X2 = [int8(seed + 10 * r + 1, k, n) for r in range(W)]
    width = 1 if scale_kind == "int64_tensor" else n
    S = [uniform(seed + 10 * r + 2, width, lo=1e-4, hi=2e-3) for r in range(W)]
    PT = [uniform(seed + 10 * r + 3, m) for r in range(W)]
    B = [torch.randint(-5000, 5000, (n,), generator=gen(seed + 10 * r + 4), dtype=torch.int32) for r in range(W)]
    out_dtype = torch.bfloat16 if scale_kind == "bf16" else torch.float16
    X3 = [torch.randn(*lead, n, generator=gen(seed + 10 * r + 5)).to(out_dtype) for r in range(W)]
    if scale_kind == "bf16":
        S = [s.to(torch.bfloat16) for s in S]
    packed = scale_kind in ("int64", "uint64", "int64_tensor")
    fp32_scale = [fp19(s) if packed else s.float() for s in S]
    passed = [npu_trans_quant_param(s) if packed else s for s in S]
    if scale_kind == "uint64":
        passed = [p.view(torch.uint64) for p in passed]
    parts, exact64 = [], []
    for r in range(W):
        p = int_product(X1[r], X2[r], B[r] if with_bias else None) * fp32_scale[r]  # int32 * fp32, as the kernel
        if with_pertoken:
            p = p * PT[r].view(m, 1)
        if with_x3:
            p = p + X3[r].reshape(m, n).float()
        parts.append(p)
        e = X1[r].double().reshape(m, k) @ X2[r].double() + (B[r].double() if with_bias else 0)
        e = e * fp32_scale[r].double() * (PT[r].double().view(m, 1) if with_pertoken else 1)
        exact64.append(e + (X3[r].reshape(m, n).double() if with_x3 else 0))
    out = ops.npu_mm_all_reduce_base(
        dev(X1[RANK]), dev(X2[RANK]), GROUP, dequant_scale=dev(passed[RANK]),
        pertoken_scale=dev(PT[RANK]) if with_pertoken else None, bias=dev(B[RANK]) if with_bias else None,
        x3=dev(X3[RANK]) if with_x3 else None, chunks=chunks)
    assert out.dtype == out_dtype and tuple(out.shape) == (*lead, n), (tag, out.dtype, out.shape)
    out = host(out).reshape(m, n)
    assert torch.equal(out, round_sum(parts, out_dtype)), tag + ": not the exactly rounded group sum"
    check_tolerance(tag, out, sum(exact64), same_dtype_sum(parts, out_dtype))


# ---------------------------------------------------------------- npu_mm_all_reduce_base, weight-only int8 x2

def check_weight_quant(lead, k, n, dtype, group_size, with_offset, with_bias, with_x3, chunks, seed=2):
    tag = f"weight_quant {lead} k={k} n={n} {dtype} group={group_size} offset={with_offset} bias={with_bias} " \
          f"x3={with_x3} chunks={chunks}"
    m = 1
    for d in lead:
        m *= d
    rows = -(-k // group_size) if group_size else 1
    X1 = [torch.randn(*lead, k, generator=gen(seed + 10 * r)).to(dtype) for r in range(W)]
    X2 = [int8(seed + 10 * r + 1, k, n) for r in range(W)]
    S = [uniform(seed + 10 * r + 2, rows, n, lo=1e-3, hi=1e-2).to(dtype) for r in range(W)]
    S = S if group_size else [s.view(n) for s in S]
    O = [(torch.randn(*s.shape, generator=gen(seed + 10 * r + 3)) * 4).to(dtype) for r, s in enumerate(S)]
    B = [torch.randn(n, generator=gen(seed + 10 * r + 4)).to(dtype) for r in range(W)]
    X3 = [torch.randn(*lead, n, generator=gen(seed + 10 * r + 5)).to(dtype) for r in range(W)]
    ref, same = 0, None
    for r in range(W):
        idx = torch.arange(k) // group_size if group_size else slice(None)
        scale = S[r].double()[idx] if group_size else S[r].double()
        offset = (O[r].double()[idx] if group_size else O[r].double()) if with_offset else 0
        w64 = (X2[r].double() + offset) * scale
        add64 = (B[r].double() if with_bias else 0) + (X3[r].reshape(m, n).double() if with_x3 else 0)
        ref = ref + X1[r].double().reshape(m, k) @ w64 + add64
        y = X1[r].reshape(m, k) @ w64.to(dtype)  # the hardware: product in x1's dtype, additions and sum in it too
        y = y + (B[r] if with_bias else 0) + (X3[r].reshape(m, n) if with_x3 else 0)
        same = y if same is None else same + y
    out = ops.npu_mm_all_reduce_base(
        dev(X1[RANK]), dev(X2[RANK]), GROUP, antiquant_scale=dev(S[RANK]),
        antiquant_offset=dev(O[RANK]) if with_offset else None, antiquant_group_size=group_size,
        bias=dev(B[RANK]) if with_bias else None, x3=dev(X3[RANK]) if with_x3 else None, chunks=chunks)
    assert out.dtype == dtype and tuple(out.shape) == (*lead, n), (tag, out.dtype, out.shape)
    check_tolerance(tag, host(out).reshape(m, n), ref, same)


# ---------------------------------------------------------------- all-gather and reduce-scatter forms

def gather_scales(m, k, n, seed, packed, with_x1_scale):
    X1 = [int8(seed + 10 * r, m, k) for r in range(W)]
    X2 = [int8(seed + 10 * r + 1, k, n) for r in range(W)]
    X1S = [uniform(seed + 10 * r + 2, m, 1) for r in range(W)] if with_x1_scale else None
    X2S = [uniform(seed + 10 * r + 3, 1, n, lo=1e-4, hi=2e-3) for r in range(W)]
    fp32 = [fp19(s) if packed else s for s in X2S]
    passed = [npu_trans_quant_param(s.view(n)).view(1, n) if packed else s for s in X2S]
    return X1, X2, X1S, fp32, passed


def check_all_gather(m, k, n, packed, with_x1_scale, output_dtype, gather_output, chunks, quant_mm=False, seed=3):
    tag = f"all_gather m={m} k={k} n={n} packed={packed} x1_scale={with_x1_scale} {output_dtype} " \
          f"gather_output={gather_output} chunks={chunks} quant_mm={quant_mm}"
    X1, X2, X1S, fp32, passed = gather_scales(m, k, n, seed, packed, with_x1_scale)
    x1s = dev(X1S[RANK]) if with_x1_scale else None
    if quant_mm:
        out, gathered, amax = ops.npu_all_gather_quant_mm(
            dev(X1[RANK]), dev(X2[RANK]), GROUP, W, x1_scale=x1s, x2_scale=dev(passed[RANK]),
            gather_output=gather_output, y_dtype=output_dtype, comm_mode="aiv" if gather_output else None,
            chunks=chunks)
        assert amax is None, tag
    else:
        out, gathered = ops.npu_all_gather_base_mm(
            dev(X1[RANK]), dev(X2[RANK]), GROUP, W, x1_scale=x1s, x2_scale=dev(passed[RANK]),
            gather_output=gather_output, output_dtype=output_dtype, comm_mode="aiv" if gather_output else None,
            chunks=chunks)
    want_dtype = torch.float16 if packed else (output_dtype or torch.bfloat16)
    full = torch.cat(X1)
    p = int_product(full, X2[RANK]) * fp32[RANK]
    if with_x1_scale:
        p = p * torch.cat(X1S)
    assert out.dtype == want_dtype, (tag, out.dtype)
    assert torch.equal(host(out), p.to(want_dtype)), tag + ": not quant_matmul of the gathered rows"
    ref = full.double() @ X2[RANK].double() * fp32[RANK].double() * (torch.cat(X1S).double() if with_x1_scale else 1)
    check_tolerance(tag, host(out), ref, p.to(want_dtype))
    if gather_output:
        assert torch.equal(host(gathered), full), tag + ": gather_out is not AllGather(x1)"
    else:
        assert gathered.numel() == 0, tag


def check_reduce_scatter(m, k, n, packed, with_x1_scale, output_dtype, chunks, seed=4):
    tag = f"reduce_scatter m={m} k={k} n={n} packed={packed} x1_scale={with_x1_scale} {output_dtype} chunks={chunks}"
    X1, X2, X1S, fp32, passed = gather_scales(m, k, n, seed, packed, with_x1_scale)
    out = ops.npu_mm_reduce_scatter_base(
        dev(X1[RANK]), dev(X2[RANK]), GROUP, W, x1_scale=dev(X1S[RANK]) if with_x1_scale else None,
        x2_scale=dev(passed[RANK]), output_dtype=output_dtype, comm_mode="aiv", chunks=chunks)
    want_dtype = torch.float16 if packed else (output_dtype or torch.bfloat16)
    parts, exact64 = [], 0
    for r in range(W):
        p = int_product(X1[r], X2[r]) * fp32[r]
        parts.append(p * X1S[r] if with_x1_scale else p)
        exact64 = exact64 + X1[r].double() @ X2[r].double() * fp32[r].double() * (
            X1S[r].double() if with_x1_scale else 1)
    rows = slice(RANK * m // W, (RANK + 1) * m // W)
    assert out.dtype == want_dtype and tuple(out.shape) == (m // W, n), (tag, out.dtype, out.shape)
    assert torch.equal(host(out), round_sum(parts, want_dtype)[rows]), tag + ": not the exactly rounded group sum"
    check_tolerance(tag, host(out), exact64[rows], same_dtype_sum(parts, want_dtype)[rows])


# ---------------------------------------------------------------- scenarios

def scenario_all_reduce():
    for i, kind in enumerate(("int64", "bf16", "fp32", "uint64", "int64_tensor")):
        check_all_reduce((6,), 64, 24, kind, with_pertoken=kind in ("fp32", "bf16"), with_bias=i % 2 == 0,
                         with_x3=i % 2 == 1, chunks=(1, 3, 0)[i % 3], seed=10 + i)
    check_all_reduce((2, 80), 96, 40, "bf16", True, True, True, 0, seed=20)  # 3-D x1, automatic chunks


def scenario_weight_quant():
    check_weight_quant((5,), 64, 24, torch.float16, 0, True, True, True, 1)
    check_weight_quant((2, 3), 96, 16, torch.bfloat16, 32, True, False, True, 2)
    check_weight_quant((4,), 64, 8, torch.float16, 0, False, True, False, 3)


def scenario_all_gather():
    check_all_gather(6, 64, 24, False, True, torch.float16, True, 1)
    check_all_gather(7, 32, 16, False, False, None, False, 3)
    check_all_gather(5, 64, 8, True, True, None, True, 0)
    check_all_gather(6, 32, 16, False, True, torch.bfloat16, True, 2, quant_mm=True)
    check_all_gather(4, 32, 8, True, False, torch.float16, False, 1, quant_mm=True)


def scenario_reduce_scatter():
    check_reduce_scatter(4 * W, 64, 24, False, True, torch.float16, 1)
    check_reduce_scatter(6 * W, 32, 16, False, False, None, 3)
    check_reduce_scatter(3 * W, 64, 8, True, True, None, 0)


def scenario_mismatch():
    """Ranks disagreeing on the rows of x1: every rank raises the same error, and the group stays usable."""
    m = 4 + RANK
    x1, x2, s = int8(1, m, 32), int8(2, 32, 8), torch.full((1,), 1e-3)
    try:
        ops.npu_mm_all_reduce_base(dev(x1), dev(x2), GROUP, dequant_scale=dev(s.bfloat16()))
        raise AssertionError("ranks with different rows must raise")
    except ValueError as e:
        assert "disagree on the rows of x1" in str(e) and "rank 0: 4" in str(e), e
    check_all_reduce((4,), 32, 8, "bf16", False, False, False, 1)  # still in step


def scenario_npu():
    """The simulated npu device: the same forms with device tensors (a gloo group communicates host copies)."""
    assert torch.ones(1).to(DEV).device.type == "npu"
    check_all_reduce((6,), 64, 16, "int64", False, True, True, 2)
    check_weight_quant((3,), 64, 16, torch.float16, 0, True, True, True, 2)
    check_all_gather(4, 32, 8, False, True, torch.float16, True, 2, quant_mm=True)
    check_reduce_scatter(2 * W, 32, 8, False, True, None, 2)


SCENARIOS = {"all_reduce": scenario_all_reduce, "weight_quant": scenario_weight_quant,
             "all_gather": scenario_all_gather, "reduce_scatter": scenario_reduce_scatter,
             "mismatch": scenario_mismatch, "npu": scenario_npu}


def main():
    global GROUP
    port, names = sys.argv[3], sys.argv[4].split(",")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=RANK, world_size=W,
                            timeout=datetime.timedelta(seconds=float(os.environ.get("MC2_TEST_PG_TIMEOUT", "60"))))
    GROUP = dist.group.WORLD.group_name
    for name in names:
        SCENARIOS[name]()
        print(f"MC2-OK {name}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
