"""MC2 ops and tensor-parallel layers across processes: gloo ranks on localhost, launched by
torch_ops_transformer._internal.spawn with every wait bounded (subprocess timeout + process-group timeout).

Each test launches ops_worker.py with a list of scenarios; a scenario passes when every rank prints MC2-OK.
opcheck of the ops runs in-process in a one-rank group (test/ops/test_opcheck.py, cases in mc2_cases.py) and with
two ranks in the `opcheck` scenario here.
"""
import os

import pytest
import torch

import torch_ops_transformer as tot
from test.common.checkout import pythonpath
from test.common.tiers import FULL
from torch_ops_transformer._internal.spawn import describe, launch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ops_worker.py")
OPS = torch.ops.npu_fa


def run_ranks(world_size, scenarios, timeout=120.0, pg_timeout=30):
    results = launch(WORKER, world_size, [",".join(scenarios)], timeout=timeout,
                     env={"MC2_TEST_PG_TIMEOUT": str(pg_timeout), "PYTHONPATH": pythonpath()})
    return results, describe(results)


def assert_all_ok(results, report, scenarios):
    for res in results:
        assert res.returncode == 0, report
        for s in scenarios:
            assert f"MC2-OK {s}" in res.stdout, report


def test_world2_ops_backward_tp_opcheck_compile_and_bad_input():
    scenarios = ["ops", "tp", "bad_input", "opcheck", "compile"]
    results, report = run_ranks(2, scenarios)
    assert_all_ok(results, report, scenarios)
    assert results[0].stdout.count("MC2-RAISED") >= 13, report


@FULL
def test_world4_ops_and_tp():
    scenarios = ["ops_core", "tp"]
    results, report = run_ranks(4, scenarios, timeout=180.0, pg_timeout=90)  # 4 ranks on 2 cores: slow when loaded
    assert_all_ok(results, report, scenarios)


def test_ranks_disagreeing_on_dtype_or_shape_all_raise_the_same_error():
    results, report = run_ranks(2, ["mismatch"])
    assert_all_ok(results, report, ["mismatch"])
    for res in results:
        assert "disagree on the dtype of x1" in res.stdout and "disagree on x1.shape[0]" in res.stdout, report


def test_a_failing_rank_makes_the_others_raise_not_hang():
    pg_timeout = 15
    results, report = run_ranks(2, ["rank_fails"], timeout=60.0, pg_timeout=pg_timeout)
    assert results[1].returncode == 3, report
    assert results[0].returncode == 0 and "MC2-RAISED" in results[0].stdout, report
    assert results[0].seconds < 60.0, report


def test_unvalidated_mismatch_fails_somewhere_and_hangs_nowhere():
    """Validation off: mismatched sizes are not caught up front. gloo aborts the rank that receives too much, and the
    others may finish with garbage (why validation is on by default), but no rank outlives the timeouts."""
    results, report = run_ranks(2, ["mismatch_unvalidated"], timeout=60.0, pg_timeout=5)
    assert all(res.returncode is not None for res in results), "a rank hung: " + report
    assert any(res.returncode != 0 or "MC2-RAISED" in res.stdout for res in results), report


def test_wrappers_need_an_initialised_process_group(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    x1, x2 = torch.randn(4, 8), torch.randn(8, 5)
    for call in (lambda: tot.npu_all_gather_base_mm(x1, x2, "g", 2),
                 lambda: tot.npu_mm_reduce_scatter_base(x1, x2, "g", 2),
                 lambda: tot.npu_mm_all_reduce_base(x1, x2, "g")):
        with pytest.raises(RuntimeError, match="torch.distributed is not initialised.*'hcom'"):
            call()


def test_ops_with_an_unregistered_group_name_name_the_argument():
    with pytest.raises(ValueError, match="'group_name' \\('nowhere'\\) names no registered process group"):
        OPS.matmul_all_reduce(torch.randn(4, 8), torch.randn(8, 5), "nowhere")
    with pytest.raises(ValueError, match="'group_name' is empty"):
        OPS.all_gather_matmul(torch.randn(4, 8), torch.randn(8, 5), "", 1)


def test_validation_switch():
    assert tot.mc2_validation() is True  # on by default
    try:
        assert tot.mc2_validation(False) is False
        assert tot.mc2_validation() is False
    finally:
        tot.mc2_validation(True)
    with pytest.raises(ValueError, match="'enable'"):
        OPS.mc2_validation(5)
