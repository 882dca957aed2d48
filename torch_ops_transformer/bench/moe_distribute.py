"""`python -m torch_ops_transformer.bench moe-distribute`: expert-parallel dispatch + combine per step vs a plain
torch.distributed baseline.

Launches its own ranks (world size 2, gloo over localhost, one compute thread each). Per shape every rank times,
alternating and in lockstep (fixed call counts, so collectives stay matched):
  baseline  what a user writes without the ops: sort the (token, slot) pairs by expert, index_select the rows,
            all_to_all_single the per-expert counts, then the rows; back with the reversed splits and a weighted
            index_add (the rows stay in source-rank order: no regrouping by local expert, no metadata)
  dispatch  npu_moe_distribute_dispatch_v2 (bfloat16 rows; "int8": quant_mode 2)
  combine   npu_moe_distribute_combine_v2 of dispatch's output
  step      dispatch + combine; ratio = baseline / step (> 1: ours faster)
Cross-rank validation of combine is off in the main columns (the baseline does not validate); its cost is the last
column. Rank 0 prints the table; times are the maximum over ranks of each rank's median.
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
from torch_ops_transformer.moe.distribute import (  # noqa: E402
    npu_moe_distribute_combine_v2, npu_moe_distribute_dispatch_v2)

WORLD = 2


def _cases(quick):
    # (tokens per rank, hidden, top-k, experts)
    if quick:
        return [(8, 64, 2, 4)]
    return [(16, 2048, 8, 16), (64, 2048, 8, 16), (128, 4096, 8, 32), (256, 7168, 8, 64)]


def _baseline(x, ids, weights, experts):
    W = dist.get_world_size()
    k = ids.shape[1]
    order = torch.sort(ids.reshape(-1).long(), stable=True).indices
    tok = order // k
    counts = torch.bincount(ids.reshape(-1).long(), minlength=experts)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    send = counts.view(W, -1).sum(1).tolist()
    recv = recv_counts.view(W, -1).sum(1).tolist()
    rows = x.index_select(0, tok)
    got = rows.new_empty(sum(recv), x.shape[1])
    dist.all_to_all_single(got, rows, recv, send)
    back = torch.empty_like(rows)
    dist.all_to_all_single(back, got, send, recv)
    w = weights.reshape(-1)[order].unsqueeze(1)
    return torch.zeros(x.shape, dtype=torch.float32).index_add_(0, tok, back.float() * w).to(x.dtype)


def rank_main(rank, port, quick, reps):
    init_rank(rank, port, WORLD)
    group = dist.group.WORLD.group_name
    rows = []
    for bs, h, k, experts in _cases(quick):
        g = torch.Generator().manual_seed(rank)
        x = torch.randn(bs, h, generator=g).to(torch.bfloat16)
        ids = torch.rand(bs, experts, generator=g).topk(k, dim=1).indices.to(torch.int32)
        weights = torch.rand(bs, k, generator=g)

        def dispatch(quant=0):
            return npu_moe_distribute_dispatch_v2(x, ids, group, WORLD, rank, experts, quant_mode=quant)

        out = dispatch()

        def combine():
            return npu_moe_distribute_combine_v2(out[0], ids, out[2], out[4], weights, group, WORLD, rank, experts)

        def validated_combine():
            mc2_validation(True)
            combine()
            mc2_validation(False)

        def step():
            o = dispatch()
            return npu_moe_distribute_combine_v2(o[0], ids, o[2], o[4], weights, group, WORLD, rank, experts)

        mc2_validation(False)
        dist.barrier()
        fns = {"baseline": lambda: _baseline(x, ids, weights, experts), "dispatch": dispatch,
               "dispatch_int8": lambda: dispatch(2), "combine": combine, "step": step,
               "combine_validated": validated_combine}
        t = {name: max_over_ranks(v) for name, v in time_alternating(fns, reps=reps, warmup=1).items()}
        ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
        rows.append([f"{bs}x{h}", k, experts, ms(t["baseline"]), ms(t["dispatch"]), ms(t["dispatch_int8"]),
                     ms(t["combine"]), ms(t["step"]), f"{t['baseline'] / t['step']:.2f}x",
                     f"+{(t['combine_validated'] - t['combine']) * 1e3:.2f}"])
    if rank == 0:
        print(f"# moe-distribute: world size {WORLD} (gloo, localhost), 1 compute thread per rank, "
              f"{os.cpu_count()} cores, bfloat16 tokens, median of {reps}; times in ms per call (max over ranks)")
        print(format_table(["tokens/rank x H", "K", "experts", "baseline step", "dispatch", "dispatch int8",
                            "combine", "step", "baseline/step", "combine validation"], rows))
    dist.barrier()
    dist.destroy_process_group()


def main(quick: bool = False, reps: int = 5) -> None:
    run_ranks(os.path.abspath(__file__), WORLD, "moe-distribute", quick, reps)

if __name__ == "__main__":
    rank_main(int(sys.argv[1]), sys.argv[3], sys.argv[4] == "--quick", int(sys.argv[5]))
