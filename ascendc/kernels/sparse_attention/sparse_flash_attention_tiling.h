// Tiling of the sparse flash attention kernel (sparse_flash_attention on the npu device): every query row attends,
// through each KV head, to the cache rows its row of sparse_indices selects (DeepSeek-V3.2's DSA), contiguous
// (BSND / TND) or paged (PA_BSND) caches, optional rope parts (attention_mode 2), sinks and softmax statistics.
//
// Work unit ("item"): (query row t, KV head n2), numbered it = t * kv_heads + n2; core c runs the contiguous range
// [ItemBegin(c), ItemBegin(c+1)). An item walks its slots in order, gathers the selected rows tile by tile into UB
// (`tile_rows` rows per tile) and runs an online softmax for `group_chunk` of the G query heads of n2 at a time
// (the whole group unless its fp32 query and accumulator rows cannot fit UB; each chunk gathers the rows again).
#pragma once

#include <cstdint>
#include <string>

#include "common/platform.h"

namespace tot_ascendc {

enum class SparseDtype : uint32_t { FP16 = 0, BF16 = 1, FP32 = 2 };

// POD: copied to GM and read by every core.
struct SparseFlashAttentionTiling {
  uint32_t block_dim = 1;
  uint32_t dtype = 0;                // SparseDtype
  uint32_t rows = 0;                 // T1: query rows (B * S1 for BSND)
  uint32_t q_heads = 0, kv_heads = 0, group = 1;
  uint32_t group_chunk = 1;          // query heads of a group per pass over the selected rows
  uint32_t slots = 0;                // K: entries per row of sparse_indices
  uint32_t sparse_block_size = 1;    // KV tokens one entry selects
  uint32_t dn = 0, dr = 0, dv = 0;   // head dims of key (= query), the rope parts (0: none) and value
  uint32_t dn_pad = 0, dr_pad = 0;   // rounded up to 32 bytes of the input dtype
  uint32_t dq_pad = 0;               // dn_pad + dr_pad: the UB row of a query or key ([latent | rope])
  uint32_t dv_pad = 0;
  uint32_t value_is_key = 0;         // value is key's memory (MLA): the key tile serves as the value tile
  uint32_t paged = 0;
  uint32_t batch = 0;
  uint32_t block_size = 0;           // paged: tokens per cache block
  uint32_t max_blocks = 0;           // paged: columns of block_table
  uint64_t kv_rows = 0;              // key viewed as [kv_rows, kv_heads, dn]
  uint32_t q_tnd = 0;                // statistics layout: TND [N2, T1, G], else BSND [B, N2, S1, G]
  uint32_t s1 = 0;                   // BSND: query positions per sequence
  uint32_t has_sinks = 0;
  uint32_t return_stats = 0;
  float scale = 1.f;
  float neg_inf = 0.f;               // -infinity (set by the host): softmax_max of a row without keys
  uint32_t tile_rows = 0;            // gathered rows per UB tile (multiple of 8)
  uint32_t items = 0;                // rows * kv_heads
  uint32_t items_base = 0, items_extra = 0;  // core c gets items_base items, +1 if c < items_extra
  uint32_t ub_bytes = 0;             // UB the kernel allocates (planned, per core)
};

inline uint32_t ItemBegin(const SparseFlashAttentionTiling& t, uint32_t c) {
  return c * t.items_base + (c < t.items_extra ? c : t.items_extra);
}

// Shapes and options of one call, as the host glue sees them after validation.
struct SparseShape {
  uint32_t rows = 0, q_heads = 0, kv_heads = 0, slots = 0, sparse_block_size = 1;
  uint32_t dn = 0, dr = 0, dv = 0;
  SparseDtype dtype = SparseDtype::FP16;
  bool value_is_key = false;
  bool paged = false;
  uint32_t batch = 0, block_size = 0, max_blocks = 0;  // block_size / max_blocks: paged only
  uint64_t kv_rows = 0;
  bool q_tnd = false;
  uint32_t s1 = 0;
  bool has_sinks = false, return_stats = false;
  float scale = 1.f;
  uint32_t max_tile_rows = 128;  // tests: smaller tiles
};

// UB bytes the kernel allocates (see the kernel's InitBuffers).
uint32_t SparseUbBytes(uint32_t tile_rows, uint32_t chunk, uint32_t dq_pad, uint32_t dv_pad, uint32_t dtype_bytes,
                       bool value_is_key);

// Fills `out`; returns "" or why the shape cannot be tiled (the glue then runs the CPU kernel).
std::string SparseFlashAttentionTilingFn(const SparseShape& shape, const PlatformInfo& platform,
                                         SparseFlashAttentionTiling& out);

}  // namespace tot_ascendc
