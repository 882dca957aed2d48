// Entry of the lightning indexer kernel (lightning_indexer_kernel.cpp), declared once for the kernel, the npu glue
// (aten_ops/npu, CPU-runtime build) and the test programs (ascendc/tests). The CANN build declares its launchers in
// the generated aclrtlaunch headers instead (aten_ops/npu/ascendc_launch.h), so the glue includes this header only
// without TOT_WITH_CANN.
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void lightning_indexer(GM_ADDR query, GM_ADDR key, GM_ADDR weights,
                                                        GM_ADDR block_table, GM_ADDR row_info, GM_ADDR sparse_indices,
                                                        GM_ADDR sparse_values, GM_ADDR workspace, GM_ADDR tiling);
