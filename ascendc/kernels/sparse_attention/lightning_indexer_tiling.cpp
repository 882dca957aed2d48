// Host tiling of the lightning indexer kernel: pure C++ (no torch), unit-tested by
// ascendc/tests/lightning_indexer_tiling_test.cpp.
#include "sparse_attention/lightning_indexer_tiling.h"

#include <limits>

namespace tot_ascendc {
namespace {

constexpr uint32_t kFloat = 4;
constexpr uint32_t kBlock = 32;       // bytes of one DataBlock
constexpr uint32_t kMaxRepeat = 255;  // level-0 repeat stride limit (DataBlocks)
constexpr uint32_t kMaxTile = 128;

uint32_t DtypeBytes(SparseDtype d) { return d == SparseDtype::FP32 ? 4 : 2; }

// Fewer items than cores: each item's keys in up to cores / items ranges of whole tiles, so every core scores keys;
// the partial lists go through the workspace to the merge. Otherwise (or with keys for one tile) no split.
void SplitKeys(const IndexerShape& s, uint32_t cores, LightningIndexerTiling& t) {
  t.splits = 1;
  t.split_keys = s.max_keys;
  t.units = t.items;
  t.workspace_bytes = 0;
  if (t.items >= cores) return;
  uint32_t splits = cores / t.items;
  if (splits > s.max_splits) splits = s.max_splits;
  const uint32_t tiles = CeilDiv(s.max_keys, t.tile_rows);
  if (splits > tiles) splits = tiles;
  if (splits < 2) return;
  t.split_keys = AlignUp(CeilDiv(s.max_keys, splits), t.tile_rows);
  t.splits = CeilDiv(s.max_keys, t.split_keys);  // no trailing range without keys
  if (t.splits < 2) {
    t.splits = 1;
    t.split_keys = s.max_keys;
    return;
  }
  t.units = t.items * t.splits;
  t.workspace_bytes = uint64_t(t.units) * t.k_pad * (kFloat + sizeof(int32_t));
}

}  // namespace

uint32_t IndexerUbBytes(uint32_t tile_rows, uint32_t group, uint32_t d_pad, uint32_t k_pad, uint32_t dtype_bytes,
                        bool return_value) {
  const uint64_t t = tile_rows, g = group, k = k_pad;
  uint64_t bytes = t * d_pad * dtype_bytes;                       // key tile as stored
  bytes += 2 * t * d_pad * kFloat;                                // the same in fp32, and the products
  bytes += AlignUp(g * d_pad * dtype_bytes, kBlock) + g * d_pad * kFloat;  // the group's queries, stored and fp32
  bytes += 2 * AlignUp(t * kFloat, kBlock);                       // one head's dot products, the tile's scores
  bytes += AlignUp(t * kFloat, kBlock) + kBlock;                  // reduction scratch and result
  bytes += 2 * k * kFloat;                                        // running top-k: scores and positions
  if (return_value && dtype_bytes != kFloat) bytes += AlignUp(k * dtype_bytes, kBlock);  // values staging
  return bytes > 0xffffffffull ? 0xffffffffu : uint32_t(bytes);
}

std::string LightningIndexerTilingFn(const IndexerShape& s, const PlatformInfo& platform,
                                     LightningIndexerTiling& t) {
  if (s.rows == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.d == 0 || s.sparse_count == 0)
    return "empty shape (rows, heads, head dim and sparse_count must be positive)";
  if (s.q_heads % s.kv_heads != 0) return "q_heads must be a multiple of kv_heads";
  if (s.paged && (s.block_size == 0 || s.max_blocks == 0)) return "a paged cache needs block_size and max_blocks";
  if (!s.paged && s.kv_rows > uint64_t(std::numeric_limits<int32_t>::max()))
    return "more than 2^31 - 1 key rows (the row table is int32)";
  t = LightningIndexerTiling{};
  const uint32_t dbytes = DtypeBytes(s.dtype);
  t.dtype = uint32_t(s.dtype);
  t.rows = s.rows;
  t.q_heads = s.q_heads;
  t.kv_heads = s.kv_heads;
  t.group = s.q_heads / s.kv_heads;
  t.d = s.d;
  t.d_pad = AlignUp(s.d, kBlock / dbytes);
  // A key row's pitch is a level-0 repeat stride in fp32 DataBlocks.
  if (t.d_pad / (kBlock / kFloat) > kMaxRepeat) return "head_dim too large for one vector repeat stride";
  t.sparse_count = s.sparse_count;
  t.k_pad = AlignUp(s.sparse_count, 16);
  t.return_value = s.return_value ? 1 : 0;
  t.paged = s.paged ? 1 : 0;
  t.batch = s.batch;
  t.block_size = s.paged ? s.block_size : 0;
  t.max_blocks = s.paged ? s.max_blocks : 0;
  t.kv_rows = s.kv_rows;
  t.neg_inf = -std::numeric_limits<float>::infinity();

  // The largest tile (multiple of 8, at most 128) whose buffers fit UB next to the group's queries and the top-k.
  uint32_t tile = s.max_tile_rows < 8 ? 8 : s.max_tile_rows / 8 * 8;
  if (tile > kMaxTile) tile = kMaxTile;
  while (tile > 8 && IndexerUbBytes(tile, t.group, t.d_pad, t.k_pad, dbytes, s.return_value) > platform.UsableUb())
    tile -= 8;
  t.ub_bytes = IndexerUbBytes(tile, t.group, t.d_pad, t.k_pad, dbytes, s.return_value);
  if (t.ub_bytes > platform.UsableUb()) return "the group's queries, the top-k and an 8-key tile do not fit UB";
  t.tile_rows = tile;

  const uint64_t items = uint64_t(s.rows) * s.kv_heads;
  if (items > std::numeric_limits<uint32_t>::max()) return "more than 2^32 - 1 (row, key head) items";
  t.items = uint32_t(items);
  const uint32_t cores = platform.aiv_cores;
  SplitKeys(s, cores, t);
  const uint32_t work = t.splits > 1 ? t.units : t.items;
  t.block_dim = work < cores ? work : cores;
  t.units_base = t.units / t.block_dim;
  t.units_extra = t.units % t.block_dim;
  t.items_base = t.items / t.block_dim;
  t.items_extra = t.items % t.block_dim;
  return "";
}

}  // namespace tot_ascendc
