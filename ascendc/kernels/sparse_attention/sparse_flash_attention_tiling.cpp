// Host tiling of the sparse flash attention kernel: pure C++ (no torch), unit-tested by
// ascendc/tests/sparse_flash_attention_tiling_test.cpp.
#include "sparse_attention/sparse_flash_attention_tiling.h"

#include <limits>

namespace tot_ascendc {
namespace {

constexpr uint32_t kFloat = 4;
constexpr uint32_t kBlock = 32;       // bytes of one DataBlock
constexpr uint32_t kStatFloats = 8;   // one DataBlock per query head: [heads, 8] statistics
constexpr uint32_t kMaxRepeat = 255;  // level-0 repeat stride limit (DataBlocks)
constexpr uint32_t kMaxTile = 128;

uint32_t DtypeBytes(SparseDtype d) { return d == SparseDtype::FP32 ? 4 : 2; }

}  // namespace

uint32_t SparseUbBytes(uint32_t tile_rows, uint32_t chunk, uint32_t dq_pad, uint32_t dv_pad, uint32_t dtype_bytes,
                       bool value_is_key) {
  const uint64_t t = tile_rows, c = chunk;
  const uint64_t widest = dq_pad > dv_pad ? dq_pad : dv_pad;
  uint64_t bytes = t * dq_pad * dtype_bytes;             // gathered key rows [latent | rope] as stored
  bytes += t * dq_pad * kFloat;                          // the same in fp32
  if (!value_is_key) bytes += t * dv_pad * (dtype_bytes + kFloat);  // value rows as stored and in fp32
  bytes += t * widest * kFloat;                          // products (scores, then P·V)
  bytes += c * t * kFloat;                               // scores (then probabilities) per query head
  bytes += t * kBlock;                                   // probabilities spread one DataBlock per row
  bytes += AlignUp(c * dq_pad * dtype_bytes, kBlock) + c * dq_pad * kFloat;  // query as stored and in fp32
  bytes += c * dv_pad * kFloat;                          // accumulator
  bytes += AlignUp(c * dv_pad * dtype_bytes, kBlock);    // output staging
  bytes += 5ull * c * kStatFloats * kFloat;              // m, l, new m, rescale factor, sink term
  bytes += 2ull * AlignUp(c * kFloat, kBlock);           // softmax_max / softmax_sum staging
  bytes += AlignUp(t * kFloat, kBlock) + kBlock;         // reduction scratch and result
  return bytes > 0xffffffffull ? 0xffffffffu : uint32_t(bytes);
}

std::string SparseFlashAttentionTilingFn(const SparseShape& s, const PlatformInfo& platform,
                                         SparseFlashAttentionTiling& t) {
  if (s.rows == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.dn == 0 || s.dv == 0)
    return "empty shape (rows, heads and head dims must be positive)";
  if (s.q_heads % s.kv_heads != 0) return "q_heads must be a multiple of kv_heads";
  if (s.sparse_block_size == 0) return "sparse_block_size must be positive";
  if (s.value_is_key && s.dv != s.dn) return "value_is_key needs dv == dn";
  if (s.paged && (s.block_size == 0 || s.max_blocks == 0 || s.block_size % s.sparse_block_size != 0))
    return "a paged cache needs block_size (a multiple of sparse_block_size) and max_blocks";
  if (!s.paged && s.kv_rows > uint64_t(std::numeric_limits<int32_t>::max()))
    return "more than 2^31 - 1 cache rows (the row table is int32)";
  t = SparseFlashAttentionTiling{};
  const uint32_t dbytes = DtypeBytes(s.dtype), lane = kBlock / dbytes;
  t.dtype = uint32_t(s.dtype);
  t.rows = s.rows;
  t.q_heads = s.q_heads;
  t.kv_heads = s.kv_heads;
  t.group = s.q_heads / s.kv_heads;
  t.slots = s.slots;
  t.sparse_block_size = s.sparse_block_size;
  t.dn = s.dn;
  t.dr = s.dr;
  t.dv = s.dv;
  t.dn_pad = AlignUp(s.dn, lane);
  t.dr_pad = AlignUp(s.dr, lane);
  t.dq_pad = t.dn_pad + t.dr_pad;
  t.dv_pad = AlignUp(s.dv, lane);
  // Row pitches are level-0 repeat strides in fp32 DataBlocks.
  if (t.dq_pad / (kBlock / kFloat) > kMaxRepeat || t.dv_pad / (kBlock / kFloat) > kMaxRepeat)
    return "head_dim too large for one vector repeat stride";
  t.value_is_key = s.value_is_key ? 1 : 0;
  t.paged = s.paged ? 1 : 0;
  t.batch = s.batch;
  t.block_size = s.paged ? s.block_size : 0;
  t.max_blocks = s.paged ? s.max_blocks : 0;
  t.kv_rows = s.kv_rows;
  t.q_tnd = s.q_tnd ? 1 : 0;
  t.s1 = s.s1;
  t.has_sinks = s.has_sinks ? 1 : 0;
  t.return_stats = s.return_stats ? 1 : 0;
  t.scale = s.scale;
  t.neg_inf = -std::numeric_limits<float>::infinity();

  // Largest tile (multiple of 8, at most what an item can select) whose buffers fit UB; prefer the whole group
  // (rows gathered once per item), halving the head chunk while not even an 8-row tile fits.
  uint32_t top = s.max_tile_rows < 8 ? 8 : s.max_tile_rows / 8 * 8;
  if (top > kMaxTile) top = kMaxTile;
  const uint64_t selectable = uint64_t(s.slots) * s.sparse_block_size;
  if (selectable < top) top = selectable < 8 ? 8 : AlignUp(selectable, 8);
  const bool vk = s.value_is_key;
  uint32_t chunk = t.group, tile = top;
  for (;; chunk = (chunk + 1) / 2) {
    tile = top;
    while (tile > 8 && SparseUbBytes(tile, chunk, t.dq_pad, t.dv_pad, dbytes, vk) > platform.UsableUb()) tile -= 8;
    if (SparseUbBytes(tile, chunk, t.dq_pad, t.dv_pad, dbytes, vk) <= platform.UsableUb()) break;
    if (chunk == 1) return "a tile of 8 gathered rows does not fit UB for these head dims";
  }
  t.group_chunk = chunk;
  t.tile_rows = tile;
  t.ub_bytes = SparseUbBytes(tile, chunk, t.dq_pad, t.dv_pad, dbytes, vk);

  const uint64_t items = uint64_t(s.rows) * s.kv_heads;
  if (items > std::numeric_limits<uint32_t>::max()) return "more than 2^32 - 1 (row, KV head) items";
  t.items = uint32_t(items);
  const uint32_t cores = platform.aiv_cores;
  t.block_dim = t.items < cores ? t.items : cores;
  t.items_base = t.items / t.block_dim;
  t.items_extra = t.items % t.block_dim;
  return "";
}

}  // namespace tot_ascendc
