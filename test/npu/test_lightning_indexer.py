"""The Ascend C lightning indexer kernel (lightning_indexer on the npu device): its host tiling unit test and its
tikicpulib-style host program (both torch-free C++ under ascendc/tests), and npu-vs-CPU cases on the simulated
device (lightning_indexer_worker.py, run in a child process)."""
import pytest

from test.npu import lightning_indexer_worker as WORKER
from test.npu.ascendc_programs import run_program
from test.npu.runner import case_names

TILING = "ascendc/kernels/sparse_attention/lightning_indexer_tiling.cpp"
KERNEL = "ascendc/kernels/sparse_attention/lightning_indexer_kernel.cpp"


def test_tiling_program():
    run_program("lightning_indexer_tiling_test", ["ascendc/tests/lightning_indexer_tiling_test.cpp", TILING])


def test_kernel_host_program_vs_float64():
    out = run_program("lightning_indexer_kernel_test",
                       ["ascendc/tests/lightning_indexer_kernel_test.cpp", KERNEL, TILING])
    # the multi-tile cases, both kinds of split ranges (scores for the merge, or a range's top-k) and no split ran
    assert "tile=8 " in out and "tile=16 " in out and "splits=1 " in out
    assert " direct " in out and " selected " in out


@pytest.mark.parametrize("case", case_names(WORKER))
def test_lightning_indexer_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
