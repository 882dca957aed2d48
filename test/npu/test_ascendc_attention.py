"""Torch-free C++ programs of the FlashAttention forward Ascend C kernel: the tiling unit tests and the
tikicpulib-style host program that runs the kernel on the CPU runtime against a float64 reference."""
from test.npu.ascendc_programs import assert_passed, build, run

KERNEL = "ascendc/kernels/attention/flash_attention_score_kernel.cpp"
TILING = "ascendc/kernels/attention/flash_attention_score_tiling.cpp"


def test_flash_attention_tiling():
    assert_passed(run(build("flash_attention_tiling_test", ["ascendc/tests/flash_attention_tiling_test.cpp", TILING])))


def test_flash_attention_kernel_host_program():
    exe = build("flash_attention_kernel_test", ["ascendc/tests/flash_attention_kernel_test.cpp", KERNEL, TILING])
    assert_passed(run(exe))
