"""Re-runs this folder's ported torch_npu tests in a child process on the simulated npu device, with
`import torch_npu` giving the shim (PYTHONPATH from `python -m torch_ops_transformer.compat --pythonpath`). Full tier:
the default tier runs the port once, on the CPU (the npu glue and the Ascend C kernels have their own tests in
test/npu, on the same semantic space)."""
import os
import subprocess
import sys

from test.common.checkout import ROOT, pythonpath
from test.common.tiers import FULL
from test.torch_npu.common import DEVICE, DEVICE_ENV
from test.torch_npu.mc2_ranks import WORLD
from torch_ops_transformer import compat

import pytest


@FULL
@pytest.mark.skipif(DEVICE == "npu", reason="this is the launcher of the npu run itself")
def test_ported_torch_npu_tests_on_simulated_npu():
    env = {k: v for k, v in os.environ.items() if k != "TOT_NPU_SIM"}
    env[DEVICE_ENV] = "npu"
    env["TOT_NPU_SIM_DEVICES"] = str(WORLD)  # one simulated device per MC2 rank (mc2_ranks.py)
    env["PYTHONPATH"] = os.pathsep.join([str(compat.PYTHONPATH_DIR), pythonpath()])
    folder = os.path.join("test", "torch_npu")
    proc = subprocess.run([sys.executable, "-m", "pytest", folder, "-q", "-p", "no:cacheprovider", "-x",
                           "--deselect", f"{folder}/test_on_simulated_npu.py"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if proc.returncode == 5:
        pytest.skip("no ported test collected yet")
    assert proc.returncode == 0, f"npu run failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
