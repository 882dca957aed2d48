// Tiling of the MoE gating top-k softmax kernel (moe_gating_top_k_softmax_kernel.cpp): a POD struct shared by the
// host glue and the kernel, and the pure host function that fills it.
//
// Work split: the N rows (tokens) are spread over the AIVs as evenly as possible (the first `rows_remainder` cores
// take one row more); each core walks its rows in UB tiles of `tile_rows` rows (the last tile is the tail), with
// the GM->UB and UB->GM queues double-buffered when two tiles fit UB, single-buffered when only one does.
// Rows of at most 64 experts (one fp32 repeat) are `batched`: each step of the softmax and each top-k round is one
// level-0 instruction over all the tile's rows (one repeat per row), so tiles then hold at most 248 rows (the
// repeat count is 8 bits).
#pragma once

#include <cstdint>

#ifndef __CCE_AICORE__  // host side only: the device compiler sees just the POD struct
#include <string>

#include "common/platform.h"
#endif

namespace tot_ascendc {

enum class GatingDtype : uint32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct MoeGatingTopKSoftmaxTiling {
  uint32_t rows = 0;            // N: tokens (all leading dims of x flattened)
  uint32_t experts = 0;         // E: the softmax / selection length
  uint32_t k = 0;               // experts chosen per row
  uint32_t dtype = 0;           // GatingDtype of x and y
  uint32_t renorm = 0;          // 0: softmax over E then top-k; 1: top-k of the logits then softmax over the k
  uint32_t has_finished = 0;    // finished[N] (bool) given: those rows get expert index E
  uint32_t want_softmax = 0;    // write the fp32 softmax over E ([N, E]; renorm 0 only)
  uint32_t want_row_idx = 0;    // write row_idx[i, j] = j * N + i (v1)
  uint32_t block_dim = 0;       // AIV cores launched
  uint32_t rows_per_core = 0;   // base share; the first rows_remainder cores take one more
  uint32_t rows_remainder = 0;
  uint32_t tile_rows = 0;       // rows per UB tile
  uint32_t buffer_num = 0;      // 2 = double-buffered queues, 1 = single
  uint32_t x_row_stride = 0;    // elements of x's dtype per UB row (E rounded up to a 32-byte DataBlock)
  uint32_t sm_row_stride = 0;   // fp32 elements per softmax-output UB row (E rounded up to 8)
  uint32_t y_row_stride = 0;    // elements of y's dtype per UB row (k rounded up to a DataBlock)
  uint32_t idx_row_stride = 0;  // int32 elements per index UB row (k rounded up to 8)
  uint32_t reduce_tmp_bytes = 0;  // sharedTmpBuffer of ReduceMax / ReduceSum
  uint32_t batched = 0;         // E <= 64: whole tiles per instruction (one repeat per row)
  uint32_t ub_bytes_used = 0;   // what Init carves out of UB (checked against the budget by the unit test)
};

#ifndef __CCE_AICORE__
struct MoeGatingTopKSoftmaxShape {
  int64_t rows = 0;
  int64_t experts = 0;
  int64_t k = 0;
  GatingDtype dtype = GatingDtype::kFloat32;
  int64_t renorm = 0;
  bool has_finished = false;
  bool want_softmax = false;
  bool want_row_idx = true;
};

uint32_t GatingDtypeBytes(GatingDtype dtype);

// UB bytes the kernel needs for a tile of `tile_rows` rows with `buffer_num` buffers per queue (the layout of the
// kernel's Init, in one place so that the tiling search and the unit test agree).
uint64_t MoeGatingUbBytes(const MoeGatingTopKSoftmaxTiling& t, uint32_t tile_rows, uint32_t buffer_num);

// Fills *out; returns "" or an error naming what cannot be tiled (then *out is unspecified).
std::string MoeGatingTopKSoftmaxTilingFor(const MoeGatingTopKSoftmaxShape& shape, const PlatformInfo& platform,
                                          MoeGatingTopKSoftmaxTiling* out);
#endif  // __CCE_AICORE__

}  // namespace tot_ascendc
