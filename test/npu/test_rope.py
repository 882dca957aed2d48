"""rotary_position_embedding on the simulated npu device (Ascend C kernel through the CPU runtime) and the torch-free
C++ programs of the rope kernel: tiling unit tests and the tikicpulib-style kernel host program."""
import pytest

from test.npu import rope_worker as WORKER
from test.npu.ascendc_programs import run_program
from test.npu.runner import case_names

TILING = ["ascendc/kernels/rope/rotary_position_embedding_tiling.cpp"]
KERNEL = ["ascendc/kernels/rope/rotary_position_embedding_kernel.cpp"]


@pytest.mark.parametrize("case", case_names(WORKER))
def test_rope_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")


def test_rope_tiling_program():
    run_program("rope_tiling_test", ["ascendc/tests/rope_tiling_test.cpp"] + TILING)


def test_rope_kernel_program():
    run_program("rope_kernel_test", ["ascendc/tests/rope_kernel_test.cpp"] + KERNEL + TILING)
