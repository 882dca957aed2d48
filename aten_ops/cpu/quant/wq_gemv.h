// The small-M path of weight_quant_batchmatmul (cpu/quant/quant_matmul.cpp): a fused dequantise-and-multiply that
// reads the int8 / packed int4 weight in place. Compiled once per instruction set by cpu/quant/wq_gemv_isa.cpp.
//
// A decode step reads every weight once, so the cost is the weight's bytes and the dequantisation, not the FLOPs:
// each weight is dequantised once per call (shared by all rows of x) and multiplied straight from registers or L1,
// never through a dequantised copy of the weight.
#pragma once

#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// How the weight is stored. "N-major": consecutive columns are adjacent in memory (int8 [K, N] with unit column
// stride; int32 [K, N/8] with eight columns per word); "K-major": consecutive rows of a column are adjacent (the
// transposed view of an int8 [N, K]; the transposed view of an int32 [N, K/8] with eight rows per word).
enum class WqWeight : int { kInt8NMajor, kInt8KMajor, kInt4NMajor, kInt4KMajor };

// The dtype the dequantised weight is rounded to before the product (x's dtype).
enum class WqRound : int { kFloat, kBFloat16, kHalf };

struct WqGemvParams {
  const float* x;       // [R, K] rows of x in fp32, row stride K
  int64_t R, K, N;
  WqWeight form;
  const void* w;        // int8_t or int32_t, the layout of `form`
  int64_t w_sk, w_sn;   // strides in elements of w along K and N; for int4 of the packed words (k / 8 or n / 8)
  const float* scale;   // fp32 [G, N], G = ceil(K / group)
  const float* offset;  // fp32 [G, N] or nullptr
  int64_t group;        // rows per scale row (K for per tensor / per channel)
  WqRound round;
  float* y;             // fp32 [R, N], row stride N
};

// y[r, n] = sum over k (ascending, a fixed order: the result does not depend on the thread count) of
// x[r, k] * round((w[k, n] + offset[g, n]) * scale[g, n]), g = k / group, fp32 accumulation; parallel over column
// blocks (at::parallel_for).
NPU_FA_DECLARE_ISA_STUB(wq_gemv_stub, void (*)(const WqGemvParams& p));

}  // namespace npu_fa::cpu
