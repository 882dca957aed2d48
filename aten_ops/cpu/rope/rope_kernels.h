// The row loops of the rotary position embedding ops (cpu/rope/ops.cpp), compiled once per instruction set by
// cpu/rope/rope_kernels_isa.cpp so the rotation runs at the CPU's vector width. The entry points validate, lay x out
// contiguously and convert the cos/sin tables to the accumulation type A (float; double for double rows) first.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "cpu/isa_dispatch.h"

namespace npu_fa::cpu {

// npu_rotary_mul / apply_rotary_pos_emb: out[r, j] = x[r, a(j)] * cos[j] + sign(j) * x[r, b(j)] * sin[j] with the index
// maps of `mode` (0 half, 1 interleave, 2 quarter, 3 interleave-half: see cpu/rope/ops.cpp), per row r of D values.
// Row r reads its cos/sin at cos + cos_off[r] / sin + sin_off[r] (broadcast tables repeat offsets).
struct RopeRowsParams {
  c10::ScalarType dtype;  // of src and dst: float, double, half or bfloat16
  int64_t rows = 0, D = 0, mode = 0;
  const void* src = nullptr;  // [rows, D]
  void* dst = nullptr;        // [rows, D]; may be src
  const void* cos = nullptr;  // A
  const void* sin = nullptr;  // A
  const int64_t* cos_off = nullptr;  // [rows]
  const int64_t* sin_off = nullptr;  // [rows]
};
NPU_FA_DECLARE_ISA_STUB(rope_rows_stub, void (*)(const RopeRowsParams&));

// rope_with_sin_cos_cache / npu_mrope: x [tokens, heads, head_size] rotated in place over its first rot values per
// head (the rest pass through). Token t's cos/sin for column j < rot / 2 come from row pos[row_of[j] * tokens + t] of
// the table (cos in its first rot / 2 values, sin in the next); neox rotates the two halves, GPT-J style the pairs.
struct RopeCacheParams {
  c10::ScalarType dtype;        // of x: float, double, half or bfloat16
  c10::ScalarType table_dtype;  // x's dtype or the accumulation type A (float; double for double x)
  int64_t tokens = 0, heads = 0, head_size = 0, rot = 0;
  bool neox = true;
  bool one_row = true;       // every column reads position row 0 (no multimodal sections)
  void* x = nullptr;
  const void* table = nullptr;  // [max_position, rot]: only the rows of the positions are read
  const int64_t* pos = nullptr;     // [rows, tokens]
  const int64_t* row_of = nullptr;  // [rot / 2]
};
NPU_FA_DECLARE_ISA_STUB(rope_cache_stub, void (*)(const RopeCacheParams&));

}  // namespace npu_fa::cpu
