// Unit test of the moe_gating_top_k_softmax host tiling: UB budget, core split (every row once), tiles and tails,
// buffer count, strides, and the error for a row that cannot fit. Reports through test_main.h.
#include <cstdio>
#include <string>
#include <vector>

#include "moe/moe_gating_top_k_softmax_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

static MoeGatingTopKSoftmaxShape Shape(int64_t n, int64_t e, int64_t k, GatingDtype d, bool fin = true,
                                       bool sm = false, int64_t renorm = 0) {
  MoeGatingTopKSoftmaxShape s;
  s.rows = n;
  s.experts = e;
  s.k = k;
  s.dtype = d;
  s.has_finished = fin;
  s.want_softmax = sm;
  s.renorm = renorm;
  s.want_row_idx = !sm;
  return s;
}

// Replays the kernel's split: core c's rows and its tiles; every row must be covered exactly once.
static void CheckSplit(const MoeGatingTopKSoftmaxTiling& t, const char* what) {
  std::vector<int> seen(t.rows, 0);
  uint32_t tiles = 0, tails = 0, out_of_range = 0;
  for (uint32_t c = 0; c < t.block_dim; ++c) {
    const uint32_t start = c * t.rows_per_core + (c < t.rows_remainder ? c : t.rows_remainder);
    const uint32_t count = t.rows_per_core + (c < t.rows_remainder ? 1 : 0);
    CHECK(count >= 1, "%s: core %u has no rows", what, c);
    for (uint32_t first = 0; first < count; first += t.tile_rows) {
      const uint32_t rows = std::min(t.tile_rows, count - first);
      ++tiles;
      tails += rows < t.tile_rows;
      for (uint32_t r = 0; r < rows; ++r)
        if (start + first + r < t.rows) ++seen[start + first + r];
        else out_of_range = start + first + r;
    }
  }
  CHECK(out_of_range == 0, "%s: row %u out of range", what, out_of_range);
  uint32_t bad = 0;
  for (uint32_t i = 0; i < t.rows; ++i) bad += seen[i] != 1;
  CHECK(bad == 0, "%s: %u rows not covered exactly once", what, bad);
  CHECK(tiles >= t.block_dim, "%s: %u tiles for %u cores", what, tiles, t.block_dim);
}

static MoeGatingTopKSoftmaxTiling Tile(const MoeGatingTopKSoftmaxShape& s, const char* what) {
  MoeGatingTopKSoftmaxTiling t;
  const std::string err = MoeGatingTopKSoftmaxTilingFor(s, Ascend910B(), &t);
  CHECK(err.empty(), "%s: unexpected error %s", what, err.c_str());
  return t;
}

static void CheckBudget(const MoeGatingTopKSoftmaxTiling& t, const char* what) {
  const uint32_t usable = Ascend910B().UsableUb();
  CHECK(t.ub_bytes_used == MoeGatingUbBytes(t, t.tile_rows, t.buffer_num), "%s: ub_bytes_used stale", what);
  CHECK(t.ub_bytes_used <= usable, "%s: %u bytes > usable %u", what, t.ub_bytes_used, usable);
  CHECK(t.buffer_num == 1 || t.buffer_num == 2, "%s: buffer_num %u", what, t.buffer_num);
  // Maximal: one more row would not fit (unless the tile already holds a whole core share or the cap).
  const uint32_t share = t.rows_per_core + (t.rows_remainder ? 1 : 0);
  const uint32_t cap = t.batched ? 248u : 1024u;
  CHECK(t.batched == (t.experts <= 64 ? 1u : 0u) && t.tile_rows <= cap, "%s: batched %u, tile_rows %u", what,
        t.batched, t.tile_rows);
  if (t.tile_rows < share && t.tile_rows < cap)
    CHECK(MoeGatingUbBytes(t, t.tile_rows + 1, t.buffer_num) > usable, "%s: tile_rows %u not maximal", what,
          t.tile_rows);
  CHECK(t.tile_rows >= 1 && t.tile_rows <= share, "%s: tile_rows %u vs share %u", what, t.tile_rows, share);
}

