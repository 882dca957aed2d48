"""npu/: the simulated npu device, the Ascend C kernels on it and their torch-free C++ programs, npu SDPA, the
performance model. A test module that sets WORKER (one of this folder's *_worker modules) gets `results`."""
import inspect

import pytest

from test.npu.runner import run_cases


@pytest.fixture(scope="session")
def _npu_results(request):
    """{module: {case: result}} of every worker case selected in this session (the `case` parameter of the tests of
    modules with a WORKER), run once in one child process on the simulated npu device."""
    selection = {}
    for item in request.session.items:
        worker = getattr(item.module, "WORKER", None)
        case = getattr(item, "callspec", None) and item.callspec.params.get("case")
        if inspect.ismodule(worker) and worker.__name__.startswith("test.npu.") and case:
            selection.setdefault(worker.__name__, []).append(case)
    return run_cases(selection)


@pytest.fixture(scope="module")
def results(request, _npu_results):
    """{case: "ok" | traceback} of the module's WORKER's selected cases."""
    return _npu_results.get(request.module.WORKER.__name__, {})
