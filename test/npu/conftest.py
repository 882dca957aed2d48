"""npu/: the simulated npu device, the Ascend C kernels on it and their torch-free C++ programs, npu SDPA, the
performance model. A test module that sets WORKER (one of this folder's *_worker modules) gets `results`."""
import pytest

from test.npu.runner import run_module


@pytest.fixture(scope="module")
def results(request):
    """{case: "ok" | traceback} of every case_* of the module's WORKER, run once in a child process on the simulated
    npu device."""
    return run_module(request.module.WORKER.__name__)
