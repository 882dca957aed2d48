"""The attention NaN policy on the simulated npu device (Ascend C FlashAttention forward/backward and decode kernels;
cases in nan_policy_worker.py, run in a child process). The CPU paths: test/attention/test_nan_policy.py."""
import pytest

from test.npu import nan_policy_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_nan_policy_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
