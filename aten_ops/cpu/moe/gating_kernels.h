// The vector part of the MoE gating rows (cpu/moe/gating.cpp): compiled once per instruction set by
// cpu/moe/gating_kernels_isa.cpp and called through moe_softmax_row_stub.
#pragma once

#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// v <- softmax(v) in place over n fp32 values; NaN propagates through the max.
NPU_FA_DECLARE_ISA_STUB(moe_softmax_row_stub, void (*)(float* v, int64_t n));

}  // namespace npu_fa::cpu
