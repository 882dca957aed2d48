"""The Ascend C grouped matmul kernel on the simulated npu device (grouped_matmul_worker.py, run in a child
process) and its tiling function's limits."""
import pytest

from test.npu import grouped_matmul_worker as WORKER
from test.npu.ascendc_programs import assert_passed, build, run
from test.npu.runner import case_names

TILING = "ascendc/kernels/moe/grouped_matmul_tiling.cpp"


def test_tiling_blocks_budget_launch_and_refusals():
    assert_passed(run(build("grouped_matmul_tiling_test", ["ascendc/tests/grouped_matmul_tiling_test.cpp", TILING])))


@pytest.mark.parametrize("case", case_names(WORKER))
def test_grouped_matmul_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
