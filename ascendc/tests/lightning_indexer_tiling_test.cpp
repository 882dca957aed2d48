// Unit tests of the lightning indexer tiling (pure host C++): the UB budget (the group's queries, the running top-k
// and the key tile), the head dim's padding, the tile size (a multiple of 8, the largest that fits), sparse_count's
// padding, the rejected shapes, and that the core split covers every (query row, key head) item exactly once.
// Reports through test_main.h.
#include <cstdio>
#include <string>
#include <vector>

#include "sparse_attention/lightning_indexer_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

namespace {

using tot_test::Check;

IndexerShape Shape(uint32_t rows, uint32_t n1, uint32_t n2, uint32_t d, SparseDtype dt, uint32_t k, bool paged,
                   bool values) {
  IndexerShape s;
  s.rows = rows; s.q_heads = n1; s.kv_heads = n2; s.d = d; s.dtype = dt; s.sparse_count = k; s.paged = paged;
  s.return_value = values; s.batch = 2; s.block_size = paged ? 128 : 0; s.max_blocks = paged ? 64 : 0;
  s.kv_rows = 8192; s.max_keys = 4096;
  return s;
}

std::string Name(const IndexerShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "T1=%u N1=%u N2=%u d=%u dtype=%u K=%u paged=%d values=%d", s.rows, s.q_heads,
                s.kv_heads, s.d, unsigned(s.dtype), s.sparse_count, int(s.paged), int(s.return_value));
  return buf;
}

// Every invariant a tiling must satisfy.
void CheckTiling(const IndexerShape& s) {
  const PlatformInfo p = Ascend910B();
  LightningIndexerTiling t;
  const std::string err = LightningIndexerTilingFn(s, p, t);
  const std::string n = Name(s);
  Check(err.empty(), n + ": tiling failed: " + err);
  if (!err.empty()) return;
  const uint32_t dbytes = s.dtype == SparseDtype::FP32 ? 4 : 2, lane = 32 / dbytes;
  Check(t.block_dim >= 1 && t.block_dim <= p.aiv_cores, n + ": block_dim in [1, 48]");
  Check(t.ub_bytes <= p.UsableUb(), n + ": UB budget");
  Check(t.ub_bytes == IndexerUbBytes(t.tile_rows, t.group, t.d_pad, t.k_pad, dbytes, s.return_value),
        n + ": ub_bytes");
  Check(t.group * t.kv_heads == t.q_heads, n + ": group = N1 / N2");
  Check(t.d_pad % lane == 0 && t.d_pad >= t.d && t.d_pad - t.d < lane, n + ": head dim padded to 32 bytes");
  Check(t.k_pad % 16 == 0 && t.k_pad >= t.sparse_count && t.k_pad - t.sparse_count < 16,
        n + ": sparse_count padded to 16");
  Check(t.tile_rows % 8 == 0 && t.tile_rows >= 8 && t.tile_rows <= 128, n + ": tile rows multiple of 8 in [8,128]");
  if (t.tile_rows < 128)  // the tiling takes the largest tile that fits
    Check(IndexerUbBytes(t.tile_rows + 8, t.group, t.d_pad, t.k_pad, dbytes, s.return_value) > p.UsableUb(),
          n + ": the tile is the largest that fits");
  // Key ranges: only for fewer items than cores; whole tiles; together they cover every key; no range empty.
  Check(t.splits >= 1 && t.units == t.items * t.splits, n + ": units = items * splits");
  if (t.items >= p.aiv_cores) Check(t.splits == 1, n + ": enough items: no split");
  if (t.splits > 1) {
    Check(t.split_keys % t.tile_rows == 0, n + ": a range is whole tiles");
    Check(uint64_t(t.split_keys) * t.splits >= s.max_keys && uint64_t(t.split_keys) * (t.splits - 1) < s.max_keys,
          n + ": the ranges cover the keys, none empty");
    Check(t.units <= p.aiv_cores && t.block_dim == t.units, n + ": one unit per core");
    Check(t.workspace_bytes == uint64_t(t.units) * t.k_pad * 8, n + ": workspace = the partial lists");
  } else {
    Check(t.workspace_bytes == 0, n + ": no split, no workspace");
  }
  // Units (phase 1) and items (whole, or the merge) each exactly once, in contiguous ranges per core.
  std::vector<int> units(t.units, 0), items(t.items, 0);
  Check(t.items == s.rows * s.kv_heads, n + ": item count");
  Check(IndexerItemBegin(t, 0) == 0 && IndexerItemBegin(t, t.block_dim) == t.items, n + ": ranges span [0, items)");
  Check(IndexerUnitBegin(t, 0) == 0 && IndexerUnitBegin(t, t.block_dim) == t.units, n + ": ranges span [0, units)");
  for (uint32_t c = 0; c < t.block_dim; ++c) {
    Check(IndexerUnitBegin(t, c + 1) > IndexerUnitBegin(t, c), n + ": every core has a unit");
    for (uint32_t k = IndexerUnitBegin(t, c); k < IndexerUnitBegin(t, c + 1) && k < t.units; ++k) units[k]++;
    for (uint32_t k = IndexerItemBegin(t, c); k < IndexerItemBegin(t, c + 1) && k < t.items; ++k) items[k]++;
  }
  bool once = true;
  for (int v : units) once = once && v == 1;
  for (int v : items) once = once && v == 1;
  Check(once, n + ": every unit and every item once");
}

}  // namespace

