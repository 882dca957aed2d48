"""flash_attention_score's Ascend C kernel on the simulated npu device vs the CPU op (cases in
attention_worker.py, run in one child process)."""
import pytest

from test.npu import attention_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_flash_attention_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
