"""What the ported MC2 tests share: ranks on a gloo group in spawned processes (torch_npu's tests use an HCCL world
of several NPUs), the `hcom` name as torch_npu code obtains it, per-rank inputs built alike on every rank, and the
checks (the project's tolerance rule against a float64 reference, and torch_npu's relative-error check).

A worker runs in each spawned rank: `worker(rank, world, port, out_dir)` calls `init_group`, runs its checks on
DEVICE tensors, and `passed(rank, out_dir)` at the end (test.common.ranks.run_ranks waits for every rank). In the
npu run the children inherit PYTHONPATH, TOT_TORCH_NPU_TEST_DEVICE and TOT_NPU_SIM_DEVICES (= WORLD), so
`test.torch_npu.common` imports the torch_npu shim there too, DEVICE is the simulated npu device and each rank
works on its own device `npu:<rank>`, as torch_npu's tests do; the gloo group communicates through host copies.
"""
import datetime
import os

import torch
import torch.distributed as dist

from test.common.ranks import run_ranks
from test.common.reference import check_tolerance
from test.torch_npu import rtol
from test.torch_npu.common import DEVICE, on_cpu

WORLD = 2  # torch_npu's tests use 2 or 8 NPUs; 2 processes keep the suite fast on a small machine


def run(worker, tmp_path, world: int = WORLD, timeout_s: float = 180.0) -> None:
    run_ranks(worker, world, str(tmp_path), timeout_s=timeout_s)


def init_group(rank: int, world: int, port: int) -> dist.ProcessGroup:
    """The default gloo group of this rank, with torch_npu's get_hccl_comm_name available on it."""
    from torch_ops_transformer.mc2 import hccl_names

    torch.set_num_threads(1)
    if DEVICE == "npu":
        torch.npu.set_device(rank)  # torch_npu's tests: each rank on its own NPU (DEVICE tensors land on npu:<rank>)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    hccl_names.install()  # what the torch_npu shim does on import
    return dist.group.WORLD


def rank_device(rank: int) -> torch.device:
    """Where a rank's DEVICE tensors and results live: npu:<rank> in the npu run, the CPU otherwise."""
    return torch.device("npu", rank) if DEVICE == "npu" else torch.device("cpu")


def hcom_name(group: dist.ProcessGroup, rank: int) -> str:
    """`hcom` as torch_npu code gets it: through the npu backend (torch > 2.0.1) where the npu device exists,
    else the group's own method (torch <= 2.0.1)."""
    if DEVICE == "npu":
        return group._get_backend(torch.device("npu")).get_hccl_comm_name(rank)
    return group.get_hccl_comm_name(rank)


def passed(rank: int, out_dir: str) -> None:
    open(os.path.join(out_dir, f"ok{rank}"), "w").close()
    dist.barrier()
    dist.destroy_process_group()


def per_rank(seed: int, world: int, shape, dtype, low: float = -1.0, high: float = 1.0):
    """One uniform [low, high) tensor per rank (torch_npu's create_common_tensor(shape, -1, 1)), the same list on
    every rank, in `dtype`."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(*shape, generator=g, dtype=torch.float64) * (high - low) + low).to(dtype)
            for _ in range(world)]


def assert_rtol_equal(name: str, ours: torch.Tensor, expected: torch.Tensor, prec: float) -> None:
    """torch_npu's assertRtolEqual(ours, expected, prec, prec) (test/torch_npu/rtol.py), on the CPU, in ours' dtype."""
    try:
        rtol.assert_rtol_equal(on_cpu(expected).to(ours.dtype), ours, prec, prec)
    except AssertionError as e:
        raise AssertionError(f"{name}: {e}") from None


def all_reduced(t: torch.Tensor) -> torch.Tensor:
    """A summed copy of `t` over the default group (the golden of the all-reduce functions)."""
    t = t.clone()
    dist.all_reduce(t)
    return t


def comm_mode_worker(rank, world, port, out_dir, check_case, check_options) -> None:
    """The rank body of the all-gather and reduce-scatter ports: float16 under both comm modes, bfloat16 with the
    default, then the option checks. Bind check_case/check_options with functools.partial (picklable for spawn)."""
    group = init_group(rank, world, port)
    hcom = hcom_name(group, rank)
    for i, comm_mode in enumerate(("aiv", "ai_cpu")):
        check_case(rank, world, hcom, torch.float16, comm_mode, seed=10 * i)
    check_case(rank, world, hcom, torch.bfloat16, None, seed=30)
    check_options(rank, world, group)
    passed(rank, out_dir)


def assert_tolerance(name: str, ours: torch.Tensor, ref64: torch.Tensor, same: torch.Tensor) -> None:
    """The project's rule: max|ours - ref64| <= 2 max|torch same-dtype - ref64| + 1e-5 (compared on the CPU)."""
    check_tolerance(name, on_cpu(ours), on_cpu(ref64), on_cpu(same))
