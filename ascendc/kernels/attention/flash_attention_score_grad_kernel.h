// Entry of the FlashAttention backward kernel (flash_attention_score_grad_kernel.cpp), declared once for the kernel,
// the npu glue (aten_ops/npu, CPU-runtime build) and the test programs (ascendc/tests). The CANN build declares its
// launchers in the generated aclrtlaunch headers instead (aten_ops/npu/ascendc_launch.h), so the glue includes
// this header only without TOT_WITH_CANN.
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void flash_attention_score_grad(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR dy,
                                                                 GM_ADDR atten_mask, GM_ADDR softmax_max,
                                                                 GM_ADDR softmax_sum, GM_ADDR attention_in,
                                                                 GM_ADDR dq, GM_ADDR dk, GM_ADDR dv,
                                                                 GM_ADDR workspace, GM_ADDR tiling);
