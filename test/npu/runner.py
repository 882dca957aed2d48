"""Pytest side of runner_worker.py: run a case module once in a child process and report each case as a test.

In a test file (the `results` fixture is this folder's conftest.py's: run_module of the test module's WORKER):
    from test.npu import rope_worker as WORKER
    from test.npu.runner import case_names
    @pytest.mark.parametrize("case", case_names(WORKER))
    def test_rope_on_npu(results, case): assert results.get(case) == "ok", results.get(case, "did not run")
"""
import contextlib
import json
import os
import subprocess
import sys

from test.common.checkout import ROOT, pythonpath


def case_names(module):
    return sorted(n for n in dir(module) if n.startswith("case_"))


def run_module(module_name, timeout=900):
    env = {k: v for k, v in os.environ.items() if k != "TOT_NPU_SIM"}
    env["PYTHONPATH"] = pythonpath()
    proc = subprocess.run([sys.executable, "-m", "test.npu.runner_worker", module_name],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, f"runner_worker {module_name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
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
