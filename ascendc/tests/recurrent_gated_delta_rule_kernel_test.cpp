// Host program (CANN CPU-debug style: GmAlloc, SetKernelMode(AIV_MODE), ICPU_RUN_KF) for the recurrent gated delta
// rule kernel, checked against a float64 recurrence computed here from the same (rounded) inputs: fp16 / bf16 /
// fp32 tokens with a state of their dtype or fp32, ragged sequences, num_accepted_tokens (a sequence starting from
// the slot of a later token), shuffled slots, GQA groups, each gate alone and all together, head dims that are not
// multiples of 16 (padded columns) and value dims not multiples of 8 (a partial row block), several row blocks per
// state. Slots no token writes must keep their contents. Prints one line per case; reports through test_main.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tikicpulib.h"
#include "linear_attention/recurrent_gated_delta_rule_tiling.h"
#include "test_main.h"
#include "linear_attention/recurrent_gated_delta_rule_kernel.h"

using namespace tot_ascendc;

namespace {

struct Case {
  const char* name;
  GdrDtype dtype, state_dtype;
  uint32_t Nk, Nv, Dk, Dv;
  std::vector<int32_t> lens, accepted;  // per sequence
  bool beta, g, gk;
  uint32_t max_rows = 248;
};

double Eps(GdrDtype d) { return d == GdrDtype::FP32 ? 1.2e-7 : d == GdrDtype::FP16 ? 9.8e-4 : 7.8e-3; }

template <typename T, typename S>
bool RunTyped(const Case& c) {
  std::mt19937 rng(11 + c.Dk * 7 + c.Dv + uint32_t(c.lens.size()));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  const uint32_t B = uint32_t(c.lens.size());
  const uint32_t T_ = uint32_t(std::accumulate(c.lens.begin(), c.lens.end(), 0));
  const uint32_t slots = T_ + 3, G = c.Nv / c.Nk;
  const uint64_t plane = uint64_t(c.Dv) * c.Dk, nState = uint64_t(slots) * c.Nv * plane;
  auto alloc = [](uint64_t n, size_t sz) { return AscendC::GmAlloc(std::max<uint64_t>(n * sz, 32)); };
  T* q = (T*)alloc(uint64_t(T_) * c.Nk * c.Dk, sizeof(T));
  T* k = (T*)alloc(uint64_t(T_) * c.Nk * c.Dk, sizeof(T));
  T* v = (T*)alloc(uint64_t(T_) * c.Nv * c.Dv, sizeof(T));
  T* out = (T*)alloc(uint64_t(T_) * c.Nv * c.Dv, sizeof(T));
  float* beta = (float*)alloc(uint64_t(T_) * c.Nv, 4);
  float* g = (float*)alloc(uint64_t(T_) * c.Nv, 4);
  float* gk = (float*)alloc(uint64_t(T_) * c.Nv * c.Dk, 4);
  int32_t* seq = (int32_t*)alloc(uint64_t(B + 1) * 2, 4);
  int32_t* slot = (int32_t*)alloc(T_, 4);
  S* state = (S*)alloc(nState, sizeof(S));
  const float kn = 1.f / std::sqrt(float(c.Dk));  // unit-size keys keep the delta rule contractive
  for (uint64_t i = 0; i < uint64_t(T_) * c.Nk * c.Dk; ++i) q[i] = T(nd(rng));
  for (uint64_t i = 0; i < uint64_t(T_) * c.Nk * c.Dk; ++i) k[i] = T(nd(rng) * kn);
  for (uint64_t i = 0; i < uint64_t(T_) * c.Nv * c.Dv; ++i) v[i] = T(nd(rng));
  for (uint64_t i = 0; i < uint64_t(T_) * c.Nv; ++i) beta[i] = ud(rng);
  for (uint64_t i = 0; i < uint64_t(T_) * c.Nv; ++i) g[i] = -0.5f * ud(rng);
  for (uint64_t i = 0; i < uint64_t(T_) * c.Nv * c.Dk; ++i) gk[i] = -0.3f * ud(rng);
  for (uint64_t i = 0; i < nState; ++i) state[i] = S(0.5f * nd(rng));
  std::vector<int32_t> perm(slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (uint32_t t = 0; t < T_; ++t) slot[t] = perm[t];
  int32_t start = 0;
  for (uint32_t b = 0; b < B; ++b) {
    seq[2 * b] = start;
    seq[2 * b + 1] = slot[start + c.accepted[b] - 1];
    start += c.lens[b];
  }
  seq[2 * B] = int32_t(T_);
  seq[2 * B + 1] = 0;
  // the reference's inputs: the rounded values, before the kernel updates the state
  std::vector<double> st0(nState);
  for (uint64_t i = 0; i < nState; ++i) st0[i] = double(float(state[i]));

  GdrShape s;
  s.tokens = T_; s.batch = B; s.k_heads = c.Nk; s.v_heads = c.Nv; s.dk = c.Dk; s.dv = c.Dv; s.slots = slots;
  s.dtype = c.dtype; s.state_dtype = c.state_dtype; s.has_beta = c.beta; s.has_g = c.g; s.has_gk = c.gk;
  s.scale = 1.f / std::sqrt(float(c.Dk)); s.max_rows = c.max_rows;
  RecurrentGdrTiling t;
  const std::string err = RecurrentGdrTilingFn(s, Ascend910B(), t);
  if (!err.empty()) { std::printf("FAIL %s: tiling: %s\n", c.name, err.c_str()); return false; }
  uint8_t* tiling = (uint8_t*)AscendC::GmAlloc(sizeof(t));
  std::memcpy(tiling, &t, sizeof(t));
  uint8_t* ws = (uint8_t*)AscendC::GmAlloc(32);
  AscendC::SetKernelMode(AscendC::KernelMode::AIV_MODE);
  try {
    ICPU_RUN_KF(recurrent_gated_delta_rule, t.block_dim, (uint8_t*)q, (uint8_t*)k, (uint8_t*)v, (uint8_t*)beta,
                (uint8_t*)g, (uint8_t*)gk, (uint8_t*)seq, (uint8_t*)slot, (uint8_t*)state, (uint8_t*)out, ws,
                tiling);
  } catch (const std::exception& e) {
    std::printf("FAIL %s: kernel: %s\n", c.name, e.what());
    return false;
  }

  // float64 recurrence; the expected final cache starts as the initial one (untouched slots keep it)
  std::vector<double> want_state(st0), want_out(uint64_t(T_) * c.Nv * c.Dv);
  const double scale = double(s.scale);
  for (uint32_t b = 0; b < B; ++b)
    for (uint32_t h = 0; h < c.Nv; ++h) {
      const uint32_t hk = h / G;
      std::vector<double> S0(st0.begin() + (uint64_t(seq[2 * b + 1]) * c.Nv + h) * plane,
                             st0.begin() + (uint64_t(seq[2 * b + 1]) * c.Nv + h + 1) * plane);
      for (int32_t tok = seq[2 * b]; tok < seq[2 * b + 2]; ++tok) {
        const uint64_t th = uint64_t(tok) * c.Nv + h;
        const double a = c.g ? std::exp(double(g[th])) : 1.0, bt = c.beta ? double(beta[th]) : 1.0;
        const T* kr = k + (uint64_t(tok) * c.Nk + hk) * c.Dk;
        const T* qr = q + (uint64_t(tok) * c.Nk + hk) * c.Dk;
        for (uint32_t i = 0; i < c.Dv; ++i) {
          double* row = S0.data() + uint64_t(i) * c.Dk;
          double x = 0;
          for (uint32_t j = 0; j < c.Dk; ++j) {
            row[j] *= a * (c.gk ? std::exp(double(gk[th * c.Dk + j])) : 1.0);
            x += row[j] * double(float(kr[j]));
          }
          const double y = bt * (double(float(v[th * c.Dv + i])) - x);
          double o = 0;
          for (uint32_t j = 0; j < c.Dk; ++j) {
            row[j] += y * double(float(kr[j]));
            o += row[j] * double(float(qr[j]));
          }
          want_out[th * c.Dv + i] = scale * o;
        }
        std::copy(S0.begin(), S0.end(), want_state.begin() + (uint64_t(slot[tok]) * c.Nv + h) * plane);
      }
    }
  auto worst = [](const double* want, auto get, uint64_t n, double eps) {
    double top = 1, e = 0;
    for (uint64_t i = 0; i < n; ++i) top = std::max(top, std::fabs(want[i]));
    for (uint64_t i = 0; i < n; ++i) {
      const double d = std::fabs(get(i) - want[i]);
      e = std::max(e, d != d ? 1e30 : d);
    }
    return e / (eps * top);
  };
  // fp32 results: accumulation in another order (a few units over Dk terms); 16-bit: one rounding of the result
  const double eo = c.dtype == GdrDtype::FP32 ? 64 * Eps(c.dtype) : 2 * Eps(c.dtype);
  const double es = c.state_dtype == GdrDtype::FP32 ? 64 * Eps(GdrDtype::FP32) : 2 * Eps(c.state_dtype);
  const double wo = worst(want_out.data(), [&](uint64_t i) { return double(float(out[i])); }, want_out.size(), eo);
  const double ws_ = worst(want_state.data(), [&](uint64_t i) { return double(float(state[i])); }, nState, es);
  const bool ok = wo <= 1.0 && ws_ <= 1.0;
  std::printf("%s %s: out err/tol %.3g state err/tol %.3g rows=%u blocks=%u cores=%u\n", ok ? "ok" : "FAIL", c.name,
              wo, ws_, t.rows, t.row_blocks, t.block_dim);
  for (void* p : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)beta, (void*)g, (void*)gk, (void*)seq,
                  (void*)slot, (void*)state, (void*)tiling, (void*)ws})
    AscendC::GmFree(p);
  return ok;
}

