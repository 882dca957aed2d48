// Unit tests of the decode-attention tiling (pure host C++): UB budget, tile sizes and tails, the split-KV
// decision, and that the core split covers every (batch, KV head, KV range) and every merge row exactly once.
// Reports through test_main.h.
#include <cstdio>
#include <string>
#include <vector>

#include "inference/incre_flash_attention_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

namespace {

using tot_test::Check;

DecodeShape Shape(uint32_t b, uint32_t n1, uint32_t n2, uint32_t d, DecodeDtype dt, bool paged, uint32_t bs,
                  uint32_t blocks_or_s) {
  DecodeShape s;
  s.batch = b; s.q_heads = n1; s.kv_heads = n2; s.head_dim = d; s.dtype = dt; s.paged = paged;
  if (paged) { s.block_size = bs; s.max_blocks = blocks_or_s; }
  else s.seq_capacity = blocks_or_s;
  s.k_seq = d; s.k_head = uint64_t(d) * (paged ? bs : blocks_or_s);
  s.k_blk = s.k_head * n2; s.kv_elems = s.k_blk * b;
  return s;
}

std::string Name(const DecodeShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "B=%u N1=%u N2=%u D=%u dtype=%u paged=%d bs=%u cap=%u", s.batch, s.q_heads,
                s.kv_heads, s.head_dim, unsigned(s.dtype), int(s.paged), s.block_size,
                s.paged ? s.block_size * s.max_blocks : s.seq_capacity);
  return buf;
}

// Every invariant a tiling must satisfy.
void CheckTiling(const DecodeShape& s) {
  const PlatformInfo p = Ascend910B();
  IncreFlashAttentionTiling t;
  const std::string err = IncreFlashAttentionTilingFn(s, p, t);
  const std::string n = Name(s);
  Check(err.empty(), n + ": tiling failed: " + err);
  if (!err.empty()) return;
  const uint32_t dbytes = s.dtype == DecodeDtype::FP32 ? 4 : 2;
  Check(t.block_dim >= 1 && t.block_dim <= p.aiv_cores, n + ": block_dim in [1, 48]");
  Check(t.ub_bytes <= p.UsableUb(), n + ": UB budget");
  Check(t.ub_bytes == DecodeUbBytes(t.tile_rows, t.group_chunk, t.head_dim_pad, dbytes, t.splits), n + ": ub_bytes");
  Check(t.group_chunk >= 1 && t.group_chunk <= t.group, n + ": head chunk within the group");
  Check(t.tile_rows % 8 == 0 && t.tile_rows >= 8 && t.tile_rows <= 128, n + ": tile rows multiple of 8 in [8,128]");
  Check(t.head_dim_pad * dbytes % 32 == 0 && t.head_dim_pad >= t.head_dim && t.head_dim_pad - t.head_dim < 32 / dbytes,
        n + ": head_dim_pad is D rounded up to 32 bytes");
  if (s.paged) Check(t.tile_rows <= s.block_size, n + ": a tile fits in one cache block");
  Check(t.split_len % t.tile_rows == 0, n + ": split_len multiple of tile_rows");
  Check(uint64_t(t.splits) * t.split_len >= t.capacity, n + ": splits cover the cache");
  Check(t.splits == 1 || uint64_t(t.splits - 1) * t.split_len < t.capacity || s.force_splits,
        n + ": no automatic split is empty for a full-length sequence");
  // Tasks: every (b, n2, split) exactly once, contiguous ranges per core.
  std::vector<int> seen(t.tasks, 0);
  Check(TaskBegin(t, 0) == 0 && TaskBegin(t, t.block_dim) == t.tasks, n + ": task ranges span [0, tasks)");
  for (uint32_t c = 0; c < t.block_dim; ++c) {
    Check(TaskBegin(t, c + 1) > TaskBegin(t, c), n + ": every core has a task");
    for (uint32_t k = TaskBegin(t, c); k < TaskBegin(t, c + 1); ++k) seen[k]++;
  }
  Check(t.tasks == s.batch * s.kv_heads * t.splits, n + ": task count");
  // Each position of each (b, n2) lies in exactly one split range.
  std::vector<int> pos_seen(t.capacity, 0);
  for (uint32_t sp = 0; sp < t.splits; ++sp)
    for (uint32_t q = sp * t.split_len; q < (sp + 1) * t.split_len && q < t.capacity; ++q) pos_seen[q]++;
  bool once = true;
  for (int v : seen) once = once && v == 1;
  for (int v : pos_seen) once = once && v == 1;
  Check(once, n + ": every (b, n2, kv range) once");
  // Merge rows.
  if (t.splits > 1) {
    Check(TaskBegin(t, 0) == 0 && RowBegin(t, t.block_dim) == t.rows && t.rows == s.batch * s.q_heads,
          n + ": merge rows span [0, B*N1)");
    Check(t.workspace_bytes == uint64_t(t.rows) * t.splits * (t.head_dim_pad + 16) * 4, n + ": workspace bytes");
    Check(t.ws_stat_offset == uint64_t(t.rows) * t.splits * t.head_dim_pad * 4, n + ": stat offset");
  } else {
    Check(t.workspace_bytes == 0, n + ": no workspace without splits");
  }
  // Tails: the last tile of a split and of a paged block.
  const uint32_t tail = t.capacity % t.tile_rows;
  Check(tail < t.tile_rows, n + ": tail smaller than a tile");
}

}  // namespace

