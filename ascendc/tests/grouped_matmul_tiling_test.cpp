// Unit test of the grouped matmul host tiling: block sizes (bn whole DataBlocks, at most 256), the UB budget of the
// epilogue, the launch sized to the work items, the workspace (two slices per AIV), and the refusals. Reports
// through test_main.h.
#include <string>

#include "moe/grouped_matmul_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

static GroupedMatmulShape Shape(uint64_t m, uint64_t k, uint64_t n, uint64_t e, GmmDtype d, GmmAct a,
                                uint64_t items = 0) {
  GroupedMatmulShape s;
  s.m = m;
  s.k = k;
  s.n = n;
  s.groups = e;
  s.dtype = d;
  s.act = a;
  s.has_bias = true;
  s.items_hint = items;
  return s;
}

static void CheckTiling(const GroupedMatmulShape& s, const char* what) {
  const PlatformInfo p = Ascend910B();
  GroupedMatmulTiling t;
  const std::string err = GroupedMatmulTilingFn(s, p, t);
  CHECK(err.empty(), "%s: %s", what, err.c_str());
  if (!err.empty()) return;
  CHECK(t.bn % 16 == 0 && t.bn <= 256 && t.bn >= (s.n < 256 ? s.n : 256), "%s: bn %u", what, t.bn);
  CHECK(uint64_t(t.n_blocks) * t.bn >= s.n && uint64_t(t.n_blocks - 1) * t.bn < s.n, "%s: n_blocks %u", what,
        t.n_blocks);
  CHECK(t.chunk_rows % 8 == 0 && t.chunk_rows <= t.bm, "%s: chunk_rows %u", what, t.chunk_rows);
  const uint32_t db = s.dtype == GmmDtype::kFloat32 ? 4 : 2;
  CHECK(t.ub_bytes == GroupedMatmulUbBytes(t.chunk_rows, t.bn, db, s.act != GmmAct::kNone) &&
            t.ub_bytes <= p.UsableUb(), "%s: ub %u", what, t.ub_bytes);
  CHECK(t.block_dim >= 1 && t.block_dim <= p.aic_cores && t.aiv_num == 2 * t.block_dim, "%s: block_dim %u", what,
        t.block_dim);
  if (s.items_hint) {
    CHECK(t.aiv_num >= (s.items_hint < 2 * p.aic_cores ? s.items_hint : 2 * p.aic_cores),
          "%s: %u AIVs for %llu items", what, t.aiv_num, (unsigned long long)s.items_hint);
  }
  CHECK(t.ws_slice == uint64_t(t.bm) * t.bn && t.ws_per_aiv >= 2 * t.ws_slice * 4 &&
            t.workspace_bytes == t.ws_per_aiv * t.aiv_num, "%s: workspace", what);
}

int main() {
  CheckTiling(Shape(37, 24, 40, 3, GmmDtype::kFloat32, GmmAct::kSilu, 3), "small fp32 silu");
  CheckTiling(Shape(4096, 7168, 2048, 64, GmmDtype::kBFloat16, GmmAct::kNone), "deepseek-like bf16");
  CheckTiling(Shape(1, 16, 1, 1, GmmDtype::kFloat16, GmmAct::kRelu, 1), "one row, one column");
  CheckTiling(Shape(300, 33, 257, 2, GmmDtype::kFloat32, GmmAct::kFastGelu, 1000), "many items");
  GroupedMatmulTiling t;
  CHECK(!GroupedMatmulTilingFn(Shape(0, 16, 16, 1, GmmDtype::kFloat32, GmmAct::kNone), Ascend910B(), t).empty(),
        "empty x refused");
  CHECK(!GroupedMatmulTilingFn(Shape(8, 70000, 16, 1, GmmDtype::kFloat32, GmmAct::kNone), Ascend910B(), t).empty(),
        "K beyond 16 bits refused");
  return tot_test::FinishChecks();
}
