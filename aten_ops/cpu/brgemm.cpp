// The probes of brgemm.h: what oneDNN's brgemm accepts on this machine and build, found by running it once per
// dtype and layout on exact small integers. An ordinary translation unit, so each probe runs once per process.
#include "cpu/brgemm.h"

#include <ATen/Context.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <exception>
#include <vector>

namespace npu_fa::cpu {
namespace {

// brgemm.h's inline half, compiled here without -DCPU_CAPABILITY (so its namespace is literally CPU_CAPABILITY).
namespace brgemm = CPU_CAPABILITY::brgemm;

// c[m, n] = a[m, k] · b[k, n] with b's row stride ldb >= n, packed as the kernels pack it (brgemm::pack_rows_vnni
// for 16-bit T); true when brgemm runs and matches the scalar product exactly.
template <typename T>
bool exact_product(int64_t m, int64_t n, int64_t k, int64_t ldb) {
  std::vector<T> a(m * k), b(k * ldb), packed(k * ldb);
  for (int64_t i = 0; i < m * k; ++i) a[i] = T(float(i % 7) - 3.f);
  for (int64_t i = 0; i < k * ldb; ++i) b[i] = T(float(i % 5) - 2.f);
  const T* operand = b.data();
  if constexpr (brgemm::kVnni<T>) {
    brgemm::pack_rows_vnni(b.data(), ldb, k, ldb, ldb, packed.data());
    operand = packed.data();
  }
  std::vector<float> c(m * n, -1.f);
  try {
    brgemm::mm(m, n, k, a.data(), k, operand, ldb, c.data(), n, false);
    brgemm::release(brgemm::kVnni<T>);
  } catch (const std::exception&) {
    return false;
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float ref = 0.f;
      for (int64_t kk = 0; kk < k; ++kk) ref += float(a[i * k + kk]) * float(b[kk * ldb + j]);
      if (ref != c[i * n + j]) return false;
    }
  return true;
}

// A product narrower than its B's row stride (n = 37, ldb = 40), as the kernels' tiles are.
template <typename T>
bool strided_product_works() {
  static const bool ok = exact_product<T>(5, 37, 6, 40);
  return ok;
}

// The wider of 128 and 64 columns whose one-panel product (ldb = n) is exact, else 0.
template <typename T>
int64_t widest_panel() {
  static const int64_t w = exact_product<T>(5, 128, 34, 128) ? 128 : exact_product<T>(5, 64, 34, 64) ? 64 : 0;
  return w;
}

}  // namespace

bool brgemm_usable(c10::ScalarType dtype) {
  if (!at::globalContext().userEnabledMkldnn()) return false;
  if (dtype == c10::kFloat) return strided_product_works<float>();
  if (dtype == c10::kBFloat16) return strided_product_works<c10::BFloat16>();
  return false;
}

int64_t brgemm_vnni_panel(c10::ScalarType dtype) {
  if (!at::globalContext().userEnabledMkldnn()) return 0;
  if (dtype == c10::kBFloat16) return widest_panel<c10::BFloat16>();
  if (dtype == c10::kHalf) return widest_panel<c10::Half>();
  return 0;
}

}  // namespace npu_fa::cpu
