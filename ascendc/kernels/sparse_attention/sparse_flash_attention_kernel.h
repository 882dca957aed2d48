// Entry of the sparse flash attention kernel (sparse_flash_attention_kernel.cpp), declared once for the kernel, the
// npu glue (aten_ops/npu, CPU-runtime build) and the test programs (ascendc/tests). The CANN build declares its
// launchers in the generated aclrtlaunch headers instead (aten_ops/npu/ascendc_launch.h), so the glue includes this
// header only without TOT_WITH_CANN.
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void sparse_flash_attention(GM_ADDR query, GM_ADDR query_rope, GM_ADDR key,
                                                             GM_ADDR key_rope, GM_ADDR value, GM_ADDR sparse_indices,
                                                             GM_ADDR block_table, GM_ADDR row_info, GM_ADDR sinks,
                                                             GM_ADDR out, GM_ADDR softmax_max, GM_ADDR softmax_sum,
                                                             GM_ADDR workspace, GM_ADDR tiling);
