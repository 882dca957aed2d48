// Argument checks of moe_init_routing_v2 shared by the CPU kernel (aten_ops/cpu/moe/init_routing.cpp) and the npu
// kernel (aten_ops/npu/moe/moe_init_routing.cpp), so both raise the same errors: every argument and shape first
// (`check_init_routing_v2`), then the expert of every pair, read on the host (`init_routing_v2_keys`).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "common/checked_math.h"
#include "common/moe/routing.h"
#include "generated/op_args.h"

namespace npu_fa {
namespace moe {

// What the arguments of one call fix before any expert index is read.
struct InitRoutingV2Shape {
  int64_t N = 0, k = 1, H = 0, pairs = 0;  // pairs = N*k, token-major (f = i*k + j)
  bool capacity = false;                   // drop_pad_mode 1: [expert_num, expert_capacity, H] slots
  bool quant = false;                      // quant_mode 0/1: int8 rows
  int64_t lo = 0, hi = -1;                 // experts routed: [lo, hi); hi = -1: any expert >= 0 (from the data)
  bool drop_outside = false;               // experts outside [lo, hi) are dropped (active_expert_range), not errors
  int64_t rows_out = 0;                    // rows of expanded_x (E*C in capacity mode)
  int64_t num_counted = 0;                 // experts [lo, lo + num_counted) in the token-count output
};

inline void check_init_routing_v2_modes(const char* op, const MoeInitRoutingV2Args& a) {
  TORCH_CHECK_VALUE(a.quant_mode >= -1 && a.quant_mode <= 1, op,
                    ": argument 'quant_mode' must be -1 (no quantisation), 0 (static int8) or 1 (dynamic per-row ",
                    "int8); got ", a.quant_mode);
  TORCH_CHECK_VALUE(a.quant_mode == 0 || !a.offset.has_value(), op,
                    ": argument 'offset' is only used by the static quantisation (quant_mode 0); pass None");
  if (a.quant_mode >= 0)
    TORCH_CHECK_TYPE(a.x.scalar_type() == at::kFloat || a.x.scalar_type() == at::kHalf ||
                         a.x.scalar_type() == at::kBFloat16,
                     op, ": argument 'x' must be float16, bfloat16 or float32 when quant_mode is ", a.quant_mode,
                     " (it is quantised to int8); got ", a.x.scalar_type());
  TORCH_CHECK_VALUE(a.row_idx_type == 0 || a.row_idx_type == 1, op,
                    ": argument 'row_idx_type' must be 0 (gather index: destination row per pair) or 1 (scatter ",
                    "index: pair per sorted row); got ", a.row_idx_type);
  TORCH_CHECK_VALUE(a.row_idx_type == 0 || a.drop_pad_mode == 0, op,
                    ": argument 'row_idx_type' 1 is supported in dropless mode (drop_pad_mode 0) only");
  TORCH_CHECK_VALUE(a.expert_tokens_num_type >= 0 && a.expert_tokens_num_type <= 2, op, ": argument ",
                    "'expert_tokens_num_type' must be 0 (cumsum), 1 (count) or 2 ((expert, count) pairs); got ",
                    a.expert_tokens_num_type);
  TORCH_CHECK_VALUE(a.drop_pad_mode == 0 || a.drop_pad_mode == 1, op, ": argument 'drop_pad_mode' must be 0 ",
                    "(dropless) or 1 (capacity drop/pad); got ", a.drop_pad_mode);
}

// The routed expert span [lo, hi) from expert_num and active_expert_range (checked).
inline void init_routing_v2_span(const char* op, const MoeInitRoutingV2Args& a, InitRoutingV2Shape& s) {
  at::IntArrayRef range = a.active_expert_range;
  // In capacity mode the range can only be every expert, [0, expert_num) (as torch_npu documents): no range then.
  if (!range.empty() && s.capacity && range.size() == 2 && range[0] == 0 && range[1] == a.expert_num) range = {};
  if (!range.empty()) {
    TORCH_CHECK_VALUE(range.size() == 2 && range[0] >= 0 && range[0] < range[1], op, ": argument ",
                      "'active_expert_range' must be [start, end) with 0 <= start < end; got ", range);
    TORCH_CHECK_VALUE(!s.capacity, op, ": argument 'active_expert_range' must be empty or [0, expert_num) in ",
                      "capacity mode (drop_pad_mode 1); got ", range);
    s.lo = range[0];
    s.hi = range[1];
    s.drop_outside = true;
  } else if (a.expert_num > 0) {
    s.hi = a.expert_num;
  }
  if (s.capacity) {
    TORCH_CHECK_VALUE(a.expert_num > 0, op, ": argument 'expert_num' must be > 0 in capacity mode (drop_pad_mode 1); ",
                      "got ", a.expert_num);
    TORCH_CHECK_VALUE(a.expert_capacity > 0, op, ": argument 'expert_capacity' must be > 0 in capacity mode ",
                      "(drop_pad_mode 1); got ", a.expert_capacity);
  }
  if (s.hi >= 0) {
    // Three counters per expert of the span (plus the dropped bucket) are allocated by the sort: a span given by
    // the user is bounded before those allocations.
    const char* what = range.empty() ? "argument 'expert_num' (three counters per expert)"
                                     : "argument 'active_expert_range' (three counters per expert of end - start)";
    check_alloc(op, what, checked_add(op, what, s.hi - s.lo, 1), 3 * static_cast<int64_t>(sizeof(int64_t)));
  }
  if (s.capacity) {
    // The output is [expert_num, expert_capacity, H]: bounded before it and the slot table are allocated.
    const int64_t slots = checked_mul(op, "arguments 'expert_num' * 'expert_capacity'", a.expert_num,
                                      a.expert_capacity);
    const char* what = "the output [expert_num, expert_capacity, H] (arguments 'expert_num', 'expert_capacity')";
    check_alloc(op, what, checked_mul(op, what, slots, s.H), static_cast<int64_t>(a.x.element_size()));
    check_alloc(op, "the slot table of expert_num * expert_capacity rows", slots,
                static_cast<int64_t>(sizeof(int64_t)));
  }
  s.num_counted = s.hi >= 0 ? s.hi - s.lo : 0;
}

// Every argument and shape of one call (the expert values are checked by init_routing_v2_keys).
inline InitRoutingV2Shape check_init_routing_v2(const char* op, const MoeInitRoutingV2Args& a) {
  check_init_routing_v2_modes(op, a);
  check_rows2d(op, "x", a.x);
  check_index(op, "expert_idx", a.expert_idx);
  TORCH_CHECK_VALUE((a.expert_idx.dim() == 2 || a.expert_idx.dim() == 1) && a.expert_idx.size(0) == a.x.size(0), op,
                    ": argument 'expert_idx' of shape ", a.expert_idx.sizes(), " must be [N, k] or [N] with N = ",
                    "x.size(0) = ", a.x.size(0));
  InitRoutingV2Shape s;
  s.N = a.x.size(0);
  s.k = a.expert_idx.dim() == 2 ? a.expert_idx.size(1) : 1;
  s.H = a.x.size(1);
  s.pairs = s.N * s.k;
  s.capacity = a.drop_pad_mode == 1;
  s.quant = a.quant_mode >= 0;
  init_routing_v2_span(op, a, s);
  if (s.capacity) s.rows_out = a.expert_num * a.expert_capacity;
  else s.rows_out = a.active_num > 0 ? std::min(a.active_num, s.pairs) : s.pairs;
  if (a.expert_tokens_num_flag) {
    TORCH_CHECK_VALUE(s.num_counted > 0, op, ": expert_tokens_num_flag needs 'expert_num' > 0 or an ",
                      "'active_expert_range' (the experts to count)");
    TORCH_CHECK_VALUE(!s.capacity || a.expert_tokens_num_type == 1, op, ": in capacity mode (drop_pad_mode 1) the ",
                      "expert token numbers are counts: 'expert_tokens_num_type' must be 1; got ",
                      a.expert_tokens_num_type);
    // key_value: one (expert, count) row per expert of the range, in a [expert_num, 2] output.
    TORCH_CHECK_VALUE(a.expert_tokens_num_type != 2 || (a.expert_num > 0 && s.hi <= a.expert_num), op,
                      ": 'expert_tokens_num_type' 2 needs 'expert_num' > 0 and the counted experts [", s.lo, ", ",
                      s.lo + s.num_counted, ") inside [0, expert_num = ", a.expert_num, ")");
  }
  if (!s.quant && a.scale.has_value()) {
    TORCH_CHECK_TYPE(a.scale->scalar_type() == at::kFloat, op, ": argument 'scale' must be float32; got ",
                     a.scale->scalar_type());
    TORCH_CHECK_VALUE(a.scale->dim() == 1 && a.scale->size(0) == s.N, op, ": argument 'scale' of shape ",
                      a.scale->sizes(), " must be [N] = [", s.N, "] (one scale per token) in the unquantised mode");
  }
  return s;
}

// The sort key of every pair: expert - lo inside [lo, hi), hi - lo (the dropped bucket, sorted last) outside it;
// without a span (hi = -1) the expert itself. Raises for an expert outside the span that is not dropped.
inline std::vector<int64_t> init_routing_v2_keys(const char* op, const InitRoutingV2Shape& s,
                                                 const std::vector<int64_t>& experts) {
  if (s.hi < 0) return experts;  // checked (>= 0) by the sort's bucket count
  std::vector<int64_t> keys(experts.size());
  const int64_t width = s.hi - s.lo;
  for (size_t f = 0; f < experts.size(); ++f) {
    const int64_t e = experts[f];
    const bool inside = e >= s.lo && e < s.hi;
    TORCH_CHECK_VALUE(inside || (s.drop_outside && e >= 0), op, ": argument 'expert_idx'[", f, "] = ", e,
                      " is out of range; expected an expert in [", s.lo, ", ", s.hi, ")",
                      s.drop_outside ? " or another non-negative expert (dropped)" : " (expert_num)");
    keys[f] = inside ? e - s.lo : width;
  }
  return keys;
}

// The sort key of a pair outside the routed span [lo, hi) (experts of active_expert_range's complement): those
// pairs follow the routed ones in the sorted order that expanded_row_idx's scatter form (row_idx_type 1) lists, and
// among themselves they sort by expert as the NPU's int32 key sees it: experts above the span by value, experts
// below it as INT32_MAX (after every other; as do experts beyond int32), ties in pair order.
inline int64_t dropped_sort_key(int64_t expert, int64_t lo) {
  return expert < lo ? INT32_MAX : std::min<int64_t>(expert, INT32_MAX);
}

}  // namespace moe
}  // namespace npu_fa
