"""flash_attention_score's Ascend C kernel on the simulated npu device vs the CPU op (cases in
npu_flash_attention_cases.py, run in one child process)."""
import pytest

import npu_flash_attention_cases
from npu_sim_cases import case_names, run_module


@pytest.fixture(scope="module")
def results():
    return run_module("npu_flash_attention_cases")


@pytest.mark.parametrize("case", case_names(npu_flash_attention_cases))
def test_flash_attention_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
