// Host tiling of moe_finalize_routing: token split over the AIVs, the H chunk, the buffer count.
#include "moe/moe_finalize_routing_tiling.h"

#include <algorithm>

namespace tot_ascendc {

namespace {

constexpr uint32_t kLanes = 64;        // H chunks are whole fp32 repeats (64 lanes = 256 bytes)
constexpr uint32_t kMaxTile = 8192;    // longer chunks gain nothing: one DataCopyPad already moves 16-32 KB

uint32_t DtypeBytes(uint32_t dtype) { return dtype == uint32_t(FinalizeDtype::kFloat32) ? 4 : 2; }

}  // namespace

uint64_t MoeFinalizeUbBytes(const MoeFinalizeRoutingTiling& t, uint32_t h_tile, uint32_t buffer_num) {
  const uint64_t s = DtypeBytes(t.dtype), h = h_tile, bn = buffer_num;
  uint64_t bytes = bn * h * s;                            // expanded row chunks (VECIN)
  if (t.has_bias) bytes += bn * h * s;                    // bias chunks (VECIN)
  if (t.has_skip1 || t.has_skip2) bytes += bn * h * s;    // skip chunks (VECIN)
  bytes += bn * h * s;                                    // out chunks (VECOUT)
  bytes += h * 4;                                         // the fp32 accumulator
  if (s != 4) bytes += h * 4;                             // an input chunk converted to fp32
  return bytes;
}

std::string MoeFinalizeRoutingTilingFor(const MoeFinalizeRoutingShape& shape, const PlatformInfo& platform,
                                        MoeFinalizeRoutingTiling* out) {
  const char* op = "moe_finalize_routing tiling";
  if (shape.tokens < 1 || shape.hidden < 1 || shape.k < 1)
    return std::string(op) + ": tokens, k and H must be >= 1 (empty calls launch nothing)";
  // Offsets of rows (R*H), pairs (N*k) and outputs (N*H) are uint32 in the kernel's address arithmetic.
  const int64_t limit = int64_t(UINT32_MAX);
  if (shape.rows * shape.hidden > limit || shape.tokens * shape.k > limit || shape.tokens * shape.hidden > limit ||
      shape.experts * shape.hidden > limit)
    return std::string(op) + ": R*H, N*k, N*H and E*H must fit uint32";

  MoeFinalizeRoutingTiling t;
  t.tokens = uint32_t(shape.tokens);
  t.k = uint32_t(shape.k);
  t.hidden = uint32_t(shape.hidden);
  t.rows = uint32_t(shape.rows);
  t.experts = shape.has_bias ? uint32_t(shape.experts) : 0u;
  t.dtype = uint32_t(shape.dtype);
  t.column_major = shape.column_major;
  t.has_skip1 = shape.has_skip1;
  t.has_skip2 = shape.has_skip2;
  t.has_bias = shape.has_bias;
  t.has_scales = shape.has_scales;
  t.block_dim = uint32_t(std::min<int64_t>(platform.aiv_cores, shape.tokens));
  t.tokens_per_core = t.tokens / t.block_dim;
  t.tokens_remainder = t.tokens % t.block_dim;

  // Double-buffered if a 64-lane chunk fits that way (always, for the UB of an AIV), then the longest chunk.
  const uint64_t budget = platform.UsableUb();
  const uint32_t want = std::min(AlignUp(t.hidden, kLanes), kMaxTile);
  for (uint32_t bn : {2u, 1u}) {
    uint32_t h = want;
    while (h > kLanes && MoeFinalizeUbBytes(t, h, bn) > budget) h -= kLanes;
    if (MoeFinalizeUbBytes(t, h, bn) > budget) continue;
    t.buffer_num = bn;
    t.h_tile = h;
    t.ub_bytes_used = uint32_t(MoeFinalizeUbBytes(t, h, bn));
    *out = t;
    return "";
  }
  return std::string(op) + ": a 64-element chunk does not fit the " + std::to_string(budget) + " usable UB bytes";
}

}  // namespace tot_ascendc
