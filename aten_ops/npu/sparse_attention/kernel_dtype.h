// The sparse-attention family's kernel dtype code (SparseDtype, shared by the sparse_flash_attention and
// lightning_indexer kernels) for a tensor's dtype; the PrivateUse1 glue of both ops maps through this one function.
// float64 never reaches a kernel: both ops fall back before launching.
#pragma once

#include <c10/core/ScalarType.h>

#include "sparse_attention/sparse_flash_attention_tiling.h"

namespace npu_fa::sparse_attention {

inline tot_ascendc::SparseDtype kernel_dtype(at::ScalarType t) {
  if (t == at::kHalf) return tot_ascendc::SparseDtype::FP16;
  if (t == at::kBFloat16) return tot_ascendc::SparseDtype::BF16;
  return tot_ascendc::SparseDtype::FP32;
}

}  // namespace npu_fa::sparse_attention
