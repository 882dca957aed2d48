// Validation shared by the CPU kernel (aten_ops/cpu/linear_attention/causal_conv1d.cpp) and the npu glue
// (aten_ops/npu/linear_attention/causal_conv1d.cpp) of fused_causal_conv1d and its in-place _v2 form: every argument
// checked with the same messages (naming the argument, the expectation and what was given), and every sequence of
// the call resolved into a SeqPlan (which cache line it reads and writes, how many cached rows precede it, the pangu
// reset, the prefix-caching block fills). All index tensors are read on the host once, here. The dtype and index
// helpers also serve masked_causal_conv1d.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/linear_attention/causal_conv1d_plan.h"

namespace npu_fa::linear_attention {

inline void check_conv_float(const char* op, const char* name, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kHalf || s == at::kBFloat16 || s == at::kFloat || s == at::kDouble, op, ": argument '",
                   name, "' must be float16, bfloat16, float32 or float64; got ", s);
}

inline void check_same_dtype(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                      const at::Tensor& ref) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": argument '", name, "' must have the dtype of '",
                   ref_name, "' (", ref.scalar_type(), "); got ", t.scalar_type());
}

// An int32 / int64 index tensor of `n` values (1-D) read to the host.
inline std::vector<int64_t> read_indices(const char* op, const char* name, const at::Tensor& t, int64_t n,
                                  const char* what) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": argument '", name,
                   "' must be int32 or int64; got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == n, op, ": argument '", name, "' must be 1-D [", n, "] (", what,
                    "); got shape ", t.sizes());
  const at::Tensor l = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + n);
}

inline std::vector<int64_t> read_optional(const char* op, const char* name, const std::optional<at::Tensor>& t, int64_t n,
                                   const char* what) {
  return t.has_value() ? read_indices(op, name, *t, n, what) : std::vector<int64_t>{};
}

// Sequence starts and lengths: x [T, dim] cut by query_start_loc, or x [batch, L, dim].
inline void sequence_bounds(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& query_start_loc,
                     std::vector<int64_t>& start, std::vector<int64_t>& len) {
  if (x.dim() == 3) {
    const int64_t B = x.size(0), L = x.size(1);
    for (int64_t b = 0; b < B; ++b) start.push_back(b * L), len.push_back(L);
    if (query_start_loc.has_value()) {
      const auto q = read_indices(op, "query_start_loc", *query_start_loc, B + 1, "batch+1 cumulative starts");
      for (int64_t b = 0; b <= B; ++b)
        TORCH_CHECK_VALUE(q[b] == b * L, op, ": argument 'query_start_loc' must be [0, L, 2L, ...] for a 3-D x [",
                          B, ", ", L, ", dim]; got ", q[b], " at ", b);
    }
    return;
  }
  TORCH_CHECK_VALUE(query_start_loc.has_value(), op,
                    ": argument 'query_start_loc' is required when x is 2-D [tokens, dim] (it cuts x into sequences)");
  const at::Tensor& q = *query_start_loc;
  TORCH_CHECK_VALUE(q.dim() == 1 && q.size(0) >= 1, op,
                    ": argument 'query_start_loc' must be 1-D [batch+1]; got shape ", q.sizes());
  const auto v = read_indices(op, "query_start_loc", q, q.size(0), "batch+1 cumulative starts");
  const int64_t T = x.size(0);
  for (size_t b = 0; b < v.size(); ++b) {
    TORCH_CHECK_VALUE(v[b] >= 0 && v[b] <= T, op, ": argument 'query_start_loc' must lie in [0, tokens=", T,
                      "]; got ", v[b], " at ", b);
    TORCH_CHECK_VALUE(b == 0 || v[b] >= v[b - 1], op, ": argument 'query_start_loc' must be non-decreasing; got ",
                      v[b - 1], " then ", v[b], " at ", b);
  }
  for (size_t b = 0; b + 1 < v.size(); ++b) start.push_back(v[b]), len.push_back(v[b + 1] - v[b]);
}

// The K-1 rows ending each block completed by this call (prefix caching): token positions in the sequence.
inline std::vector<int64_t> block_fill_positions(int64_t computed, int64_t len, int64_t block_size, int64_t n_fill) {
  const int64_t done_in_block = computed % block_size;
  const int64_t to_boundary = block_size - done_in_block;
  const int64_t tail = (((len - to_boundary) % block_size) + block_size) % block_size;
  int64_t last_full = len - tail;
  if (tail == 0) last_full -= block_size;
  std::vector<int64_t> at;
  for (int64_t chunk = 0; chunk < n_fill; ++chunk) at.push_back(last_full - (n_fill - chunk - 1) * block_size);
  return at;
}

