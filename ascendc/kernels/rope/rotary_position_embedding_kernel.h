// Entries of the rotary position embedding kernels, forward and backward (rotary_position_embedding_kernel.cpp),
// declared once for the kernels, the npu glue (aten_ops/npu, CPU-runtime build) and the test programs
// (ascendc/tests). The CANN build declares its launchers in the generated aclrtlaunch headers instead
// (aten_ops/npu/ascendc_launch.h), so the glue includes this header only without TOT_WITH_CANN.
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void rotary_position_embedding_kernel(GM_ADDR x, GM_ADDR cos, GM_ADDR sin,
                                                                       GM_ADDR out, GM_ADDR workspace,
                                                                       GM_ADDR tiling);
extern "C" __global__ __aicore__ void rotary_position_embedding_grad_kernel(GM_ADDR grad, GM_ADDR cos, GM_ADDR sin,
                                                                            GM_ADDR x, GM_ADDR dx, GM_ADDR dcos,
                                                                            GM_ADDR dsin, GM_ADDR workspace,
                                                                            GM_ADDR tiling);
