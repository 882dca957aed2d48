"""`python -m torch_ops_transformer.bench moe_quant` (also part of `bench moe`): quantised grouped matmul on expert
FFN shapes, same groups for every contender:

- w8a8        npu_grouped_matmul(int8 x, int8 weight, bf16 per-channel scale, fp32 per-token scale) -> bf16 (the
              serving engines' call; x arrives quantised from the previous op, so its quantisation is not timed);
- bf16        npu_grouped_matmul on bf16 x and bf16 weights (the unquantised model);
- dequant     dequantise-then-GEMM in plain PyTorch: weights and x to bf16 with their scales, then the bf16
              grouped matmul (what running W8A8 checkpoints costs without an int8 GEMM);
- w8a16       weight-only int8 (antiquant_scale, bf16 x; our kernel dequantises each expert's weight, then bf16 GEMM).

Speed-up = contender time / w8a8 time (same process, alternating contenders). Two clocks: wall time (median of
--reps) and this process's CPU time per call (minimum of --reps): on a machine shared with other jobs the wall time
mostly measures the scheduler, while the CPU time still compares the kernels (with 1 thread it is the compute time;
with several it also counts the threads' spin-waits). The header prints the load average."""
import os
import time

import torch

from ..moe.grouped_matmul import npu_grouped_matmul
from .common import format_table


def _isa() -> str:
    """The int8 / bf16 dot-product instruction sets of this CPU (oneDNN picks its int8 kernels by them)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "unknown ISA"
    wanted = ("amx_int8", "amx_bf16", "avx512_vnni", "avx_vnni", "avx512_bf16")
    return ", ".join(f for f in wanted if f in flags) or "no VNNI/AMX"


def _time(fns, reps):
    """(median wall seconds, minimum CPU seconds) per call of each fn, alternating the contenders."""
    for fn in fns.values():
        fn()
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append(time.process_time() - c0)
            wall[name].append(time.perf_counter() - w0)
    return ({k: sorted(v)[len(v) // 2] for k, v in wall.items()}, {k: min(v) for k, v in cpu.items()})


def _case(e, m, k, n):
    counts = [m // e] * e
    counts[0] += m - sum(counts)
    x8 = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    w8 = torch.randint(-127, 128, (e, k, n), dtype=torch.int8)
    scale = (torch.rand(e, n) * 1e-3).to(torch.bfloat16)
    pts = torch.rand(m) * 1e-2
    gl = torch.tensor(counts)
    xb = (x8.float() * pts[:, None]).to(torch.bfloat16)
    wb = (w8.float() * scale.float()[:, None, :]).to(torch.bfloat16)
    return x8, w8, scale, pts, gl, xb, wb


def quant_table(quick: bool, reps: int):
    cases = [("2048x1408 (DeepSeek-V2-Lite down)", 8, 512, 1408, 2048),
             ("2048x2816 (V2-Lite gate_up)", 8, 512, 2048, 2816),
             ("2048x7168 (DeepSeek-V3 down)", 8, 512, 2048, 7168),
             ("decode: 64 tokens, 2048x1408", 8, 64, 1408, 2048)]
    if quick:
        cases = [("tiny", 4, 64, 64, 32)]
    rows = []
    for name, e, m, k, n in cases:
        x8, w8, scale, pts, gl, xb, wb = _case(e, m, k, n)
        common = dict(group_list=gl, split_item=3, group_type=0, group_list_type=1)

        def w8a8():
            return npu_grouped_matmul([x8], [w8], scale=[scale], per_token_scale=[pts], output_dtype=torch.bfloat16,
                                      **common)[0]

        def bf16():
            return npu_grouped_matmul([xb], [wb], **common)[0]

        def dequant():
            w = (w8.to(torch.bfloat16) * scale[:, None, :])
            x = (x8.to(torch.float32) * pts[:, None]).to(torch.bfloat16)
            return npu_grouped_matmul([x], [w], **common)[0]

        def w8a16():
            return npu_grouped_matmul([xb], [w8], antiquant_scale=[scale], **common)[0]

        fns = {"w8a8": w8a8, "bf16": bf16, "dequant": dequant, "w8a16": w8a16}
        ref = bf16().float()
        diff = (w8a8().float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
        t, c = _time(fns, reps)
        gop = 2 * m * k * n / 1e9
        rows.append([name, f"E={e} M={m} K={k} N={n}", *(f"{t[f] * 1e3:.1f}" for f in fns),
                     f"{t['bf16'] / t['w8a8']:.2f}x", f"{t['dequant'] / t['w8a8']:.2f}x",
                     *(f"{c[f] * 1e3:.1f}" for f in fns),
                     f"{c['bf16'] / c['w8a8']:.2f}x", f"{c['dequant'] / c['w8a8']:.2f}x",
                     f"{c['w8a16'] / c['w8a8']:.2f}x", f"{gop / c['w8a8']:.0f}", f"{diff:.1e}"])
    load = " / ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"quantised grouped matmul (group_type 0, uniform groups), {torch.get_num_threads()} threads, "
          f"{reps} reps; CPU: {_isa()}; load average {load} on {os.cpu_count()} cores\n")
    print(format_table(["shape", "groups", "w8a8 ms", "bf16 ms", "dequant ms", "w8a16 ms", "bf16/w8a8",
                        "dequant/w8a8", "w8a8 cpu ms", "bf16 cpu ms", "dequant cpu ms", "w8a16 cpu ms",
                        "cpu bf16/w8a8", "cpu dequant/w8a8", "cpu w8a16/w8a8", "w8a8 GOP/cpu-s",
                        "max|w8a8-bf16|/max|bf16|"], rows))
    print()


def main(quick: bool = False, reps: int = 5):
    quant_table(quick, reps)
