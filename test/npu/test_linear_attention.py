"""The Ascend C recurrent gated delta rule kernel (recurrent_gated_delta_rule on the npu device): its host tiling
unit test and its tikicpulib-style host program (both torch-free C++ under ascendc/tests), and npu-vs-CPU cases on
the simulated device (linear_attention_worker.py, run in a child process)."""
import pytest

from test.npu import linear_attention_worker as WORKER
from test.npu.ascendc_programs import run_program
from test.npu.runner import case_names

TILING = "ascendc/kernels/linear_attention/recurrent_gated_delta_rule_tiling.cpp"
KERNEL = "ascendc/kernels/linear_attention/recurrent_gated_delta_rule_kernel.cpp"


def test_tiling_program():
    run_program("recurrent_gated_delta_rule_tiling_test",
                ["ascendc/tests/recurrent_gated_delta_rule_tiling_test.cpp", TILING])


def test_kernel_host_program_vs_float64():
    out = run_program("recurrent_gated_delta_rule_kernel_test",
                      ["ascendc/tests/recurrent_gated_delta_rule_kernel_test.cpp", KERNEL, TILING])
    # several row blocks with a partial last one, row blocks split over the cores, and whole states in UB
    assert "rows=8 blocks=3 " in out and "rows=128 blocks=1 " in out and "cores=48" in out


@pytest.mark.parametrize("case", case_names(WORKER))
def test_linear_attention_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
