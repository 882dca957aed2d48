"""torch.compile with Inductor on the simulated npu device (inductor_worker.py, run in a child process)."""
import pytest

from test.npu import inductor_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_inductor_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
