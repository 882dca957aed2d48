// Argument checks of moe_finalize_routing (and its backward) shared by the CPU kernels
// (aten_ops/cpu/moe/finalize_routing.cpp) and the npu kernel (aten_ops/npu/moe/moe.cpp), so both raise the same
// errors: shapes, dtypes, the pair order of drop_pad_mode and every source row / expert index, read on the host.
//
// expanded_src_to_dst_row names, per (token, slot) pair, the row of expanded_permuted_rows that pair reads, in every
// drop_pad_mode (0/2 dropless rows, 1/3 capacity slots of [E, C, H]); the forward op never writes through it. So two
// pairs may name the same row (torch_npu's documented examples draw the index at random, with repeats): only the
// range is checked. The backward scatters gradients through it and sums the pairs that share a row.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <utility>
#include <vector>

#include "common/moe/routing.h"

namespace npu_fa {
namespace moe {

struct FinalizePlan {
  int64_t N = 0, k = 0, H = 0, R = 0;
  std::vector<int64_t> src;     // per (i, j) at i*k + j: row of expanded or -1
  std::vector<int64_t> expert;  // per (i, j), when bias is given
  bool repeated_rows = false;   // some row is read by more than one pair (the backward then accumulates)
  bool past_rows = false;       // some entry is a sorted position past the rows (src holds -1 for it)
};

inline FinalizePlan plan_finalize(const char* op, const at::Tensor& expanded, const std::optional<at::Tensor>& skip1,
                                  const std::optional<at::Tensor>& skip2, const std::optional<at::Tensor>& bias,
                                  const std::optional<at::Tensor>& scales, const at::Tensor& dst_row,
                                  const std::optional<at::Tensor>& experts, int64_t drop_pad_mode) {
  check_float(op, "expanded_permuted_rows", expanded);
  TORCH_CHECK_VALUE(expanded.dim() >= 2, op, ": argument 'expanded_permuted_rows' must be [rows, H] (or [E, C, H]); ",
                    "got shape ", expanded.sizes());
  TORCH_CHECK_VALUE(drop_pad_mode >= 0 && drop_pad_mode <= 3, op, ": argument 'drop_pad_mode' must be 0-3 (0/1: ",
                    "column-major pairs j*N+i, 2/3: token-major i*k+j; 1/3 capacity layout); got ", drop_pad_mode);
  check_index(op, "expanded_src_to_dst_row", dst_row);
  FinalizePlan fz;
  fz.H = expanded.size(-1);
  fz.R = expanded.numel() / std::max<int64_t>(fz.H, 1);
  if (skip1.has_value()) fz.N = skip1->size(0);
  else if (scales.has_value()) fz.N = scales->size(0);
  else if (experts.has_value()) fz.N = experts->size(0);
  else TORCH_CHECK_VALUE(false, op, ": one of 'skip1', 'scales' or 'export_for_source_row' is needed to know the ",
                         "token count N");
  const int64_t n = dst_row.numel();
  TORCH_CHECK_VALUE(dst_row.dim() == 1 && (fz.N == 0 ? n == 0 : n % fz.N == 0), op, ": argument ",
                    "'expanded_src_to_dst_row' of shape ", dst_row.sizes(), " must be 1-D [N*k] with N = ", fz.N);
  fz.k = fz.N ? n / fz.N : 0;
  // With no tokens, k is read from the [N, k] arguments so an empty batch gives an empty result.
  if (fz.N == 0 && scales.has_value() && scales->dim() == 2) fz.k = scales->size(1);
  else if (fz.N == 0 && experts.has_value() && experts->dim() == 2) fz.k = experts->size(1);
  for (const auto& [name, t] : {std::pair<const char*, const std::optional<at::Tensor>*>{"skip1", &skip1},
                                {"skip2", &skip2}}) {
    if (!t->has_value()) continue;
    check_same_dtype(op, name, **t, "expanded_permuted_rows", expanded);
    TORCH_CHECK_VALUE((*t)->dim() == 2 && (*t)->size(0) == fz.N && (*t)->size(1) == fz.H, op, ": argument '", name,
                      "' of shape ", (*t)->sizes(), " must be [N, H] = [", fz.N, ", ", fz.H, "]");
  }
  if (scales.has_value()) {
    check_float(op, "scales", *scales);
    TORCH_CHECK_VALUE(scales->dim() == 2 && scales->size(0) == fz.N && scales->size(1) == fz.k, op,
                      ": argument 'scales' of shape ", scales->sizes(), " must be [N, k] = [", fz.N, ", ", fz.k,
                      "] (k = the length ", n, " of 'expanded_src_to_dst_row' / N)");
  }
  const std::vector<int64_t> raw = read_index(dst_row);
  // Dropless modes (0/2) also accept a sorted position past the rows, [R, N*k): moe_init_routing_v2 gives every
  // routed pair its position, also the pairs active_num leaves without a row. Such a pair contributes nothing, as
  // -1 does (moe_token_unpermute's rule for the pairs num_out_tokens drops). Capacity modes: -1 or a slot.
  const bool dropless = drop_pad_mode == 0 || drop_pad_mode == 2;
  check_rows_in_range(op, "expanded_src_to_dst_row", raw, dropless ? std::max(fz.R, n) : fz.R, true);
  const bool column_major = drop_pad_mode <= 1;
  fz.src.resize(n);
  for (int64_t i = 0; i < fz.N; ++i)
    for (int64_t j = 0; j < fz.k; ++j) {
      const int64_t r = raw[column_major ? j * fz.N + i : i * fz.k + j];
      fz.past_rows = fz.past_rows || r >= fz.R;
      fz.src[i * fz.k + j] = r >= fz.R ? -1 : r;
    }
  fz.repeated_rows = first_repeated_row(fz.src, fz.R) >= 0;
  if (bias.has_value()) {
    check_same_dtype(op, "bias", *bias, "expanded_permuted_rows", expanded);
    TORCH_CHECK_VALUE(bias->dim() == 2 && bias->size(1) == fz.H, op, ": argument 'bias' of shape ", bias->sizes(),
                      " must be [E, H] with H = ", fz.H);
    TORCH_CHECK_VALUE(experts.has_value(), op, ": argument 'export_for_source_row' (the expert of each pair) is ",
                      "required with bias");
    check_index(op, "export_for_source_row", *experts);
    TORCH_CHECK_VALUE(experts->dim() == 2 && experts->size(0) == fz.N && experts->size(1) == fz.k, op,
                      ": argument 'export_for_source_row' of shape ", experts->sizes(), " must be [N, k] = [", fz.N,
                      ", ", fz.k, "]");
    fz.expert = read_index(*experts);
    for (size_t f = 0; f < fz.expert.size(); ++f)
      TORCH_CHECK_VALUE(fz.expert[f] >= 0 && fz.expert[f] < bias->size(0), op, ": argument 'export_for_source_row'[",
                        f, "] = ", fz.expert[f], " is out of range [0, E = bias.size(0) = ", bias->size(0), ")");
  }
  return fz;
}

}  // namespace moe
}  // namespace npu_fa
