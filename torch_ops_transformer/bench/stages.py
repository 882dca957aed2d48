"""`python -m torch_ops_transformer.bench stages`: where the CPU attention kernels spend their time, per score element.

For the forward, prefill, backward and decode kernels at one representative shape each (fp32 and bf16): nanoseconds
per score element (query row x visible key x head) inside the matrix-product micro-kernel (oneDNN brgemm) and in the
vector work around it (row max, exponent, row sum, casts to bf16, rescaling of the output, K/V packing, micro-kernel
release), and a projection to an AMX machine: the brgemm time divided by --amx-ratio, everything else unchanged.

How the stages are measured: the kernels themselves carry chained stage laps (cpu/stage_timing.h), switched on by the
op attention_stage_ticks for the timed calls only. A lap charges the time since the previous lap to one stage, so the
stages of a worker add up to its time; the residual (instrumented call time x threads - sum of the stages) is what
runs outside the workers (argument checks, output allocation, planning, the parallel region's start). The plain
(uninstrumented) time of the same call is printed next to it: the difference is the cost of the laps.
"""
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .common import format_table, isa_flags, machine_line

# The stages in the order of attention_stage_ticks' result (cpu/stage_timing.h): (name, kernel, kind). kind "brgemm":
# the oneDNN micro-kernel (what AMX speeds up); "vector": everything else, including decode's dot products, which are
# vector FMA loops over the cache stream (memory-bound; AMX leaves them alone).
STAGES: Tuple[Tuple[str, str, str], ...] = (
    ("pack K/V/Q", "fwd", "vector"),
    ("S = Q·Kᵀ", "fwd", "brgemm"),
    ("scale, mask, row max", "fwd", "vector"),
    ("exp, row sum, P cast", "fwd", "vector"),
    ("rescale acc", "fwd", "vector"),
    ("acc += P·V", "fwd", "brgemm"),
    ("write out, release", "fwd", "vector"),
    ("pack Kᵀ, Vᵀ, K", "bwd", "vector"),
    ("S = Q·Kᵀ, dP = dY·Vᵀ", "bwd", "brgemm"),
    ("P = exp, dS = P(dP - Di)", "bwd", "vector"),
    ("P, dS cast/transpose, Q, dY pack", "bwd", "vector"),
    ("dV, dK, dQ products", "bwd", "brgemm"),
    ("write dK/dV/dQ, release", "bwd", "vector"),
    ("q·k dots", "decode", "vector"),
    ("scale, mask", "decode", "vector"),
    ("max, exp, sum, rescale", "decode", "vector"),
    ("acc += p·v", "decode", "vector"),
    ("query setup, merge, output", "decode", "vector"),
)

# How many times faster the brgemm products run with AMX-BF16 than with AVX512-BF16 (bf16 FlashAttention forward on
# an Intel Xeon, one thread, B=1 N=16 S=2048 D=128). fp32 products have no AMX path (ratio 1 for fp32 rows).
DEFAULT_AMX_RATIO = 5.0


@dataclass
class Case:
    kernel: str  # "fwd" (flash_attention_score), "prefill" (prompt_flash_attention), "bwd", "decode"
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: torch.dtype
    causal: bool = False

    @property
    def stage_kernel(self) -> str:  # prefill runs the forward kernel
        return "fwd" if self.kernel == "prefill" else self.kernel

    def label(self) -> str:
        n = f"{self.q_heads}/{self.kv_heads}" if self.q_heads != self.kv_heads else f"{self.q_heads}"
        s = f"S={self.q_len}" if self.q_len == self.kv_len else f"Sq={self.q_len} Skv={self.kv_len}"
        return f"B={self.batch} N={n} {s} D={self.head_dim}" + (" causal" if self.causal else "")

    def score_elements(self) -> int:
        """Query rows x visible keys x query heads: the elements of the score matrix the kernel computes."""
        if self.causal:  # top-left causal with Sq == Skv
            pairs = self.q_len * (self.q_len + 1) // 2
        else:
            pairs = self.q_len * self.kv_len
        return self.batch * self.q_heads * pairs


