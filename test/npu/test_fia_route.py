"""fused_infer_attention_score's route and learnable_sink on the simulated npu device (fia_route_worker.py, run in a
child process): the route is the CPU op's, the sink is refused by name or run by the CPU kernel."""
import pytest

from test.npu import fia_route_worker as WORKER
from test.npu.runner import case_names


@pytest.mark.parametrize("case", case_names(WORKER))
def test_fia_route_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
