"""Timing and memory helpers shared by the benchmark tables (protocol below).

Contenders are alternated within each repetition and the median is reported, so machine noise hits both
sides alike; ratios, not absolute times, are the result.
"""
import datetime
import gc
import os
import platform
import statistics
import subprocess
import time
from typing import Callable, Dict, List, Sequence

import torch
import torch.distributed as dist

from .._internal.spawn import describe, launch


def time_alternating(fns: Dict[str, Callable[[], object]], reps: int = 5, warmup: int = 1,
                     min_time: float = 0.0) -> Dict[str, float]:
    """Median seconds per call of each fn, alternating the contenders every repetition."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            n, elapsed = 0, 0.0
            start = time.perf_counter()
            while True:
                fn()
                n += 1
                elapsed = time.perf_counter() - start
                if elapsed >= min_time:
                    break
            samples[name].append(elapsed / n)
    return {k: statistics.median(v) for k, v in samples.items()}


def _read_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_growth(fn: Callable[[], object]) -> int:
    """Bytes the peak resident set grows by while fn runs (Linux: VmHWM reset through clear_refs)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError as e:  # pragma: no cover - non-Linux
        raise RuntimeError("peak memory measurement needs Linux /proc/self/clear_refs") from e
    base = _read_status("VmRSS:")
    result = fn()
    peak = _read_status("VmHWM:")
    del result
    gc.collect()
    return max(0, peak - base)


def gemm_gflops(dtype: torch.dtype, n: int = 2048, reps: int = 3) -> float:
    """Same-run matmul speed, the yardstick for achieved attention GFLOP/s."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    t = time_alternating({"mm": lambda: torch.mm(a, b)}, reps=reps)["mm"]
    return 2 * n**3 / t / 1e9


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo, else lscpu, else platform.processor())."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover - non-Linux
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):  # pragma: no cover
        pass
    return platform.processor() or "unknown CPU"


ISA_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16")


def isa_flags() -> Dict[str, bool]:
    """Which of ISA_FLAGS the CPU reports (/proc/cpuinfo flags; AMX also through torch when cpuinfo is absent)."""
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:  # pragma: no cover - non-Linux
        pass
    found = {name: name in flags for name in ISA_FLAGS}
    if not flags:  # pragma: no cover
        found["amx_bf16"] = bool(torch.cpu._is_amx_tile_supported())
    return found


def memory_read_gbs(nbytes: int = 1 << 30, reps: int = 3) -> float:
    """Same-run memory-read speed: the best of `reps` sums of an nbytes fp32 tensor (the decode yardstick)."""
    big = torch.ones(nbytes // 4, dtype=torch.float32)
    big.sum()  # first touch
    best = min(_once(big.sum) for _ in range(reps))
    return nbytes / best / 1e9


def _once(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def machine_line(threads: int) -> str:
    """`CPU <model>; avx512f present, ...; torch <v>; <n> threads (affinity ...)` for table headers."""
    isa = ", ".join(f"{k} {'present' if v else 'absent'}" for k, v in isa_flags().items())
    try:
        cpus = sorted(os.sched_getaffinity(0))
        affinity = f", affinity CPUs {cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else f", affinity CPU {cpus[0]}"
    except (AttributeError, OSError, IndexError):  # pragma: no cover - non-Linux
        affinity = ""
    return f"CPU {cpu_model()}; {isa}; torch {torch.__version__}; {threads} threads{affinity}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def run_ranks(script: str, world: int, table: str, quick: bool, reps: int) -> None:
    """Runs a multi-process benchmark table: `script` launched once per rank (its `rank_main` times and rank 0
    prints the table), the output of rank 0 printed here; a failing rank is an error naming the table."""
    results = launch(script, world, ["--quick" if quick else "--full", str(reps)],
                     timeout=600.0 if not quick else 180.0)
    for res in results:
        if res.returncode != 0:
            raise RuntimeError(f"{table} benchmark: a rank failed\n" + describe(results))
    print(results[0].stdout, end="")


def init_rank(rank: int, port: str, world: int) -> None:
    """A benchmark rank: one compute thread (the ranks share the cores) in a gloo group on localhost."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))


def max_over_ranks(seconds: float) -> float:
    """The slowest rank's time: a collective step is as slow as its last rank."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()
