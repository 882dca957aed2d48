"""MoE gating top-k softmax on the NPU backend: the host tiling unit test and the tikicpulib-style kernel program
(torch-free C++, ascendc/tests/), and the op on the simulated npu device against the CPU backend
(moe_worker.py, run in a child process)."""
import pytest

from test.npu import moe_worker as WORKER
from test.npu.ascendc_programs import assert_passed, build, run
from test.npu.runner import case_names

TILING = "ascendc/kernels/moe/moe_gating_top_k_softmax_tiling.cpp"
KERNEL = "ascendc/kernels/moe/moe_gating_top_k_softmax_kernel.cpp"


def _passes(name, sources):
    assert_passed(run(build(name, sources)))


def test_tiling_budget_split_and_tails():
    _passes("moe_gating_tiling_test", ["ascendc/tests/moe_gating_tiling_test.cpp", TILING])


def test_kernel_against_float64_reference():
    _passes("moe_gating_kernel_test", ["ascendc/tests/moe_gating_kernel_test.cpp", KERNEL, TILING])


@pytest.mark.parametrize("case", case_names(WORKER))
def test_moe_gating_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
