// Unit tests of the sparse flash attention tiling (pure host C++): the UB budget, the head dims' padding, the tile
// size (a multiple of 8, never more than an item can select), the head chunks of big groups, and that the core
// split covers every (query row, KV head) item exactly once. Reports through test_main.h.
#include <cstdio>
#include <string>
#include <vector>

#include "sparse_attention/sparse_flash_attention_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

namespace {

using tot_test::Check;

SparseShape Shape(uint32_t rows, uint32_t n1, uint32_t n2, uint32_t dn, uint32_t dr, uint32_t dv, SparseDtype dt,
                  uint32_t slots, uint32_t sbs, bool paged, bool value_is_key) {
  SparseShape s;
  s.rows = rows; s.q_heads = n1; s.kv_heads = n2; s.dn = dn; s.dr = dr; s.dv = dv; s.dtype = dt;
  s.slots = slots; s.sparse_block_size = sbs; s.paged = paged; s.value_is_key = value_is_key;
  s.batch = 2; s.block_size = paged ? 128 : 0; s.max_blocks = paged ? 16 : 0; s.kv_rows = 4096; s.s1 = rows / 2;
  return s;
}

std::string Name(const SparseShape& s) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "T1=%u N1=%u N2=%u dn=%u dr=%u dv=%u dtype=%u K=%u sbs=%u paged=%d vk=%d", s.rows,
                s.q_heads, s.kv_heads, s.dn, s.dr, s.dv, unsigned(s.dtype), s.slots, s.sparse_block_size,
                int(s.paged), int(s.value_is_key));
  return buf;
}

// Every invariant a tiling must satisfy.
void CheckTiling(const SparseShape& s) {
  const PlatformInfo p = Ascend910B();
  SparseFlashAttentionTiling t;
  const std::string err = SparseFlashAttentionTilingFn(s, p, t);
  const std::string n = Name(s);
  Check(err.empty(), n + ": tiling failed: " + err);
  if (!err.empty()) return;
  const uint32_t dbytes = s.dtype == SparseDtype::FP32 ? 4 : 2, lane = 32 / dbytes;
  Check(t.block_dim >= 1 && t.block_dim <= p.aiv_cores, n + ": block_dim in [1, 48]");
  Check(t.ub_bytes <= p.UsableUb(), n + ": UB budget");
  Check(t.ub_bytes == SparseUbBytes(t.tile_rows, t.group_chunk, t.dq_pad, t.dv_pad, dbytes, s.value_is_key),
        n + ": ub_bytes");
  Check(t.group_chunk >= 1 && t.group_chunk <= t.group, n + ": head chunk within the group");
  Check(t.tile_rows % 8 == 0 && t.tile_rows >= 8 && t.tile_rows <= 128, n + ": tile rows multiple of 8 in [8,128]");
  Check(t.tile_rows <= (uint64_t(s.slots) * s.sparse_block_size + 7) / 8 * 8 || t.tile_rows == 8,
        n + ": no tile larger than an item's selection");
  for (auto [d, pad] : {std::pair<uint32_t, uint32_t>{t.dn, t.dn_pad}, {t.dr, t.dr_pad}, {t.dv, t.dv_pad}})
    Check(pad % lane == 0 && pad >= d && pad - d < lane, n + ": head dims padded to 32 bytes");
  Check(t.dq_pad == t.dn_pad + t.dr_pad, n + ": query row = latent + rope");
  // A bigger tile or chunk would not fit (the tiling takes the largest that does).
  if (t.tile_rows < 128 && t.tile_rows < (uint64_t(s.slots) * s.sparse_block_size + 7) / 8 * 8)
    Check(SparseUbBytes(t.tile_rows + 8, t.group_chunk, t.dq_pad, t.dv_pad, dbytes, s.value_is_key) > p.UsableUb(),
          n + ": the tile is the largest that fits");
  // Items: every (row, KV head) exactly once, contiguous non-empty ranges per core.
  std::vector<int> seen(t.items, 0);
  Check(t.items == s.rows * s.kv_heads, n + ": item count");
  Check(ItemBegin(t, 0) == 0 && ItemBegin(t, t.block_dim) == t.items, n + ": item ranges span [0, items)");
  for (uint32_t c = 0; c < t.block_dim; ++c) {
    Check(ItemBegin(t, c + 1) > ItemBegin(t, c), n + ": every core has an item");
    for (uint32_t k = ItemBegin(t, c); k < ItemBegin(t, c + 1) && k < t.items; ++k) seen[k]++;
  }
  bool once = true;
  for (int v : seen) once = once && v == 1;
  Check(once, n + ": every item once");
}

}  // namespace

