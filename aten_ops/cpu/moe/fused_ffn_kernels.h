// The fused MoE FFN (moe_ffn, cpu/moe/fused_ffn.cpp): the tiled brgemm passes with their epilogues, compiled once
// per instruction set by cpu/moe/fused_ffn_kernels_isa.cpp.
//
// Packed expert weights (moe_ffn_prepack) are [E, NB, Kp, kFfnBlock]: NB column blocks of kFfnBlock output columns,
// each a [Kp, kFfnBlock] brgemm B operand (row-major for fp32; VNNI pairs of rows for bf16/fp16: element (k, j) at
// ((k / 2) * kFfnBlock + j) * 2 + k % 2, Kp = K rounded up to even). A gated (SwiGLU) w13 block holds kFfnHalf gate
// columns then the kFfnHalf up columns of the same intermediate features, so one product gives both operands of
// the epilogue; columns past the end are zero.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "cpu/isa_dispatch.h"
#include "cpu/moe/grouped_matmul_kernels.h"

namespace npu_fa::cpu {

constexpr int64_t kFfnBlock = 64;             // output columns of one packed block
constexpr int64_t kFfnHalf = kFfnBlock / 2;   // gated: intermediate features per w13 block
constexpr int64_t kFfnRows = 64;              // rows of one work item

// Activations of moe_ffn: grouped_matmul's act_type values (cpu/moe/activations.h computes them), plus the gated
// kFfnSwiglu, silu(gate) * up.
enum FfnAct : int64_t {
  kFfnNone = kActNone, kFfnRelu = kActRelu, kFfnGeluTanh = kActGeluTanh, kFfnFastGelu = kActFastGelu,
  kFfnSilu = kActSilu, kFfnSwiglu = 6
};

struct FusedFfnParams {
  c10::ScalarType dtype;        // Float or BFloat16 (the brgemm types)
  int64_t experts, tokens, k;   // E, T, top-k
  int64_t H, Hp, F, Fp;         // hidden size (Hp: rounded up to the packing's K multiple), intermediate size
  int64_t act;                  // FfnAct
  const int64_t* offsets;       // [E + 1] first sorted row of each expert
  const int64_t* order;         // [R] pair (t * k + j) of each sorted row
  const int64_t* pos;           // [T * k] sorted row of each pair
  const float* pair_weight;     // [T * k] combine weight of each pair (fp32)
  const void* x;                // [T, H] input rows (dtype)
  const void* w13;              // packed [E, NB1, Hp, kFfnBlock]
  int64_t nb1;
  const void* w2;               // packed [E, NB2, Fp, kFfnBlock]
  int64_t nb2;
  const float* b13;             // [E, 2F] (gated) or [E, F] fp32, or null
  const float* b2;              // [E, H] fp32, or null
  void* out;                    // [T, H] (dtype)
};

// Runs the whole FFN (gather, gate/up + activation, down + weight, combine) on the calling thread's pool.
NPU_FA_DECLARE_ISA_STUB(fused_ffn_stub, void (*)(const FusedFfnParams& p));

}  // namespace npu_fa::cpu
