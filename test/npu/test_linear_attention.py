"""The Ascend C linear attention kernels on the npu device — the recurrent gated delta rule
(recurrent_gated_delta_rule) and the fused causal conv1d (fused_causal_conv1d, _v2): their host tiling unit tests and
tikicpulib-style host programs (torch-free C++ under ascendc/tests), and npu-vs-CPU cases on the simulated device
(linear_attention_worker.py, run in a child process)."""
import pytest

from test.npu import linear_attention_worker as WORKER
from test.npu.ascendc_programs import run_program
from test.npu.runner import case_names

TILING = "ascendc/kernels/linear_attention/recurrent_gated_delta_rule_tiling.cpp"
KERNEL = "ascendc/kernels/linear_attention/recurrent_gated_delta_rule_kernel.cpp"
CONV_TILING = "ascendc/kernels/linear_attention/fused_causal_conv1d_tiling.cpp"
CONV_KERNEL = "ascendc/kernels/linear_attention/fused_causal_conv1d_kernel.cpp"


def test_tiling_program():
    run_program("recurrent_gated_delta_rule_tiling_test",
                ["ascendc/tests/recurrent_gated_delta_rule_tiling_test.cpp", TILING])


def test_kernel_host_program_vs_float64():
    out = run_program("recurrent_gated_delta_rule_kernel_test",
                      ["ascendc/tests/recurrent_gated_delta_rule_kernel_test.cpp", KERNEL, TILING])
    # several row blocks with a partial last one, row blocks split over the cores, and whole states in UB
    assert "rows=8 blocks=3 " in out and "rows=128 blocks=1 " in out and "cores=48" in out


def test_conv_tiling_program():
    run_program("fused_causal_conv1d_tiling_test", ["ascendc/tests/fused_causal_conv1d_tiling_test.cpp", CONV_TILING])


def test_conv_kernel_host_program_vs_float64():
    out = run_program("fused_causal_conv1d_kernel_test",
                      ["ascendc/tests/fused_causal_conv1d_kernel_test.cpp", CONV_KERNEL, CONV_TILING])
    # several channel blocks with a partial last one, 8-row tiles, and a decode spread over all 48 cores
    assert "channels=16 blocks=3 rows=8" in out and "cores=48" in out


@pytest.mark.parametrize("case", case_names(WORKER))
def test_linear_attention_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