int main() {
  const SparseDtype dts[] = {SparseDtype::FP16, SparseDtype::BF16, SparseDtype::FP32};
  for (SparseDtype dt : dts) {
    CheckTiling(Shape(4, 128, 1, 512, 64, 512, dt, 2048, 1, true, true));   // DeepSeek-V3.2 decode
    CheckTiling(Shape(300, 16, 1, 512, 64, 512, dt, 2048, 1, false, true)); // prefill rows
    CheckTiling(Shape(7, 8, 2, 40, 0, 24, dt, 6, 4, false, false));         // plain, odd dims, tiny selection
    CheckTiling(Shape(1, 4, 4, 64, 16, 64, dt, 1, 1, true, false));         // one slot: an 8-row tile
    CheckTiling(Shape(50, 2, 2, 8, 8, 8, dt, 64, 128, false, false));       // big sparse blocks
    CheckTiling(Shape(100, 64, 8, 128, 0, 128, dt, 512, 2, true, false));   // many items
  }
  {
    SparseFlashAttentionTiling t;
    const PlatformInfo p = Ascend910B();
    SparseFlashAttentionTilingFn(Shape(4, 128, 1, 512, 64, 512, SparseDtype::BF16, 2048, 1, true, true), p, t);
    Check(t.group_chunk < 128, "128 heads of 576 in fp32 do not fit UB at once: the group is taken in chunks");
    Check(t.block_dim == 4, "4 items: 4 cores");
    SparseFlashAttentionTilingFn(Shape(4, 8, 1, 64, 0, 64, SparseDtype::FP16, 16, 1, false, false), p, t);
    Check(t.group_chunk == 8 && t.tile_rows == 16, "a small group in one pass; tile = the 16 selectable rows");
    SparseFlashAttentionTiling vk, sep;
    SparseFlashAttentionTilingFn(Shape(4, 64, 1, 512, 64, 512, SparseDtype::FP16, 2048, 1, false, true), p, vk);
    SparseFlashAttentionTilingFn(Shape(4, 64, 1, 512, 64, 512, SparseDtype::FP16, 2048, 1, false, false), p, sep);
    Check(vk.ub_bytes > 0 && (vk.tile_rows > sep.tile_rows || vk.group_chunk > sep.group_chunk ||
                              vk.ub_bytes < sep.ub_bytes),
          "value_is_key saves the value tile");
    SparseShape s = Shape(2, 4, 1, 64, 0, 64, SparseDtype::FP32, 64, 1, false, false);
    s.max_tile_rows = 12;
    SparseFlashAttentionTilingFn(s, p, t);
    Check(t.tile_rows == 8, "max_tile_rows rounds down to a multiple of 8");
    Check(!SparseFlashAttentionTilingFn(Shape(1, 4, 1, 4096, 0, 64, SparseDtype::FP32, 8, 1, false, false), p, t)
               .empty(), "a head_dim beyond the vector repeat stride is rejected");
    Check(!SparseFlashAttentionTilingFn(Shape(1, 4, 3, 64, 0, 64, SparseDtype::FP32, 8, 1, false, false), p, t)
               .empty(), "q_heads not a multiple of kv_heads is rejected");
    Check(!SparseFlashAttentionTilingFn(Shape(1, 4, 1, 64, 0, 32, SparseDtype::FP32, 8, 1, false, true), p, t)
               .empty(), "value_is_key with another value head dim is rejected");
    Check(!SparseFlashAttentionTilingFn(Shape(0, 4, 1, 64, 0, 64, SparseDtype::FP32, 8, 1, false, false), p, t)
               .empty(), "no rows is rejected");
    SparseShape big = Shape(1, 4, 1, 64, 0, 64, SparseDtype::FP32, 8, 1, false, false);
    big.kv_rows = 1ull << 31;
    Check(!SparseFlashAttentionTilingFn(big, p, t).empty(), "2^31 cache rows are rejected (int32 row table)");
  }
  return tot_test::FinishChecks();
}
