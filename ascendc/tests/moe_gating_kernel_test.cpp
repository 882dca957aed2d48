// tikicpulib-style host program for the moe_gating_top_k_softmax Ascend C kernel: GmAlloc'd arguments, host
// tiling, SetKernelMode(AIV_MODE), ICPU_RUN_KF, then a float64 C++ reference. Indices must be equal (ties to the
// lower expert; -inf logits; finished rows -> E; row_idx = j*N + i); y within a few units in the last place of
// its dtype; the V2 fp32 softmax within 1e-6. Prints the failures; reports through test_main.h.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tikicpulib.h"
#include "moe/moe_gating_top_k_softmax_tiling.h"
#include "test_main.h"
#include "moe/moe_gating_top_k_softmax_kernel.h"


using tot_ascendc::GatingDtype;

namespace {

struct Case {
  const char* name;
  int64_t n, e, k;
  GatingDtype dtype;
  int renorm = 0;
  bool finished = false, softmax = false, row_idx = true;
  int pattern = 0;  // 0 random, 1 ties (few distinct values), 2 some -inf, 3 some all -inf rows
};


void Store(uint8_t* buf, int64_t i, float v, GatingDtype d) {
  if (d == GatingDtype::kFloat16) reinterpret_cast<half*>(buf)[i] = half(v);
  else if (d == GatingDtype::kBFloat16) reinterpret_cast<bfloat16_t*>(buf)[i] = bfloat16_t(v);
  else reinterpret_cast<float*>(buf)[i] = v;
}

float Load(const uint8_t* buf, int64_t i, GatingDtype d) {
  if (d == GatingDtype::kFloat16) return float(reinterpret_cast<const half*>(buf)[i]);
  if (d == GatingDtype::kBFloat16) return float(reinterpret_cast<const bfloat16_t*>(buf)[i]);
  return reinterpret_cast<const float*>(buf)[i];
}

// Float64 reference of one row: stable top-k (value descending, index ascending), softmax over E or over the k.
void ReferenceRow(const std::vector<double>& x, int64_t k, int renorm, std::vector<int64_t>& idx,
                  std::vector<double>& y, std::vector<double>& p) {
  const int64_t e = int64_t(x.size());
  std::vector<char> used(e, 0);
  idx.assign(k, 0);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t i = 0; i < e; ++i)
      if (!used[i] && (best < 0 || x[i] > x[best])) best = i;
    used[best] = 1;
    idx[j] = best;
  }
  auto softmax = [](std::vector<double> v) {
    double m = -INFINITY, s = 0;
    for (double a : v) m = std::max(m, a);
    for (double& a : v) s += (a = std::exp(a - m));
    for (double& a : v) a /= s;
    return v;
  };
  p = softmax(x);
  y.assign(k, 0);
  if (renorm == 0) {
    for (int64_t j = 0; j < k; ++j) y[j] = p[idx[j]];
  } else {
    std::vector<double> sel(k);
    for (int64_t j = 0; j < k; ++j) sel[j] = x[idx[j]];
    y = softmax(sel);
  }
}

double Ulp(GatingDtype d) {
  return d == GatingDtype::kFloat16 ? std::ldexp(1.0, -10) : d == GatingDtype::kBFloat16 ? std::ldexp(1.0, -7)
                                                                                          : std::ldexp(1.0, -21);
}