int main() {
  const DecodeDtype dts[] = {DecodeDtype::FP16, DecodeDtype::BF16, DecodeDtype::FP32};
  for (DecodeDtype dt : dts) {
    CheckTiling(Shape(1, 8, 2, 64, dt, false, 0, 200));        // few pairs: split-KV
    CheckTiling(Shape(32, 32, 8, 128, dt, false, 0, 1000));    // many pairs: no split
    CheckTiling(Shape(2, 4, 4, 40, dt, true, 16, 9));          // paged 16, D tail
    CheckTiling(Shape(3, 8, 2, 128, dt, true, 128, 5));        // paged 128
    CheckTiling(Shape(1, 64, 1, 256, dt, false, 0, 4096));     // big GQA group: smaller tiles
    CheckTiling(Shape(4, 4, 1, 8, dt, false, 0, 5));           // tiny cache
    CheckTiling(Shape(2, 2, 2, 600, dt, true, 512, 3));        // large D, block 512
  }
  // Split decisions.
  {
    IncreFlashAttentionTiling t;
    IncreFlashAttentionTilingFn(Shape(1, 8, 2, 64, DecodeDtype::FP16, false, 0, 4096), Ascend910B(), t);
    Check(t.splits > 1 && t.block_dim > 2, "few (b, n2) pairs and a long cache split the KV axis");
    IncreFlashAttentionTilingFn(Shape(64, 8, 8, 64, DecodeDtype::FP16, false, 0, 4096), Ascend910B(), t);
    Check(t.splits == 1 && t.block_dim == 48, "512 pairs: no split, 48 cores");
    IncreFlashAttentionTilingFn(Shape(1, 2, 1, 64, DecodeDtype::FP16, false, 0, 20), Ascend910B(), t);
    Check(t.splits == 1, "a cache of one tile is not split");
    DecodeShape s = Shape(2, 4, 2, 64, DecodeDtype::BF16, true, 16, 8);
    s.force_splits = 3;
    CheckTiling(s);
    IncreFlashAttentionTilingFn(s, Ascend910B(), t);
    Check(t.splits == 3, "forced splits honoured");
    // UB budget shrinks the tile as the group grows.
    IncreFlashAttentionTiling small, big;
    IncreFlashAttentionTilingFn(Shape(1, 4, 1, 512, DecodeDtype::FP32, false, 0, 4096), Ascend910B(), small);
    IncreFlashAttentionTilingFn(Shape(1, 128, 1, 512, DecodeDtype::FP32, false, 0, 4096), Ascend910B(), big);
    Check(big.group_chunk < 128 || big.tile_rows < small.tile_rows, "a bigger GQA group gets smaller tiles or chunks");
    Check(small.group_chunk == 4, "a small group is processed in one pass");
    // Impossible input reports an error.
    Check(!IncreFlashAttentionTilingFn(Shape(1, 4, 1, 4096, DecodeDtype::FP32, false, 0, 64), Ascend910B(), t)
               .empty(), "a head_dim beyond the vector repeat stride is rejected");
    Check(!IncreFlashAttentionTilingFn(Shape(1, 4, 3, 64, DecodeDtype::FP32, false, 0, 64), Ascend910B(), t).empty(),
          "q_heads not a multiple of kv_heads is rejected");
  }
  return tot_test::FinishChecks();
}
