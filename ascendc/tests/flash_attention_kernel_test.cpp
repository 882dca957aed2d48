// Host program for the FlashAttention forward kernel, tikicpulib style (GmAlloc, SetKernelMode(MIX_MODE),
// ICPU_RUN_KF): the same program builds against CANN's tikicpulib. Compares out / softmax_max / softmax_sum with a
// float64 reference for a few small cases (GQA, tails, head dim not a multiple of 16, causal band, bool mask,
// fp16 / bf16 / fp32). Prints one line per case; reports through test_main.h.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tikicpulib.h"
#include "attention/flash_attention_score_tiling.h"
#include "test_main.h"
#include "attention/flash_attention_score_kernel.h"


using namespace tot_ascendc;

struct Case {
  const char* name;
  FaDtype dtype;
  uint32_t B, N, G, S1, S2, D, Dv;
  int mask;          // 0 none, 1 explicit [B,1,S1,S2] random mask (with one fully masked row)
  int64_t lo, hi;    // band
  uint32_t s1_block, s2_block;
};

template <typename T>
struct Buf {
  T* p = nullptr;
  size_t n = 0;
  explicit Buf(size_t count) : p(static_cast<T*>(AscendC::GmAlloc(std::max<size_t>(count, 1) * sizeof(T)))), n(count) {}
  ~Buf() { AscendC::GmFree(p); }
  uint8_t* gm() const { return reinterpret_cast<uint8_t*>(p); }
};

