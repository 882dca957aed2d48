// Entry of the fused causal conv1d kernel (fused_causal_conv1d_kernel.cpp), declared once for the kernel, the npu glue
// (aten_ops/npu, CPU-runtime build) and the test programs (ascendc/tests). The CANN build declares its launchers in
// the generated aclrtlaunch headers instead (aten_ops/npu/ascendc_launch.h), so the glue includes this header only
// without TOT_WITH_CANN.
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void fused_causal_conv1d(GM_ADDR x, GM_ADDR weight, GM_ADDR bias,
                                                          GM_ADDR seq_table, GM_ADDR conv_states, GM_ADDR y,
                                                          GM_ADDR workspace, GM_ADDR tiling);
