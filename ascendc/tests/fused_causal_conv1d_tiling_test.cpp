// Unit tests of the fused causal conv1d tiling (pure host C++): the UB budget, the channel block (a multiple of 16,
// the whole dim up to the cap, narrower when there are fewer units than cores), the tile rows (a multiple of 8, the
// largest that fits, at most the longest sequence), the rejected shapes, and that the core split covers every
// (channel block, sequence) unit exactly once. Reports through test_main.h.
#include <cstdio>
#include <string>
#include <vector>

#include "linear_attention/fused_causal_conv1d_tiling.h"
#include "test_main.h"

using namespace tot_ascendc;

namespace {

using tot_test::Check;

ConvShape Shape(uint32_t seqs, uint32_t longest, uint32_t dim, uint32_t K, uint32_t C, ConvDtype dt, bool bias) {
  ConvShape s;
  s.tokens = seqs * longest; s.seqs = seqs; s.longest = longest; s.dim = dim; s.width = K; s.state_len = C;
  s.slots = seqs + 2; s.dtype = dt; s.has_bias = bias; s.silu = true; s.residual = true;
  return s;
}

std::string Name(const ConvShape& s) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "seqs=%u longest=%u dim=%u K=%u C=%u dtype=%u bias=%d", s.seqs, s.longest, s.dim,
                s.width, s.state_len, unsigned(s.dtype), int(s.has_bias));
  return buf;
}

uint32_t Bytes(ConvDtype d) { return d == ConvDtype::FP32 ? 4 : 2; }

// Every invariant a tiling must satisfy.
void CheckTiling(const ConvShape& s) {
  const PlatformInfo p = Ascend910B();
  CausalConvTiling t;
  const std::string err = CausalConvTilingFn(s, p, t);
  const std::string n = Name(s);
  Check(err.empty(), n + ": tiling failed: " + err);
  if (!err.empty()) return;
  const uint32_t db = Bytes(s.dtype);
  Check(t.block_dim >= 1 && t.block_dim <= p.aiv_cores, n + ": block_dim in [1, 48]");
  Check(t.ub_bytes <= p.UsableUb(), n + ": UB budget");
  Check(t.ub_bytes == ConvUbBytes(t.channels, t.rows, t.width, db, s.has_bias), n + ": ub_bytes");
  Check(t.channels % 16 == 0 && t.channels >= 16 && t.channels <= 256, n + ": channels a multiple of 16 in [16, 256]");
  Check(t.channels < s.dim + 16, n + ": channels at most the 16-padded dim");
  Check(t.rows % 8 == 0 && t.rows >= 8 && t.rows <= 248, n + ": rows a multiple of 8 in [8, 248]");
  Check(t.rows < (s.longest < 1 ? 1 : s.longest) + 8, n + ": rows at most the 8-padded longest sequence");
  Check(t.stage_rows >= t.rows && t.stage_rows >= t.width, n + ": staging holds a tile and the weights");
  Check(t.blocks == (s.dim + t.channels - 1) / t.channels, n + ": blocks = ceil(dim / channels)");
  Check(t.units == t.blocks * s.seqs, n + ": units = blocks * seqs");
  if (t.rows < 248 && t.rows + 8 <= (s.longest + 7) / 8 * 8)  // not capped by the sequence: the largest that fits
    Check(ConvUbBytes(t.channels, t.rows + 8, t.width, db, s.has_bias) > p.UsableUb(),
          n + ": the tile is the largest that fits");
  if (uint64_t(s.seqs) * ((s.dim + 255) / 256) >= p.aiv_cores && s.width <= 8)  // enough units: no split
    Check(t.channels == (s.dim < 256 ? (s.dim + 15) / 16 * 16 : 256), n + ": whole blocks when the units fill the cores");
  // every unit on exactly one core, in order, the loads differing by at most one
  std::vector<int> seen(t.units, 0);
  uint32_t lo = 0xffffffffu, hi = 0;
  for (uint32_t c = 0; c < t.block_dim; ++c) {
    const uint32_t b = ConvUnitBegin(t, c), e = ConvUnitBegin(t, c + 1);
    lo = e - b < lo ? e - b : lo;
    hi = e - b > hi ? e - b : hi;
    for (uint32_t u = b; u < e && u < t.units; ++u) ++seen[u];
  }
  Check(ConvUnitBegin(t, t.block_dim) == t.units, n + ": the last core ends at the last unit");
  bool once = true;
  for (int x : seen) once = once && x == 1;
  Check(once, n + ": every unit on exactly one core");
  Check(hi - lo <= 1 && lo >= 1, n + ": balanced, no idle core");
}

void CheckRejected(ConvShape s, const std::string& what) {
  CausalConvTiling t;
  Check(!CausalConvTilingFn(s, Ascend910B(), t).empty(), "rejected: " + what);
}

}  // namespace

int main() {
  const ConvDtype F16 = ConvDtype::FP16, BF = ConvDtype::BF16, F32 = ConvDtype::FP32;
  for (ConvDtype dt : {F16, BF, F32})
    for (uint32_t seqs : {1u, 3u, 16u, 64u})
      for (uint32_t longest : {0u, 1u, 5u, 300u, 4096u})
        for (uint32_t dim : {1u, 40u, 128u, 300u, 8192u})
          for (uint32_t K : {1u, 4u, 9u})
            for (bool bias : {false, true}) CheckTiling(Shape(seqs, longest, dim, K, K + 1, dt, bias));
  CheckTiling(Shape(1, 1, 8192, 4, 3, BF, false));     // Qwen3-Next decode, one sequence
  CheckTiling(Shape(1, 64, 16, 200, 199, F32, true));  // a kernel width that needs narrow blocks

  {
    CausalConvTiling t;
    // Qwen3-Next decode over 16 sequences: 8192 channels in blocks of 256, 512 units on 48 cores, one-row tiles
    CausalConvTilingFn(Shape(16, 1, 8192, 4, 3, BF, false), Ascend910B(), t);
    Check(t.channels == 256 && t.blocks == 32 && t.rows == 8 && t.block_dim == 48, "decode B16 dim 8192");
    // one long prefill: narrower blocks so that every core has one
    CausalConvTilingFn(Shape(1, 4096, 2048, 4, 3, BF, false), Ascend910B(), t);
    Check(t.channels == 48 && t.block_dim == 43 && t.rows == 248, "prefill of 2048 channels over 48 cores");
  }
  {
    ConvShape s = Shape(3, 20, 40, 4, 5, F32, true);
    s.max_channels = 16;
    s.max_rows = 8;
    CausalConvTiling t;
    Check(CausalConvTilingFn(s, Ascend910B(), t).empty() && t.channels == 16 && t.blocks == 3 && t.rows == 8,
          "max_channels 16, max_rows 8: three blocks, a partial last one");
  }
  CheckRejected(Shape(0, 1, 64, 4, 3, F16, false), "no sequences");
  CheckRejected(Shape(2, 1, 0, 4, 3, F16, false), "no channels");
  CheckRejected(Shape(2, 1, 64, 4, 2, F16, false), "state_len < K - 1");
  CheckRejected(Shape(1, 1, 16, 2000, 1999, F32, false), "a kernel width beyond UB");
  {
    ConvShape s = Shape(2, 1, 64, 4, 3, F16, false);
    s.slots = 1ull << 31;
    CheckRejected(s, "2^31 cache lines");
  }
  return tot_test::FinishChecks();
}
