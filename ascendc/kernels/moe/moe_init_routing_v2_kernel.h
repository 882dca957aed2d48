// Entry of the MoE dispatch kernel (moe_init_routing_v2_kernel.cpp), declared once for the kernel, the npu glue
// (CPU-runtime build) and the test programs. The CANN build declares its launcher in the generated aclrtlaunch
// headers instead (aten_ops/npu/ascendc_launch.h).
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void moe_init_routing_v2_kernel(GM_ADDR x, GM_ADDR expertIdx, GM_ADDR scale,
                                                                 GM_ADDR expandedX, GM_ADDR expandedRowIdx,
                                                                 GM_ADDR expertTokens, GM_ADDR expandedScale,
                                                                 GM_ADDR workspace, GM_ADDR tiling);
