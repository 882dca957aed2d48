// Entry of the MoE gating (top-k softmax) kernel (moe_gating_top_k_softmax_kernel.cpp), declared once for the kernel,
// the npu glue (aten_ops/npu, CPU-runtime build) and the test programs (ascendc/tests). The CANN build declares its
// launchers in the generated aclrtlaunch headers instead (aten_ops/npu/ascendc_launch.h), so the glue includes
// this header only without TOT_WITH_CANN.
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void moe_gating_top_k_softmax_kernel(GM_ADDR x, GM_ADDR finished, GM_ADDR y,
                                                                      GM_ADDR expertIdx, GM_ADDR rowIdx,
                                                                      GM_ADDR softmaxOut, GM_ADDR workspace,
                                                                      GM_ADDR tiling);
