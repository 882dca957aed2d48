// Unit tests of the recurrent gated delta rule tiling (pure host C++): the UB budget, the key head dim's padding,
// the row block (a multiple of 8, the largest that fits, the whole state when it fits and there are enough units,
// smaller blocks when there are fewer units than cores), the rejected shapes, and that the core split covers every
// (sequence, value head, row block) unit exactly once. Reports through test_main.h.
#include <cstdio>
#include <string>
#include <vector>

#include "linear_attention/recurrent_gated_delta_rule_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

namespace {

using tot_test::Check;

GdrShape Shape(uint32_t batch, uint32_t nk, uint32_t nv, uint32_t dk, uint32_t dv, GdrDtype dt, GdrDtype st,
               bool gk) {
  GdrShape s;
  s.tokens = batch * 2; s.batch = batch; s.k_heads = nk; s.v_heads = nv; s.dk = dk; s.dv = dv; s.slots = 64;
  s.dtype = dt; s.state_dtype = st; s.has_beta = true; s.has_g = true; s.has_gk = gk;
  return s;
}

std::string Name(const GdrShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "B=%u Nk=%u Nv=%u Dk=%u Dv=%u dtype=%u state=%u gk=%d", s.batch, s.k_heads,
                s.v_heads, s.dk, s.dv, unsigned(s.dtype), unsigned(s.state_dtype), int(s.has_gk));
  return buf;
}

uint32_t Bytes(GdrDtype d) { return d == GdrDtype::FP32 ? 4 : 2; }

// Every invariant a tiling must satisfy.
void CheckTiling(const GdrShape& s) {
  const PlatformInfo p = Ascend910B();
  RecurrentGdrTiling t;
  const std::string err = RecurrentGdrTilingFn(s, p, t);
  const std::string n = Name(s);
  Check(err.empty(), n + ": tiling failed: " + err);
  if (!err.empty()) return;
  const uint32_t db = Bytes(s.dtype), sb = Bytes(s.state_dtype);
  Check(t.block_dim >= 1 && t.block_dim <= p.aiv_cores, n + ": block_dim in [1, 48]");
  Check(t.ub_bytes <= p.UsableUb(), n + ": UB budget");
  Check(t.ub_bytes == GdrUbBytes(t.rows, t.dk_pad, db, sb, s.has_gk), n + ": ub_bytes");
  Check(t.group * t.k_heads == t.v_heads, n + ": group = Nv / Nk");
  Check(t.dk_pad % 16 == 0 && t.dk_pad >= t.dk && t.dk_pad - t.dk < 16, n + ": Dk padded to 16");
  Check(t.rows % 8 == 0 && t.rows >= 8 && t.rows <= 248, n + ": rows a multiple of 8 in [8, 248]");
  Check(t.row_blocks == (t.dv + t.rows - 1) / t.rows, n + ": row_blocks = ceil(Dv / rows)");
  Check(t.items == s.batch * s.v_heads && t.units == t.items * t.row_blocks, n + ": units = items * row_blocks");
  const uint32_t whole = (s.dv + 7) / 8 * 8;
  if (t.units > p.aiv_cores && t.rows < whole && t.rows < 248)  // enough units: the largest block that fits
    Check(GdrUbBytes(t.rows + 8, t.dk_pad, db, sb, s.has_gk) > p.UsableUb() || t.row_blocks * t.items >= p.aiv_cores,
          n + ": the row block is the largest that fits");
  if (t.items >= p.aiv_cores && GdrUbBytes(whole, t.dk_pad, db, sb, s.has_gk) <= p.UsableUb() && whole <= 248)
    Check(t.row_blocks == 1, n + ": enough items and a state that fits: whole states");
  // every unit on exactly one core, in order, the loads differing by at most one
  std::vector<int> seen(t.units, 0);
  uint32_t lo = 0xffffffffu, hi = 0;
  for (uint32_t c = 0; c < t.block_dim; ++c) {
    const uint32_t b = GdrUnitBegin(t, c), e = GdrUnitBegin(t, c + 1);
    lo = e - b < lo ? e - b : lo;
    hi = e - b > hi ? e - b : hi;
    for (uint32_t u = b; u < e && u < t.units; ++u) ++seen[u];
  }
  Check(GdrUnitBegin(t, t.block_dim) == t.units, n + ": the last core ends at the last unit");
  bool once = true;
  for (int x : seen) once = once && x == 1;
  Check(once, n + ": every unit on exactly one core");
  Check(hi - lo <= 1 && lo >= 1, n + ": balanced, no idle core");
}

void CheckRejected(GdrShape s, const std::string& what) {
  RecurrentGdrTiling t;
  Check(!RecurrentGdrTilingFn(s, Ascend910B(), t).empty(), "rejected: " + what);
}

}  // namespace

int main() {
  const GdrDtype F16 = GdrDtype::FP16, BF = GdrDtype::BF16, F32 = GdrDtype::FP32;
  for (GdrDtype dt : {F16, BF, F32})
    for (bool f32state : {false, true})
      for (uint32_t batch : {1u, 3u, 12u, 64u})
        for (uint32_t dk : {8u, 40u, 128u, 256u})
          for (uint32_t dv : {8u, 20u, 128u, 256u})
            for (bool gk : {false, true})
              CheckTiling(Shape(batch, 2, 4, dk, dv, dt, f32state ? F32 : dt, gk));
  CheckTiling(Shape(1, 16, 32, 128, 128, BF, BF, false));  // Qwen3-Next decode, one sequence
  CheckTiling(Shape(1, 1, 1, 2032, 16, F32, F32, true));   // the widest key head dim a repeat stride allows

  // Qwen3-Next-like 128 x 128 with 48 items: one whole state per core, in UB
  {
    RecurrentGdrTiling t;
    RecurrentGdrTilingFn(Shape(12, 2, 4, 128, 128, BF, BF, false), Ascend910B(), t);
    Check(t.rows == 128 && t.row_blocks == 1 && t.block_dim == 48, "48 items of 128 x 128: whole states");
    RecurrentGdrTilingFn(Shape(1, 16, 32, 128, 128, BF, F32, false), Ascend910B(), t);
    Check(t.rows == 64 && t.row_blocks == 2 && t.block_dim == 48, "32 items: two row blocks each over 48 cores");
  }
  // a small cap (tests) gives several blocks with a partial last one
  {
    GdrShape s = Shape(64, 2, 4, 40, 20, F32, F32, true);
    s.max_rows = 8;
    RecurrentGdrTiling t;
    Check(RecurrentGdrTilingFn(s, Ascend910B(), t).empty() && t.rows == 8 && t.row_blocks == 3, "max_rows 8");
  }
  // rejected shapes
  CheckRejected(Shape(0, 2, 4, 64, 64, F16, F16, false), "no sequences");
  CheckRejected(Shape(1, 3, 4, 64, 64, F16, F16, false), "Nv not a multiple of Nk");
  CheckRejected(Shape(1, 2, 4, 0, 64, F16, F16, false), "Dk 0");
  CheckRejected(Shape(1, 2, 4, 2048, 64, F32, F32, false), "Dk beyond a repeat stride");
  CheckRejected(Shape(1, 2, 4, 64, 64, F16, BF, false), "state dtype neither the inputs' nor fp32");
  {
    GdrShape s = Shape(1, 2, 4, 64, 64, F16, F16, false);
    s.slots = 1ull << 31;
    CheckRejected(s, "2^31 slots");
  }
  return tot_test::FinishChecks();
}
