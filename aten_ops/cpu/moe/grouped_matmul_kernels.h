// Element-wise parts of grouped_matmul (bias + activation epilogue, activation gradient), compiled once per
// instruction set by cpu/moe/grouped_matmul_kernels_isa.cpp and called through the stubs below by
// cpu/moe/grouped_matmul.cpp. The matrix products themselves run on ATen's CPU GEMM (MKL / oneDNN) there.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// act_type values of grouped_matmul (CANN numbering; 3 is not used by CANN either).
enum GmmAct : int64_t { kActNone = 0, kActRelu = 1, kActGeluTanh = 2, kActFastGelu = 4, kActSilu = 5 };

// A row-major [rows, cols] block of `dtype` elements with row stride ld (elements).
struct Block {
  void* data = nullptr;
  int64_t ld = 0;
};

// pre = pre + bias (bias [cols] fp32, fp64 for float64 data, or null); with act != 0 also out = act(pre).
// pre and out may alias only when act == 0. Runs on the calling thread.
NPU_FA_DECLARE_ISA_STUB(gmm_epilogue_stub, void (*)(c10::ScalarType dtype, Block pre, Block out, const void* bias,
                                                     int64_t rows, int64_t cols, int64_t act));
// dst = grad * act'(pre), all contiguous [n] of `dtype`; parallel over chunks.
NPU_FA_DECLARE_ISA_STUB(gmm_act_backward_stub, void (*)(c10::ScalarType dtype, const void* grad, const void* pre,
                                                         void* dst, int64_t n, int64_t act));

}  // namespace npu_fa::cpu
