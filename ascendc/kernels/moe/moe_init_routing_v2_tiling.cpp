// Host tiling of moe_init_routing_v2: pair and row shares over the AIVs, the counter arrays, the H chunk.
#include "moe/moe_init_routing_v2_tiling.h"

#include <algorithm>

namespace tot_ascendc {

namespace {

constexpr uint32_t kLanes = 64;          // H chunks are whole 64-element units (32-byte aligned in every dtype)
constexpr uint32_t kMaxTile = 8192;      // longer chunks gain nothing: one DataCopyPad already moves 16-64 KB
constexpr int64_t kMinPairsPerCore = 16; // fewer pairs per core would cost more in histogram rows than it saves

}  // namespace

uint64_t MoeInitRoutingV2UbBytes(const MoeInitRoutingV2Tiling& t, uint32_t h_tile) {
  const uint64_t row = AlignUp(uint64_t(h_tile) * t.elem_bytes, 32);
  uint64_t bytes = uint64_t(kInitRoutingCounterArrays) * t.buckets_aligned * 4;  // counters
  bytes += 2 * row;                                                              // ping-pong row chunks
  bytes += row;                                                                  // zeros (empty rows, scales)
  bytes += kInitRoutingIndexChunk * 4;                                           // index / count staging
  bytes += 2 * 32;                                                               // one-value slots (scatter)
  return bytes;
}

std::string MoeInitRoutingV2TilingFor(const MoeInitRoutingV2Shape& s, const PlatformInfo& platform,
                                      MoeInitRoutingV2Tiling* out) {
  const char* op = "moe_init_routing_v2 tiling";
  const int64_t pairs = s.tokens * s.k;
  if (s.tokens < 1 || s.k < 1 || s.width < 1 || s.hidden < 0)
    return std::string(op) + ": tokens, k and the expert span must be >= 1 (empty calls launch nothing)";
  if (s.elem_bytes != 1 && s.elem_bytes != 2 && s.elem_bytes != 4 && s.elem_bytes != 8)
    return std::string(op) + ": elements of 1, 2, 4 or 8 bytes";
  // Pair, row and element offsets are uint32 in the kernel; expert ids and positions are int32.
  const int64_t limit = int64_t(INT32_MAX);
  // The ranks add the per-core counts on the vector unit: exact while every count stays below 2^24.
  if (pairs >= (int64_t(1) << 24))
    return std::string(op) + ": N*k must be below 2^24 (the vector adds of the per-core counts stay exact)";
  const int64_t sort_width = std::max(s.width, s.sort_width);
  if (pairs > limit || s.rows_out > limit || pairs * s.hidden > limit || s.rows_out * s.hidden > limit ||
      s.first_expert + sort_width > limit || s.expert_num > limit)
    return std::string(op) + ": N*k, the output rows and their elements must fit int32";

  MoeInitRoutingV2Tiling t;
  t.tokens = uint32_t(s.tokens);
  t.k = uint32_t(s.k);
  t.hidden = uint32_t(s.hidden);
  t.pairs = uint32_t(pairs);
  t.rows_out = uint32_t(s.rows_out);
  t.capacity = s.capacity;
  t.expert_capacity = uint32_t(s.capacity ? s.expert_capacity : 0);
  t.first_expert = int32_t(s.first_expert);
  t.width = uint32_t(s.width);
  t.sort_width = uint32_t(sort_width);
  t.buckets_aligned = AlignUp(uint64_t(sort_width) + 1, 8);
  t.row_idx_type = uint32_t(s.row_idx_type);
  t.tokens_flag = s.tokens_flag;
  t.tokens_type = uint32_t(s.tokens_type);
  t.expert_num = uint32_t(std::max<int64_t>(s.expert_num, 0));
  t.has_scale = s.has_scale;
  t.elem_bytes = uint32_t(s.elem_bytes);
  const int64_t by_pairs = (pairs + kMinPairsPerCore - 1) / kMinPairsPerCore;
  t.block_dim = uint32_t(std::max<int64_t>(1, std::min<int64_t>(platform.aiv_cores, by_pairs)));
  t.pairs_per_core = t.pairs / t.block_dim;
  t.pairs_remainder = t.pairs % t.block_dim;
  t.rows_per_core = t.rows_out / t.block_dim;
  t.rows_remainder = t.rows_out % t.block_dim;
  t.workspace_bytes = t.block_dim * t.buckets_aligned * 4;

  const uint64_t budget = platform.UsableUb();
  uint32_t h = std::min(AlignUp(std::max<int64_t>(s.hidden, 1), kLanes), kMaxTile);
  while (h > kLanes && MoeInitRoutingV2UbBytes(t, h) > budget) h -= kLanes;
  if (MoeInitRoutingV2UbBytes(t, h) > budget)
    return std::string(op) + ": the counters of " + std::to_string(sort_width) + " experts do not fit the " +
           std::to_string(budget) + " usable UB bytes";
  t.h_tile = h;
  t.ub_bytes_used = uint32_t(MoeInitRoutingV2UbBytes(t, h));
  *out = t;
  return "";
}

}  // namespace tot_ascendc
