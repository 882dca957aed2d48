// PrivateUse1 (npu) kernels of rotary_position_embedding and its backward: the Ascend C kernel
// ascendc/kernels/rope/rotary_position_embedding_kernel.cpp for what it handles, the CPU kernel on CPU aliases of
// the npu tensors otherwise (simulated device only). docs/ascendc_rope.md lists which is which.
//
// Kernel: modes 0 (half) and 1 (interleave); x float32/float16/bfloat16; cos/sin of any float dtype (passed in
// x's dtype when both already are, else converted to float32 as the CPU op does); cos/sin whose broadcast to x is
// "outer broadcast dims x table dims x inner broadcast dims" (every standard layout); D small enough for UB.
// Backward: dx, dcos and dsin by the grad kernel (dcos/dsin reduced over the broadcast dims by atomic adds into
// fp32 accumulators).
#include <ATen/ATen.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/rope/params.h"
#include "generated/kernels.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"
#include "rope/rotary_position_embedding_tiling.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "rope/rotary_position_embedding_kernel.h"
#endif

namespace npu_fa {
namespace {

using tot_ascendc::RopeProblem;
using tot_ascendc::RotaryPositionEmbeddingTiling;

bool kernel_dtype(at::ScalarType s, uint32_t* code) {
  switch (s) {
    case at::kFloat: *code = tot_ascendc::kRopeFloat32; return true;
    case at::kHalf: *code = tot_ascendc::kRopeFloat16; return true;
    case at::kBFloat16: *code = tot_ascendc::kRopeBFloat16; return true;
    default: return false;
  }
}

// The table's shape right-aligned to x's rank (leading 1s).
std::vector<int64_t> aligned_shape(const at::Tensor& table, int64_t rank) {
  std::vector<int64_t> s(rank - table.dim(), 1);
  for (int64_t d : table.sizes()) s.push_back(d);
  return s;
}

// A kernel launch plan, or why the kernel does not take this call.
struct Plan {
  std::string why_not;
  RotaryPositionEmbeddingTiling tiling{};
  at::ScalarType table_dtype = at::kFloat;
};

Plan plan(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t mode, bool grad) {
  Plan p;
  RopeProblem prob;
  if (mode != 0 && mode != 1) {
    p.why_not = "mode " + std::to_string(mode) + " (the kernel has half and interleave)";
    return p;
  }
  if (!kernel_dtype(x.scalar_type(), &prob.x_dtype)) {
    p.why_not = std::string("x dtype ") + c10::toString(x.scalar_type());
    return p;
  }
  const bool same = cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type();
  p.table_dtype = same ? x.scalar_type() : at::kFloat;
  kernel_dtype(p.table_dtype, &prob.table_dtype);
  const std::vector<int64_t> xs(x.sizes().begin(), x.sizes().end());
  const std::vector<int64_t> cs = aligned_shape(cos, x.dim()), ss = aligned_shape(sin, x.dim());
  uint64_t cos_rows = 0, cos_rep = 0, sin_rows = 0, sin_rep = 0;
  const int nd = int(x.dim());
  if (!tot_ascendc::RopeBroadcastPattern(xs.data(), cs.data(), nd, &cos_rows, &cos_rep) ||
      !tot_ascendc::RopeBroadcastPattern(xs.data(), ss.data(), nd, &sin_rows, &sin_rep) || cos_rows != sin_rows ||
      cos_rep != sin_rep) {
    p.why_not = "this cos/sin broadcast (cos " + c10::str(cos.sizes()) + ", sin " + c10::str(sin.sizes()) +
                " onto x " + c10::str(x.sizes()) + ")";
    return p;
  }
  prob.rows = uint64_t(x.numel() / x.size(-1));
  prob.d = x.size(-1);
  prob.mode = mode;
  prob.is_grad = grad;
  prob.table_rows = cos_rows;
  prob.repeat = cos_rep;
  p.why_not = tot_ascendc::RopeTiling(prob, tot_ascendc::Ascend910B(), &p.tiling);
  return p;
}

at::Tensor tables_as(const Plan& p, const at::Tensor& t) { return t.to(p.table_dtype).contiguous(); }

at::Tensor forward_kernel(const Plan& p, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const at::Tensor xc = x.contiguous(), cc = tables_as(p, cos), sc = tables_as(p, sin);
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  ascendc::Launch run("rotary_position_embedding");
  TOT_ASCENDC_RUN(run, rotary_position_embedding_kernel, p.tiling.block_dim, AscendC::KernelMode::AIV_MODE,
                  run.Gm(xc), run.Gm(cc), run.Gm(sc), run.Gm(out), run.Workspace(0, x.options()),
                  run.Tiling(p.tiling, x.options()));
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> grad_kernel(const Plan& p, const at::Tensor& grad,
                                                           const at::Tensor& cos, const at::Tensor& sin,
                                                           const at::Tensor& x) {
  const at::Tensor gc = grad.to(x.scalar_type()).contiguous(), xc = x.contiguous();
  const at::Tensor cc = tables_as(p, cos), sc = tables_as(p, sin);
  at::Tensor dx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  // fp32 accumulators the kernel adds into, one row per cos/sin row (cos's own shape, flattened).
  at::Tensor dcos = at::zeros({cos.numel()}, x.options().dtype(at::kFloat));
  at::Tensor dsin = at::zeros({sin.numel()}, x.options().dtype(at::kFloat));
  ascendc::Launch run("rotary_position_embedding_grad");
  TOT_ASCENDC_RUN(run, rotary_position_embedding_grad_kernel, p.tiling.block_dim, AscendC::KernelMode::AIV_MODE,
                  run.Gm(gc), run.Gm(cc), run.Gm(sc), run.Gm(xc), run.Gm(dx), run.Gm(dcos), run.Gm(dsin),
                  run.Workspace(0, x.options()), run.Tiling(p.tiling, x.options()));
  return {dx, dcos.view(cos.sizes()).to(cos.scalar_type()), dsin.view(sin.sizes()).to(sin.scalar_type())};
}

}  // namespace

at::Tensor rotary_position_embedding_npu(const RotaryPositionEmbeddingArgs& args) {
  const char* op = "rotary_position_embedding";
  rope::check_mode_and_dim(op, args.mode, args.x.dim() ? args.x.size(-1) : 0);
  rope::check_tables(op, args.x, args.cos, args.sin);
  if (args.x.numel() == 0) return at::empty(args.x.sizes(),
                                            args.x.options().memory_format(at::MemoryFormat::Contiguous));
  const Plan p = plan(args.x, args.cos, args.sin, args.mode, /*grad=*/false);
  if (p.why_not.empty()) return forward_kernel(p, args.x, args.cos, args.sin);
  return npu_host::fallback_to_cpu(op, p.why_not, args, rotary_position_embedding_cpu, args.x.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rotary_position_embedding_grad_npu(
    const RotaryPositionEmbeddingGradArgs& args) {
  const char* op = "rotary_position_embedding_grad";
  rope::check_grad(op, args.grad, args.x);
  rope::check_mode_and_dim(op, args.mode, args.x.dim() ? args.x.size(-1) : 0);
  rope::check_tables(op, args.x, args.cos, args.sin);
  const Plan p = args.x.numel() ? plan(args.x, args.cos, args.sin, args.mode, /*grad=*/true) : Plan{"empty x"};
  if (!p.why_not.empty()) {
    return npu_host::fallback_to_cpu(op, p.why_not, args, rotary_position_embedding_grad_cpu, args.x.device());
  }
  return grad_kernel(p, args.grad, args.cos, args.sin, args.x);
}

}  // namespace npu_fa
