// The logits of FlashAttentionScore when they need more than the scale and an explicit pse: FlashAttention-2's
// softcap and the in-kernel ALiBi bias (pse_type 2/3). Shared by the forward and the backward (which recomputes
// the logits), so both apply exactly the same formula. Included per ISA (namespace CPU_CAPABILITY).
//
// Order (FlashAttention-2's: its kernels cap the scaled scores, then add the ALiBi bias, then mask):
//   x = scale * QKᵀ            (scale * (QKᵀ + pse) with pse_type 1: that pse is part of the score)
//   x = softcap * tanh(x / softcap)   when softcap > 0
//   x += pse                   (pse_type 0: a bias added after scaling, so after capping too)
//   x += -slope * |d|  or  -slope * sqrt(|d|)   (pse_type 2 / 3), d = j - i + alibi_shift[b]
// and the mask (-inf) comes last.
#pragma once

#include <ATen/cpu/vec/vec.h>

#include <algorithm>

#include "common/attention/params.h"

namespace npu_fa::cpu::CPU_CAPABILITY {
namespace fa_logits {

using attention::AttentionParams;

// s: raw Q·Kᵀ of row i (sequence b, head n), keys [j0, j0 + nk), replaced by the logits. dcap (optional, with
// softcap): receives d logit / d x = 1 - tanh², the factor the backward applies to dS. tmp: nk floats of scratch.
inline void transform_logits(const AttentionParams& p, int64_t b, int64_t n, int64_t i, int64_t j0, int64_t nk,
                             float* s, float* dcap, float* tmp) {
  using Vec = at::vec::Vectorized<float>;
  const float* ps = nullptr;
  if (p.pse) {
    const attention::PseView& pv = *p.pse;
    ps = pv.row(b, n, i) + j0 * pv.sj;
    if (pv.sj != 1) {
      for (int64_t j = 0; j < nk; ++j) tmp[j] = ps[j * pv.sj];
      ps = tmp;
    }
  }
  const bool pse_before = ps && p.pse_type == 1, pse_after = ps && p.pse_type == 0;
  const bool cap = p.softcap > 0.f;
  const Vec vscale(p.scale), vcap(p.softcap), vinv_cap(cap ? 1.f / p.softcap : 0.f), one(1.f);
  const bool alibi = p.alibi_slopes != nullptr, alibi_sqrt = p.pse_type == 3;
  const Vec neg_slope(alibi ? -p.alibi_slopes[b * p.alibi_sb + n] : 0.f);
  const float d0 = alibi ? static_cast<float>(j0 - i + p.alibi_shift[b]) : 0.f;
  for (int64_t j = 0; j < nk; j += Vec::size()) {
    const int64_t cnt = std::min<int64_t>(Vec::size(), nk - j);
    Vec x = Vec::loadu(s + j, cnt);
    if (pse_before) x = x + Vec::loadu(ps + j, cnt);
    x = x * vscale;
    if (cap) {
      const Vec t = (x * vinv_cap).tanh();
      if (dcap) (one - t * t).store(dcap + j, cnt);
      x = t * vcap;
    }
    if (pse_after) x = x + Vec::loadu(ps + j, cnt);
    if (alibi) {
      Vec d = Vec::arange(d0 + static_cast<float>(j), 1.f).abs();
      if (alibi_sqrt) d = d.sqrt();
      x = at::vec::fmadd(d, neg_slope, x);
    }
    x.store(s + j, cnt);
  }
}

}  // namespace fa_logits
}  // namespace npu_fa::cpu::CPU_CAPABILITY
