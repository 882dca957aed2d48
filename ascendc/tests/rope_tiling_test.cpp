// Unit tests of the rotary position embedding host tiling (torch-free): UB budget, core split, tiles and tails,
// the cos/sin rows a tile can touch, the broadcast pattern, and the errors for impossible input.
// Reports through test_main.h.
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "rope/rotary_position_embedding_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

namespace {

using tot_test::Check;

std::string Name(const RopeProblem& p) {
  return std::string(p.is_grad ? "grad " : "") + "rows=" + std::to_string(p.rows) + " D=" + std::to_string(p.d) + " mode=" + std::to_string(p.mode) +
         " x_dtype=" + std::to_string(p.x_dtype) + " table_dtype=" + std::to_string(p.table_dtype) +
         " table_rows=" + std::to_string(p.table_rows) + " repeat=" + std::to_string(p.repeat);
}

// Every invariant of one successful tiling.
void CheckTiling(const RopeProblem& p) {
  const PlatformInfo plat = Ascend910B();
  RotaryPositionEmbeddingTiling t{};
  const std::string err = RopeTiling(p, plat, &t);
  const std::string n = Name(p);
  Check(err.empty(), n + ": unexpected error " + err);
  if (!err.empty()) return;
  Check(t.block_dim >= 1 && t.block_dim <= plat.aiv_cores, n + ": block_dim in [1, 48]");
  Check(t.ub_bytes <= plat.UsableUb(), n + ": UB budget");
  Check(t.ub_bytes == RopeUbBytes(t, t.tile_rows, t.tile_table_rows), n + ": ub_bytes matches the buffers");
  Check(t.tile_rows >= 1 && t.tile_rows <= 2047, n + ": tile rows in [1, 2047]");
  // A bigger tile would not fit (or the tile already covers a core's rows or the DataCopyPad block limit).
  const uint64_t core_max = t.base_rows + (t.big_cores ? 1 : 0);
  Check(t.tile_rows == core_max || t.tile_rows == 2047 ||
            RopeUbBytes(t, t.tile_rows + 1, RopeTableRowsPerTile(t.tile_rows + 1, t.repeat)) > plat.UsableUb(),
        n + ": tile is the largest that fits");
  // Row pitch: whole DataBlocks for x's dtype and fp32; holds D (interleave) or each half (half mode).
  const uint32_t xb = RopeDtypeBytes(t.x_dtype);
  Check(t.row_pitch * xb % 32 == 0 && t.row_pitch * 4 % 32 == 0, n + ": row pitch 32-byte aligned");
  if (p.mode == 0)
    Check(t.half_pitch >= t.d / 2 && t.half_pitch * xb % 32 == 0 && t.row_pitch == 2 * t.half_pitch,
          n + ": half pitch");
  else
    Check(t.row_pitch >= t.d && t.row_pitch - t.d < 32 / xb, n + ": interleave pitch");
  // Core split: contiguous ranges covering every row once; sizes differ by at most one.
  uint64_t next = 0, tiles = 0, tails = 0;
  for (uint64_t c = 0; c < t.block_dim; ++c) {
    const uint64_t first = c * t.base_rows + (c < t.big_cores ? c : t.big_cores);
    const uint64_t count = t.base_rows + (c < t.big_cores ? 1 : 0);
    Check(first == next && count >= 1, n + ": core " + std::to_string(c) + " range");
    next = first + count;
    for (uint64_t done = 0; done < count; done += t.tile_rows) {
      const uint64_t rows = std::min<uint64_t>(t.tile_rows, count - done);
      tiles++;
      tails += rows < t.tile_rows;
      // The table rows this tile loads fit the tile's table buffer.
      const uint64_t r0 = first + done, k = (r0 + rows - 1) / t.repeat - r0 / t.repeat + 1;
      if (k > t.tile_table_rows) Check(false, n + ": tile at row " + std::to_string(r0) + " needs more table rows");
    }
  }
  Check(next == p.rows, n + ": split covers all rows");
  Check(tiles >= t.block_dim, n + ": at least one tile per core");
  (void)tails;
}

void TestTableRowsPerTile() {
  // Brute force: the distinct values of r / repeat over any window of n rows.
  for (uint64_t repeat : {1, 2, 3, 7, 32})
    for (uint64_t n : {1, 2, 5, 31, 64}) {
      uint64_t worst = 0;
      for (uint64_t r0 = 0; r0 < 3 * repeat + n; ++r0) {
        std::set<uint64_t> seen;
        for (uint64_t r = r0; r < r0 + n; ++r) seen.insert(r / repeat);
        worst = std::max<uint64_t>(worst, seen.size());
      }
      Check(RopeTableRowsPerTile(n, repeat) == worst,
            "table rows per tile n=" + std::to_string(n) + " repeat=" + std::to_string(repeat));
    }
}

void Pattern(std::vector<int64_t> x, std::vector<int64_t> tab, bool ok, uint64_t rows, uint64_t repeat) {
  uint64_t r = 0, rep = 0;
  const bool got = RopeBroadcastPattern(x.data(), tab.data(), int(x.size()), &r, &rep);
  std::string n = "pattern x=[";
  for (auto v : x) n += std::to_string(v) + ",";
  n += "] table=[";
  for (auto v : tab) n += std::to_string(v) + ",";
  n += "]";
  Check(got == ok, n + ": supported?");
  if (ok && got) Check(r == rows && rep == repeat, n + ": rows " + std::to_string(r) + " repeat " + std::to_string(rep));
}

void TestBroadcastPattern() {
  Pattern({2, 5, 3, 8}, {1, 5, 1, 8}, true, 5, 3);    // BSND, cos [1,S,1,D]
  Pattern({2, 3, 5, 8}, {1, 1, 5, 8}, true, 5, 1);    // BNSD, cos [1,1,S,D]
  Pattern({5, 2, 3, 8}, {5, 1, 1, 8}, true, 5, 6);    // SBND, cos [S,1,1,D]
  Pattern({7, 3, 8}, {7, 1, 8}, true, 7, 3);          // TND, cos [T,1,D]
  Pattern({2, 5, 3, 8}, {2, 5, 1, 8}, true, 10, 3);   // per-batch tables [B,S,1,D]
  Pattern({2, 5, 3, 8}, {2, 5, 3, 8}, true, 30, 1);   // full shape
  Pattern({2, 5, 3, 8}, {1, 1, 1, 8}, true, 1, 1);    // one row for everything (repeat set by the tiling)
  Pattern({2, 1, 3, 8}, {1, 1, 3, 8}, true, 3, 1);    // size-1 dims fit any phase
  Pattern({2, 5, 3, 8}, {2, 1, 3, 8}, false, 0, 0);   // table, broadcast, table
  Pattern({2, 5, 3, 8}, {1, 4, 1, 8}, false, 0, 0);   // not broadcastable
}

void TestErrors() {
  const PlatformInfo plat = Ascend910B();
  RotaryPositionEmbeddingTiling t{};
  auto err = [&](RopeProblem p) { return RopeTiling(p, plat, &t); };
  RopeProblem base;
  base.rows = 12;
  base.d = 64;
  RopeProblem p = base;
  p.mode = 2;
  Check(err(p).find("mode 0 (half) and 1 (interleave)") != std::string::npos, "error: quarter mode");
  p = base;
  p.d = 7;
  Check(err(p).find("D must be even") != std::string::npos, "error: odd D");
  p = base;
  p.d = 1 << 20;
  Check(err(p).find("bytes of UB for one row") != std::string::npos, "error: D too large for UB");
  p = base;
  p.x_dtype = kRopeFloat32;
  p.table_dtype = kRopeFloat16;
  Check(err(p).find("cos/sin must have x's dtype or float32") != std::string::npos, "error: table dtype");
  p = base;
  p.table_rows = 5;
  Check(err(p).find("not a multiple of table_rows*repeat") != std::string::npos, "error: inconsistent pattern");
  p = base;
  p.rows = 0;
  Check(err(p).find("no rows") != std::string::npos, "error: no rows");
}

void TestTilings() {
  for (int64_t d : {8, 6, 64, 128, 256, 2})
    for (int64_t mode : {0, 1})
      for (bool grad : {false, true})
      for (uint32_t xd : {kRopeFloat32, kRopeFloat16, kRopeBFloat16})
        for (uint32_t td : {xd, uint32_t(kRopeFloat32)}) {
          for (auto shape : std::vector<std::vector<uint64_t>>{{1, 1, 1},  {37, 37, 1},  {5000, 50, 4},
                                                               {96, 8, 12}, {131, 131, 1}, {100000, 1, 1},
                                                               {7, 7, 1},  {3 * 48 * 11, 48, 33}}) {
            RopeProblem p;
            p.rows = shape[0];
            p.table_rows = shape[1];
            p.repeat = shape[2];
            p.d = d;
            p.mode = mode;
            p.x_dtype = xd;
            p.table_dtype = td;
            p.is_grad = grad;
            CheckTiling(p);
          }
        }
  // A long sequence on one core: several tiles with a tail.
  RopeProblem p;
  p.rows = 5000;
  p.table_rows = 5000;
  p.d = 128;
  p.x_dtype = kRopeFloat16;
  p.table_dtype = kRopeFloat16;
  RotaryPositionEmbeddingTiling t{};
  Check(RopeTiling(p, Ascend910B(), &t).empty() && t.block_dim == 48 && t.base_rows == 104 && t.big_cores == 8,
        "split 5000 rows over 48 cores");
  Check(t.tile_rows < t.base_rows && t.base_rows % t.tile_rows != 0, "5000 rows: several tiles per core and a tail");
}

}  // namespace

int main() {
  TestTableRowsPerTile();
  TestBroadcastPattern();
  TestErrors();
  TestTilings();
  return tot_test::FinishChecks();
}
