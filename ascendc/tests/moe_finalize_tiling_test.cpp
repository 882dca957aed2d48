// Unit test of the moe_finalize_routing host tiling: the token split over the AIVs, the H chunk (whole 64-lane
// repeats, at most 8192, the UB budget), double buffering, and the refusals. Reports through test_main.h.
#include <string>

#include "moe/moe_finalize_routing_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

static MoeFinalizeRoutingShape Shape(int64_t n, int64_t k, int64_t h, FinalizeDtype d, bool all_optional) {
  MoeFinalizeRoutingShape s;
  s.tokens = n;
  s.k = k;
  s.hidden = h;
  s.rows = n * k;
  s.experts = 8;
  s.dtype = d;
  s.has_skip1 = s.has_skip2 = s.has_bias = s.has_scales = all_optional;
  return s;
}

static void CheckTiling(const MoeFinalizeRoutingShape& s, const char* what) {
  const PlatformInfo p = Ascend910B();
  MoeFinalizeRoutingTiling t;
  const std::string err = MoeFinalizeRoutingTilingFor(s, p, &t);
  CHECK(err.empty(), "%s: %s", what, err.c_str());
  if (!err.empty()) return;
  CHECK(t.block_dim >= 1 && t.block_dim <= p.aiv_cores && int64_t(t.block_dim) <= s.tokens, "%s: block_dim %u", what,
        t.block_dim);
  CHECK(uint64_t(t.tokens_per_core) * t.block_dim + t.tokens_remainder == uint64_t(s.tokens) &&
            t.tokens_remainder < t.block_dim, "%s: split %u + %u", what, t.tokens_per_core, t.tokens_remainder);
  CHECK(t.h_tile % 64 == 0 && t.h_tile >= 64 && t.h_tile <= 8192, "%s: h_tile %u", what, t.h_tile);
  const uint32_t want = uint32_t(s.hidden + 63) / 64 * 64 < 8192 ? uint32_t(s.hidden + 63) / 64 * 64 : 8192u;
  CHECK(t.h_tile == want || MoeFinalizeUbBytes(t, t.h_tile + 64, t.buffer_num) > p.UsableUb(),
        "%s: h_tile %u is not the longest chunk that fits for H %lld", what, t.h_tile, (long long)s.hidden);
  CHECK(t.buffer_num == 2, "%s: double-buffered", what);
  CHECK(t.ub_bytes_used == MoeFinalizeUbBytes(t, t.h_tile, t.buffer_num) && t.ub_bytes_used <= p.UsableUb(),
        "%s: ub %u", what, t.ub_bytes_used);
  CHECK(t.column_major == uint32_t(s.column_major) && t.experts == (s.has_bias ? uint32_t(s.experts) : 0u),
        "%s: flags", what);
}

int main() {
  CheckTiling(Shape(5, 2, 40, FinalizeDtype::kFloat32, false), "small fp32");
  CheckTiling(Shape(4096, 8, 7168, FinalizeDtype::kBFloat16, true), "deepseek-like bf16");
  CheckTiling(Shape(101, 3, 8292, FinalizeDtype::kFloat16, true), "long rows fp16");
  CheckTiling(Shape(1, 1, 1, FinalizeDtype::kFloat32, true), "one value");
  MoeFinalizeRoutingTiling t;
  CHECK(MoeFinalizeRoutingTilingFor(Shape(4096, 8, 8192, FinalizeDtype::kFloat32, true), Ascend910B(), &t).empty() &&
            t.h_tile < 8192, "fp32 with every optional input: the chunk shrinks to fit UB (%u)", t.h_tile);
  CHECK(!MoeFinalizeRoutingTilingFor(Shape(0, 2, 8, FinalizeDtype::kFloat32, false), Ascend910B(), &t).empty(),
        "no tokens refused");
  CHECK(!MoeFinalizeRoutingTilingFor(Shape(1 << 20, 8, 8192, FinalizeDtype::kFloat32, false), Ascend910B(), &t)
             .empty(), "offsets beyond uint32 refused");
  return tot_test::FinishChecks();
}
