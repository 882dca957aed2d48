// CPU kernel of grouped_matmul_add (torch_npu's npu_grouped_matmul_add_, MindSpeed's weight-gradient
// accumulation): y[g] += x_g^T @ weight_g, the groups splitting the token (reduced) dimension M of x [M, K] and
// weight [M, N]. 16-bit operands widen exactly to fp32 once, so every product and sum is an fp32 GEMM (at::addmm_
// into y's group slice, which ATen runs on its BLAS); a y in x's 16-bit dtype is accumulated in fp32 and rounded
// once per group.
#include <ATen/ATen.h>

#include <vector>

#include "generated/kernels.h"

namespace npu_fa {

void grouped_matmul_add_cpu(const GroupedMatmulAddArgs& args) {
  const char* op = "grouped_matmul_add";
  TORCH_CHECK_VALUE(args.transpose_x && !args.transpose_weight, op, ": only transpose_x=True and ",
                    "transpose_weight=False are supported (upstream's only form); got transpose_x=",
                    args.transpose_x, ", transpose_weight=", args.transpose_weight);
  TORCH_CHECK_VALUE(args.group_type == 2, op, ": argument 'group_type' must be 2 (groups split the reduced ",
                    "dimension M of x and weight); got ", args.group_type);
  TORCH_CHECK_VALUE(args.group_list_type == 0 || args.group_list_type == 1, op, ": argument 'group_list_type' must ",
                    "be 0 (cumulative ends) or 1 (counts); got ", args.group_list_type);
  const at::Tensor &x = args.x, &w = args.weight, &y = args.y;
  const auto s = x.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble, op,
                   ": argument 'x' must be float16, bfloat16, float32 or float64; got ", s);
  TORCH_CHECK_TYPE(w.scalar_type() == s, op, ": argument 'weight' (", w.scalar_type(),
                   ") must have the dtype of 'x' (", s, ")");
  const at::ScalarType acc = s == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK_TYPE(y.scalar_type() == acc || y.scalar_type() == s, op, ": argument 'y' must be ", acc,
                   " (or x's dtype ", s, "); got ", y.scalar_type());
  TORCH_CHECK_VALUE(x.dim() == 2 && w.dim() == 2 && x.size(0) == w.size(0), op, ": arguments 'x' [M, K] and ",
                    "'weight' [M, N] must be 2-D with the same M; got ", x.sizes(), " and ", w.sizes());
  const at::Tensor& gl = args.group_list;
  TORCH_CHECK_TYPE(gl.scalar_type() == at::kLong || gl.scalar_type() == at::kInt, op,
                   ": argument 'group_list' must be int64 (or int32); got ", gl.scalar_type());
  TORCH_CHECK_VALUE(gl.dim() == 1 && gl.numel() >= 1, op, ": argument 'group_list' must be 1-D [G] with G >= 1; ",
                    "got shape ", gl.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = w.size(1), G = gl.numel();
  TORCH_CHECK_VALUE((y.dim() == 2 && y.size(0) == G * K && y.size(1) == N) ||
                        (y.dim() == 3 && y.size(0) == G && y.size(1) == K && y.size(2) == N),
                    op, ": argument 'y' must be [G*K, N] = [", G * K, ", ", N, "] or [G, K, N] = [", G, ", ", K, ", ",
                    N, "]; got ", y.sizes());
  const at::Tensor glv = gl.to(at::kLong).contiguous();
  const int64_t* gp = glv.data_ptr<int64_t>();
  std::vector<int64_t> ends(G);
  for (int64_t g = 0; g < G; ++g) {
    ends[g] = args.group_list_type == 0 ? gp[g] : (g ? ends[g - 1] : 0) + gp[g];
    const int64_t prev = g ? ends[g - 1] : 0;
    TORCH_CHECK_VALUE((args.group_list_type == 0 ? gp[g] >= prev : gp[g] >= 0) && ends[g] <= M, op,
                      ": argument 'group_list' must give ", args.group_list_type == 0 ? "non-decreasing ends" : "non-negative counts",
                      " within M = ", M, " rows; got ", glv);
  }
  if (K == 0 || N == 0) return;
  const at::Tensor xf = x.to(acc), wf = w.to(acc);  // exact widening; no-op for fp32 / fp64
  const at::Tensor y3 = y.view({G, K, N});
  int64_t start = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t end = ends[g];
    if (end > start) {
      const at::Tensor xg = xf.narrow(0, start, end - start), wg = wf.narrow(0, start, end - start);
      at::Tensor yg = y3.select(0, g);
      if (y.scalar_type() == acc) {
        yg.addmm_(xg.t(), wg);
      } else {
        yg.copy_(at::addmm(yg.to(acc), xg.t(), wg));
      }
    }
    start = end;
  }
}

}  // namespace npu_fa
