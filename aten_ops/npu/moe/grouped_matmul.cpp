// grouped_matmul on the npu device (PrivateUse1): the Ascend C kernel (ascendc/kernels/moe/grouped_matmul_kernel.cpp)
// for the MoE expert form — x [M, K] split along M by group_list, one weight tensor [E, K, N], no bias or an [E, N]
// bias, activation none / relu / fast_gelu / silu, fp32 / fp16 / bf16. Everything else, and any argument the
// CPU op would reject, goes to npu_host::fallback_to_cpu (the CPU kernel, which also raises the CPU op's errors, on
// the simulated device; an error on CANN builds and under TOT_NPU_SIM_NO_FALLBACK=1). docs/ascendc_moe.md.
#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "generated/kernels.h"
#include "moe/grouped_matmul_tiling.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "moe/grouped_matmul_kernel.h"
#endif

namespace npu_fa {
namespace {

constexpr const char* kOp = "grouped_matmul";

std::optional<tot_ascendc::GmmDtype> kernel_dtype(at::ScalarType t) {
  if (t == at::kFloat) return tot_ascendc::GmmDtype::kFloat32;
  if (t == at::kHalf) return tot_ascendc::GmmDtype::kFloat16;
  if (t == at::kBFloat16) return tot_ascendc::GmmDtype::kBFloat16;
  return std::nullopt;
}

// Rows per group from group_list (read on the host), or "" in `why` when the list is not one the CPU op accepts
// for these M and E (then the CPU kernel runs, and raises its own error).
std::vector<int64_t> group_rows(const at::Tensor& gl, int64_t groups, int64_t m, bool counts, std::string& why) {
  std::vector<int64_t> rows;
  if (gl.dim() != 1 || gl.size(0) != groups || (gl.scalar_type() != at::kLong && gl.scalar_type() != at::kInt)) {
    why = "this group_list (the kernel takes E int32/int64 entries)";
    return rows;
  }
  const at::Tensor host = gl.to(at::kCPU, at::kLong).contiguous();
  const int64_t* v = host.data_ptr<int64_t>();
  int64_t start = 0;
  for (int64_t e = 0; e < groups; ++e) {
    const int64_t end = counts ? start + v[e] : v[e];
    if (end < start || end > m) {
      why = "a group_list that does not split x's rows";
      return {};
    }
    rows.push_back(end - start);
    start = end;
  }
  if (start != m) why = "a group_list that does not cover x's rows";
  return rows;
}

struct Plan {
  std::string why_not;
  tot_ascendc::GroupedMatmulTiling tiling;
};

Plan plan(const GroupedMatmulArgs& a) {
  Plan p;
  if (a.group_type != 0) return {"group_type " + std::to_string(a.group_type) + " (the kernel splits x's rows: 0)"};
  if (a.x.size() != 1 || a.x[0].dim() != 2) return {"x other than one [M, K] tensor"};
  if (a.weight.size() != 1 || a.weight[0].dim() != 3) return {"weight other than one [E, K, N] tensor"};
  const at::Tensor &x = a.x[0], &w = a.weight[0];
  const auto dtype = kernel_dtype(x.scalar_type());
  if (!dtype || w.scalar_type() != x.scalar_type()) return {"these dtypes (the kernel takes fp32/fp16/bf16 x and weight)"};
  if (a.act_type != 0 && a.act_type != 1 && a.act_type != 4 && a.act_type != 5) {
    return {"act_type " + std::to_string(a.act_type) + " (the kernel has none, relu, fast_gelu, silu)"};
  }
  if (a.group_list_type != 0 && a.group_list_type != 1) return {"this group_list_type"};
  const int64_t m = x.size(0), k = x.size(1), groups = w.size(0), n = w.size(2);
  if (w.size(1) != k) return {"weight's K differing from x's (the CPU op reports it)"};
  const bool bias = !a.bias.empty();
  if (bias && (a.bias.size() != 1 || a.bias[0].dim() != 2 || a.bias[0].size(0) != groups || a.bias[0].size(1) != n ||
               (a.bias[0].scalar_type() != x.scalar_type() && a.bias[0].scalar_type() != at::kFloat))) {
    return {"this bias (the kernel takes one [E, N] tensor)"};
  }
  if (!a.group_list.has_value()) return {"a missing group_list"};
  const std::vector<int64_t> rows = group_rows(*a.group_list, groups, m, a.group_list_type == 1, p.why_not);
  if (!p.why_not.empty()) return p;
  tot_ascendc::GroupedMatmulShape s;
  s.m = uint64_t(m);
  s.k = uint64_t(k);
  s.n = uint64_t(n);
  s.groups = uint64_t(groups);
  s.dtype = *dtype;
  s.act = tot_ascendc::GmmAct(a.act_type);
  s.has_bias = bias;
  s.counts = a.group_list_type == 1;
  p.why_not = tot_ascendc::GroupedMatmulTilingFn(s, tot_ascendc::Ascend910B(), p.tiling);
  if (!p.why_not.empty()) return p;
  uint64_t items = 0;  // launch no more AI Core groups than there are items
  for (int64_t r : rows) items += uint64_t((r + p.tiling.bm - 1) / p.tiling.bm) * p.tiling.n_blocks;
  s.items_hint = items ? items : 1;
  p.why_not = tot_ascendc::GroupedMatmulTilingFn(s, tot_ascendc::Ascend910B(), p.tiling);
  return p;
}

}  // namespace

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> grouped_matmul_npu(const GroupedMatmulArgs& args) {
  const Plan p = plan(args);
  const c10::Device device = args.x.empty() ? c10::Device(c10::DeviceType::PrivateUse1) : args.x[0].device();
  if (!p.why_not.empty()) return npu_host::fallback_to_cpu(kOp, p.why_not, args, grouped_matmul_cpu, device);

  const at::Tensor x = args.x[0].contiguous(), w = args.weight[0].contiguous();
  const auto& t = p.tiling;
  at::Tensor out = at::empty({int64_t(t.m), int64_t(t.n)}, x.options());
  const bool act = t.act != uint32_t(tot_ascendc::GmmAct::kNone);
  at::Tensor act_input = act ? at::empty({int64_t(t.m), int64_t(t.n)}, x.options()) : at::empty({0}, x.options());
  std::optional<at::Tensor> bias;
  if (t.has_bias) bias = args.bias[0].to(device, at::kFloat).contiguous();
  const at::Tensor group_list = args.group_list->to(device, at::kLong).contiguous();

  ascendc::Launch launch(kOp);
  TOT_ASCENDC_RUN(launch, grouped_matmul_kernel, t.block_dim, AscendC::KernelMode::MIX_MODE, launch.Gm(x),
                  launch.Gm(w), launch.Gm(bias), launch.Gm(group_list), launch.Gm(out),
                  act ? launch.Gm(act_input) : nullptr, launch.Workspace(int64_t(t.workspace_bytes), x.options()),
                  launch.Tiling(t, x.options()));
  return {{out}, {act_input}};
}

}  // namespace npu_fa