bool Run(const Case& c) {
  const bool f32s = c.state_dtype == GdrDtype::FP32;
  if (c.dtype == GdrDtype::FP16) return f32s ? RunTyped<half, float>(c) : RunTyped<half, half>(c);
  if (c.dtype == GdrDtype::BF16) return f32s ? RunTyped<bfloat16_t, float>(c) : RunTyped<bfloat16_t, bfloat16_t>(c);
  return RunTyped<float, float>(c);
}

}  // namespace

int main() {
  const GdrDtype F16 = GdrDtype::FP16, BF = GdrDtype::BF16, F32 = GdrDtype::FP32;
  // name, dtype, state dtype, Nk, Nv, Dk, Dv, lengths, accepted, beta, g, gk, max_rows
  std::vector<Case> cases = {
      {"fp32 ragged, accepted, GQA2, all gates, Dk 40, 8-row blocks", F32, F32, 2, 4, 40, 24, {3, 1, 2}, {2, 1, 2},
       true, true, true, 8},
      {"fp16 tokens, fp32 state, decode, g and beta", F16, F32, 1, 2, 64, 64, {1, 1, 1}, {1, 1, 1}, true, true,
       false},
      {"bf16 tokens and state, gk only, Dv 20 (partial row block)", BF, BF, 1, 3, 24, 20, {2, 3}, {1, 3}, false,
       false, true, 8},
      {"fp16 tokens and state, no gates, 128 x 128 split over the cores", F16, F16, 2, 4, 128, 128, {2}, {1}, false,
       false, false},
      {"bf16 tokens, fp32 state, Qwen3-Next-like 128 x 128, GQA2, MTP", BF, F32, 2, 4, 128, 128, {3, 2}, {2, 1},
       true, true, false},
      {"bf16 tokens and state, 48 decode items: whole 128 x 128 states in UB", BF, BF, 2, 4, 128, 128,
       std::vector<int32_t>(12, 1), std::vector<int32_t>(12, 1), true, true, false},
      {"fp32 Dk 8 (one DataBlock gap), Dv 8", F32, F32, 1, 1, 8, 8, {4}, {4}, true, true, true},
  };
  int failed = 0;
  for (const Case& c : cases) failed += Run(c) ? 0 : 1;
  return tot_test::Finish(failed, int(cases.size()), "cases");
}
