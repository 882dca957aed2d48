// The exponentials of the CPU attention kernels' softmax, as powers of two.
//
// exp(x·scale − m) = 2^(x·a − b) with a = scale·log2(e), b = m·log2(e): the softmax scale and the change of base
// fold into one fused multiply-add per score, so a row of raw Q·Kᵀ goes to probabilities without a scaling pass.
// 2^y (y = n + f, n = round(y), |f| ≤ 1/2) is a polynomial in f times 2^n built in the exponent bits:
//   - n comes from one add of the shifter 1.5·2^23 + 127, which leaves round(y) + 127 in the low mantissa bits
//     (no round or float→int conversion instruction); shifting those bits up by 23 gives 2^n as a float;
//   - the polynomial is a minimax fit of 2^f on [−1/2, 1/2] with constant term exactly 1 (so 2^0 = 1 exactly),
//     its degree sized to the precision P is used in: degree 5 for fp32 (max relative error 5.1e-7, about 4 ulp;
//     ATen's exp_u20, used before, allows 20 ulp), degree 4 for P rounded to bf16 or fp16 (3.6e-6, 130× below
//     bf16's and 130× below fp16's rounding of P);
//   - y is clamped below at −127, whose power 2^−127 is built as +0.0 (exponent field 0): scores of masked keys
//     (−inf) and every y ≤ −127 give exactly 0; y in (−127, −126) gives a subnormal or 0 (|P| < 2^−126, far below
//     any rounding of P relative to the row's largest P, which is ≥ 1).
// Beyond the polynomial, the fp32 argument itself is rounded (y = (s − m)·scale·log2(e), and log2(e) too): that
// adds up to |y|·2^−23 to y, a relative error of ln(2)·|y|·2^−23 = 2·|s − m|·scale·2^−24 in P, as in any fp32
// exponent (1e-5 at the widest gap that does not underflow, P ≈ 2^−126).
// The argument is at most a rounding error above 0 in the kernels (the row maximum is subtracted), so there is no
// overflow branch: y must be ≤ 127. A NaN argument gives an unspecified value (the kernels route NaN rows
// elsewhere before calling this). Everything is ATen's Vectorized<float> except the two bit reinterpretations, which
// ATen does not expose for floats; they are intrinsics per instruction set with a portable fallback.
//
// Included by the per-ISA kernel sources, so everything lives in npu_fa::cpu::CPU_CAPABILITY (see vec_convert.h).
#pragma once

#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace softmax_exp {

using Vec = at::vec::Vectorized<float>;

constexpr float kLog2e = 1.4426950408889634f;

// Degree of the polynomial for probabilities that end up in dtype T (fp32: 5; bf16 / fp16: 4).
template <typename T>
constexpr int degree_for = std::is_same_v<T, float> ? 5 : 4;

// (bits of v) << 23, reinterpreted as float: 2^(k − 127) for v = shifter + k, 0 ≤ k < 256.
inline Vec shift_to_exponent(const Vec& v) {
#if defined(CPU_CAPABILITY_AVX512)
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(v), 23));
#elif defined(CPU_CAPABILITY_AVX2)
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(v), 23));
#else
  float lanes[Vec::size()];
  v.store(lanes);
  for (float& x : lanes) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    u <<= 23;
    std::memcpy(&x, &u, sizeof u);
  }
  return Vec::loadu(lanes);
#endif
}

// 2^y for y ≤ 127 (see the top of the file).
template <int kDegree>
inline Vec exp2(Vec y) {
  static_assert(kDegree == 4 || kDegree == 5, "fitted degrees: 4 (bf16/fp16 P) and 5 (fp32 P)");
  const Vec shifter(12583039.f);  // 1.5·2^23 + 127: adding it rounds y to an integer, biased by 127, in the low bits
  y = at::vec::clamp_min(y, Vec(-127.f));
  const Vec t = y + shifter;
  const Vec f = y - (t - shifter);  // in [−1/2, 1/2]
  Vec p;
  if constexpr (kDegree == 5) {
    p = at::vec::fmadd(f, Vec(0x1.23a604p-10f), Vec(0x1.3cbea8p-7f));
    p = at::vec::fmadd(f, p, Vec(0x1.c74322p-5f));
    p = at::vec::fmadd(f, p, Vec(0x1.ebfa4ep-3f));
    p = at::vec::fmadd(f, p, Vec(0x1.62e39ep-1f));
  } else {
    p = at::vec::fmadd(f, Vec(0x1.409104p-7f), Vec(0x1.ca9008p-5f));
    p = at::vec::fmadd(f, p, Vec(0x1.ebf1b4p-3f));
    p = at::vec::fmadd(f, p, Vec(0x1.62dfcap-1f));
  }
  p = at::vec::fmadd(f, p, Vec(1.f));
  return p * shift_to_exponent(t);
}

// Probabilities rounded to bf16, ties to even, for finite non-negative v (never NaN: ATen's conversion spends two
// more instructions per vector on NaN). round_bf16 keeps them in fp32 (P rounded to the input dtype before an fp32
// P·V product); store_bf16 writes n ≤ 2·Vec::size() of them (the product's VNNI operand).
inline Vec round_bf16(const Vec& v) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, odd), _mm512_set1_epi32(0x7fff));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, odd), _mm256_set1_epi32(0x7fff));
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
#else
  float lanes[Vec::size()];
  v.store(lanes);
  for (float& x : lanes) x = static_cast<float>(c10::BFloat16(x));
  return Vec::loadu(lanes);
#endif
}

inline void store_bf16(const Vec& lo, const Vec& hi, c10::BFloat16* out, int64_t n) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m512i a = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(lo)), 16);
  const __m512i b = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(hi)), 16);
  // packus interleaves 128-bit lanes of a and b; the permutation restores the order a0..a15 b0..b15.
  const __m512i idx = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
  const __m512i packed = _mm512_permutexvar_epi64(idx, _mm512_packus_epi32(a, b));
  if (n >= 2 * Vec::size()) _mm512_storeu_si512(out, packed);
  else _mm512_mask_storeu_epi16(out, (n > 0 ? (~0u >> (32 - n)) : 0u), packed);
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256i a = _mm256_srli_epi32(_mm256_castps_si256(round_bf16(lo)), 16);
  const __m256i b = _mm256_srli_epi32(_mm256_castps_si256(round_bf16(hi)), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
  if (n >= 2 * Vec::size()) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), packed);
  } else {
    alignas(32) c10::BFloat16 tmp[2 * Vec::size()];
    _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), packed);
    std::copy_n(tmp, n, out);
  }
#else
  float lanes[2 * Vec::size()];
  lo.store(lanes);
  hi.store(lanes + Vec::size());
  for (int64_t j = 0; j < n; ++j) out[j] = c10::BFloat16(lanes[j]);
#endif
}

// exp(x) for x ≤ 88 with the precision for dtype T: exp2 of x·log2(e). For callers whose argument is already
// the difference from the row maximum (exactly 0 for the maximum, so its probability is exactly 1).
template <typename T>
inline Vec exp(const Vec& x) {
  return exp2<degree_for<T>>(x * Vec(kLog2e));
}

}  // namespace softmax_exp
}  // namespace npu_fa::cpu::CPU_CAPABILITY
