// Tiling of the decode-attention kernel (incre_flash_attention on the npu device): one query token per sequence
// against a contiguous or paged KV cache, GQA groups, optional split of the KV axis across cores.
//
// Work unit ("task"): (batch b, KV head n2, KV split s). A task reads KV positions [s*split_len, (s+1)*split_len)
// of sequence b (clipped to its length), tile by tile, once for each chunk of `group_chunk` query heads sharing
// KV head n2 (normally the whole group: the KV is read once; huge groups take several passes).
// Tasks are numbered t = ((b*kv_heads + n2)*splits + s) and core c runs the contiguous range
// [TaskBegin(c), TaskBegin(c+1)). With splits > 1 every task writes fp32 partials (running max m, sum l,
// unnormalised accumulator) to the workspace; after SyncAll, core c merges query-head rows
// [RowBegin(c), RowBegin(c+1)) of the B*q_heads rows with their log-sum-exp weights.
#pragma once

#include <cstdint>
#include <string>

#include "common/platform.h"

namespace tot_ascendc {

enum class DecodeDtype : uint32_t { FP16 = 0, BF16 = 1, FP32 = 2 };

// POD: copied to GM and read by every core.
struct IncreFlashAttentionTiling {
  uint32_t block_dim = 1;
  uint32_t dtype = 0;                 // DecodeDtype
  uint32_t batch = 0, q_heads = 0, kv_heads = 0, group = 1;
  uint32_t group_chunk = 1;           // query heads of a group processed per pass over the KV (UB holds them)
  uint32_t head_dim = 0;              // D
  uint32_t head_dim_pad = 0;          // D rounded up to 32 bytes of the input dtype (UB row pitch, elements)
  uint32_t paged = 0;
  uint32_t block_size = 0;            // paged: positions per cache block; contiguous: the cache length S
  uint32_t max_blocks = 0;            // paged: columns of block_table
  uint32_t capacity = 0;              // positions per sequence (paged: max_blocks*block_size)
  uint64_t kv_elems = 0;              // elements of key (= of value)
  uint64_t q_elems = 0;               // elements of query (= of out)
  uint64_t k_blk = 0, k_head = 0, k_seq = 0;  // element strides of a cache row: block (or batch), head, position
  float scale = 1.f;
  uint32_t tile_rows = 0;             // KV positions per UB tile (multiple of 8)
  uint32_t splits = 1;                // KV splits per (b, n2)
  uint32_t split_len = 0;             // positions per split (multiple of tile_rows)
  uint32_t tasks = 0;                 // batch * kv_heads * splits
  uint32_t tasks_base = 0, tasks_extra = 0;  // core c gets tasks_base tasks, +1 if c < tasks_extra
  uint32_t rows = 0;                  // batch * q_heads (merge phase)
  uint32_t rows_base = 0, rows_extra = 0;
  uint32_t ub_bytes = 0;              // UB the kernel allocates (planned, per core)
  uint64_t ws_acc_offset = 0;         // workspace bytes: fp32 acc [rows, splits, head_dim_pad]
  uint64_t ws_stat_offset = 0;        // fp32 stats [rows, splits, 16] (m block of 8, l block of 8)
  uint64_t workspace_bytes = 0;
};

inline uint32_t RangeBegin(uint32_t c, uint32_t base, uint32_t extra) { return c * base + (c < extra ? c : extra); }
inline uint32_t TaskBegin(const IncreFlashAttentionTiling& t, uint32_t c) {
  return RangeBegin(c, t.tasks_base, t.tasks_extra);
}
inline uint32_t RowBegin(const IncreFlashAttentionTiling& t, uint32_t c) {
  return RangeBegin(c, t.rows_base, t.rows_extra);
}

// Shapes and options of one call, as the host glue sees them after validation.
struct DecodeShape {
  uint32_t batch = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  DecodeDtype dtype = DecodeDtype::FP16;
  bool paged = false;
  uint32_t block_size = 0;   // paged only
  uint32_t max_blocks = 0;   // paged only
  uint32_t seq_capacity = 0; // contiguous: S of the cache
  uint64_t k_blk = 0, k_head = 0, k_seq = 0, kv_elems = 0;
  float scale = 1.f;
  uint32_t force_splits = 0; // tests: 0 = automatic
  uint32_t max_tile_rows = 128;
};

// UB bytes the kernel allocates for a tile of `tile_rows` positions (see the kernel's InitBuffers).
uint32_t DecodeUbBytes(uint32_t tile_rows, uint32_t group, uint32_t head_dim_pad, uint32_t dtype_bytes,
                       uint32_t splits);

// Fills `out`; returns "" or why the shape cannot be tiled (the glue then runs the CPU kernel).
std::string IncreFlashAttentionTilingFn(const DecodeShape& shape, const PlatformInfo& platform,
                                        IncreFlashAttentionTiling& out);

}  // namespace tot_ascendc
