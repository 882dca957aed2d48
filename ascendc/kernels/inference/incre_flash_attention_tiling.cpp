// Host tiling of the decode-attention kernel: pure C++ (no torch), unit-tested by
// ascendc/tests/incre_flash_attention_tiling_test.cpp.
#include "inference/incre_flash_attention_tiling.h"

namespace tot_ascendc {
namespace {

constexpr uint32_t kFloat = 4;
constexpr uint32_t kBlock = 32;           // bytes of one DataBlock
constexpr uint32_t kStatFloats = 8;       // one DataBlock per query-head row: [rows, 8] statistics
constexpr uint32_t kMaxRepeat = 255;      // level-0 repeat count and repeat stride limits
constexpr float kMinSplitTiles = 1;       // a split reads at least one whole tile

uint32_t DtypeBytes(DecodeDtype d) { return d == DecodeDtype::FP32 ? 4 : 2; }

uint32_t Ceil(uint64_t a, uint64_t b) { return CeilDiv(a, b); }

void SplitEvenly(uint32_t items, uint32_t cores, uint32_t& base, uint32_t& extra) {
  base = items / cores;
  extra = items % cores;
}

}  // namespace

uint32_t DecodeUbBytes(uint32_t tile_rows, uint32_t group, uint32_t head_dim_pad, uint32_t dtype_bytes,
                       uint32_t splits) {
  const uint64_t tile_in = uint64_t(tile_rows) * head_dim_pad * dtype_bytes;  // one K or V tile as stored
  const uint64_t tile_f32 = uint64_t(tile_rows) * head_dim_pad * kFloat;
  const uint64_t group_in = AlignUp(uint64_t(group) * head_dim_pad * dtype_bytes, kBlock);
  const uint64_t group_f32 = uint64_t(group) * head_dim_pad * kFloat;
  uint64_t bytes = 2 * 2 * tile_in;                   // K and V input queues, double-buffered
  bytes += 3 * tile_f32;                              // K and V in fp32, the q*k products
  bytes += uint64_t(group) * tile_rows * kFloat;      // scores (then probabilities) per query head
  bytes += uint64_t(tile_rows) * kBlock;              // probabilities spread one DataBlock per row (P·V)
  bytes += group_in + 2 * group_f32;                  // query as stored, query fp32, accumulator
  bytes += group_in;                                  // output staging in the output dtype
  bytes += 4ull * group * kStatFloats * kFloat;       // m, l, new m, rescale factor
  bytes += AlignUp(uint64_t(tile_rows) * kFloat, kBlock) + kBlock;  // reduction scratch and result
  if (splits > 1) {                                   // merge phase: one row's partials
    bytes += uint64_t(splits) * head_dim_pad * kFloat;        // accumulators
    bytes += uint64_t(splits) * 2 * kStatFloats * kFloat;     // (m, l) blocks
    bytes += uint64_t(splits) * kStatFloats * kFloat;         // weights
    bytes += uint64_t(head_dim_pad) * kFloat;                 // merged row
    bytes += AlignUp(uint64_t(head_dim_pad) * dtype_bytes, kBlock);
  }
  return bytes > 0xffffffffull ? 0xffffffffu : uint32_t(bytes);
}

std::string IncreFlashAttentionTilingFn(const DecodeShape& s, const PlatformInfo& platform,
                                        IncreFlashAttentionTiling& t) {
  if (s.batch == 0 || s.q_heads == 0 || s.kv_heads == 0 || s.head_dim == 0)
    return "empty shape (batch, heads and head_dim must be positive)";
  if (s.q_heads % s.kv_heads != 0) return "q_heads must be a multiple of kv_heads";
  if (s.paged && (s.block_size == 0 || s.max_blocks == 0)) return "paged cache needs block_size and max_blocks";
  t = IncreFlashAttentionTiling{};
  const uint32_t dbytes = DtypeBytes(s.dtype);
  t.dtype = uint32_t(s.dtype);
  t.batch = s.batch;
  t.q_heads = s.q_heads;
  t.kv_heads = s.kv_heads;
  t.group = s.q_heads / s.kv_heads;
  t.head_dim = s.head_dim;
  t.head_dim_pad = AlignUp(s.head_dim, kBlock / dbytes);
  if (t.head_dim_pad / (kBlock / kFloat) > kMaxRepeat) return "head_dim too large for one vector repeat stride";
  t.paged = s.paged ? 1 : 0;
  t.block_size = s.paged ? s.block_size : s.seq_capacity;
  t.max_blocks = s.paged ? s.max_blocks : 1;
  t.capacity = s.paged ? s.block_size * s.max_blocks : s.seq_capacity;
  t.kv_elems = s.kv_elems;
  t.q_elems = uint64_t(s.batch) * s.q_heads * s.head_dim;
  t.k_blk = s.k_blk;
  t.k_head = s.k_head;
  t.k_seq = s.k_seq;
  t.scale = s.scale;

  // Core split: (b, n2) pairs; split the KV axis when they leave most vector cores idle.
  const uint32_t cores = platform.aiv_cores;
  const uint32_t pairs = s.batch * s.kv_heads;
  const uint32_t capacity = t.capacity > 0 ? t.capacity : 1;

  // Largest tile (multiple of 8, within a paged block) whose buffers fit UB; splits are decided with it.
  uint32_t tile = s.max_tile_rows < 8 ? 8 : s.max_tile_rows / 8 * 8;
  if (tile > 128) tile = 128;
  if (s.paged && tile > s.block_size) tile = s.block_size;
  const uint32_t cap_tiles = AlignUp(capacity, 8);
  if (tile > cap_tiles) tile = cap_tiles;
  const uint32_t top_tile = tile;
  uint32_t chunk = t.group;
  // Prefer the whole group (KV read once); halve the head chunk while not even an 8-row tile fits.
  for (;; chunk = (chunk + 1) / 2) {
    tile = top_tile;
    while (tile > 8 && DecodeUbBytes(tile, chunk, t.head_dim_pad, dbytes, 1) > platform.UsableUb()) tile -= 8;
    if (DecodeUbBytes(tile, chunk, t.head_dim_pad, dbytes, 1) <= platform.UsableUb()) break;
    if (chunk == 1) return "a tile of 8 KV rows does not fit UB for this head_dim";
  }
  t.group_chunk = chunk;
  // Split-KV when the (b, n2) pairs leave most vector cores idle, as far as the merge buffers fit UB.
  uint32_t splits = 1;
  if (s.force_splits) {
    splits = s.force_splits;
  } else if (pairs * 2 <= cores) {
    const uint32_t by_cores = Ceil(cores, pairs);
    const uint32_t by_len = uint32_t(capacity / (kMinSplitTiles * tile));
    splits = by_cores < by_len ? by_cores : by_len;
    if (splits < 1) splits = 1;
    while (splits > 1 && DecodeUbBytes(tile, chunk, t.head_dim_pad, dbytes, splits) > platform.UsableUb()) --splits;
  }
  t.tile_rows = tile;
  t.split_len = AlignUp(Ceil(capacity, splits), tile);
  t.splits = Ceil(capacity, t.split_len);
  if (s.force_splits && t.splits != s.force_splits) t.splits = s.force_splits;  // trailing splits may be empty
  t.ub_bytes = DecodeUbBytes(tile, t.group_chunk, t.head_dim_pad, dbytes, t.splits);
  if (t.ub_bytes > platform.UsableUb()) return "the merge buffers of the KV splits do not fit UB";

  t.tasks = pairs * t.splits;
  t.block_dim = t.tasks < cores ? t.tasks : cores;
  SplitEvenly(t.tasks, t.block_dim, t.tasks_base, t.tasks_extra);
  t.rows = s.batch * s.q_heads;
  SplitEvenly(t.rows, t.block_dim, t.rows_base, t.rows_extra);
  if (t.splits > 1) {
    t.ws_acc_offset = 0;
    t.ws_stat_offset = uint64_t(t.rows) * t.splits * t.head_dim_pad * kFloat;
    t.workspace_bytes = t.ws_stat_offset + uint64_t(t.rows) * t.splits * 2 * kStatFloats * kFloat;
  }
  return "";
}

}  // namespace tot_ascendc
