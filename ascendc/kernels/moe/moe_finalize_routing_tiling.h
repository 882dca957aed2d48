// Tiling of the MoE combine kernel (moe_finalize_routing_kernel.cpp): a POD struct shared by the host glue and the
// kernel, and the pure host function that fills it.
//
// Work split: the N tokens are spread over the AIVs as evenly as possible (the first `tokens_remainder` cores take
// one more); each core walks its tokens one at a time and each token's H values in chunks of `h_tile` elements
// (the last chunk is the tail), with the GM->UB and UB->GM queues double-buffered when two chunks fit UB.
#pragma once

#include <cstdint>

#ifndef __CCE_AICORE__  // host side only: the device compiler sees just the POD struct
#include <string>

#include "common/platform.h"
#endif

namespace tot_ascendc {

enum class FinalizeDtype : uint32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

struct MoeFinalizeRoutingTiling {
  uint32_t tokens = 0;           // N
  uint32_t k = 0;                // pairs per token
  uint32_t hidden = 0;           // H
  uint32_t rows = 0;             // R: rows of expanded_permuted_rows (any leading shape flattened)
  uint32_t experts = 0;          // E: rows of bias (0 without bias)
  uint32_t dtype = 0;            // FinalizeDtype of rows, skips, bias and out
  uint32_t column_major = 0;     // pair (i, j) at j*N + i in expanded_src_to_dst_row (modes 0/1), else i*k + j
  uint32_t has_skip1 = 0, has_skip2 = 0, has_bias = 0, has_scales = 0;
  uint32_t block_dim = 0;        // AIV cores launched
  uint32_t tokens_per_core = 0;  // base share; the first tokens_remainder cores take one more
  uint32_t tokens_remainder = 0;
  uint32_t h_tile = 0;           // elements of H per UB chunk (a multiple of 64; the tail chunk is shorter)
  uint32_t buffer_num = 0;       // 2 = double-buffered queues, 1 = single
  uint32_t ub_bytes_used = 0;    // what Init carves out of UB (checked against the budget by the unit test)
};

#ifndef __CCE_AICORE__
struct MoeFinalizeRoutingShape {
  int64_t tokens = 0, k = 0, hidden = 0, rows = 0, experts = 0;
  FinalizeDtype dtype = FinalizeDtype::kFloat32;
  bool column_major = true;
  bool has_skip1 = false, has_skip2 = false, has_bias = false, has_scales = false;
};

// UB bytes the kernel needs for chunks of `h_tile` elements with `buffer_num` buffers per queue (the layout of
// the kernel's Init, in one place so that the tiling search and the unit test agree).
uint64_t MoeFinalizeUbBytes(const MoeFinalizeRoutingTiling& t, uint32_t h_tile, uint32_t buffer_num);

// Fills *out; returns "" or an error naming what cannot be tiled (then *out is unspecified).
std::string MoeFinalizeRoutingTilingFor(const MoeFinalizeRoutingShape& shape, const PlatformInfo& platform,
                                        MoeFinalizeRoutingTiling* out);
#endif  // __CCE_AICORE__

}  // namespace tot_ascendc
