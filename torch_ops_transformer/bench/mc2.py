"""`python -m torch_ops_transformer.bench mc2`: MC2 fused matmul + collective vs the unfused computation.

Launches its own ranks (world size 2, gloo over localhost, one compute thread each). For each op and shape every
rank times, alternating and in lockstep (fixed call counts, so collectives stay matched):
  comm     the collective alone (torch.distributed, the tensor the op communicates)
  compute  the matmuls alone
  unfused  torch.distributed collective, then torch.mm (what a user writes without MC2)
  fused    our op with the automatic chunk count (and an explicit one)
hidden = (comm + compute - fused) / comm, fused being the faster of the two fused columns: the share of
communication the pipeline hid behind compute (clipped to [0, 1]; 0 when fused is no faster than comm + compute). Rank 0 prints the table; times are the maximum over ranks
of each rank's median.
"""
import os
import sys

import torch
import torch.distributed as dist

if __package__ in (None, ""):  # launched as a rank script: import the package this file belongs to
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from torch_ops_transformer.bench.common import (  # noqa: E402
    format_table, init_rank, max_over_ranks, run_ranks, time_alternating)
from torch_ops_transformer.mc2.ops import mc2_validation  # noqa: E402

WORLD = 2


def _cases(quick):
    # (op, m_local_or_rows, k, n): all_gather_matmul gathers m rows per rank; matmul_reduce_scatter and
    # matmul_all_reduce multiply m rows (reduce-scatter keeps m / W).
    if quick:
        return [("all_gather_matmul", 64, 64, 32), ("matmul_reduce_scatter", 128, 64, 32),
                ("matmul_all_reduce", 64, 64, 32)]
    return [("all_gather_matmul", 1024, 1024, 512), ("all_gather_matmul", 2048, 512, 2048),
            ("matmul_reduce_scatter", 2048, 512, 1024), ("matmul_reduce_scatter", 4096, 256, 2048),
            ("matmul_all_reduce", 2048, 512, 1024), ("matmul_all_reduce", 4096, 256, 2048)]


def _contenders(op, m, k, n, group, chunks):
    ops = torch.ops.npu_fa
    W = dist.get_world_size()
    g = torch.Generator().manual_seed(dist.get_rank())
    x2 = torch.randn(k, n, generator=g)
    if op == "all_gather_matmul":
        x1 = torch.randn(m, k, generator=g)
        buf, full_x1 = torch.empty(W * m, k), torch.randn(W * m, k, generator=g)

        def comm():
            dist.all_gather_into_tensor(buf, x1)

        def unfused():
            comm()
            return buf @ x2
        return {"comm": comm, "compute": lambda: full_x1 @ x2, "unfused": unfused,
                "fused": lambda: ops.all_gather_matmul(x1, x2, group, W, None, 0, False, 0),
                f"fused_c{chunks}": lambda: ops.all_gather_matmul(x1, x2, group, W, None, 0, False, chunks)}
    x1 = torch.randn(m, k, generator=g)
    prod = torch.randn(m, n, generator=g)
    if op == "matmul_reduce_scatter":
        out = torch.empty(m // W, n)

        def comm(t=prod):
            dist.reduce_scatter_tensor(out, t)
            return out
        fused = lambda c: ops.matmul_reduce_scatter(x1, x2, group, W, None, c)  # noqa: E731
    else:
        def comm(t=prod):
            t = t.clone()
            dist.all_reduce(t)
            return t
        fused = lambda c: ops.matmul_all_reduce(x1, x2, group, None, c)  # noqa: E731
    return {"comm": comm, "compute": lambda: x1 @ x2, "unfused": lambda: comm(x1 @ x2), "fused": lambda: fused(0),
            f"fused_c{chunks}": lambda: fused(chunks)}


def _auto_chunks(op, m, k, n, W):
    """The chunk count the op picks (mirrors choose_chunks in aten_ops/cpu/mc2/ops.cpp, for the table only)."""
    rows = m if op != "matmul_reduce_scatter" else m // W
    row_bytes = 4 * (k * W if op == "all_gather_matmul" else n * (W if op == "matmul_reduce_scatter" else 1))
    return max(1, min(4, rows // 64, rows * row_bytes // (128 * 1024)))


def rank_main(rank, port, quick, reps):
    init_rank(rank, port, WORLD)
    mc2_validation(False)  # the unfused contenders do not validate either; its cost is reported below
    group = dist.group.WORLD.group_name
    rows = []
    for op, m, k, n in _cases(quick):
        explicit = 8 if not quick else 2
        fns = _contenders(op, m, k, n, group, explicit)
        dist.barrier()
        times = {name: max_over_ranks(t) for name, t in time_alternating(fns, reps=reps, warmup=1).items()}
        comm, compute, unfused, fused = times["comm"], times["compute"], times["unfused"], times["fused"]
        best = min(fused, times[f"fused_c{explicit}"])
        hidden = min(1.0, max(0.0, (comm + compute - best) / comm)) if comm > 0 else 0.0
        rows.append([op, f"{m}x{k}x{n}", _auto_chunks(op, m, k, n, WORLD), f"{comm * 1e3:.2f}", f"{compute * 1e3:.2f}",
                     f"{unfused * 1e3:.2f}", f"{fused * 1e3:.2f}", f"{times[f'fused_c{explicit}'] * 1e3:.2f}",
                     f"{unfused / fused:.2f}x", f"{hidden:.0%}"])
    # cost of cross-rank validation: one extra tiny all-gather per call, on a call dominated by collective latency
    x1, x2 = torch.randn(32, 32), torch.randn(32, 32)
    call = lambda: torch.ops.npu_fa.matmul_all_reduce(x1, x2, group, None, 1)  # noqa: E731

    def validated():
        mc2_validation(True)
        call()
        mc2_validation(False)
    v = time_alternating({"off": lambda: [call() for _ in range(20)], "on": lambda: [validated() for _ in range(20)]},
                         reps=max(reps, 5), warmup=1)
    v = {k_: t / 20 for k_, t in v.items()}
    v = {k_: max_over_ranks(t) for k_, t in v.items()}
    if rank == 0:
        print(f"# mc2: world size {WORLD} (gloo, localhost), 1 compute thread per rank, {os.cpu_count()} cores, "
              f"fp32, median of {reps}; times in ms (max over ranks)")
        print(format_table(["op", "m x k x n", "auto chunks", "comm", "compute", "unfused", "fused(auto)",
                            f"fused(c={explicit})", "unfused/fused", "comm hidden"], rows))
        print(f"# validation (signature all-gather) on a 32x32x32 matmul_all_reduce: {v['off'] * 1e6:.0f} us off, "
              f"{v['on'] * 1e6:.0f} us on (+{(v['on'] - v['off']) * 1e6:.0f} us per call)")
    dist.barrier()
    dist.destroy_process_group()


def main(quick: bool = False, reps: int = 5) -> None:
    run_ranks(os.path.abspath(__file__), WORLD, "mc2", quick, reps)

if __name__ == "__main__":
    rank_main(int(sys.argv[1]), sys.argv[3], sys.argv[4] == "--quick", int(sys.argv[5]))
