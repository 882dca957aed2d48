// How fused_infer_attention_score computes a call, decided once from its arguments for every backend: the CPU op
// (cpu/inference/prefill.cpp) and the npu op (npu/inference/inference.cpp) switch on the same plan and differ only
// in the kernels they launch per route. The Python wrappers (npu_fused_infer_attention_score(_v2)) decide nothing:
// they translate torch_npu's calling conventions and call the op once. docs/inference.md, "Routes".
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "generated/op_args.h"

namespace npu_fa::attention {

enum class FiaRoute {
  Mla,           // query_rope / key_rope: the MLA paths (cpu/inference/mla.cpp)
  Decode,        // one query token per sequence whose band hides no key, any cache: incre_flash_attention
  PagedPrefill,  // every other paged call: the prefill kernel over the cache's blocks
  DensePrefill,  // a contiguous cache, calls the decode route does not take: the prefill kernel
};

struct FiaPlan {
  FiaRoute route = FiaRoute::DensePrefill;
  bool paged = false, tnd = false, int8_kv = false;
  // Decode of a TND batch (one query token per sequence): the decode op runs it as BSND, or BNSD over a head-major
  // cache, with one position per sequence.
  bool tnd_decode = false;
  // actual_seq_lengths as the decision read them (once): per-batch lengths of a dense layout, cumulative ends of
  // TND; empty when absent or not a 1-D integer tensor (the routes' parsers then report what is wrong).
  std::vector<int64_t> q_lens;
  // The call the route runs: the caller's arguments, except that a paged sliding window (sparse_mode 4) drops the
  // blocks wholly before it from block_table and actual_seq_lengths_kv (skip_blocks_before_window).
  FusedInferAttentionScoreValues call;
};

// Validates what every route shares (inner_precise, block_size without a table, antiquant arguments without an int8
// cache, learnable_sink) and chooses the route; the rules and why are in fia_route.cpp.
FiaPlan plan_fia(const char* op, const FusedInferAttentionScoreArgs& a);

// The Decode route, the same on every backend: npu_fa::incre_flash_attention through the dispatcher (so the npu
// device runs its own decode kernel) on the cache in place. Returns (attention_out, the empty softmax_lse).
std::tuple<at::Tensor, at::Tensor> run_decode_route(const FiaPlan& plan);

}  // namespace npu_fa::attention