static void CheckStrides(const MoeGatingTopKSoftmaxTiling& t, const char* what) {
  const uint32_t s = GatingDtypeBytes(GatingDtype(t.dtype));
  CHECK(t.x_row_stride >= t.experts && t.x_row_stride * s % 32 == 0 && t.x_row_stride - t.experts < 32 / s,
        "%s: x_row_stride %u", what, t.x_row_stride);
  CHECK(t.y_row_stride >= t.k && t.y_row_stride * s % 32 == 0 && t.y_row_stride - t.k < 32 / s,
        "%s: y_row_stride %u", what, t.y_row_stride);
  CHECK(t.idx_row_stride % 8 == 0 && t.idx_row_stride - t.k < 8, "%s: idx_row_stride %u", what, t.idx_row_stride);
  CHECK(t.sm_row_stride % 8 == 0 && t.sm_row_stride - t.experts < 8, "%s: sm_row_stride", what);
}

int main() {
  const GatingDtype dtypes[] = {GatingDtype::kFloat32, GatingDtype::kFloat16, GatingDtype::kBFloat16};
  // Shapes: fewer rows than cores, rows not a multiple of 48, E not a multiple of 8/16, E = 256, k = E.
  const int64_t shapes[][3] = {{1, 8, 1}, {5, 8, 2}, {37, 60, 2}, {48, 256, 8}, {1000, 60, 4},
                               {4097, 256, 8}, {100003, 8, 2}, {7, 7, 7}, {300, 1500, 1024}};
  for (auto d : dtypes)
    for (auto& sh : shapes)
      for (int variant = 0; variant < 3; ++variant) {
        const bool sm = variant == 2;
        const auto s = Shape(sh[0], sh[1], sh[2], d, variant != 1, sm, 0);
        char what[128];
        std::snprintf(what, sizeof what, "N=%lld E=%lld k=%lld dtype=%u variant=%d", (long long)sh[0],
                      (long long)sh[1], (long long)sh[2], unsigned(d), variant);
        const auto t = Tile(s, what);
        CHECK(t.block_dim == std::min<int64_t>(48, sh[0]), "%s: block_dim %u", what, t.block_dim);
        CHECK(t.want_softmax == (sm ? 1u : 0u), "%s: want_softmax", what);
        CheckBudget(t, what);
        CheckStrides(t, what);
        CheckSplit(t, what);
      }

  // Tails: 100 rows of E=256 fp32 with softmax on 48 cores -> shares of 2 and 3 rows; a big N forces several
  // tiles per core with a shorter last one.
  {
    const auto t = Tile(Shape(100003, 256, 8, GatingDtype::kFloat32, true, true), "big");
    CHECK(t.tile_rows < t.rows_per_core, "several tiles per core expected, tile %u share %u", t.tile_rows,
          t.rows_per_core);
    CHECK(t.rows_per_core % t.tile_rows != 0 || (t.rows_per_core + 1) % t.tile_rows != 0, "a tail tile expected");
    CHECK(t.buffer_num == 2, "double-buffered expected");
  }
  // renorm 1 never writes the softmax.
  CHECK(Tile(Shape(10, 16, 2, GatingDtype::kFloat16, false, true, 1), "renorm1").want_softmax == 0, "renorm1 sm");
  // A wide row only fits single-buffered; a wider one not at all (error names E and the budget).
  {
    bool single = false;
    for (int64_t e = 4096; e <= 65536 && !single; e += 512) {
      MoeGatingTopKSoftmaxTiling t;
      if (MoeGatingTopKSoftmaxTilingFor(Shape(4, e, 8, GatingDtype::kFloat16, true, true), Ascend910B(), &t).empty()) {
        single = t.buffer_num == 1;
        if (single) CheckBudget(t, "single");
      }
    }
    CHECK(single, "some E should fit only single-buffered");
    MoeGatingTopKSoftmaxTiling t;
    const std::string err = MoeGatingTopKSoftmaxTilingFor(Shape(4, 200000, 8, GatingDtype::kFloat32), Ascend910B(), &t);
    CHECK(err.find("E=200000") != std::string::npos && err.find("UB") != std::string::npos, "error: %s",
          err.c_str());
  }
  // Bad shapes are errors, not tilings.
  {
    MoeGatingTopKSoftmaxTiling t;
    CHECK(!MoeGatingTopKSoftmaxTilingFor(Shape(4, 8, 9, GatingDtype::kFloat32), Ascend910B(), &t).empty(), "k > E");
    CHECK(!MoeGatingTopKSoftmaxTilingFor(Shape(0, 8, 1, GatingDtype::kFloat32), Ascend910B(), &t).empty(), "N = 0");
    CHECK(!MoeGatingTopKSoftmaxTilingFor(Shape(4, 2000, 1025, GatingDtype::kFloat32), Ascend910B(), &t).empty(),
          "k > 1024");
  }
  return tot_test::FinishChecks();
}
