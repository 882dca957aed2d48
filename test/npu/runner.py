"""Pytest side of npu_sim_runner.py: run a case module once in a child process and report each case as a test.

In a test file:
    import npu_rope_cases
    from npu_sim_cases import case_names, run_module
    @pytest.fixture(scope="module")
    def results(): return run_module("npu_rope_cases")
    @pytest.mark.parametrize("case", case_names(npu_rope_cases))
    def test_rope_on_npu(results, case): assert results.get(case) == "ok", results.get(case, "did not run")
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def case_names(module):
    return sorted(n for n in dir(module) if n.startswith("case_"))


def run_module(module_name, timeout=900):
    env = {k: v for k, v in os.environ.items() if k != "TOT_NPU_SIM"}
    root = os.path.dirname(HERE)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, os.path.join(HERE, "npu_sim_runner.py"), module_name],
                          capture_output=True, text=True, env=env, cwd=root, timeout=timeout)
    assert proc.returncode == 0, f"npu_sim_runner {module_name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
