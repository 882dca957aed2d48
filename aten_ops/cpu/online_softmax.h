// The row rules every CPU attention kernel's online softmax shares: how a running maximum keeps a NaN, and which
// maxima leave the fast path (docs/attention.md, "NaN and infinities"). Included by the per-ISA kernel sources
// (forward.h, backward.h, decode_kernels_isa.cpp), so everything lives in npu_fa::cpu::CPU_CAPABILITY: inline
// functions of the same name compiled with different instruction sets must not be merged by the linker.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace online_softmax {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Largest |row max| the fast path takes. The kernels compute exp(x * scale - m) with one fused multiply-add, where
// m is the rounded product of the row's largest x: the exponent of that key is then the rounding error of m,
// |m| * 2^-24 at most. It cancels in P / l, but above 2^24 (|error| > 0.5) it could overflow or underflow exp
// (scale = 1e30 gives NaN or an all-zero row), so such rows round the scaled scores first (exponent exactly 0).
constexpr float kHugeMax = 16777216.f;

// max(a, b) that returns a NaN when either is one. std::max(a, NaN) returns a, which would silently drop the NaN
// score of a tile and give the row a finite (or zero) output where the math says NaN.
inline float nan_max(float a, float b) { return (a < b || b != b) ? b : a; }

// What a row's running maximum means for its softmax. Every kernel tests `!(|m| < kHugeMax)` first (one compare
// per row and tile) and only then asks which rare case it is.
enum class RowKind {
  Regular,  // finite and below kHugeMax: the fast path
  Unseen,   // -inf: no visible key so far (fully masked rows end here: output 0)
  NaN,      // NaN or +inf: a NaN score, or exp(inf - inf) in the math, so the row is NaN
  Huge,     // finite, >= kHugeMax: round the scaled scores before the exponent
};

inline RowKind row_kind(float m) {
  if (std::abs(m) < kHugeMax) return RowKind::Regular;
  if (m == kNegInf) return RowKind::Unseen;
  if (!std::isfinite(m)) return RowKind::NaN;
  return RowKind::Huge;
}

// A sink (one more logit s per head, compared with the scaled scores, whose value row is 0: attention sinks) added
// to a row's final maximum m and sum l as one more key: m = max(m, s), l += exp(s - m). Adding it last gives the
// statistics of starting from (m, l) = (s, 1), also for rows merged from split key ranges. Returns the factor the
// row's P·V accumulator must be multiplied by: exp(m_before - m); 0 for a row without a visible key (l == 0), which
// then holds the sink alone (m = s, l = 1, output 0); NaN when the row becomes NaN (a NaN row, or a NaN or +inf sink:
// exp(inf - inf) in the math). A sink of -inf adds nothing (factor 1).
inline float add_sink(float s, float& m, float& l) {
  if (s == kNegInf) return 1.f;
  if (std::isnan(m) || !(s < std::numeric_limits<float>::infinity())) {
    m = l = kNaN;
    return kNaN;
  }
  if (l == 0.f) {
    m = s;
    l = 1.f;
    return 0.f;
  }
  const float m_new = std::max(m, s);
  const float alpha = std::exp(m - m_new);
  l = l * alpha + std::exp(s - m_new);
  m = m_new;
  return alpha;
}

}  // namespace online_softmax
}  // namespace npu_fa::cpu::CPU_CAPABILITY
