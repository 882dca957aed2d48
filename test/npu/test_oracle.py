"""The differential oracle on the simulated npu device (oracle_worker.py, run in a child process): injected kernel
faults caught and reported, no report over correct kernels' test grids, the SDPA hook and a Hugging Face model
checked forward and backward, modes, lists, save and replay, the torch_npu route, the calls that are not re-run,
the environment switch."""
import pytest

from test.npu import oracle_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_oracle_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
