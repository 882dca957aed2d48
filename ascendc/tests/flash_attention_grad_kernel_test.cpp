// Host program (CANN CPU-debug style: GmAlloc, SetKernelMode(MIX_MODE), ICPU_RUN_KF) for the FlashAttention backward
// kernel: small GQA problems with tails, a causal band or a bool mask, checked against a float64 reference of the
// forward statistics and of the gradients. Prints one "case ... max_err ... ok|FAIL" line per case; reports through
// test_main.h.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "tikicpulib.h"
#include "attention/flash_attention_score_grad_tiling.h"
#include "test_main.h"
#include "attention/flash_attention_score_grad_kernel.h"


using namespace tot_ascendc;

namespace {

struct Case {
  const char* name;
  int B, N1, N2, S1, S2, D;
  FagDtype dtype;
  int sparse;     // 0 full, 2 top-left causal, 3 bottom-right causal
  bool mask;      // random bool mask [S1, S2] (with one fully masked row)
  int blocks;     // max block_dim
  int bq, bkv;    // tile overrides (0 = automatic)
};

template <typename T>
T* Upload(const std::vector<double>& x) {
  T* p = static_cast<T*>(AscendC::GmAlloc(x.size() * sizeof(T)));
  for (size_t i = 0; i < x.size(); ++i) p[i] = T(float(x[i]));
  return p;
}

template <typename T>
std::vector<double> Rounded(const std::vector<double>& x) {
  std::vector<double> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = double(float(T(float(x[i]))));
  return r;
}

template <typename T>
bool RunCase(const Case& c) {
  const int G = c.N1 / c.N2, D = c.D;
  std::mt19937 gen(1234);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto randn = [&](size_t n) { std::vector<double> v(n); for (auto& x : v) x = nd(gen); return Rounded<T>(v); };
  const size_t qn = size_t(c.B) * c.N1 * c.S1 * D, kn = size_t(c.B) * c.N2 * c.S2 * D;
  std::vector<double> q = randn(qn), k = randn(kn), v = randn(kn), dy = randn(qn);
  std::vector<uint8_t> mask(size_t(c.S1) * c.S2, 0);
  if (c.mask) {
    for (auto& m : mask) m = (gen() % 4) == 0;
    for (int j = 0; j < c.S2; ++j) mask[size_t(c.S1 / 2) * c.S2 + j] = 1;  // a fully masked row
  }
  const double scale = 1.0 / std::sqrt(double(D));
  int64_t lo = -(int64_t(1) << 40), hi = int64_t(1) << 40;
  if (c.sparse == 2) hi = 0;
  if (c.sparse == 3) hi = c.S2 - c.S1;
  auto visible = [&](int i, int j) { return j - i >= lo && j - i <= hi && !(c.mask && mask[size_t(i) * c.S2 + j]); };

  // float64 forward (statistics as the CPU op stores them) and backward.
  const size_t rows = size_t(c.B) * c.N1 * c.S1;
  std::vector<double> o(qn, 0.0), mx(rows), sm(rows), dq(qn, 0.0), dk(kn, 0.0), dv(kn, 0.0);
  std::vector<double> P(size_t(c.S1) * c.S2), dP(size_t(c.S1) * c.S2);
  for (int b = 0; b < c.B; ++b)
    for (int n = 0; n < c.N1; ++n) {
      const int n2 = n / G;
      const double* Q = &q[(size_t(b) * c.N1 + n) * c.S1 * D];
      const double* K = &k[(size_t(b) * c.N2 + n2) * c.S2 * D];
      const double* V = &v[(size_t(b) * c.N2 + n2) * c.S2 * D];
      const double* dY = &dy[(size_t(b) * c.N1 + n) * c.S1 * D];
      double* O = &o[(size_t(b) * c.N1 + n) * c.S1 * D];
      for (int i = 0; i < c.S1; ++i) {
        const size_t row = (size_t(b) * c.N1 + n) * c.S1 + i;
        double m = -INFINITY, l = 0;
        for (int j = 0; j < c.S2; ++j) {
          double s = 0;
          for (int e = 0; e < D; ++e) s += Q[i * D + e] * K[j * D + e];
          P[size_t(i) * c.S2 + j] = visible(i, j) ? s * scale : -INFINITY;
          m = std::max(m, P[size_t(i) * c.S2 + j]);
        }
        for (int j = 0; j < c.S2; ++j) {
          double& p = P[size_t(i) * c.S2 + j];
          p = m == -INFINITY ? 0.0 : std::exp(p - m);
          l += p;
        }
        mx[row] = l == 0 ? -INFINITY : m;
        sm[row] = l;
        double di = 0;
        for (int j = 0; j < c.S2; ++j) {
          double& p = P[size_t(i) * c.S2 + j];
          if (l > 0) p /= l;
          for (int e = 0; e < D; ++e) O[i * D + e] += p * V[j * D + e];
        }
        for (int e = 0; e < D; ++e) di += dY[i * D + e] * O[i * D + e];
        for (int j = 0; j < c.S2; ++j) {
          double dp = 0;
          for (int e = 0; e < D; ++e) dp += dY[i * D + e] * V[j * D + e];
          dP[size_t(i) * c.S2 + j] = P[size_t(i) * c.S2 + j] * (dp - di) * scale;  // scale * dS
        }
      }
      for (int i = 0; i < c.S1; ++i)
        for (int j = 0; j < c.S2; ++j) {
          const double p = P[size_t(i) * c.S2 + j], ds = dP[size_t(i) * c.S2 + j];
          for (int e = 0; e < D; ++e) {
            dq[((size_t(b) * c.N1 + n) * c.S1 + i) * D + e] += ds * K[j * D + e];
            dk[((size_t(b) * c.N2 + n2) * c.S2 + j) * D + e] += ds * Q[i * D + e];
            dv[((size_t(b) * c.N2 + n2) * c.S2 + j) * D + e] += p * dY[i * D + e];
          }
        }
    }
  o = Rounded<T>(o);  // the forward hands attention_in over in the input dtype

  FlashAttentionScoreGradShape shape;
  shape.batch = c.B; shape.q_heads = c.N1; shape.kv_heads = c.N2; shape.s1 = c.S1; shape.s2 = c.S2;
  shape.d = shape.dv = D; shape.dtype = c.dtype; shape.scale = float(scale);
  shape.band_lo = lo; shape.band_hi = hi; shape.has_mask = c.mask;
  shape.max_block_dim = c.blocks; shape.block_q = c.bq; shape.block_kv = c.bkv;
  FlashAttentionScoreGradTiling tiling;
  const std::string err = FlashAttentionScoreGradTilingFunc(shape, Ascend910B(), tiling);
  if (!err.empty()) { std::printf("case %s tiling error: %s\n", c.name, err.c_str()); return false; }

  T *gq = Upload<T>(q), *gk = Upload<T>(k), *gv = Upload<T>(v), *gdy = Upload<T>(dy), *go = Upload<T>(o);
  float* gmax = static_cast<float*>(AscendC::GmAlloc(rows * 8 * 4));
  float* gsum = static_cast<float*>(AscendC::GmAlloc(rows * 8 * 4));
  for (size_t r = 0; r < rows; ++r)
    for (int e = 0; e < 8; ++e) { gmax[r * 8 + e] = float(mx[r]); gsum[r * 8 + e] = float(sm[r]); }
  uint8_t* gmask = nullptr;
  if (c.mask) {
    gmask = static_cast<uint8_t*>(AscendC::GmAlloc(mask.size()));
    std::memcpy(gmask, mask.data(), mask.size());
  }
  T* gdq = static_cast<T*>(AscendC::GmAlloc(qn * sizeof(T)));
  T* gdk = static_cast<T*>(AscendC::GmAlloc(kn * sizeof(T)));
  T* gdv = static_cast<T*>(AscendC::GmAlloc(kn * sizeof(T)));
  uint8_t* ws = static_cast<uint8_t*>(AscendC::GmAlloc(tiling.workspace_bytes));
  auto* gt = static_cast<FlashAttentionScoreGradTiling*>(AscendC::GmAlloc(sizeof(tiling)));
  *gt = tiling;
  AscendC::SetKernelMode(AscendC::KernelMode::MIX_MODE);
  ICPU_RUN_KF(flash_attention_score_grad, tiling.block_dim, (uint8_t*)gq, (uint8_t*)gk, (uint8_t*)gv, (uint8_t*)gdy,
              gmask, (uint8_t*)gmax, (uint8_t*)gsum, (uint8_t*)go, (uint8_t*)gdq, (uint8_t*)gdk, (uint8_t*)gdv, ws,
              (uint8_t*)gt);

  // fp32: tight; 16-bit: P and dS are rounded to the input dtype, so a relative bound on the output scale.
  auto check = [&](const char* what, const T* got, const std::vector<double>& ref) {
    double err_max = 0, ref_max = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      err_max = std::max(err_max, std::fabs(double(float(got[i])) - ref[i]));
      ref_max = std::max(ref_max, std::fabs(ref[i]));
    }
    const double tol = (c.dtype == FagDtype::FP32 ? 2e-5 : c.dtype == FagDtype::FP16 ? 4e-3 : 3e-2) * (1 + ref_max);
    const bool ok = err_max <= tol && std::isfinite(err_max);
    std::printf("case %s %s max_err %.3g tol %.3g %s\n", c.name, what, err_max, tol, ok ? "ok" : "FAIL");
    return ok;
  };
  bool ok = check("dq", gdq, dq);
  ok = check("dk", gdk, dk) && ok;
  ok = check("dv", gdv, dv) && ok;
  for (void* p : {(void*)gq, (void*)gk, (void*)gv, (void*)gdy, (void*)go, (void*)gmax, (void*)gsum, (void*)gdq,
                  (void*)gdk, (void*)gdv, (void*)ws, (void*)gt})
    AscendC::GmFree(p);
  if (gmask) AscendC::GmFree(gmask);
  return ok;
}

}  // namespace

int main() {
  const Case cases[] = {
      {"fp32_gqa_causal3_tails", 1, 4, 2, 37, 45, 24, FagDtype::FP32, 3, false, 3, 16, 16},
      {"fp16_mask_gqa1", 2, 2, 1, 20, 33, 16, FagDtype::FP16, 0, true, 2, 0, 0},
      {"bf16_causal2", 1, 2, 2, 19, 19, 40, FagDtype::BF16, 2, false, 1, 16, 16},
  };
  int failed = 0;
  for (const Case& c : cases) {
    if (c.dtype == FagDtype::FP32) failed += !RunCase<float>(c);
    else if (c.dtype == FagDtype::FP16) failed += !RunCase<half>(c);
    else failed += !RunCase<bfloat16_t>(c);
  }
  return tot_test::Finish(failed, int(sizeof(cases) / sizeof(cases[0])), "cases");
}
