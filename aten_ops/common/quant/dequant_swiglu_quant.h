// Argument checks of dequant_swiglu_quant (torch_npu npu_dequant_swiglu_quant), shared by every backend: one parser
// turns the arguments into the shapes, row groups and per-group scale tables the kernels read, with one set of
// messages (each names the argument, what it must be and what was given).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace npu_fa {
struct DequantSwigluQuantArgs;  // generated/op_args.h
}  // namespace npu_fa

namespace npu_fa::quant {

struct DequantSwigluQuantPlan {
  int64_t dim = 0;          // activate_dim, normalised to [0, x.dim())
  bool last_dim = true;     // activate_dim is x's last dimension
  int64_t rows = 0;         // rows of x's last dimension: numel / cols
  int64_t cols = 0;         // x.size(-1)
  int64_t pre = 0;          // product of x's sizes before dim
  int64_t cut = 0;          // x.size(dim) (even)
  int64_t post = 0;         // product of x's sizes after dim
  int64_t y_rows = 0;       // rows of y's last dimension
  int64_t y_cols = 0;       // y.size(-1)
  int64_t groups = 1;       // G: group_index's length, 1 without it
  std::vector<int64_t> group_end;  // cumulative row ends of the groups (x's rows; y's rows when last_dim)
  int64_t active_rows = 0;  // rows computed: group_end.back() (all rows without group_index)
  std::vector<int64_t> y_shape, scale_shape;
};

// Validates every argument (dtypes, shapes, modes, the group counts) and returns the plan. Raises ValueError /
// TypeError naming the argument.
DequantSwigluQuantPlan parse_dequant_swiglu_quant(const DequantSwigluQuantArgs& args);

// A per-row-group parameter as a float32 [G, n] table (row g: group g's values along the last dimension):
// [G, n], [1, n] or [n] (shared by every group), [G, 1] or [G] (one value per group), [1] (one value). When G == n a
// 1-D tensor is taken per channel. Raises ValueError naming the argument for any other shape.
at::Tensor per_group_table(const char* op, const char* name, const at::Tensor& t, int64_t groups, int64_t n);

}  // namespace npu_fa::quant