def default_cases(quick: bool) -> List[Case]:
    if quick:
        shapes = [("fwd", 1, 2, 2, 128, 128, 64, False), ("prefill", 1, 2, 2, 128, 128, 64, True),
                  ("bwd", 1, 2, 2, 128, 128, 64, False), ("decode", 2, 4, 2, 1, 256, 64, False)]
    else:
        shapes = [("fwd", 1, 16, 16, 2048, 2048, 128, False), ("prefill", 1, 16, 16, 2048, 2048, 128, True),
                  ("bwd", 1, 16, 16, 1024, 1024, 128, False), ("decode", 4, 32, 8, 1, 8192, 128, False)]
    return [Case(k, b, n1, n2, sq, skv, d, dt, c) for (k, b, n1, n2, sq, skv, d, c) in shapes
            for dt in (torch.float32, torch.bfloat16)]


def _call(case: Case) -> Callable[[], object]:
    """The op call of the case (inputs made once); the backward call gets a forward's saved outputs."""
    ops = torch.ops.npu_fa
    g = torch.Generator().manual_seed(0)
    B, N1, N2, Sq, Skv, D = case.batch, case.q_heads, case.kv_heads, case.q_len, case.kv_len, case.head_dim
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(case.dtype)
    q, k, v = rnd(B, N1, Sq, D), rnd(B, N2, Skv, D), rnd(B, N2, Skv, D)
    scale = 1.0 / math.sqrt(D)
    mode = 3 if case.causal else 0
    if case.kernel == "fwd":
        return lambda: ops.flash_attention_score(q, k, v, N1, "BNSD", scale=scale, sparse_mode=mode)
    if case.kernel == "prefill":
        return lambda: ops.prompt_flash_attention(q, k, v, num_heads=N1, num_key_value_heads=N2, scale_value=scale,
                                                  input_layout="BNSD", sparse_mode=mode)
    if case.kernel == "bwd":
        out, smax, ssum = ops.flash_attention_score(q, k, v, N1, "BNSD", scale=scale, sparse_mode=mode)[:3]
        dy = rnd(B, N1, Sq, D)
        return lambda: ops.flash_attention_score_grad(q, k, v, dy, N1, "BNSD", softmax_max=smax, softmax_sum=ssum,
                                                      attention_in=out, scale=scale, sparse_mode=mode)
    if case.kernel == "decode":
        return lambda: ops.incre_flash_attention(q, k, v, num_heads=N1, num_key_value_heads=N2, scale_value=scale,
                                                 input_layout="BNSD")
    raise ValueError(f"unknown kernel {case.kernel!r}")


def stage_ticks(enable: int = -1, reset: bool = False) -> Tuple[int, List[int]]:
    """(counter ticks per second, ticks of each stage of STAGES) from the op attention_stage_ticks."""
    res = list(torch.ops.npu_fa.attention_stage_ticks(enable, reset))
    if len(res) != len(STAGES) + 1:
        raise RuntimeError(f"attention_stage_ticks returned {len(res) - 1} stages, bench stages knows {len(STAGES)}")
    return res[0], res[1:]


@dataclass
class Measurement:
    case: Case
    threads: int
    plain_s: float  # median seconds per call, timing off
    timed_s: float  # mean seconds per call, timing on (the calls whose stages are summed)
    stage_s: Dict[str, float]  # seconds per call of each stage of the case's kernel (summed over threads)
    kinds: Dict[str, str]

    @property
    def elements(self) -> int:
        return self.case.score_elements()

    def total(self, kind: Optional[str] = None) -> float:
        return sum(s for n, s in self.stage_s.items() if kind is None or self.kinds[n] == kind)

    @property
    def residual_s(self) -> float:
        """Thread-seconds of the instrumented call that no stage holds (outside the workers)."""
        return self.timed_s * self.threads - self.total()

    def ns_per_element(self, seconds: float) -> float:
        return seconds * 1e9 / self.elements


def measure(case: Case, reps: int, threads: int) -> Measurement:
    fn = _call(case)
    with torch.no_grad():
        stage_ticks(0, True)
        fn()  # warm-up (allocations, tile choice)
        plain = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            plain.append(time.perf_counter() - t0)
        stage_ticks(1, True)  # zero the totals, timing on
        timed = 0.0
        try:
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                timed += time.perf_counter() - t0
        finally:
            rate, ticks = stage_ticks(0, True)
    names = [(i, n, kind) for i, (n, kern, kind) in enumerate(STAGES) if kern == case.stage_kernel]
    return Measurement(case, threads, statistics.median(plain), timed / reps,
                       {n: ticks[i] / rate / reps for i, n, _ in names}, {n: kind for _, n, kind in names})


