"""Pytest side of runner_worker.py: the `case_*` functions of the *_worker modules run on the simulated npu device in
one child process per pytest session, and each case is reported as a test.

In a test file (the `results` fixture is this folder's conftest.py's: the results of the module's WORKER):
    from test.npu import rope_worker as WORKER
    from test.npu.runner import case_names
    @pytest.mark.parametrize("case", case_names(WORKER))
    def test_rope_on_npu(results, case): assert results.get(case) == "ok", results.get(case, "did not run")

A worker marks an exhaustive case with @full_case: it runs only in the full tier (test/common/tiers.py).
"""
import contextlib
import json
import os
import subprocess
import sys
from typing import Dict, List

import pytest

from test.common.checkout import ROOT, pythonpath
from test.common.tiers import FULL


def full_case(case):
    """Worker side: this case runs only in the full tier."""
    case.full_tier = True
    return case


def case_names(module):
    """The parameter values of a module's cases; a @full_case carries the `full` marker."""
    names = sorted(n for n in dir(module) if n.startswith("case_"))
    return [pytest.param(n, marks=FULL) if getattr(getattr(module, n), "full_tier", False) else n for n in names]


def run_cases(selection: Dict[str, List[str]], timeout=1800, env_vars=None) -> Dict[str, Dict[str, str]]:
    """{module: {case: "ok" | traceback}} for the selected cases of each worker module, run in one child process
    (renaming PrivateUse1 to "npu" is permanent for a process, so it never happens in the pytest session itself;
    one child for all modules pays the torch and extension import once). `env_vars` are set in the child (e.g.
    TOT_NPU_SIM_DEVICES); the simulator's variables of this process are not passed on."""
    env = {k: v for k, v in os.environ.items() if k not in ("TOT_NPU_SIM", "TOT_NPU_SIM_DEVICES")}
    env.update(env_vars or {})
    env["PYTHONPATH"] = pythonpath()
    proc = subprocess.run([sys.executable, "-m", "test.npu.runner_worker", json.dumps(selection)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, f"runner_worker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def env_var(name, value):
    """os.environ[name] = value for the calls inside (worker side: read by the npu glue at each call); the previous
    value is restored."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


def no_fallback(on=True):
    """TOT_NPU_SIM_NO_FALLBACK for the calls inside: 1 makes every npu glue raise instead of running the CPU
    kernel, 0 allows the fallback."""
    return env_var("TOT_NPU_SIM_NO_FALLBACK", "1" if on else "0")


def assert_same_error(call, what=""):
    """call(device) raises on "cpu" and raises the same exception type and first message line on "npu" (worker
    side: the bad-input rules of an op hold identically on both backends)."""
    messages = []
    for device in ("cpu", "npu"):
        try:
            call(device)
        except (ValueError, TypeError, RuntimeError) as e:
            messages.append((type(e), str(e).split("\n")[0]))
        else:
            messages.append(None)
    assert messages[0] is not None and messages[0] == messages[1], (what, messages)
