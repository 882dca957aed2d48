// Tiling of the lightning indexer kernel (lightning_indexer on the npu device, DeepSeek-V3.2's indexer forward):
// for every query row t and key head n2, score[s] = sum_h w[t, h] * ReLU(q[t, h] . k[s, n2]) over the G query heads
// of n2 and the keys the row may see, then the top `sparse_count` positions (descending, ties to the lower
// position, -1 past the visible keys).
//
// Item: (query row t, key head n2), numbered it = t * kv_heads + n2. An item's keys are walked in ascending position,
// `tile_rows` keys per UB tile, with a running top-k of `sparse_count` (score, position) pairs in UB.
//
// With at least as many items as vector cores (prefill), core c runs the items [IndexerItemBegin(c),
// IndexerItemBegin(c+1)) whole (splits = 1). With fewer (decode: one row per sequence), the keys of an item are
// split into `splits` ranges of `split_keys` keys so that the idle cores work too: phase 1 gives the units
// u = it * splits + range to the cores ([IndexerUnitBegin(c), IndexerUnitBegin(c+1))), each writing its range's
// top-k to the GM workspace; after a SyncAll, phase 2 merges each item's `splits` partial lists (the items spread
// over the cores as in the unsplit case) into its row of the output.
#pragma once

#include <cstdint>
#include <string>

#include "common/platform.h"
#include "sparse_attention/sparse_flash_attention_tiling.h"  // SparseDtype: the family's input dtypes

namespace tot_ascendc {

// POD: copied to GM and read by every core.
struct LightningIndexerTiling {
  uint32_t block_dim = 1;
  uint32_t dtype = 0;                // SparseDtype of query and key (weights arrive as fp32)
  uint32_t rows = 0;                 // query rows (B * S1 for BSND, T1 for TND)
  uint32_t q_heads = 0, kv_heads = 0, group = 1;
  uint32_t d = 0, d_pad = 0;         // head dim, rounded up to 32 bytes of the input dtype
  uint32_t sparse_count = 0;         // K: output slots per (row, key head)
  uint32_t k_pad = 0;                // K rounded up to 16 elements (32 bytes of a 16-bit staging row)
  uint32_t return_value = 0;         // also write the selected scores (in the input dtype)
  uint32_t paged = 0;
  uint32_t batch = 0;
  uint32_t block_size = 0;           // paged: tokens per cache block
  uint32_t max_blocks = 0;           // paged: columns of block_table
  uint64_t kv_rows = 0;              // key viewed as [kv_rows, kv_heads, d]
  float neg_inf = 0.f;               // -infinity (set by the host): the value of a -1 slot
  uint32_t tile_rows = 0;            // keys per UB tile (multiple of 8)
  uint32_t items = 0;                // rows * kv_heads
  uint32_t items_base = 0, items_extra = 0;  // core c gets items_base items, +1 if c < items_extra (whole / merge)
  uint32_t splits = 1;               // key ranges per item (1: no split, no workspace)
  uint32_t split_keys = 0;           // keys per range (a multiple of tile_rows)
  uint32_t units = 0;                // items * splits
  uint32_t units_base = 0, units_extra = 0;  // phase 1: core c gets units_base units, +1 if c < units_extra
  uint64_t workspace_bytes = 0;      // partial lists: fp32 scores [units, k_pad] then int32 positions [units, k_pad]
  uint32_t ub_bytes = 0;             // UB the kernel allocates (planned, per core)
};

inline uint32_t IndexerItemBegin(const LightningIndexerTiling& t, uint32_t c) {
  return c * t.items_base + (c < t.items_extra ? c : t.items_extra);
}

inline uint32_t IndexerUnitBegin(const LightningIndexerTiling& t, uint32_t c) {
  return c * t.units_base + (c < t.units_extra ? c : t.units_extra);
}

// Shapes and options of one call, as the host glue sees them after validation.
struct IndexerShape {
  uint32_t rows = 0, q_heads = 0, kv_heads = 0, d = 0, sparse_count = 0;
  SparseDtype dtype = SparseDtype::FP16;
  bool return_value = false;
  bool paged = false;
  uint32_t batch = 0, block_size = 0, max_blocks = 0;  // block_size / max_blocks: paged only
  uint64_t kv_rows = 0;
  uint32_t max_keys = 0;         // the most keys any row sees (sizes the split of few items' keys)
  uint32_t max_tile_rows = 128;  // tests: smaller tiles
  uint32_t max_splits = 48;      // tests / callers: at most this many key ranges per item (1: never split)
};

// UB bytes the kernel allocates (see the kernel's InitBuffers).
uint32_t IndexerUbBytes(uint32_t tile_rows, uint32_t group, uint32_t d_pad, uint32_t k_pad, uint32_t dtype_bytes,
                        bool return_value);

// Fills `out`; returns "" or why the shape cannot be tiled (the glue then runs the CPU kernel).
std::string LightningIndexerTilingFn(const IndexerShape& shape, const PlatformInfo& platform,
                                     LightningIndexerTiling& out);

}  // namespace tot_ascendc
