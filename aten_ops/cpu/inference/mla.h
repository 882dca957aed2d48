// fused_infer_attention_score with query_rope / key_rope (MLA): argument checks, the absorbed-MLA kernel route and
// the route that appends the rope parts to the heads and runs the ordinary paths.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

#include "generated/kernels.h"

namespace npu_fa {

std::tuple<at::Tensor, at::Tensor> fused_infer_attention_score_mla(const char* op,
                                                                   const FusedInferAttentionScoreArgs& a);

}  // namespace npu_fa
