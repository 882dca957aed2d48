"""softcap and in-kernel ALiBi on the simulated npu device: the CPU-kernel fallback (cases in
softcap_alibi_worker.py, one child process)."""
import pytest

from test.npu import softcap_alibi_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_softcap_alibi_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