std::string RunCase(const Case& c, std::mt19937& rng) {
  tot_ascendc::MoeGatingTopKSoftmaxShape shape;
  shape.rows = c.n;
  shape.experts = c.e;
  shape.k = c.k;
  shape.dtype = c.dtype;
  shape.renorm = c.renorm;
  shape.has_finished = c.finished;
  shape.want_softmax = c.softmax;
  shape.want_row_idx = c.row_idx;
  tot_ascendc::MoeGatingTopKSoftmaxTiling tiling;
  const std::string err = tot_ascendc::MoeGatingTopKSoftmaxTilingFor(shape, tot_ascendc::Ascend910B(), &tiling);
  if (!err.empty()) return "tiling: " + err;

  const int64_t n = c.n, e = c.e, k = c.k;
  const size_t s = tot_ascendc::GatingDtypeBytes(c.dtype);
  auto* x = static_cast<uint8_t*>(AscendC::GmAlloc(n * e * s));
  auto* fin = c.finished ? static_cast<uint8_t*>(AscendC::GmAlloc(n)) : nullptr;
  auto* y = static_cast<uint8_t*>(AscendC::GmAlloc(n * k * s));
  auto* idx = static_cast<int32_t*>(AscendC::GmAlloc(n * k * 4));
  auto* row = c.row_idx ? static_cast<int32_t*>(AscendC::GmAlloc(n * k * 4)) : nullptr;
  auto* sm = tiling.want_softmax ? static_cast<float*>(AscendC::GmAlloc(n * e * 4)) : nullptr;
  auto* ws = static_cast<uint8_t*>(AscendC::GmAlloc(32));
  auto* tl = static_cast<uint8_t*>(AscendC::GmAlloc(sizeof(tiling)));
  std::memcpy(tl, &tiling, sizeof(tiling));

  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_int_distribution<int> few(0, 3);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < e; ++j) {
      float v = c.pattern == 1 ? float(few(rng)) : normal(rng);
      if (c.pattern == 2 && (i + j) % 3 == 0) v = -INFINITY;
      if (c.pattern == 3 && i % 4 == 1) v = -INFINITY;
      Store(x, i * e + j, v, c.dtype);
    }
  for (int64_t i = 0; fin && i < n; ++i) fin[i] = (i % 3) == 2;

  AscendC::SetKernelMode(AscendC::KernelMode::AIV_MODE);
  ICPU_RUN_KF(moe_gating_top_k_softmax_kernel, tiling.block_dim, x, fin, y, reinterpret_cast<uint8_t*>(idx),
              reinterpret_cast<uint8_t*>(row), reinterpret_cast<uint8_t*>(sm), ws, tl);

  std::string bad;
  std::vector<double> xr(e), yr, p;
  std::vector<int64_t> ir;
  for (int64_t i = 0; i < n && bad.empty(); ++i) {
    for (int64_t j = 0; j < e; ++j) xr[j] = Load(x, i * e + j, c.dtype);
    ReferenceRow(xr, k, c.renorm, ir, yr, p);
    const bool done = fin && fin[i];
    for (int64_t j = 0; j < k && bad.empty(); ++j) {
      const int64_t want = done ? e : ir[j];
      char msg[256];
      if (idx[i * k + j] != want) {
        std::snprintf(msg, sizeof msg, "expert_idx[%lld,%lld] = %d, want %lld", (long long)i, (long long)j,
                      idx[i * k + j], (long long)want);
        bad = msg;
      }
      if (row && row[i * k + j] != j * n + i) {
        std::snprintf(msg, sizeof msg, "row_idx[%lld,%lld] = %d", (long long)i, (long long)j, row[i * k + j]);
        bad = msg;
      }
      const double got = Load(y, i * k + j, c.dtype);
      const double tol = 2 * Ulp(c.dtype) * std::fabs(yr[j]) + 1e-7;
      const bool both_nan = std::isnan(got) && std::isnan(yr[j]);
      if (!both_nan && !(std::fabs(got - yr[j]) <= tol)) {
        std::snprintf(msg, sizeof msg, "y[%lld,%lld] = %.9g, want %.9g", (long long)i, (long long)j, got, yr[j]);
        bad = msg;
      }
    }
    for (int64_t j = 0; sm && j < e && bad.empty(); ++j) {
      const bool both_nan = std::isnan(sm[i * e + j]) && std::isnan(p[j]);
      if (!both_nan && !(std::fabs(sm[i * e + j] - p[j]) <= 1e-6)) {
        char msg[128];
        std::snprintf(msg, sizeof msg, "softmax[%lld,%lld] = %.9g, want %.9g", (long long)i, (long long)j,
                      sm[i * e + j], p[j]);
        bad = msg;
      }
    }
  }
  for (void* ptr : {static_cast<void*>(x), static_cast<void*>(fin), static_cast<void*>(y), static_cast<void*>(idx),
                    static_cast<void*>(row), static_cast<void*>(sm), static_cast<void*>(ws), static_cast<void*>(tl)})
    AscendC::GmFree(ptr);
  return bad;
}

}  // namespace

int main() {
  const GatingDtype dtypes[] = {GatingDtype::kFloat32, GatingDtype::kFloat16, GatingDtype::kBFloat16};
  const char* names[] = {"fp32", "fp16", "bf16"};
  std::vector<Case> cases;
  for (int d = 0; d < 3; ++d) {
    const GatingDtype t = dtypes[d];
    cases.push_back({"E8_k1", 5, 8, 1, t});
    cases.push_back({"E60_k2_finished", 101, 60, 2, t, 0, true});
    cases.push_back({"E256_k8_v2_softmax", 53, 256, 8, t, 0, true, true, false});
    cases.push_back({"E7_k_eq_E", 9, 7, 7, t});
    cases.push_back({"ties", 50, 13, 5, t, 0, false, false, true, 1});
    cases.push_back({"neg_inf", 40, 9, 6, t, 0, false, false, true, 2});
    cases.push_back({"all_neg_inf_rows", 12, 5, 3, t, 1, false, false, true, 3});
    cases.push_back({"renorm1", 70, 60, 4, t, 1, true, false, false});
    cases.push_back({"renorm1_ties", 30, 16, 3, t, 1, false, false, false, 1});
  }
  cases.push_back({"many_tiles", 3000, 256, 2, GatingDtype::kFloat16, 0, true, true, false});
  std::mt19937 rng(7);
  int failed = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    std::string err;
    try {
      err = RunCase(c, rng);
    } catch (const std::exception& ex) {
      err = std::string("kernel check: ") + ex.what();
    }
    if (!err.empty()) {
      ++failed;
      std::printf("FAIL %s/%s: %s\n", names[int(c.dtype)], c.name, err.c_str());
    }
  }
  return tot_test::Finish(failed, int(cases.size()), "cases");
}
