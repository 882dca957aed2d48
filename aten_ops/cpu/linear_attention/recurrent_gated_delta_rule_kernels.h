// The loops of recurrent_gated_delta_rule and rms_norm_gated (cpu/linear_attention/recurrent_gated_delta_rule.cpp),
// compiled once per instruction set by recurrent_gated_delta_rule_kernels_isa.cpp so the rank-1 updates of the
// state and the norm's rows run at the CPU's vector width. The entry points validate, make the token tensors
// contiguous, convert the gates to the accumulation type A (float, double for double inputs) and resolve the
// sequences and slots on the host before calling these.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// One call of the recurrence. Per sequence i (tokens seq_start[i] .. seq_start[i + 1]) and value head h, the state
// S [Dv, Dk] starts from slot first_slot[i] and, per token t, becomes a S diag(ak) + b (v - a S diag(ak) k) kᵀ; the
// output is scale S q and S is written to slot slot[t]. Work items (sequence, head) are independent (the slots of
// a call are distinct), so the result does not depend on the thread count.
struct RecurrentGdrParams {
  c10::ScalarType dtype;        // of query, key, value, out
  c10::ScalarType state_dtype;  // dtype, or float32
  int64_t T = 0, B = 0, Nk = 0, Nv = 0, Dk = 0, Dv = 0;
  double scale = 1.0;
  const void* query = nullptr;  // [T, Nk, Dk] contiguous
  const void* key = nullptr;    // [T, Nk, Dk] contiguous
  const void* value = nullptr;  // [T, Nv, Dv] contiguous
  const void* beta = nullptr;   // A [T, Nv] or nullptr (1)
  const void* g = nullptr;      // A [T, Nv] or nullptr (0: no decay)
  const void* gk = nullptr;     // A [T, Nv, Dk] or nullptr (0)
  const int64_t* seq_start = nullptr;   // [B + 1]
  const int64_t* first_slot = nullptr;  // [B]
  const int64_t* slot = nullptr;        // [T]
  void* state = nullptr;  // [slots, Nv, Dv, Dk] contiguous
  void* out = nullptr;    // [T, Nv, Dv] contiguous
};

// Gated RMSNorm rows (transformers' Qwen3NextRMSNormGated): rstd in A; h = x * rstd rounded to dtype; p = weight *
// h, rounded to dtype when round_product (weight has x's dtype); y = p * silu(gate) rounded to dtype.
struct RmsNormGatedParams {
  c10::ScalarType dtype;       // of x, y
  c10::ScalarType gate_dtype;  // dtype or float32
  int64_t rows = 0, n = 0;
  double eps = 0;
  bool round_product = false;
  const void* x = nullptr;       // [rows, n]
  const void* weight = nullptr;  // A [n]
  const void* gate = nullptr;    // [rows, n] or nullptr
  void* y = nullptr;             // [rows, n]
  void* rstd = nullptr;          // A [rows]
};

// Its backward (roundings taken as exact): u = dy * silu(gate), dweight = sum_rows u h, dx = rstd (w u - h mean(w u
// h)), dgate = dy w h silu'(gate). dweight is summed over fixed chunks of rows (the chunking depends on the row
// count only), so it does not depend on the thread count.
struct RmsNormGatedGradParams {
  c10::ScalarType dtype;       // of dy, x, dx
  c10::ScalarType gate_dtype;  // of gate, dgate
  int64_t rows = 0, n = 0;
  const void* dy = nullptr;      // [rows, n]
  const void* x = nullptr;       // [rows, n]
  const void* weight = nullptr;  // A [n]
  const void* rstd = nullptr;    // A [rows]
  const void* gate = nullptr;    // [rows, n] or nullptr
  void* dx = nullptr;            // [rows, n]
  void* dweight = nullptr;       // A [n]
  void* dgate = nullptr;         // [rows, n] or nullptr
};

NPU_FA_DECLARE_ISA_STUB(recurrent_gdr_stub, void (*)(const RecurrentGdrParams&));
NPU_FA_DECLARE_ISA_STUB(rms_norm_gated_rows_stub, void (*)(const RmsNormGatedParams&));
NPU_FA_DECLARE_ISA_STUB(rms_norm_gated_grad_rows_stub, void (*)(const RmsNormGatedGradParams&));

}  // namespace npu_fa::cpu
