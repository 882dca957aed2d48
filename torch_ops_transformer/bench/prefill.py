"""`python -m torch_ops_transformer.bench prefill`: prompt_flash_attention vs PyTorch's CPU SDPA (inference).

Causal prefill (PFA sparse_mode 3, SDPA is_causal=True: identical for Sq == Skv), BNSD inputs, no autograd.
Both contenders run in the same process, alternating, median of the repetitions; speed-up = torch / ours.
"""
import math
from typing import List, Tuple

import torch
import torch.nn.functional as F

from .common import format_table, gemm_gflops, time_alternating

# (B, N, S, D)
SHAPES: List[Tuple[int, int, int, int]] = [(1, 16, 2048, 128), (4, 32, 512, 128)]
QUICK_SHAPES: List[Tuple[int, int, int, int]] = [(1, 4, 256, 64), (2, 4, 128, 64)]


def run_case(B: int, N: int, S: int, D: int, dtype: torch.dtype, reps: int):
    ops = torch.ops.npu_fa  # registered by the package's import, which ran before this module's
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, N, S, D, generator=g).to(dtype) for _ in range(3))
    scale = 1.0 / math.sqrt(D)
    ours = lambda: ops.prompt_flash_attention(q, k, v, num_heads=N, scale_value=scale, input_layout="BNSD",
                                              sparse_mode=3)
    theirs = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    with torch.no_grad():
        torch.testing.assert_close(ours().float(), theirs().float(), atol=3e-2, rtol=3e-2)
        return time_alternating({"ours": ours, "torch": theirs}, reps=reps)


def main(quick: bool = False, reps: int = 5) -> None:
    threads = torch.get_num_threads()
    dt_name = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    gemm = {dt: gemm_gflops(dt, 512 if quick else 2048) for dt in dt_name}
    print(f"# prefill: prompt_flash_attention vs F.scaled_dot_product_attention (CPU, causal), {threads} threads, "
          f"median of {reps}, same-run GEMM fp32 {gemm[torch.float32]:.0f} GFLOP/s, "
          f"bf16 {gemm[torch.bfloat16]:.0f} GFLOP/s")
    rows = []
    for dtype in dt_name:
        for B, N, S, D in (QUICK_SHAPES if quick else SHAPES):
            t = run_case(B, N, S, D, dtype, reps)
            flops = 4.0 * B * N * D * S * (S + 1) / 2
            gf = flops / t["ours"] / 1e9
            rows.append([f"B={B} N={N} S={S} D={D}", dt_name[dtype], "causal", f"{t['ours'] * 1e3:.1f}",
                         f"{t['torch'] * 1e3:.1f}", f"{t['torch'] / t['ours']:.2f}x", f"{gf:.0f}",
                         f"{100 * gf / gemm[dtype]:.0f}%"])
            print(f"  done: {rows[-1][0]} {rows[-1][1]}", flush=True)
    print(format_table(["shape", "dtype", "mask", "ours ms", "torch ms", "speed-up", "ours GFLOP/s", "of GEMM"],
                       rows))
