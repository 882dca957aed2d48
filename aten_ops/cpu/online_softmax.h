// The row rules every CPU attention kernel's online softmax shares: how a running maximum keeps a NaN, and which
// maxima leave the fast path (docs/attention.md, "NaN and infinities"). Included by the per-ISA kernel sources
// (forward.h, backward.h, decode_kernels_isa.cpp), so everything lives in npu_fa::cpu::CPU_CAPABILITY: inline
// functions of the same name compiled with different instruction sets must not be merged by the linker.
#pragma once

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

}  // namespace online_softmax
}  // namespace npu_fa::cpu::CPU_CAPABILITY
