"""TOT_NPU_SIM_NO_FALLBACK refuses every CPU fallback on the simulated npu device (fallback_worker.py, run in a
child process)."""
import pytest

from test.npu import fallback_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_fallback_switch(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
