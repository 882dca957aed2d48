"""Launch W ranks of a Python script on localhost (gloo rendezvous on a free port), every wait bounded.

Used by the MC2 tests and benchmarks (free_port / rank_env also by the other multi-rank tests). Each rank runs `python <script> <rank> <world_size> <port> *args` and its
stdout/stderr are returned. A rank that does not finish within `timeout` seconds is killed (its process group
only, never anything else) and reported with returncode None.
"""
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence


@dataclass
class RankResult:
    rank: int
    returncode: Optional[int]  # None: killed at the timeout
    stdout: str
    stderr: str
    seconds: float


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world_size: int, port: int, **extra: str) -> dict:
    """This process's environment plus torch.distributed's env:// rendezvous variables for one localhost rank."""
    return dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), **extra)


def launch(script: str, world_size: int, args: Sequence[str] = (), timeout: float = 60.0,
           threads_per_rank: int = 1, env: Optional[dict] = None) -> List[RankResult]:
    port = free_port()
    # PYTHONFAULTHANDLER: a rank that dies on a signal prints every thread's Python stack to its stderr, which
    # describe() shows (a bare "returncode -11" says nothing about where).
    run_env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_rank), "PYTHONFAULTHANDLER": "1", **(env or {})}
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, script, str(r), str(world_size), str(port), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=run_env,
                              start_new_session=True)
             for r in range(world_size)]
    results = []
    for r, p in enumerate(procs):
        left = max(0.1, timeout - (time.monotonic() - start))
        try:
            out, err = p.communicate(timeout=left)
            code = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, err = p.communicate()
            code = None
        results.append(RankResult(r, code, out, err, time.monotonic() - start))
    return results


def describe(results: List[RankResult]) -> str:
    """Every rank's exit status and output tail, for assertion messages."""
    parts = []
    for res in results:
        parts.append(f"--- rank {res.rank}: returncode {res.returncode} after {res.seconds:.1f}s\n"
                     f"stdout: {res.stdout[-2000:]}\nstderr: {res.stderr[-3000:]}")
    return "\n".join(parts)
