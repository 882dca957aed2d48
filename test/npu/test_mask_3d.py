"""3-D atten_mask of the prefill ops on the simulated npu (mask_3d_worker.py, run in a child process), in the
AddressSanitizer subset: a mask read with the wrong shape indexes past the mask buffer."""
import pytest

from test.npu import mask_3d_worker as WORKER
from test.npu.runner import case_names

pytestmark = pytest.mark.asan  # the whole module runs in the AddressSanitizer subset (docs/sanitizers.md)


@pytest.mark.parametrize("case", case_names(WORKER))
def test_mask_3d_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
