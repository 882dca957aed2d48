// Host program (CANN CPU-debug style: GmAlloc, SetKernelMode(AIV_MODE), ICPU_RUN_KF) for the fused causal conv1d
// kernel, checked against a float64 conv computed here from the same (rounded) inputs: fp16 / bf16 / fp32, ragged
// prefill tiles (sequences longer than a tile, tiles shorter than K-1), decode and speculative offsets
// (num_accepted_tokens), lines longer than K-1 (older rows shifted up or down inside the line), no initial state
// (K-1 zero rows), bias, SiLU, the pangu reset, residual, y written over x (the in-place op), channel blocks with a
// partial last one, K = 1 with an empty line. The cache is compared exactly (it only moves values); lines no
// sequence writes and rows of y no sequence computes must keep their contents. Prints one line per case; reports
// through test_main.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tikicpulib.h"
#include "linear_attention/fused_causal_conv1d_tiling.h"
#include "test_main.h"
#include "linear_attention/fused_causal_conv1d_kernel.h"

using namespace tot_ascendc;

namespace {

struct Seq {
  uint32_t len;
  int32_t line;       // its cache line
  bool state;         // false: K-1 zero rows
  int32_t accepted;   // 0: the default offset C-(K-1); else num_accepted_tokens
  uint32_t reset;     // pangu: y[t] = 0 (before the residual) for t < reset
};

struct Case {
  const char* name;
  ConvDtype dtype;
  uint32_t dim, K, C;
  std::vector<Seq> seqs;
  bool bias, silu, residual, in_place;
  uint32_t max_channels = 256, max_rows = 248;
};

double Eps(ConvDtype d) { return d == ConvDtype::FP32 ? 1.2e-7 : d == ConvDtype::FP16 ? 9.8e-4 : 7.8e-3; }

template <typename T>
bool RunTyped(const Case& c) {
  std::mt19937 rng(7 + c.dim * 3 + c.K + uint32_t(c.seqs.size()));
  std::normal_distribution<float> nd(0.f, 1.f);
  const uint32_t B = uint32_t(c.seqs.size()), K = c.K, C = c.C, dim = c.dim;
  uint32_t T_ = 2;  // two rows no sequence covers: they must keep their values
  for (const Seq& s : c.seqs) T_ += s.len;
  const uint32_t slots = B + 2;
  auto alloc = [](uint64_t n, size_t sz) { return AscendC::GmAlloc(std::max<uint64_t>(n * sz, 32)); };
  T* x = (T*)alloc(uint64_t(T_) * dim, sizeof(T));
  T* y = c.in_place ? x : (T*)alloc(uint64_t(T_) * dim, sizeof(T));
  T* w = (T*)alloc(uint64_t(K) * dim, sizeof(T));
  T* bias = (T*)alloc(dim, sizeof(T));
  T* st = (T*)alloc(uint64_t(slots) * C * dim, sizeof(T));
  int32_t* table = (int32_t*)alloc(uint64_t(B) * kConvSeqFields, 4);
  for (uint64_t i = 0; i < uint64_t(T_) * dim; ++i) x[i] = T(nd(rng));
  if (!c.in_place)
    for (uint64_t i = 0; i < uint64_t(T_) * dim; ++i) y[i] = T(-7.f);
  for (uint64_t i = 0; i < uint64_t(K) * dim; ++i) w[i] = T(0.5f * nd(rng));
  for (uint32_t i = 0; i < dim; ++i) bias[i] = T(nd(rng));
  for (uint64_t i = 0; i < uint64_t(slots) * C * dim; ++i) st[i] = T(nd(rng));
  // the reference's inputs: the rounded values, before the kernel writes
  auto f = [](T v) { return double(float(v)); };
  std::vector<double> x0(uint64_t(T_) * dim), y0(uint64_t(T_) * dim), st0(uint64_t(slots) * C * dim);
  for (uint64_t i = 0; i < x0.size(); ++i) x0[i] = f(x[i]), y0[i] = f(y[i]);
  for (uint64_t i = 0; i < st0.size(); ++i) st0[i] = f(st[i]);

  // the sequence table and the float64 reference (cache: exact values; y: the conv in float64)
  std::vector<double> want_y(y0), want_st(st0);
  uint32_t start = 1, longest = 0;  // row 0 belongs to no sequence
  for (uint32_t b = 0; b < B; ++b) {
    const Seq& s = c.seqs[b];
    const int32_t offset = !s.state ? 0 : s.accepted ? s.accepted - 1 : int32_t(C - (K - 1));
    int32_t* r = table + uint64_t(b) * kConvSeqFields;
    r[kConvStart] = int32_t(start);
    r[kConvLen] = int32_t(s.len);
    r[kConvReadLine] = s.state ? s.line : -1;
    r[kConvOffset] = offset;
    r[kConvWriteLine] = s.line;
    r[kConvReset] = int32_t(s.reset);
    const uint32_t prefix = uint32_t(offset) + K - 1, total = prefix + s.len;
    std::vector<double> padded(uint64_t(total) * dim, 0.0);
    if (s.state)
      std::copy(st0.begin() + uint64_t(s.line) * C * dim, st0.begin() + (uint64_t(s.line) * C + prefix) * dim,
                padded.begin());
    std::copy(x0.begin() + uint64_t(start) * dim, x0.begin() + uint64_t(start + s.len) * dim,
              padded.begin() + uint64_t(prefix) * dim);
    const uint32_t kept = std::min(C, total);
    std::copy(padded.begin() + uint64_t(total - kept) * dim, padded.end(),
              want_st.begin() + (uint64_t(s.line) * C + C - kept) * dim);
    for (uint32_t t = 0; t < s.len; ++t)
      for (uint32_t j = 0; j < dim; ++j) {
        double acc = 0;
        for (uint32_t k = 0; k < K; ++k) acc += f(w[uint64_t(k) * dim + j]) * padded[uint64_t(offset + t + k) * dim + j];
        if (c.bias) acc += f(bias[j]);
        if (c.silu) acc = acc / (1.0 + std::exp(-acc));
        if (t < s.reset) acc = 0;
        if (c.residual) acc += x0[uint64_t(start + t) * dim + j];
        want_y[uint64_t(start + t) * dim + j] = acc;
      }
    start += s.len;
    longest = std::max(longest, s.len);
  }

  ConvShape sh;
  sh.tokens = T_; sh.seqs = B; sh.dim = dim; sh.width = K; sh.state_len = C; sh.longest = longest; sh.slots = slots;
  sh.dtype = c.dtype; sh.has_bias = c.bias; sh.silu = c.silu; sh.residual = c.residual;
  sh.max_channels = c.max_channels; sh.max_rows = c.max_rows;
  CausalConvTiling t;
  const std::string err = CausalConvTilingFn(sh, Ascend910B(), t);
  if (!err.empty()) { std::printf("FAIL %s: tiling: %s\n", c.name, err.c_str()); return false; }
  uint8_t* tiling = (uint8_t*)AscendC::GmAlloc(sizeof(t));
  std::memcpy(tiling, &t, sizeof(t));
  uint8_t* ws = (uint8_t*)AscendC::GmAlloc(32);
  AscendC::SetKernelMode(AscendC::KernelMode::AIV_MODE);
  try {
    ICPU_RUN_KF(fused_causal_conv1d, t.block_dim, (uint8_t*)x, (uint8_t*)w, (uint8_t*)bias, (uint8_t*)table,
                (uint8_t*)st, (uint8_t*)y, ws, tiling);
  } catch (const std::exception& e) {
    std::printf("FAIL %s: kernel: %s\n", c.name, e.what());
    return false;
  }
  // y: fp32 sums K products in another order (a few units); 16-bit: one rounding of the result
  double top = 1, ey = 0;
  for (double v : want_y) top = std::max(top, std::fabs(v));
  for (uint64_t i = 0; i < want_y.size(); ++i) {
    const double d = std::fabs(f(y[i]) - want_y[i]);
    ey = std::max(ey, d != d ? 1e30 : d);
  }
  const double tol = (c.dtype == ConvDtype::FP32 ? 16 : 2) * Eps(c.dtype) * top;
  uint64_t bad_st = 0;
  for (uint64_t i = 0; i < want_st.size(); ++i) bad_st += f(st[i]) != want_st[i];
  const bool ok = ey <= tol && bad_st == 0;
  std::printf("%s %s: y err/tol %.3g, cache values differing %llu; channels=%u blocks=%u rows=%u cores=%u\n",
              ok ? "ok" : "FAIL", c.name, ey / tol, (unsigned long long)bad_st, t.channels, t.blocks, t.rows,
              t.block_dim);
  for (void* p : {(void*)x, (void*)w, (void*)bias, (void*)st, (void*)table, (void*)tiling, (void*)ws})
    AscendC::GmFree(p);
  if (!c.in_place) AscendC::GmFree(y);
  return ok;
}

bool Run(const Case& c) {
  if (c.dtype == ConvDtype::FP16) return RunTyped<half>(c);
  if (c.dtype == ConvDtype::BF16) return RunTyped<bfloat16_t>(c);
  return RunTyped<float>(c);
}

}  // namespace