@dataclass
class Projection:
    ratio: float  # the ratio applied to this row's brgemm time
    vector_ns: float  # per element: vector stages + residual (unchanged by AMX)
    brgemm_ns: float  # per element, after the ratio
    total_ns: float
    vector_share: float


def project(m: Measurement, amx_ratio: float) -> Projection:
    """AMX projection of a measurement: brgemm / ratio (bf16 products only: fp32 has no AMX path), the rest as is."""
    ratio = amx_ratio if m.case.dtype == torch.bfloat16 else 1.0
    vec = m.ns_per_element(m.total("vector") + max(m.residual_s, 0.0))
    mm = m.ns_per_element(m.total("brgemm")) / ratio
    total = vec + mm
    return Projection(ratio, vec, mm, total, vec / total if total > 0 else 0.0)


def _dt(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]


def stage_rows(m: Measurement) -> List[List[object]]:
    whole = m.timed_s * m.threads
    rows = [[m.case.kernel, _dt(m.case.dtype), name, m.kinds[name], f"{s * 1e3:.2f}", f"{m.ns_per_element(s):.3f}",
             f"{100 * s / whole:.1f}%"] for name, s in m.stage_s.items()]
    rows.append([m.case.kernel, _dt(m.case.dtype), "residual (outside workers)", "-", f"{m.residual_s * 1e3:.2f}",
                 f"{m.ns_per_element(m.residual_s):.3f}", f"{100 * m.residual_s / whole:.1f}%"])
    return rows


def summary_row(m: Measurement, amx_ratio: float) -> List[object]:
    p = project(m, amx_ratio)
    whole = m.timed_s * m.threads
    vec, mm = m.ns_per_element(m.total("vector")), m.ns_per_element(m.total("brgemm"))
    return [m.case.kernel, m.case.label(), _dt(m.case.dtype), f"{m.plain_s * 1e3:.1f}", f"{m.timed_s * 1e3:.1f}",
            f"{100 * (m.timed_s / m.plain_s - 1):+.1f}%", f"{100 * m.residual_s / whole:+.1f}%", f"{vec:.3f}",
            f"{mm:.3f}", f"{100 * m.total('vector') / whole:.0f}%", f"{p.ratio:g}", f"{p.total_ns:.3f}",
            f"{100 * p.vector_share:.0f}%"]


SUMMARY_HEADERS = ("kernel", "shape", "dtype", "plain ms", "instrumented ms", "lap cost", "residual",
                   "vector ns/elem", "brgemm ns/elem", "vector share", "AMX ratio", "projected ns/elem",
                   "projected vector share")


def products_line() -> str:
    flags = isa_flags()
    if flags.get("amx_bf16") or flags.get("avx512_bf16"):
        return "bf16 products: bf16 brgemm (VNNI-packed operands)"
    return "bf16 products: fp32 brgemm (no AVX512-BF16 or AMX: bf16 K/V/P converted to fp32 while packing)"


def main(quick: bool = False, reps: int = 5, amx_ratio: Optional[float] = None,
         cases: Optional[Sequence[Case]] = None) -> List[Measurement]:
    threads = torch.get_num_threads()
    flags = isa_flags()
    on_amx = bool(flags.get("amx_bf16"))
    if amx_ratio is None:  # on an AMX machine the measurement is the AMX figure: nothing to project
        amx_ratio = 1.0 if on_amx else DEFAULT_AMX_RATIO
    if amx_ratio <= 0:
        raise ValueError(f"--amx-ratio must be > 0; got {amx_ratio}")
    print(f"# stages: ns per score element inside the brgemm micro-kernel and in the vector work around it, "
          f"{threads} threads, {reps} calls per case")
    print(f"# {machine_line(threads)}")
    print(f"# {products_line()}; AMX projection: brgemm time / {amx_ratio:g} for bf16 rows "
          f"({'measured on AMX: no projection' if on_amx and amx_ratio == 1.0 else 'fp32 rows unchanged'})")
    measurements = [measure(c, reps, threads) for c in (cases or default_cases(quick))]
    print(format_table(("kernel", "dtype", "stage", "kind", "ms per call", "ns/elem", "of call"),
                       [r for m in measurements for r in stage_rows(m)]))
    print()
    print(format_table(SUMMARY_HEADERS, [summary_row(m, amx_ratio) for m in measurements]))
    return measurements
