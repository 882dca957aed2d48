"""flash_attention_score_grad's Ascend C backward kernel: tiling unit tests and the kernel host program (C++, against
the CPU runtime), and the npu op on the simulated device (cases in npu_flash_attention_grad_cases.py)."""
import pytest

import ascendc_programs
import npu_flash_attention_grad_cases
from npu_sim_cases import case_names, run_module

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


@pytest.fixture(scope="module")
def results():
    return run_module("npu_flash_attention_grad_cases")


@pytest.mark.parametrize("case", case_names(npu_flash_attention_grad_cases))
def test_flash_attention_grad_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
