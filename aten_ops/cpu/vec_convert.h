// Row conversions and tile transposes the CPU kernels share, compiled per instruction set with the kernel that includes them (so they
// live in npu_fa::cpu::CPU_CAPABILITY: inline functions compiled with different instruction sets must not be merged
// by the linker; a file without -DCPU_CAPABILITY gets the literal namespace CPU_CAPABILITY, a separate copy).
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace npu_fa::cpu::CPU_CAPABILITY {

// dst[0..n) = src[0..n) in the accumulation type A. 16-bit rows go to fp32 two vectors at a time (ATen's
// load_to_float): gathering and converting cache rows is a visible share of the attention kernels' work, and the
// scalar conversion does not vectorise reliably.
template <typename A, typename T>
inline void to_acc(const T* src, int64_t n, A* dst) {
  int64_t d = 0;
  if constexpr (std::is_same_v<A, float> && (std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>)) {
    using Vf = at::vec::Vectorized<float>;
    constexpr int64_t L = 2 * Vf::size();
    for (; d + L <= n; d += L) {
      Vf lo, hi;
      at::vec::load_to_float<T>(src + d, lo, hi);
      lo.store(dst + d);
      hi.store(dst + d + Vf::size());
    }
  }
  for (; d < n; ++d) dst[d] = static_cast<A>(src[d]);
}

// dst[0..n) = src[0..n) (accumulation type A) in the storage type T: ATen's vectorised conversion for 16-bit T.
template <typename A, typename T>
inline void from_acc(const A* src, int64_t n, T* dst) {
  if constexpr (std::is_same_v<T, A>) {
    std::copy(src, src + n, dst);
  } else {
    at::vec::convert(src, dst, n);
  }
}

// dst[j * ld_dst + i] = src[i * ld_src + j] for i < rows, j < cols: register transposes of full vector-width
// tiles (ATen's transpose_mxn), scalar edges. Products on brgemm take row-major operands only, so the kernels
// transpose small blocks on every step; the scalar loop's strided stores were a visible share of their time.
template <typename A>
inline void transpose_tiles(const A* src, int64_t ld_src, int64_t rows, int64_t cols, A* dst, int64_t ld_dst) {
  constexpr int64_t T = at::vec::Vectorized<A>::size();
  for (int64_t i0 = 0; i0 < rows; i0 += T)
    for (int64_t j0 = 0; j0 < cols; j0 += T) {
      const A* s = src + i0 * ld_src + j0;
      A* d = dst + j0 * ld_dst + i0;
      if (i0 + T <= rows && j0 + T <= cols) {
        at::vec::transpose_mxn<A, T, T>(s, ld_src, d, ld_dst);
      } else {
        for (int64_t i = 0; i < std::min(T, rows - i0); ++i)
          for (int64_t j = 0; j < std::min(T, cols - j0); ++j) d[j * ld_dst + i] = s[i * ld_src + j];
      }
    }
}

}  // namespace npu_fa::cpu::CPU_CAPABILITY
