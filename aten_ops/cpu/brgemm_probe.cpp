#include "cpu/brgemm_probe.h"

#include <ATen/Context.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/BFloat16.h>

#include <exception>
#include <vector>

namespace npu_fa::cpu {
namespace {

// c[M, N] = a[M, K] · b[K, N] with ldb > N (VNNI-packed for 2-byte types), compared with the scalar product.
template <typename T>
bool probe() {
  constexpr int64_t M = 5, N = 37, K = 6, LDB = 40;
  constexpr bool vnni = sizeof(T) == 2;
  auto b_at = [](int64_t kk, int64_t j) { return vnni ? ((kk / 2) * LDB + j) * 2 + kk % 2 : kk * LDB + j; };
  std::vector<T> a(M * K), b(K * LDB, T(0.f));
  std::vector<float> c(M * N, -1.f);
  for (int64_t i = 0; i < M * K; ++i) a[i] = T(float(i % 7) - 3.f);
  for (int64_t kk = 0; kk < K; ++kk)
    for (int64_t j = 0; j < N; ++j) b[b_at(kk, j)] = T(float((kk * N + j) % 5) - 2.f);
  try {
    at::native::cpublas::brgemm(M, N, K, K, LDB, N, false, a.data(), b.data(), c.data(), vnni);
    at::native::cpublas::brgemm_release(vnni);
  } catch (const std::exception&) {
    return false;
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float ref = 0.f;
      for (int64_t kk = 0; kk < K; ++kk) ref += float(a[i * K + kk]) * float(b[b_at(kk, j)]);
      if (ref != c[i * N + j]) return false;
    }
  return true;
}

}  // namespace

bool brgemm_usable(c10::ScalarType dtype) {
  if (!at::globalContext().userEnabledMkldnn()) return false;
  static const bool f32 = probe<float>();
  static const bool bf16 = probe<c10::BFloat16>();
  return (dtype == c10::kFloat && f32) || (dtype == c10::kBFloat16 && bf16);
}

}  // namespace npu_fa::cpu
