"""moe_finalize_routing on the NPU backend: the host tiling unit test (torch-free C++, ascendc/tests/) and the op on
the simulated npu device against float64 and the CPU backend (moe_routing_worker.py, run in a child process)."""
import pytest

from test.npu import moe_routing_worker as WORKER
from test.npu.ascendc_programs import assert_passed, build, run
from test.npu.runner import case_names


def test_finalize_tiling_split_chunks_and_refusals():
    assert_passed(run(build("moe_finalize_tiling_test", ["ascendc/tests/moe_finalize_tiling_test.cpp",
                                                          "ascendc/kernels/moe/moe_finalize_routing_tiling.cpp"])))


@pytest.mark.parametrize("case", case_names(WORKER))
def test_moe_finalize_routing_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
