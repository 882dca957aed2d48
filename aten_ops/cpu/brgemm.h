// The oneDNN brgemm micro-kernels (at::native::cpublas::brgemm) as the CPU kernels call them, and the VNNI layout of
// their 16-bit B operands, in one place. libtorch exports brgemm but not the cpublas::gemm overloads, so the
// attention forward and backward (attention/forward.h, backward.h), the MLA kernel (inference/mla_kernels_isa.cpp)
// and the fused MoE FFN (moe/fused_ffn_kernels_isa.cpp) all run their products on it.
//
// B operands: fp32 B is row-major with row stride ldb. A 16-bit B (bf16, fp16) is VNNI-packed: rows 2p and 2p + 1
// are interleaved, element (kk, j) at b[((kk / 2) * ldb + j) * 2 + kk % 2], so k is even (an odd k gets a zero row).
//
// Two halves:
//   brgemm_usable, brgemm_vnni_panel  what brgemm accepts on this machine and build; probed once per process in
//                                     brgemm.cpp, an ordinary translation unit, so no per-ISA copy of a probe exists.
//   namespace brgemm                  inline wrappers and packing. The *_isa.cpp files are compiled once per ISA, so
//                                     these live in npu_fa::cpu::CPU_CAPABILITY like the kernels' other headers:
//                                     inline functions compiled with different instruction sets must not be merged
//                                     by the linker. (In a file without -DCPU_CAPABILITY the namespace is literally
//                                     CPU_CAPABILITY, again distinct from every per-ISA copy.)
#pragma once

#include <ATen/native/CPUBlas.h>
#include <c10/core/ScalarType.h>

#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace npu_fa::cpu {

// True when brgemm gives exact small-integer products for `dtype` (kFloat, or kBFloat16 with B VNNI-packed) with
// any ldb >= n; some builds or CPUs refuse a layout or throw. Any other dtype: false. False whenever the user
// disabled oneDNN (torch.backends.mkldnn).
bool brgemm_usable(c10::ScalarType dtype);

// The widest panel (128 or 64 columns) in which brgemm multiplies a VNNI-packed `dtype` B (kBFloat16 or kHalf)
// exactly, for mm_panels / pack_rows_vnni / pack_cols_vnni; 0 when none works (then compute in fp32), for any other
// dtype, or with oneDNN disabled. AMX kernels take at most 64 columns.
int64_t brgemm_vnni_panel(c10::ScalarType dtype);

}  // namespace npu_fa::cpu

namespace npu_fa::cpu::CPU_CAPABILITY::brgemm {

// Whether brgemm takes B of element type T VNNI-packed: the 16-bit types do, fp32 does not.
template <typename T>
inline constexpr bool kVnni = sizeof(T) == 2;

// c[m, n] (+)= a[m, k] · b[k, n] in fp32, row-major (add: accumulate into c). b is VNNI-packed for 16-bit T.
template <typename T>
inline void mm(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, float* c,
               int64_t ldc, bool add) {
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, add, a, b, c, kVnni<T>);
}

// mm with a 16-bit b made by pack_rows_vnni / pack_cols_vnni: panels of `panel` columns one after the other, each
// [k / 2][w][2] (w = the panel's width, its ldb). fp32 b is one row-major operand with row stride ldb (panel unused).
template <typename T>
inline void mm_panels(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, float* c,
                      int64_t ldc, bool add, int64_t panel) {
  if (m == 0 || n == 0) return;
  if constexpr (!kVnni<T>) {
    mm(m, n, k, a, lda, b, ldb, c, ldc, add);
  } else {
    for (int64_t c0 = 0; c0 < n; c0 += panel) {
      const int64_t w = std::min(panel, n - c0);
      mm(m, w, k, a, lda, b + c0 * k, w, c + c0, ldc, add);
    }
  }
}

