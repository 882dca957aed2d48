"""F.scaled_dot_product_attention on the simulated npu device runs our flash attention through PyTorch's
overrideable SDPA hook (torch_ops_transformer.npu_sim.sdpa); the cases live in sdpa_worker.py and run in one child
process (renaming PrivateUse1 is permanent for a process)."""
import pytest

from test.npu import sdpa_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_sdpa_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, f"{case} did not run")