template <class Args>
FusedPlan plan_fused(const char* op, const Args& a) {
  const at::Tensor &x = a.x, &weight = a.weight, &states = a.conv_states;
  check_conv_float(op, "x", x);
  check_same_dtype(op, "weight", weight, "x", x);
  check_same_dtype(op, "conv_states", states, "x", x);
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3, op,
                    ": argument 'x' must be 2-D [tokens, dim] or 3-D [batch, seq_len, dim]; got shape ", x.sizes());
  FusedPlan p;
  p.dim = x.size(-1);
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(0) >= 1 && weight.size(1) == p.dim, op,
                    ": argument 'weight' must be 2-D [K, dim] with K >= 1 and dim = ", p.dim,
                    " (x's last dimension); got shape ", weight.sizes());
  p.K = weight.size(0);
  TORCH_CHECK_VALUE(states.dim() == 3 && states.size(1) >= p.K - 1 && states.size(2) == p.dim, op,
                    ": argument 'conv_states' must be 3-D [slots, state_len, dim] with state_len >= K-1 = ", p.K - 1,
                    " and dim = ", p.dim, "; got shape ", states.sizes());
  p.slots = states.size(0);
  p.C = states.size(1);
  if (a.bias.has_value()) {
    check_same_dtype(op, "bias", *a.bias, "x", x);
    TORCH_CHECK_VALUE(a.bias->dim() == 1 && a.bias->size(0) == p.dim, op, ": argument 'bias' must be 1-D [dim] = [",
                      p.dim, "]; got shape ", a.bias->sizes());
  }
  const std::string act(a.activation);
  TORCH_CHECK_VALUE(act == "None" || act == "none" || act.empty() || act == "silu" || act == "swish", op,
                    ": argument 'activation' must be \"None\", \"silu\" or \"swish\"; got \"", act, "\"");
  p.silu = act == "silu" || act == "swish";
  TORCH_CHECK_VALUE(a.residual_connection == 0 || a.residual_connection == 1, op,
                    ": argument 'residual_connection' must be 0 or 1; got ", a.residual_connection);
  p.residual = a.residual_connection == 1;
  const std::string mode(a.conv_mode);
  TORCH_CHECK_VALUE(mode == "default" || mode == "pangu", op,
                    ": argument 'conv_mode' must be \"default\" or \"pangu\"; got \"", mode, "\"");
  const bool pangu = mode == "pangu";

  std::vector<int64_t> start, len;
  sequence_bounds(op, x, a.query_start_loc, start, len);
  const int64_t B = static_cast<int64_t>(len.size());
  const int64_t longest = B ? *std::max_element(len.begin(), len.end()) : 0;
  TORCH_CHECK_VALUE(a.max_query_len == -1 || a.max_query_len >= longest, op,
                    ": argument 'max_query_len' must be -1 or at least the longest sequence (", longest, "); got ",
                    a.max_query_len);

  const bool apc = a.cache_indices.has_value() && a.cache_indices->dim() == 2;
  p.prefix_caching = apc;
  std::vector<int64_t> lines;  // [B] (1-D) or [B * max_blocks] (2-D)
  int64_t max_blocks = 1;
  if (a.cache_indices.has_value()) {
    const at::Tensor& ci = *a.cache_indices;
    TORCH_CHECK_TYPE(ci.scalar_type() == at::kInt || ci.scalar_type() == at::kLong, op,
                     ": argument 'cache_indices' must be int32 or int64; got ", ci.scalar_type());
    TORCH_CHECK_VALUE((ci.dim() == 1 || ci.dim() == 2) && ci.size(0) == B, op,
                      ": argument 'cache_indices' must be [batch] = [", B, "] or, for prefix caching, [batch, "
                      "max_blocks]; got shape ", ci.sizes());
    if (apc) max_blocks = ci.size(1);
    const at::Tensor l = ci.to(at::kCPU, at::kLong).contiguous();
    lines.assign(l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel());
  } else {
    TORCH_CHECK_VALUE(p.slots >= B, op, ": argument 'conv_states' must have at least batch = ", B,
                      " lines when cache_indices is None (sequence b uses line b); got ", p.slots);
  }
  const auto accepted = read_optional(op, "num_accepted_tokens", a.num_accepted_tokens, B, "one per sequence");
  const auto computed = read_optional(op, "num_computed_tokens", a.num_computed_tokens, B, "one per sequence");
  const auto has_state = read_optional(op, "initial_state_mode", a.initial_state_mode, B, "one per sequence");
  TORCH_CHECK_VALUE(!pangu || !computed.empty(), op,
                    ": argument 'num_computed_tokens' is required with conv_mode=\"pangu\"");
  std::vector<int64_t> first, last, initial;
  if (apc) {
    TORCH_CHECK_VALUE(a.block_idx_first_scheduled_token.has_value() && a.block_idx_last_scheduled_token.has_value() &&
                          a.initial_state_idx.has_value() && !computed.empty(),
                      op, ": a 2-D argument 'cache_indices' (prefix caching) requires block_idx_first_scheduled_token, "
                      "block_idx_last_scheduled_token, initial_state_idx and num_computed_tokens");
    TORCH_CHECK_VALUE(a.block_size >= 2, op, ": argument 'block_size' must be at least 2; got ", a.block_size);
    first = read_indices(op, "block_idx_first_scheduled_token", *a.block_idx_first_scheduled_token, B,
                         "one per sequence");
    last = read_indices(op, "block_idx_last_scheduled_token", *a.block_idx_last_scheduled_token, B,
                        "one per sequence");
    initial = read_indices(op, "initial_state_idx", *a.initial_state_idx, B, "one per sequence");
  } else {
    const char* given = a.block_idx_first_scheduled_token.has_value()   ? "block_idx_first_scheduled_token"
                        : a.block_idx_last_scheduled_token.has_value() ? "block_idx_last_scheduled_token"
                        : a.initial_state_idx.has_value()              ? "initial_state_idx"
                                                                       : nullptr;
    TORCH_CHECK_VALUE(given == nullptr, op, ": argument '", given,
                      "' is for prefix caching, which needs a 2-D cache_indices [batch, max_blocks]");
  }

  std::vector<int64_t> owner(static_cast<size_t>(p.slots), -1);  // the sequence that touches each line
  auto claim = [&](int64_t line, int64_t b, const char* role) {
    TORCH_CHECK_VALUE(line >= 0 && line < p.slots, op, ": argument 'cache_indices' must lie in [0, slots=", p.slots,
                      ") or be pad_slot_id=", a.pad_slot_id, "; got ", line, " (", role, " line of sequence ", b, ")");
    TORCH_CHECK_VALUE(owner[line] == -1 || owner[line] == b, op, ": argument 'cache_indices': line ", line,
                      " is used by sequences ", owner[line], " and ", b,
                      "; the cache lines of different sequences must be distinct");
    owner[line] = b;
  };
  for (int64_t b = 0; b < B; ++b) {
    SeqPlan s;
    s.start = start[b];
    s.len = len[b];
    if (apc) {
      TORCH_CHECK_VALUE(first[b] >= 0 && first[b] <= last[b] && last[b] < max_blocks, op,
                        ": arguments 'block_idx_first_scheduled_token' and 'block_idx_last_scheduled_token' must "
                        "satisfy 0 <= first <= last < max_blocks = ", max_blocks, "; got ", first[b], " and ", last[b],
                        " for sequence ", b);
      TORCH_CHECK_VALUE(initial[b] >= 0 && initial[b] <= last[b] && initial[b] <= first[b] + 1, op,
                        ": argument 'initial_state_idx' must lie in [0, min(block_idx_last_scheduled_token, "
                        "block_idx_first_scheduled_token + 1)]; got ", initial[b], " for sequence ", b);
      s.read_line = lines[b * max_blocks + initial[b]];
      s.write_line = lines[b * max_blocks + last[b]];
    } else {
      s.read_line = s.write_line = lines.empty() ? b : lines[b];
    }
    if (s.read_line == a.pad_slot_id) continue;  // a padded batch entry: nothing computed, nothing written
    claim(s.read_line, b, "read");
    claim(s.write_line, b, "write");
    if (!accepted.empty()) {
      TORCH_CHECK_VALUE(accepted[b] >= 1 && accepted[b] <= std::max<int64_t>(s.len, 1), op,
                        ": argument 'num_accepted_tokens' must lie in [1, the sequence's length ", s.len, "]; got ",
                        accepted[b], " for sequence ", b);
      TORCH_CHECK_VALUE(accepted[b] - 1 + p.K - 1 <= p.C, op, ": argument 'num_accepted_tokens' reads rows up to ",
                        accepted[b] - 1 + p.K - 1, " of a cache line of state_len ", p.C, " (sequence ", b, ")");
    }
    if (!computed.empty())
      TORCH_CHECK_VALUE(computed[b] >= 0, op, ": argument 'num_computed_tokens' must be >= 0; got ", computed[b],
                        " for sequence ", b);
    const bool zero_state = (!computed.empty() && computed[b] == 0) || (!has_state.empty() && has_state[b] == 0);
    if (zero_state) {
      s.read_line = -1;
      s.offset = 0;
    } else {
      s.offset = accepted.empty() ? p.C - (p.K - 1) : accepted[b] - 1;
    }
    if (pangu) s.reset = std::min(std::max<int64_t>(p.K - 1 - computed[b], 0), s.len);
    if (apc) {
      const int64_t n_fill = last[b] - first[b];
      s.fill_at = block_fill_positions(computed[b], s.len, a.block_size, n_fill);
      for (int64_t chunk = 0; chunk < n_fill; ++chunk) {
        TORCH_CHECK_VALUE(s.fill_at[chunk] > 0 && s.fill_at[chunk] <= s.len, op,
                          ": arguments 'block_idx_first_scheduled_token' / 'block_idx_last_scheduled_token' ask for ",
                          n_fill, " completed blocks of ", a.block_size, " tokens, more than sequence ", b, " (", s.len,
                          " tokens after ", computed[b], " computed) completes");
        const int64_t line = lines[b * max_blocks + first[b] + chunk];
        claim(line, b, "block");
        s.fill_lines.push_back(line);
      }
    }
    p.seqs.push_back(std::move(s));
  }
  return p;
}

}  // namespace npu_fa::linear_attention
