"""`python -m torch_ops_transformer.bench weight_quant`: weight-only quantised linear layers (W8A16 per channel, W4A16
per group of 128 rows) with `npu_weight_quant_batchmatmul`, against the same layer in PyTorch.

x is bf16 [M, K] (M = 1: decode, 32: a small batch and the largest M of the fused small-M kernel, 256: prefill), the
weight [K, N] int8 or int4 (eight per int32, `npu_convert_weight_to_int4pack`), per channel or per group of 128 rows,
with bf16 scales. Contenders, alternating in one process (median):
- ours: `npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_group_size=...)`;
- torch fp32: `x.float() @ w` with the weight dequantised once beforehand to fp32 (an unquantised fp32 layer: 4 bytes
  per weight against ours 1 or 0.5);
- torch bf16: `x @ w` with the weight dequantised once to bf16 (an unquantised bf16 layer). Where the CPU has no
  native bf16 GEMM (AVX512-BF16 / AMX) PyTorch emulates it: then it is timed for M = 1 only (at M = 32 one
  product takes seconds) and the note under the table says so;
- torch dequant + mm: the weight dequantised on every call, then `x @ w` in fp32 (what a port without the op does).
Ratios are peer / ours. A row whose result differs from a float64 reference by more than 2% of its largest value
fails the command after the table is printed.
"""
import dataclasses
from typing import List, Optional

import torch

from ..quant.api import npu_convert_weight_to_int4pack, npu_weight_quant_batchmatmul
from .common import format_table, isa_flags, machine_line, time_alternating

TOL = 2e-2  # of max|reference|: bf16 weights and outputs
GEMV_ROWS = 32  # rows of x up to which the op runs its fused small-M kernel (kGemvRows in quant_matmul.cpp)


@dataclasses.dataclass
class Case:
    m: int
    k: int
    n: int
    bits: int    # 8: per-channel int8; 4: int4 per group
    group: int = 0


def default_cases(quick: bool) -> List[Case]:
    if quick:
        return [Case(1, 256, 128, 8), Case(4, 256, 128, 4, 128)]
    decode = [Case(m, 4096, 4096, bits, group) for bits in (8, 4) for group in (0, 128) for m in (1, GEMV_ROWS)]
    return decode + [Case(256, 4096, 4096, 8), Case(256, 4096, 4096, 4, 128)]


def _layer(c: Case, g: torch.Generator):
    """(weight as the op takes it, scale, the dequantised weight in float32)."""
    lo, hi = (-127, 128) if c.bits == 8 else (-8, 8)
    q = torch.randint(lo, hi, (c.k, c.n), generator=g, dtype=torch.int32)
    rows = c.k // c.group if c.group else 1
    scale = (torch.rand(rows, c.n, generator=g) * 0.02 + 0.001).to(torch.bfloat16)
    dense = (q.float().view(rows, -1, c.n) * scale.float()[:, None]).view(c.k, c.n)
    weight = q.to(torch.int8) if c.bits == 8 else npu_convert_weight_to_int4pack(q)
    return weight, (scale[0] if not c.group else scale), dense


def run_case(c: Case, reps: int, time_bf16: bool):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(c.m, c.k, generator=g).to(torch.bfloat16)
    weight, scale, dense = _layer(c, g)
    w_bf16 = dense.to(torch.bfloat16)
    q = weight.float() if c.bits == 8 else None

    def dequant_mm():
        if c.bits == 4:
            return x.float() @ dense.clone()  # (int4: unpacking is not timed on this side)
        s = scale.float().repeat_interleave(c.group, 0) if c.group else scale.float()
        return x.float() @ (q * s)

    fns = {"ours": lambda: npu_weight_quant_batchmatmul(x, weight, scale, antiquant_group_size=c.group),
           "fp32": lambda: x.float() @ dense, "dequant": dequant_mm}
    if time_bf16:
        fns["bf16"] = lambda: x @ w_bf16
    times = time_alternating(fns, reps=reps)
    ref = x.double() @ w_bf16.double()
    err = float((fns["ours"]().double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))
    return times, err


def run(quick: bool = False, reps: int = 5, cases: Optional[List[Case]] = None):
    """Measures, prints the header and table, returns the rows; raises RuntimeError (after printing) when a result is
    off."""
    native_bf16 = isa_flags().get("avx512_bf16", False) or isa_flags().get("amx_bf16", False)
    rows, bad = [], []
    for c in cases or default_cases(quick):
        times, err = run_case(c, reps, native_bf16 or c.m == 1)
        ours = times["ours"]
        name = f"W{c.bits}A16" + (f" g{c.group}" if c.group else " per-channel")
        if not err <= TOL:
            bad.append(f"{name} M={c.m}: max|ours - float64| = {err:.3g} of max|ref| > {TOL}")
        bf16 = times.get("bf16")
        rows.append([name, f"{c.m}x{c.k}x{c.n}", f"{ours * 1e3:.3f}", f"{times['fp32'] * 1e3:.3f}",
                     f"{times['fp32'] / ours:.2f}x", f"{bf16 * 1e3:.3f}" if bf16 else "emulated",
                     f"{bf16 / ours:.2f}x" if bf16 else "-", f"{times['dequant'] * 1e3:.3f}",
                     f"{times['dequant'] / ours:.2f}x", f"{err:.1e}"])
    print(f"# weight_quant: weight-only quantised linear (npu_weight_quant_batchmatmul) vs PyTorch, bf16 x, one "
          f"process, contenders alternating, median of {reps}")
    print(f"# {machine_line(torch.get_num_threads())}")
    print(format_table(["weight", "MxKxN", "ours ms", "torch fp32 ms", "fp32/ours", "torch bf16 ms", "bf16/ours",
                        "dequant+mm ms", "dequant/ours", "max err"], rows))
    if not native_bf16:
        print(f"note: this CPU has no native bf16 GEMM (no avx512_bf16 / amx_bf16): torch bf16 is PyTorch's emulated "
              f"one, timed for M = 1 only")
    if bad:
        raise RuntimeError("weight_quant benchmark: " + "; ".join(bad))
    return rows


def main(quick: bool = False, reps: int = 5) -> None:
    run(quick, reps)
