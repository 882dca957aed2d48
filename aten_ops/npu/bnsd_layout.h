// The attention kernels address q/k/v/dy/out as [B, N, S, D] contiguous: conversions from and to the dense layouts
// of the ops (BSH, SBH, BSND, BNSD). On the NPU these are extra copies; the kernels could read strided layouts
// directly (docs/ascendc_attention.md).
#pragma once

#include <ATen/ATen.h>

#include "common/attention/params.h"

namespace npu_fa::npu_host {

// [B, N, S, D] contiguous copy of a tensor given in `layout` with `heads` heads.
inline at::Tensor to_bnsd(const at::Tensor& t, attention::Layout layout, int64_t heads) {
  using attention::Layout;
  switch (layout) {
    case Layout::BSND: return t.permute({0, 2, 1, 3}).contiguous();
    case Layout::BSH: return t.reshape({t.size(0), t.size(1), heads, -1}).permute({0, 2, 1, 3}).contiguous();
    case Layout::SBH: return t.reshape({t.size(0), t.size(1), heads, -1}).permute({1, 2, 0, 3}).contiguous();
    default: return t.contiguous();
  }
}

// A [B, N, S, D] kernel result in `layout` (contiguous, like the CPU op's outputs).
inline at::Tensor from_bnsd(const at::Tensor& o, attention::Layout layout) {
  using attention::Layout;
  const int64_t B = o.size(0), N = o.size(1), S = o.size(2), D = o.size(3);
  switch (layout) {
    case Layout::BSND: return o.permute({0, 2, 1, 3}).contiguous();
    case Layout::BSH: return o.permute({0, 2, 1, 3}).reshape({B, S, N * D});
    case Layout::SBH: return o.permute({2, 0, 1, 3}).reshape({S, B, N * D});
    default: return o;
  }
}

}  // namespace npu_fa::npu_host
