// The attention kernels address q/k/v/dy/out as [B, N, S, D] contiguous: conversions from and to the dense layouts
// of the ops (BSH, SBH, BSND, BNSD). On the NPU these are extra copies; the kernels could read strided layouts
// directly (docs/ascendc_attention.md).
#pragma once

#include <ATen/ATen.h>

#include "common/attention/params.h"

namespace npu_fa::npu_host {

// A tensor given in `layout` with `heads` heads, seen as [B, N, S, D] (a strided view, no copy).
inline at::Tensor bnsd_view(const at::Tensor& t, attention::Layout layout, int64_t heads) {
  using attention::Layout;
  switch (layout) {
    case Layout::BSND: return t.permute({0, 2, 1, 3});
    case Layout::BSH: return t.reshape({t.size(0), t.size(1), heads, -1}).permute({0, 2, 1, 3});
    case Layout::SBH: return t.reshape({t.size(0), t.size(1), heads, -1}).permute({1, 2, 0, 3});
    default: return t;
  }
}

// A [B, N, S, D] tensor in `layout` (a view where the layout allows it; BSH / SBH merge the heads, which copies a
// tensor that is not already laid out that way).
inline at::Tensor layout_view(const at::Tensor& o, attention::Layout layout) {
  using attention::Layout;
  const int64_t B = o.size(0), N = o.size(1), S = o.size(2), D = o.size(3);
  switch (layout) {
    case Layout::BSND: return o.permute({0, 2, 1, 3});
    case Layout::BSH: return o.permute({0, 2, 1, 3}).reshape({B, S, N * D});
    case Layout::SBH: return o.permute({2, 0, 1, 3}).reshape({S, B, N * D});
    default: return o;
  }
}

// [B, N, S, D] contiguous copy of a tensor given in `layout` with `heads` heads.
inline at::Tensor to_bnsd(const at::Tensor& t, attention::Layout layout, int64_t heads) {
  return bnsd_view(t, layout, heads).contiguous();
}

// A [B, N, S, D] kernel result in `layout` (contiguous, like the CPU op's outputs).
inline at::Tensor from_bnsd(const at::Tensor& o, attention::Layout layout) {
  return layout_view(o, layout).contiguous();
}

}  // namespace npu_fa::npu_host
