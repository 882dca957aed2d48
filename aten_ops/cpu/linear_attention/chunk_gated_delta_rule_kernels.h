// The chunked gated delta rule's loops (cpu/linear_attention/chunk_gated_delta_rule.cpp validates and allocates;
// chunk_gated_delta_rule_kernels_isa.cpp, compiled once per instruction set, runs the chunks). One task is one
// (sequence, value head): its chunks run in order on one thread, so results do not depend on the thread count.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// Chunk length of the WY / UT form. The result does not depend on it beyond rounding (upstream's kernel and golden
// use 64). Per token and value head a chunk of C tokens costs C·(3·Dk + 2·Dv) multiply-adds inside the chunk plus
// 3·Dk·Dv against the state, so at Dk = Dv = 128 C = 32 does 23% fewer than C = 64, and its products (32 to 64
// rows) still run near brgemm's peak: the forward takes about 35% less time than with C = 64, training about 25%
// (16 is slower again: 16-row products fall off the peak).
constexpr int64_t kGdnChunk = 32;

// One call's geometry and buffers. query / key / value (and d_out) are contiguous in `dtype`; every other buffer is
// contiguous in the accumulation type acc_t (float, or double for a float64 `dtype`).
struct GdnChunkParams {
  c10::ScalarType dtype = c10::ScalarType::Float;
  int64_t B = 0, T = 0, Nk = 1, Nv = 1, Dk = 0, Dv = 0;
  const int64_t* starts = nullptr;  // [B + 1]: sequence b holds tokens starts[b] .. starts[b + 1] - 1
  double scale = 1.0;
  const void* q = nullptr;      // [T, Nk, Dk]
  const void* k = nullptr;      // [T, Nk, Dk]
  const void* v = nullptr;      // [T, Nv, Dv]
  const void* beta = nullptr;   // [T, Nv] acc_t
  const void* g = nullptr;      // [T, Nv] acc_t
  const void* state0 = nullptr; // [B, Nv, Dv, Dk] acc_t
  // forward
  void* out = nullptr;          // [T, Nv, Dv] dtype
  void* state = nullptr;        // [B, Nv, Dv, Dk] acc_t: the final states
  // backward
  const void* d_out = nullptr;        // [T, Nv, Dv] dtype
  const void* d_state = nullptr;      // [B, Nv, Dv, Dk] acc_t
  void* dq = nullptr;                 // [T, Nk, Dk] acc_t
  void* dk = nullptr;                 // [T, Nk, Dk] acc_t
  void* dv = nullptr;                 // [T, Nv, Dv] acc_t
  void* dbeta = nullptr;              // [T, Nv] acc_t
  void* dg = nullptr;                 // [T, Nv] acc_t
  void* d_state0 = nullptr;           // [B, Nv, Dv, Dk] acc_t
};

NPU_FA_DECLARE_ISA_STUB(chunk_gated_delta_rule_forward_stub, void (*)(const GdnChunkParams&));
NPU_FA_DECLARE_ISA_STUB(chunk_gated_delta_rule_backward_stub, void (*)(const GdnChunkParams&));

}  // namespace npu_fa::cpu
