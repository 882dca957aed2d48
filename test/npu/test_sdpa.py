"""F.scaled_dot_product_attention on the simulated npu device runs our flash attention through PyTorch's
overrideable SDPA hook (torch_ops_transformer.npu_sdpa); the cases live in npu_sdpa_cases.py and run in one child
process (renaming PrivateUse1 is permanent for a process)."""
import pytest

import npu_sdpa_cases
from npu_sim_cases import case_names, run_module


@pytest.fixture(scope="module")
def results():
    return run_module("npu_sdpa_cases")


@pytest.mark.parametrize("case", case_names(npu_sdpa_cases))
def test_sdpa_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, f"{case} did not run")
