// Argument checks of the MoE ops shared by every backend (the CPU kernels in aten_ops/cpu/moe, the npu kernels in
// aten_ops/npu/moe), so all raise the same errors. The CPU-only helpers live in aten_ops/cpu/moe/routing_helpers.h.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

namespace npu_fa {
namespace moe {

inline void check_float(const char* op, const char* name, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble, op, ": argument '",
                   name, "' must be float32, float16, bfloat16 or float64; got ", s);
}

inline void check_index(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": argument '", name,
                   "' must be int32 or int64; got ", t.scalar_type());
}

inline void check_same_dtype(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                             const at::Tensor& ref) {
  TORCH_CHECK_TYPE(t.scalar_type() == ref.scalar_type(), op, ": argument '", name, "' (", t.scalar_type(),
                   ") must have the dtype of '", ref_name, "' (", ref.scalar_type(), ")");
}

// The argument checks of moe_gating_top_k_softmax(_v2, _grad), shared by the CPU kernels (gating.cpp) and the
// npu kernels (aten_ops/npu/moe/moe.cpp) so both backends raise identical errors.
struct GatingShape {
  int64_t rows, E;
  std::vector<int64_t> out_sizes;  // x.shape[:-1] + [k]
};

inline GatingShape check_gating(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& finished,
                                int64_t k) {
  moe::check_float(op, "x", x);
  TORCH_CHECK_VALUE(x.dim() == 2 || x.dim() == 3, op, ": argument 'x' must be 2-D [N, E] or 3-D [B, S, E]; got shape ",
                    x.sizes());
  GatingShape g{1, x.size(-1), {}};
  for (int64_t d = 0; d + 1 < x.dim(); ++d) {
    g.rows *= x.size(d);
    g.out_sizes.push_back(x.size(d));
  }
  g.out_sizes.push_back(k);
  TORCH_CHECK_VALUE(k >= 1 && k <= g.E, op, ": argument 'k' must satisfy 1 <= k <= num_experts (x.size(-1) = ", g.E,
                    "); got k=", k);
  TORCH_CHECK_VALUE(k <= 1024, op, ": argument 'k' must be at most 1024; got k=", k);
  if (finished.has_value()) {
    TORCH_CHECK_TYPE(finished->scalar_type() == at::kBool, op, ": argument 'finished' must be bool; got ",
                     finished->scalar_type());
    TORCH_CHECK_VALUE(finished->sizes() == x.sizes().slice(0, x.dim() - 1), op, ": argument 'finished' of shape ",
                      finished->sizes(), " must be x.shape[:-1] = ", x.sizes().slice(0, x.dim() - 1));
  }
  return g;
}

// Index tensors are read as a contiguous int64 host copy: simple, their size (N*k) is small next to the rows, and
// every index is checked before a kernel reads through it (for npu tensors this is a device-to-host copy).
inline std::vector<int64_t> read_index(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = c.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

inline void check_gating_renorm(const char* op, int64_t renorm) {
  TORCH_CHECK_VALUE(renorm == 0 || renorm == 1, op, ": argument 'renorm' must be 0 (softmax, then top-k) or 1 (top-k, ",
                    "then softmax over the k); got ", renorm);
}

// Every value in [0, limit) or -1 (when allowed). Enough for an index the op only reads rows through: two pairs
// may read the same row.
inline void check_rows_in_range(const char* op, const char* name, const std::vector<int64_t>& v, int64_t limit,
                                bool allow_minus_one) {
  for (size_t f = 0; f < v.size(); ++f) {
    const int64_t r = v[f];
    if (r == -1 && allow_minus_one) continue;
    TORCH_CHECK_VALUE(r >= 0 && r < limit, op, ": argument '", name, "'[", f, "] = ", r, " is out of range; expected ",
                      allow_minus_one ? "-1 (dropped) or " : "", "a row in [0, ", limit, ")");
  }
}

// The first row in v (values -1 or in [0, limit), checked) named a second time, or -1.
inline int64_t first_repeated_row(const std::vector<int64_t>& v, int64_t limit) {
  std::vector<uint8_t> seen(std::max<int64_t>(limit, 0), 0);
  for (const int64_t r : v) {
    if (r < 0) continue;
    if (seen[r]) return r;
    seen[r] = 1;
  }
  return -1;
}

// In range (as above) and no value twice: the rows written through it must be distinct, or two pairs would write
// the same row and the result would depend on their order.
inline void check_destinations(const char* op, const char* name, const std::vector<int64_t>& v, int64_t limit,
                               bool allow_minus_one) {
  check_rows_in_range(op, name, v, limit, allow_minus_one);
  const int64_t r = first_repeated_row(v, limit);
  TORCH_CHECK_VALUE(r < 0, op, ": argument '", name, "' names row ", r,
                    " more than once; every (token, slot) pair needs its own row");
}

// The 2-D [N, H] view checks shared by the ops that take token rows.
inline void check_rows2d(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.dim() == 2, op, ": argument '", name, "' must be 2-D [num_tokens, H]; got shape ", t.sizes());
}

}  // namespace moe
}  // namespace npu_fa
