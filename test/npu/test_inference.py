"""The Ascend C decode-attention kernel (incre_flash_attention on the npu device): its host tiling unit test and
its tikicpulib-style host program (both torch-free C++ under ascendc/tests), and npu-vs-CPU cases on the
simulated device (inference_worker.py, run in a child process)."""
import pytest

from test.npu import inference_worker as WORKER
from test.npu.ascendc_programs import run_program
from test.npu.runner import case_names

TILING = "ascendc/kernels/inference/incre_flash_attention_tiling.cpp"
KERNEL = "ascendc/kernels/inference/incre_flash_attention_kernel.cpp"


def test_tiling_program():
    run_program("incre_flash_attention_tiling_test", ["ascendc/tests/incre_flash_attention_tiling_test.cpp", TILING])


def test_kernel_host_program_vs_float64():
    out = run_program("incre_flash_attention_kernel_test",
                       ["ascendc/tests/incre_flash_attention_kernel_test.cpp", KERNEL, TILING])
    assert "splits=3" in out and "chunk=32" in out  # the forced-split and chunked-group cases ran as intended


@pytest.mark.parametrize("case", case_names(WORKER))
def test_decode_attention_on_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
