"""moe_init_routing_v2 (the MoE dispatch) on the NPU backend: the host tiling unit test (torch-free C++, ascendc/tests/)
and the op on the simulated npu device against the reference of moe_reference.py and the CPU backend
(moe_dispatch_worker.py, run in a child process)."""
import pytest

from test.npu import moe_dispatch_worker as WORKER
from test.npu.ascendc_programs import assert_passed, build, run
from test.npu.runner import case_names


def test_init_routing_tiling_split_counters_and_refusals():
    assert_passed(run(build("moe_init_routing_tiling_test", ["ascendc/tests/moe_init_routing_tiling_test.cpp",
                                                              "ascendc/kernels/moe/moe_init_routing_v2_tiling.cpp"])))


@pytest.mark.parametrize("case", case_names(WORKER))
def test_moe_init_routing_v2_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
