"""What the ported torch_npu tests import: `torch_npu` and the device they run on.

The suite runs twice: in the main test process on the CPU (DEVICE "cpu", `torch_npu` = the shim module, nothing
installed), and once more in a child process on the simulated npu device, where `import torch_npu` itself gives the
installed shim (test_on_simulated_npu.py sets the environment below and PYTHONPATH to the shim's entry)."""
import os

import torch

DEVICE_ENV = "TOT_TORCH_NPU_TEST_DEVICE"
DEVICE = os.environ.get(DEVICE_ENV, "cpu")

if DEVICE == "npu":
    import torch_npu  # noqa: F401  (the shim, through PYTHONPATH)
    from torch_ops_transformer import compat

    assert compat.installed(), "the npu run must import the torch_npu shim"
else:
    from torch_ops_transformer import compat

    torch_npu = compat.module()


def to_device(*tensors):
    """Moves tensors (None passes) to DEVICE; one argument gives one result."""
    moved = [t.to(DEVICE) if isinstance(t, torch.Tensor) else t for t in tensors]
    return moved[0] if len(moved) == 1 else moved


def on_cpu(*tensors):
    moved = [t.cpu() if isinstance(t, torch.Tensor) else t for t in tensors]
    return moved[0] if len(moved) == 1 else moved
