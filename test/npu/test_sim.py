"""The simulated NPU device (torch_ops_transformer.npu_sim). Every check runs in a child process: renaming
PrivateUse1 to "npu" is permanent for a process and must not leak into the rest of the test session."""
import json
import os
import subprocess
import sys

import pytest

from test.common.checkout import ROOT, pythonpath
from test.npu import sim_worker  # only to list its cases; importing it enables nothing


def _run(arg, **env):
    full_env = {k: v for k, v in os.environ.items() if k != "TOT_NPU_SIM"}
    full_env.update(env)
    full_env["PYTHONPATH"] = pythonpath()
    proc = subprocess.run([sys.executable, "-m", "test.npu.sim_worker", arg], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, f"worker {arg} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def case_results():
    return json.loads(_run("cases"))


CASES = sorted(n for n in dir(sim_worker) if n.startswith("case_"))


@pytest.mark.parametrize("case", CASES)
def test_on_simulated_npu(case_results, case):
    assert case_results.get(case) == "ok", case_results.get(case, f"{case} did not run")


@pytest.mark.parametrize("scenario", sorted(sim_worker.SCENARIOS))
def test_scenario(scenario):
    env = {"TOT_NPU_SIM": "1"} if scenario == "environment_variable" else {}
    assert _run(scenario, **env) == "ok"
