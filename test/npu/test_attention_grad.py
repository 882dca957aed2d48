"""flash_attention_score_grad's Ascend C backward kernel: tiling unit tests and the kernel host program (C++, against
the CPU runtime), and the npu op on the simulated device (cases in attention_grad_worker.py)."""
import pytest

from test.npu import ascendc_programs
from test.npu import attention_grad_worker as WORKER
from test.npu.runner import case_names

TILING = "ascendc/kernels/attention/flash_attention_score_grad_tiling.cpp"
KERNEL = "ascendc/kernels/attention/flash_attention_score_grad_kernel.cpp"


def test_tiling_budget_tails_and_split():
    exe = ascendc_programs.build("flash_attention_grad_tiling_test",
                                 ["ascendc/tests/flash_attention_grad_tiling_test.cpp", TILING])
    res = ascendc_programs.run(exe)
    ascendc_programs.assert_passed(res)


def test_kernel_host_program_vs_float64():
    exe = ascendc_programs.build("flash_attention_grad_kernel_test",
                                 ["ascendc/tests/flash_attention_grad_kernel_test.cpp", KERNEL, TILING])
    res = ascendc_programs.run(exe)
    ascendc_programs.assert_passed(res)


@pytest.mark.parametrize("case", case_names(WORKER))
def test_flash_attention_grad_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
