"""rotary_position_embedding on the simulated npu device (Ascend C kernel through the CPU runtime) and the torch-free
C++ programs of the rope kernel: tiling unit tests and the tikicpulib-style kernel host program."""
import pytest

from test.npu import rope_worker as WORKER
from test.npu.ascendc_programs import assert_passed, build, run
from test.npu.runner import case_names

TILING = ["ascendc/kernels/rope/rotary_position_embedding_tiling.cpp"]
KERNEL = ["ascendc/kernels/rope/rotary_position_embedding_kernel.cpp"]


@pytest.mark.parametrize("case", case_names(WORKER))
def test_rope_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")


def _run_program(name, sources):
    assert_passed(run(build(name, sources)))


def test_rope_tiling_program():
    _run_program("rope_tiling_test", ["ascendc/tests/rope_tiling_test.cpp"] + TILING)


def test_rope_kernel_program():
    _run_program("rope_kernel_test", ["ascendc/tests/rope_kernel_test.cpp"] + KERNEL + TILING)
