// Row conversions the CPU kernels share, compiled per instruction set with the kernel that includes them (so they
// live in npu_fa::cpu::CPU_CAPABILITY: inline functions compiled with different instruction sets must not be merged
// by the linker; a file without -DCPU_CAPABILITY gets the literal namespace CPU_CAPABILITY, a separate copy).
#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

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

}  // namespace npu_fa::cpu::CPU_CAPABILITY
