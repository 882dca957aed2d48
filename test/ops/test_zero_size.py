"""The zero-size rule for every op of native_functions.yaml with tensor arguments: a call with an empty batch, an
empty sequence or all-zero lengths returns the documented empty (or zero) result and never raises or crashes. The
ops come from the YAML; the calls from zero_size_cases.py, each run in its own process so a crash (SIGFPE, SIGSEGV)
fails that case instead of ending pytest. Ops with an npu kernel of their own run the same calls on the simulated
npu too."""
import json
import subprocess
import sys

import pytest

from test.ops import zero_size_cases
from tools.codegen import model

pytestmark = pytest.mark.asan  # the whole module runs in the AddressSanitizer subset

YAML_OPS = [op for op in model.load("native_functions.yaml") if op.has_tensor_arguments]
PARAMS = [pytest.param(op.name, case, id=f"{op.name}-{case}")
          for op in YAML_OPS for case in zero_size_cases.CASES.get(op.name, {})]


def test_every_op_with_tensors_has_a_zero_size_case_or_a_reason():
    names = {op.name for op in YAML_OPS}
    covered = set(zero_size_cases.CASES) | set(zero_size_cases.NO_CASE)
    assert names - covered == set(), "ops without a zero-size case or a reason in NO_CASE"
    assert covered - names == set(), "zero-size cases for ops that are not in native_functions.yaml (or renamed)"
    assert not set(zero_size_cases.CASES) & set(zero_size_cases.NO_CASE)


def _run(*argv):
    return subprocess.run([sys.executable, "-m", "test.ops.zero_size_cases", *argv], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def batch():
    """Every case in one process (importing torch once); the cases a crash cut off are absent and run alone."""
    r = _run("--all")
    return {(d["op"], d["case"]): d for d in map(json.loads, r.stdout.splitlines()) if d}


def _check(op, case, batch, *device):
    got = batch.get((op, case))
    if got is None:  # the batch process died at or before this case: run it alone to see how
        r = _run(*device, op, case)
        assert r.returncode == 0, f"{op} ({case}) failed with exit code {r.returncode}:\n{r.stderr[-2000:]}"
        got = {"shapes": json.loads(r.stdout.strip().splitlines()[-1])}
    assert "error" not in got, f"{op} ({case}) raised {got.get('error')}"
    assert got["shapes"] == zero_size_cases.expected(op, case)


@pytest.mark.parametrize("op,case", PARAMS)
def test_zero_size(op, case, batch):
    _check(op, case, batch)


@pytest.fixture(scope="module")
def npu_batch():
    r = _run("--device", "npu", "--all")
    return {(d["op"], d["case"]): d for d in map(json.loads, r.stdout.splitlines()) if d}


NPU_PARAMS = [p for p in PARAMS if "PrivateUse1" in next(op.dispatch for op in YAML_OPS if op.name == p.values[0])]


@pytest.mark.parametrize("op,case", NPU_PARAMS)
def test_zero_size_on_the_npu_kernels(op, case, npu_batch):
    """The same calls on the simulated npu, for the ops with an npu kernel of their own (Ascend C)."""
    _check(op, case, npu_batch, "--device", "npu")
