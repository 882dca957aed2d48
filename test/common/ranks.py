"""Run a test worker function on W spawned ranks and wait for every rank, bounded in time."""
import os
import time

import pytest

from torch_ops_transformer._internal.spawn import free_port


def run_ranks(worker, world: int, out_dir: str, timeout_s: float = 120.0) -> None:
    """Spawn `worker(rank, world, port, out_dir)` on `world` processes; each rank writes `ok<rank>` into out_dir
    when its checks pass. Fails the test if a rank dies, hangs past timeout_s, or does not report."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(worker, args=(world, free_port(), str(out_dir)), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"run with {world} ranks did not finish in {timeout_s:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    assert sorted(os.listdir(out_dir)) == [f"ok{r}" for r in range(world)]
