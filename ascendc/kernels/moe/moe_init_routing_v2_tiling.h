// Tiling of the MoE dispatch kernel (moe_init_routing_v2_kernel.cpp): a POD struct shared by the host glue and the
// kernel, and the pure host function that fills it.
//
// Work split: the N*k pairs (token-major, f = i*k + j) are cut into contiguous, ordered shares, one per AIV (the first
// `pairs_remainder` cores take one more), so that a pair's rank among the pairs of its expert is "pairs of that expert
// in earlier shares + earlier pairs of this share" — a stable counting sort in two passes around one SyncAll. The
// rows of expanded_x (for the zero fill of empty rows) are split the same way. Rows are moved in chunks of `h_tile`
// elements (the tail chunk is shorter) through two ping-pong UB buffers.
#pragma once

#include <cstdint>

#ifndef __CCE_AICORE__  // host side only: the device compiler sees just the POD struct
#include <string>

#include "common/platform.h"
#endif

namespace tot_ascendc {

struct MoeInitRoutingV2Tiling {
  uint32_t tokens = 0;           // N
  uint32_t k = 0;                // pairs per token
  uint32_t hidden = 0;           // H (0: only the indices and counts are produced)
  uint32_t pairs = 0;            // N*k
  uint32_t rows_out = 0;         // rows of expanded_x: min(active_num, N*k) dropless, E*C in capacity mode
  uint32_t capacity = 0;         // drop_pad_mode 1
  uint32_t expert_capacity = 0;  // C (capacity mode)
  int32_t first_expert = 0;      // the routed span [first_expert, first_expert + width)
  uint32_t width = 0;            // experts in the span [first_expert, first_expert + width): the routed pairs
  uint32_t sort_width = 0;       // buckets before the last: >= width, the experts above the span that get their own
                                 // bucket (row_idx_type 1 lists the dropped pairs by expert); the last bucket,
                                 // `sort_width`, holds every other pair (below the span), in pair order
  uint32_t buckets_aligned = 0;  // sort_width + 1 rounded up to 8 (whole DataBlocks of int32 counters)
  uint32_t row_idx_type = 0;     // 0: destination row per pair, 1: pair per sorted row
  uint32_t tokens_flag = 0;      // write expert_tokens_count_or_cumsum
  uint32_t tokens_type = 0;      // 0 cumsum, 1 count, 2 (expert, count) rows
  uint32_t expert_num = 0;       // rows of the type-2 output
  uint32_t has_scale = 0;        // gather scale [N] fp32 into expanded_scale
  uint32_t elem_bytes = 0;       // x's element size: rows are moved as bytes (1, 2, 4 or 8)
  uint32_t block_dim = 0;        // AIV cores launched
  uint32_t pairs_per_core = 0, pairs_remainder = 0;
  uint32_t rows_per_core = 0, rows_remainder = 0;
  uint32_t h_tile = 0;           // elements of H per UB chunk (a multiple of 64)
  uint32_t ub_bytes_used = 0;    // what Init carves out of UB (checked against the budget by the unit test)
  uint32_t workspace_bytes = 0;  // the per-core expert histograms, block_dim x buckets_aligned int32
};

#ifndef __CCE_AICORE__
struct MoeInitRoutingV2Shape {
  int64_t tokens = 0, k = 1, hidden = 0, rows_out = 0;
  bool capacity = false;
  int64_t expert_capacity = 0;
  int64_t first_expert = 0, width = 0;  // the span [first, first + width); width >= 1
  int64_t sort_width = 0;               // 0 or < width: width (the dropped pairs need no order among themselves)
  int64_t row_idx_type = 0;
  bool tokens_flag = false;
  int64_t tokens_type = 0, expert_num = 0;
  bool has_scale = false;
  int64_t elem_bytes = 4;
};

// Int32 counters per bucket staged in UB for a tile (the histogram, the totals, the running starts and the bases).
constexpr uint32_t kInitRoutingCounterArrays = 4;
// Int32 entries of the index staging buffer (also holds 512 int64 token counts).
constexpr uint32_t kInitRoutingIndexChunk = 1024;

// UB bytes the kernel needs for chunks of `h_tile` elements (the layout of the kernel's Init).
uint64_t MoeInitRoutingV2UbBytes(const MoeInitRoutingV2Tiling& t, uint32_t h_tile);

// Fills *out; returns "" or an error naming what cannot be tiled (then *out is unspecified).
std::string MoeInitRoutingV2TilingFor(const MoeInitRoutingV2Shape& shape, const PlatformInfo& platform,
                                      MoeInitRoutingV2Tiling* out);
#endif  // __CCE_AICORE__

}  // namespace tot_ascendc