template <typename T>
bool RunCase(const Case& c) {
  FlashAttentionTilingInput in;
  in.batch = c.B; in.q_heads = c.N; in.group = c.G; in.s1 = c.S1; in.s2 = c.S2; in.head_dim = c.D;
  in.v_head_dim = c.Dv; in.dtype = c.dtype; in.scale = 1.0f / std::sqrt(float(c.D));
  in.mask_kind = c.mask ? FA_MASK_EXPLICIT : FA_MASK_NONE; in.mask_per_batch = true; in.mask_per_head = false;
  in.band_lo = c.lo; in.band_hi = c.hi;
  FlashAttentionTilingOptions opt{c.s1_block, c.s2_block};
  FlashAttentionScoreTilingData t;
  const std::string err = FlashAttentionScoreTiling(in, opt, Ascend910B(), &t);
  if (!err.empty()) { std::printf("%s: tiling failed: %s\n", c.name, err.c_str()); return false; }

  const uint32_t KV = c.N / c.G;
  Buf<T> q(size_t(c.B) * c.N * c.S1 * c.D), k(size_t(c.B) * KV * c.S2 * c.D), v(size_t(c.B) * KV * c.S2 * c.Dv);
  Buf<T> out(size_t(c.B) * c.N * c.S1 * c.Dv);
  Buf<float> smax(size_t(c.B) * c.N * c.S1 * 8), ssum(size_t(c.B) * c.N * c.S1 * 8);
  Buf<uint8_t> mask(size_t(c.B) * c.S1 * c.S2), ws(t.workspace_bytes);
  Buf<FlashAttentionScoreTilingData> tiling(1);
  std::mt19937 gen(42);
  std::normal_distribution<float> nd;
  for (size_t i = 0; i < q.n; ++i) q.p[i] = T(nd(gen) * 1.5f);
  for (size_t i = 0; i < k.n; ++i) k.p[i] = T(nd(gen));
  for (size_t i = 0; i < v.n; ++i) v.p[i] = T(nd(gen));
  std::uniform_real_distribution<float> ud;
  for (size_t i = 0; i < mask.n; ++i) mask.p[i] = ud(gen) < 0.3f;
  if (c.mask) for (uint32_t j = 0; j < c.S2; ++j) mask.p[1 * c.S2 + j] = 1;  // batch 0, row 1 fully masked
  *tiling.p = t;

  AscendC::SetKernelMode(AscendC::KernelMode::MIX_MODE);
  ICPU_RUN_KF(flash_attention_score, t.block_dim, q.gm(), k.gm(), v.gm(), c.mask ? mask.gm() : nullptr, out.gm(),
              smax.gm(), ssum.gm(), ws.gm(), tiling.gm());

  // float64 reference from the same (rounded) inputs.
  double max_err = 0, stat_err = 0;
  bool ok = true;
  std::vector<double> s(c.S2);
  for (uint32_t b = 0; b < c.B; ++b)
    for (uint32_t n = 0; n < c.N; ++n)
      for (uint32_t i = 0; i < c.S1; ++i) {
        const uint32_t h = n / c.G;
        double m = -INFINITY;
        for (uint32_t j = 0; j < c.S2; ++j) {
          const bool vis = int64_t(j) >= int64_t(i) + c.lo && int64_t(j) <= int64_t(i) + c.hi &&
                           !(c.mask && mask.p[(size_t(b) * c.S1 + i) * c.S2 + j]);
          double acc = 0;
          for (uint32_t d = 0; d < c.D; ++d)
            acc += double(float(q.p[((size_t(b) * c.N + n) * c.S1 + i) * c.D + d])) *
                   double(float(k.p[((size_t(b) * KV + h) * c.S2 + j) * c.D + d]));
          s[j] = vis ? acc * double(in.scale) : -INFINITY;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (uint32_t j = 0; j < c.S2; ++j) l += m == -INFINITY ? 0.0 : std::exp(s[j] - m);
        const size_t row = (size_t(b) * c.N + n) * c.S1 + i;
        for (uint32_t d = 0; d < c.Dv; ++d) {
          double o = 0;
          for (uint32_t j = 0; j < c.S2; ++j)
            if (l > 0) o += std::exp(s[j] - m) / l * double(float(v.p[((size_t(b) * KV + h) * c.S2 + j) * c.Dv + d]));
          const double got = double(float(out.p[row * c.Dv + d]));
          if (!std::isfinite(got)) ok = false;
          max_err = std::max(max_err, std::fabs(got - o));
        }
        for (int e = 0; e < 8; ++e) {
          const double gm = smax.p[row * 8 + e], gs = ssum.p[row * 8 + e];
          if (l == 0) {
            if (!(gm == -INFINITY && gs == 0.0)) ok = false;
          } else {
            stat_err = std::max(stat_err, std::fabs(gm - m) + std::fabs(gs - l) / l);
          }
        }
      }
  const double tol = c.dtype == FA_FLOAT32 ? 1e-4 : c.dtype == FA_FLOAT16 ? 4e-3 : 3e-2;
  ok = ok && max_err <= tol && stat_err <= 1e-3;
  std::printf("%s: %s max|out-ref64|=%.3g (tol %.3g) stats err=%.3g blocks %ux%u vec_rows %u cores %u\n", c.name,
              ok ? "ok" : "FAIL", max_err, tol, stat_err, t.s1_block, t.s2_block, t.vec_rows, t.block_dim);
  return ok;
}

int main() {
  const int64_t inf = int64_t(1) << 40;
  const Case cases[] = {
      {"fp16_gqa_tails_forced16x64", FA_FLOAT16, 2, 4, 2, 37, 150, 40, 40, 0, -inf, inf, 16, 64},
      {"bf16_causal_bottom_right", FA_BFLOAT16, 1, 4, 4, 33, 45, 32, 24, 0, -inf, 45 - 33, 16, 64},
      {"fp32_mask_mqa_auto", FA_FLOAT32, 2, 2, 2, 20, 37, 16, 16, 1, -inf, inf, 0, 0},
      {"fp16_causal_top_left_mask", FA_FLOAT16, 2, 2, 1, 40, 40, 64, 64, 1, -inf, 0, 16, 64},
  };
  int failed = 0;
  for (const Case& c : cases) {
    bool ok = false;
    try {
      if (c.dtype == FA_FLOAT16) ok = RunCase<half>(c);
      else if (c.dtype == FA_BFLOAT16) ok = RunCase<bfloat16_t>(c);
      else ok = RunCase<float>(c);
    } catch (const std::exception& e) {
      std::printf("%s: kernel check failed: %s\n", c.name, e.what());
    }
    failed += !ok;
  }
  return tot_test::Finish(failed, int(sizeof(cases) / sizeof(cases[0])), "cases");
}
