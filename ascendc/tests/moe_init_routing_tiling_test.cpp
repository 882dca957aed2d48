// Unit test of the moe_init_routing_v2 host tiling: the pair and row shares over the AIVs (every pair and row exactly
// once, in order), the counter arrays, the H chunk within the UB budget, the workspace, and the refusals. Reports
// through test_main.h.
#include <string>

#include "moe/moe_init_routing_v2_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

static MoeInitRoutingV2Shape Shape(int64_t n, int64_t k, int64_t h, int64_t width, int64_t elem_bytes) {
  MoeInitRoutingV2Shape s;
  s.tokens = n;
  s.k = k;
  s.hidden = h;
  s.rows_out = n * k;
  s.width = width;
  s.expert_num = width;
  s.elem_bytes = elem_bytes;
  return s;
}

// Shares of `total` items over block_dim cores as the kernel computes them: contiguous, ordered, covering.
static bool SharesCover(uint32_t total, uint32_t per, uint32_t rem, uint32_t cores) {
  uint32_t next = 0;
  for (uint32_t c = 0; c < cores; ++c) {
    const uint32_t start = c * per + (c < rem ? c : rem), count = per + (c < rem ? 1 : 0);
    if (start != next) return false;
    next = start + count;
  }
  return next == total;
}

static void CheckTiling(const MoeInitRoutingV2Shape& s, const char* what) {
  const PlatformInfo p = Ascend910B();
  MoeInitRoutingV2Tiling t;
  const std::string err = MoeInitRoutingV2TilingFor(s, p, &t);
  CHECK(err.empty(), "%s: %s", what, err.c_str());
  if (!err.empty()) return;
  CHECK(t.block_dim >= 1 && t.block_dim <= p.aiv_cores, "%s: block_dim %u", what, t.block_dim);
  CHECK(SharesCover(t.pairs, t.pairs_per_core, t.pairs_remainder, t.block_dim), "%s: pair shares", what);
  CHECK(SharesCover(t.rows_out, t.rows_per_core, t.rows_remainder, t.block_dim), "%s: row shares", what);
  CHECK(t.buckets_aligned % 8 == 0 && t.buckets_aligned >= t.width + 1 && t.buckets_aligned < t.width + 9,
        "%s: buckets %u for %u experts", what, t.buckets_aligned, t.width);
  CHECK(t.workspace_bytes == t.block_dim * t.buckets_aligned * 4, "%s: workspace %u", what, t.workspace_bytes);
  CHECK(t.h_tile % 64 == 0 && t.h_tile >= 64 && t.h_tile <= 8192, "%s: h_tile %u", what, t.h_tile);
  const uint32_t want = uint32_t(s.hidden + 63) / 64 * 64;
  CHECK(t.h_tile == (want < 64 ? 64 : want > 8192 ? 8192 : want) || MoeInitRoutingV2UbBytes(t, t.h_tile + 64) >
                                                                         p.UsableUb(),
        "%s: h_tile %u is not the longest chunk that fits for H %lld", what, t.h_tile, (long long)s.hidden);
  CHECK(t.ub_bytes_used == MoeInitRoutingV2UbBytes(t, t.h_tile) && t.ub_bytes_used <= p.UsableUb(), "%s: ub %u", what,
        t.ub_bytes_used);
}

int main() {
  CheckTiling(Shape(7, 3, 40, 8, 4), "small fp32");
  CheckTiling(Shape(4096, 8, 7168, 256, 2), "deepseek-like bf16");
  CheckTiling(Shape(1, 1, 0, 1, 8), "one pair, H = 0, fp64");
  CheckTiling(Shape(150, 4, 8292, 64, 1), "int8 rows with a tail");
  MoeInitRoutingV2Tiling t;
  CHECK(MoeInitRoutingV2TilingFor(Shape(8, 2, 16, 4, 4), Ascend910B(), &t).empty() && t.block_dim == 1,
        "16 pairs take one core (%u)", t.block_dim);
  CHECK(MoeInitRoutingV2TilingFor(Shape(4096, 8, 16, 4, 4), Ascend910B(), &t).empty() && t.block_dim == 48,
        "32768 pairs take every AIV (%u)", t.block_dim);
  CHECK(MoeInitRoutingV2TilingFor(Shape(64, 1, 8192, 9000, 8), Ascend910B(), &t).empty() && t.h_tile < 8192,
        "many experts: the chunk shrinks to fit UB (%u)", t.h_tile);
  CHECK(!MoeInitRoutingV2TilingFor(Shape(64, 1, 64, 20000, 4), Ascend910B(), &t).empty(),
        "counters beyond UB refused");
  CHECK(!MoeInitRoutingV2TilingFor(Shape(0, 2, 8, 4, 4), Ascend910B(), &t).empty(), "no tokens refused");
  CHECK(!MoeInitRoutingV2TilingFor(Shape(8, 2, 8, 4, 3), Ascend910B(), &t).empty(), "3-byte elements refused");
  CHECK(!MoeInitRoutingV2TilingFor(Shape(1 << 20, 8, 8192, 4, 2), Ascend910B(), &t).empty(),
        "element offsets beyond int32 refused");
  CHECK(!MoeInitRoutingV2TilingFor(Shape(1 << 21, 8, 0, 4, 2), Ascend910B(), &t).empty(),
        "2^24 pairs refused (the vector adds of the counts must stay exact)");
  return tot_test::FinishChecks();
}