int main() {
  const SparseDtype dts[] = {SparseDtype::FP16, SparseDtype::BF16, SparseDtype::FP32};
  for (SparseDtype dt : dts) {
    CheckTiling(Shape(4, 64, 1, 128, dt, 2048, true, false));    // DeepSeek-V3.2 decode
    CheckTiling(Shape(4, 64, 1, 128, dt, 8192, true, false));    // the largest sparse_count
    CheckTiling(Shape(300, 64, 1, 128, dt, 2048, false, true));  // prefill rows with values
    CheckTiling(Shape(7, 6, 2, 40, dt, 5, false, true));         // odd dims, tiny K
    CheckTiling(Shape(1, 4, 4, 16, dt, 1, false, false));        // K = 1
    CheckTiling(Shape(100, 64, 8, 96, dt, 512, true, false));    // many items
  }
  const PlatformInfo p = Ascend910B();
  LightningIndexerTiling t;
  IndexerShape few = Shape(4, 8, 1, 64, SparseDtype::FP16, 64, false, false);
  few.max_splits = 1;
  LightningIndexerTilingFn(few, p, t);
  Check(t.tile_rows == 128 && t.block_dim == 4 && t.splits == 1, "max_splits 1: one core per item");
  LightningIndexerTilingFn(Shape(4, 64, 1, 128, SparseDtype::BF16, 2048, true, false), p, t);
  Check(t.splits >= 8 && t.splits <= 12 && t.block_dim == t.units,
        "decode, 4 items of 4096 keys: 8 to 12 ranges each (whole tiles), one core per range");
  IndexerShape short_keys = Shape(4, 8, 1, 64, SparseDtype::FP16, 64, false, false);
  short_keys.max_keys = 200;
  LightningIndexerTilingFn(short_keys, p, t);
  Check(t.splits == 2 && t.split_keys == 128, "200 keys of 128-key tiles: two ranges");
  short_keys.max_keys = 100;
  LightningIndexerTilingFn(short_keys, p, t);
  Check(t.splits == 1 && t.workspace_bytes == 0, "keys for one tile: no split");
  for (uint32_t keys : {1u, 9u, 100u, 1000u, 5000u}) {
    IndexerShape k = Shape(3, 16, 1, 64, SparseDtype::BF16, 512, true, false);
    k.max_keys = keys;
    CheckTiling(k);
  }
  LightningIndexerTiling big_k;
  LightningIndexerTilingFn(Shape(4, 64, 1, 128, SparseDtype::BF16, 8192, true, false), p, big_k);
  LightningIndexerTilingFn(Shape(4, 64, 1, 128, SparseDtype::BF16, 2048, true, false), p, t);
  Check(big_k.tile_rows < t.tile_rows, "a larger top-k leaves room for a smaller key tile");
  IndexerShape s = Shape(2, 4, 1, 64, SparseDtype::FP32, 64, false, false);
  s.max_tile_rows = 12;
  LightningIndexerTilingFn(s, p, t);
  Check(t.tile_rows == 8, "max_tile_rows rounds down to a multiple of 8");
  Check(!LightningIndexerTilingFn(Shape(1, 4, 1, 4096, SparseDtype::FP32, 8, false, false), p, t).empty(),
        "a head_dim beyond the vector repeat stride is rejected");
  Check(!LightningIndexerTilingFn(Shape(1, 4, 3, 64, SparseDtype::FP32, 8, false, false), p, t).empty(),
        "q_heads not a multiple of kv_heads is rejected");
  Check(!LightningIndexerTilingFn(Shape(0, 4, 1, 64, SparseDtype::FP32, 8, false, false), p, t).empty(),
        "no rows is rejected");
  Check(!LightningIndexerTilingFn(Shape(1, 512, 1, 2040, SparseDtype::FP32, 8192, false, false), p, t).empty(),
        "a group whose queries and top-k do not fit UB is rejected");
  IndexerShape rows = Shape(1, 4, 1, 64, SparseDtype::FP32, 8, false, false);
  rows.kv_rows = 1ull << 31;
  Check(!LightningIndexerTilingFn(rows, p, t).empty(), "2^31 key rows are rejected (int32 row table)");
  return tot_test::FinishChecks();
}
