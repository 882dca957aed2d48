// Entry of the recurrent gated delta rule kernel (recurrent_gated_delta_rule_kernel.cpp), declared once for the
// kernel, the npu glue (aten_ops/npu, CPU-runtime build) and the test programs (ascendc/tests). The CANN build
// declares its launchers in the generated aclrtlaunch headers instead (aten_ops/npu/ascendc_launch.h), so the glue
// includes this header only without TOT_WITH_CANN.
#pragma once

#include "kernel_operator.h"

extern "C" __global__ __aicore__ void recurrent_gated_delta_rule(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                                                 GM_ADDR beta, GM_ADDR g, GM_ADDR gk,
                                                                 GM_ADDR seq_table, GM_ADDR slot_table,
                                                                 GM_ADDR state, GM_ADDR out, GM_ADDR workspace,
                                                                 GM_ADDR tiling);
