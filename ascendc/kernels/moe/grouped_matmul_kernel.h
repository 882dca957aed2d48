// Entry of the grouped matmul kernel (grouped_matmul_kernel.cpp), declared once for the kernel, the npu glue
// (CPU-runtime build) and the test programs. The CANN build declares its launcher in the generated aclrtlaunch
// headers instead (aten_ops/npu/ascendc_launch.h).
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void grouped_matmul_kernel(GM_ADDR x, GM_ADDR weight, GM_ADDR bias,
                                                            GM_ADDR groupList, GM_ADDR out, GM_ADDR actInput,
                                                            GM_ADDR workspace, GM_ADDR tiling);
