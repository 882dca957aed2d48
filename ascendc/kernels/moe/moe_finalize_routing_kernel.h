// Entry of the MoE combine kernel (moe_finalize_routing_kernel.cpp), declared once for the kernel, the npu glue
// (CPU-runtime build) and the test programs. The CANN build declares its launcher in the generated aclrtlaunch
// headers instead (aten_ops/npu/ascendc_launch.h).
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void moe_finalize_routing_kernel(GM_ADDR expandedRows, GM_ADDR skip1, GM_ADDR skip2,
                                                                  GM_ADDR bias, GM_ADDR scales, GM_ADDR srcToDst,
                                                                  GM_ADDR expertForRow, GM_ADDR out,
                                                                  GM_ADDR workspace, GM_ADDR tiling);
