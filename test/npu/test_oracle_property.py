"""The oracle over random valid calls on the simulated npu (oracle_property_worker.py, in one child process): no
report on correct kernels, every effective injected fault caught; the worker prints the rates."""
import pytest

from test.npu import oracle_property_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_oracle_property_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