int main() {
  const ConvDtype F16 = ConvDtype::FP16, BF = ConvDtype::BF16, F32 = ConvDtype::FP32;
  // Seq: len, line, state, accepted, reset
  std::vector<Case> cases = {
      {"fp32 ragged prefill over 8-row tiles, K 4 C 3, bias silu residual", F32, 40, 4, 3,
       {{19, 3, true, 0, 0}, {2, 0, true, 0, 0}, {8, 4, false, 0, 0}}, true, true, true, false, 256, 8},
      {"bf16 decode, K 4, lines of 5 rows (older rows shifted down)", BF, 72, 4, 5,
       {{1, 1, true, 0, 0}, {1, 4, true, 0, 0}, {1, 0, true, 0, 0}}, false, false, false, false},
      {"fp16 speculative decode: accepted offsets, C = K-1+2", F16, 24, 3, 4,
       {{3, 0, true, 1, 0}, {3, 2, true, 2, 0}, {3, 3, true, 3, 0}}, true, false, true, false},
      {"fp32 short sequences in long lines (rows shifted up), zero state, pangu reset", F32, 20, 3, 9,
       {{2, 2, true, 2, 0}, {1, 0, false, 0, 1}, {3, 3, true, 0, 2}, {0, 1, true, 0, 0}}, true, true, false,
       false, 256, 8},
      {"bf16 in place (y is x), 16-channel blocks, partial last block, tiles shorter than K-1", BF, 40, 6, 5,
       {{13, 1, true, 0, 0}, {4, 2, false, 0, 0}}, true, true, true, true, 16, 8},
      {"fp16 K 1, empty lines", F16, 33, 1, 0, {{5, 0, true, 0, 0}, {2, 1, false, 0, 0}}, true, false, true, false},
      {"fp32 lines of 30 rows moved down and up through overlapping 8-row chunks", F32, 16, 4, 30,
       {{3, 0, true, 0, 0}, {10, 1, true, 10, 0}, {40, 2, true, 0, 0}}, false, true, false, false, 256, 8},
      {"bf16 Qwen3-Next-like decode: 2048 channels, 16 sequences, 48 cores", BF, 2048, 4, 3,
       {{1, 0, true, 0, 0}, {1, 1, true, 0, 0}, {1, 2, true, 0, 0}, {1, 3, true, 0, 0}, {1, 4, true, 0, 0},
        {1, 5, true, 0, 0}, {1, 6, true, 0, 0}, {1, 7, true, 0, 0}, {1, 8, true, 0, 0}, {1, 9, true, 0, 0},
        {1, 10, true, 0, 0}, {1, 11, true, 0, 0}, {1, 12, true, 0, 0}, {1, 13, true, 0, 0}, {1, 14, true, 0, 0},
        {1, 15, true, 0, 0}}, false, true, false, true},
  };
  int failed = 0;
  for (const Case& c : cases) failed += Run(c) ? 0 : 1;
  return tot_test::Finish(failed, int(cases.size()), "cases");
}