// Frees the hardware state brgemm configured on the calling thread (AMX tile configuration, for VNNI products).
// Every thread that ran products calls it once when done with them.
inline void release(bool vnni) { at::native::cpublas::brgemm_release(vnni); }

// One VNNI row pair: out[2c] = r0[c], out[2c + 1] = r1[c] for c < n (rows 2p and 2p + 1 of a B operand). A null r1
// pairs r0 with zeros (the zero row after an odd k). Values move as bits.
template <typename T>
inline void interleave_rows(const T* r0, const T* r1, int64_t n, T* out) {
  static_assert(sizeof(T) == 2, "VNNI pairs are of 16-bit values");
  const auto* x0 = reinterpret_cast<const uint16_t*>(r0);
  const auto* x1 = reinterpret_cast<const uint16_t*>(r1);
  auto* o = reinterpret_cast<uint16_t*>(out);
  int64_t c = 0;
#if defined(CPU_CAPABILITY_AVX512)
  if (x1 != nullptr) {
    // unpacklo/hi pair the low/high 4 elements of each 128-bit lane; the permutes restore the element order.
    const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    for (; c + 32 <= n; c += 32) {
      const __m512i a = _mm512_loadu_si512(x0 + c), b = _mm512_loadu_si512(x1 + c);
      const __m512i lo = _mm512_unpacklo_epi16(a, b), hi = _mm512_unpackhi_epi16(a, b);
      _mm512_storeu_si512(o + 2 * c, _mm512_permutex2var_epi64(lo, first, hi));
      _mm512_storeu_si512(o + 2 * c + 32, _mm512_permutex2var_epi64(lo, second, hi));
    }
  }
#endif
  for (; c < n; ++c) {
    o[2 * c] = x0[c];
    o[2 * c + 1] = x1 ? x1[c] : 0;
  }
}

// B = X in panels of `panel` columns (mm_panels), X being k rows x n columns with row stride ld; an odd k gets a
// zero row.
template <typename T>
inline void pack_rows_vnni(const T* x, int64_t ld, int64_t k, int64_t n, int64_t panel, T* out) {
  const int64_t k2 = (k + 1) & ~int64_t(1);
  for (int64_t c0 = 0; c0 < n; c0 += panel) {
    const int64_t w = std::min(panel, n - c0);
    T* o = out + c0 * k2;
    for (int64_t r = 0; r < k2; r += 2, o += 2 * w) {
      const T* x0 = x + r * ld + c0;
      interleave_rows(x0, r + 1 < k ? x0 + ld : nullptr, w, o);
    }
  }
}

// Row j of a matrix X (k values of type S) as column j of B = Xᵀ, w columns, in brgemm's layout for C: a plain
// column for fp32 C (values converted), VNNI pairs of consecutive values for 16-bit C (S == C, k even).
template <typename C, typename S>
inline void store_transposed_row(const S* x, int64_t k, int64_t j, int64_t w, C* out) {
  if constexpr (kVnni<C>) {
    static_assert(std::is_same_v<S, C>, "a VNNI B is packed from values of its own type");
    for (int64_t q = 0; q < k / 2; ++q) std::memcpy(out + 2 * (q * w + j), x + 2 * q, 2 * sizeof(C));
  } else {
    for (int64_t d = 0; d < k; ++d) out[d * w + j] = static_cast<C>(x[d]);
  }
}

// B = Xᵀ in panels of `panel` columns (mm_panels), X being n rows x k columns (k even) with row stride ld.
template <typename T>
inline void pack_cols_vnni(const T* x, int64_t ld, int64_t n, int64_t k, int64_t panel, T* out) {
  for (int64_t c0 = 0; c0 < n; c0 += panel) {
    const int64_t w = std::min(panel, n - c0);
    for (int64_t j = 0; j < w; ++j) store_transposed_row(x + (c0 + j) * ld, k, j, w, out + c0 * k);
  }
}

}  // namespace npu_fa::cpu::CPU_CAPABILITY::brgemm
