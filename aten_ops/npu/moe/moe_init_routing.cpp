// PrivateUse1 (npu) kernel of moe_init_routing_v2: validate like the CPU op (shared checks in
// common/moe/init_routing.h), tile on the host, launch the Ascend C dispatch kernel
// (ascendc/kernels/moe/moe_init_routing_v2_kernel.cpp).
//
// What the kernel does not take (docs/ascendc_moe.md) runs the CPU kernel on CPU aliases of the npu tensors — on the
// simulated device only; a CANN build reports it as unsupported:
//   - quant_mode 0 / 1 (int8 rows: the quantisation is not in the kernel);
//   - no expert_num and no active_expert_range (the bucket count would come from the data);
//   - spans whose counters do not fit UB, or sizes beyond int32 (the tiling's errors).
// Calls without pairs launch nothing: their outputs are zeros / empty, as the CPU op's.
#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "common/moe/init_routing.h"
#include "generated/kernels.h"
#include "moe/moe_init_routing_v2_tiling.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "moe/moe_init_routing_v2_kernel.h"
#endif

namespace npu_fa {

namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The experts as the kernel reads them (int32) and the buckets it sorts into before its last one.
struct KernelExperts {
  std::vector<int32_t> ids;  // empty: expert_idx itself (converted on the device)
  int64_t sort_width = 0;
};

// The scatter index (row_idx_type 1) lists the pairs outside active_expert_range too, those above the span by
// expert (moe::dropped_sort_key). The kernel gives such experts buckets after the span's: here each is replaced by
// lo + width + its rank among the distinct keys above the span, so the buckets stay as few as those experts however
// large their ids; keys of INT32_MAX (ids beyond int32) tie with the experts below the span, in the last bucket.
KernelExperts kernel_experts(const MoeInitRoutingV2Args& a, const moe::InitRoutingV2Shape& s,
                             const std::vector<int64_t>& experts) {
  const int64_t width = s.hi - s.lo;
  if (a.row_idx_type != 1 || !s.drop_outside) return {{}, width};
  std::vector<int64_t> above;
  for (const int64_t e : experts)
    if (e >= s.hi && moe::dropped_sort_key(e, s.lo) < INT32_MAX) above.push_back(e);
  std::sort(above.begin(), above.end());
  above.erase(std::unique(above.begin(), above.end()), above.end());
  KernelExperts k{std::vector<int32_t>(experts.size()), width + static_cast<int64_t>(above.size())};
  for (size_t f = 0; f < experts.size(); ++f) {
    const int64_t e = experts[f];
    if (e < s.hi) {
      k.ids[f] = static_cast<int32_t>(e);  // inside the span, or below it (the last bucket)
    } else if (moe::dropped_sort_key(e, s.lo) == INT32_MAX) {
      k.ids[f] = static_cast<int32_t>(s.lo - 1);  // below the span as far as the kernel can tell: the last bucket
    } else {
      const int64_t rank = std::lower_bound(above.begin(), above.end(), e) - above.begin();
      k.ids[f] = static_cast<int32_t>(s.lo + width + rank);  // fits int32: the tiling checks lo + sort_width
    }
  }
  return k;
}

// Why the Ascend C kernel cannot run this (validated) call ("" when it can); fills the tiling when it can.
std::string init_routing_refusal(const MoeInitRoutingV2Args& a, const moe::InitRoutingV2Shape& s,
                                 int64_t sort_width, tot_ascendc::MoeInitRoutingV2Tiling* tiling) {
  if (s.quant) return "quant_mode " + std::to_string(a.quant_mode) + " (int8 rows)";
  if (s.hi < 0) return "a call without 'expert_num' or 'active_expert_range' (the expert count would come from the data)";
  tot_ascendc::MoeInitRoutingV2Shape t;
  t.tokens = s.N;
  t.k = s.k;
  t.hidden = s.H;
  t.rows_out = s.rows_out;
  t.capacity = s.capacity;
  t.expert_capacity = a.expert_capacity;
  t.first_expert = s.lo;
  t.width = s.hi - s.lo;
  t.sort_width = sort_width;
  t.row_idx_type = a.row_idx_type;
  t.tokens_flag = a.expert_tokens_num_flag;
  t.tokens_type = a.expert_tokens_num_type;
  t.expert_num = a.expert_num;
  t.has_scale = a.scale.has_value();
  t.elem_bytes = a.x.element_size();
  return tot_ascendc::MoeInitRoutingV2TilingFor(t, tot_ascendc::Ascend910B(), tiling);
}

Outputs allocate_outputs(const MoeInitRoutingV2Args& a, const moe::InitRoutingV2Shape& s) {
  const auto opts = a.x.options();
  at::Tensor x = s.capacity ? at::empty({a.expert_num, a.expert_capacity, s.H}, opts) : at::empty({s.rows_out, s.H}, opts);
  at::Tensor row_idx = at::empty({s.pairs}, opts.dtype(at::kInt));
  at::Tensor tokens = !a.expert_tokens_num_flag          ? at::empty({0}, opts.dtype(at::kLong))
                      : a.expert_tokens_num_type == 2 ? at::empty({a.expert_num, 2}, opts.dtype(at::kLong))
                                                      : at::empty({s.num_counted}, opts.dtype(at::kLong));
  at::Tensor scale = at::empty({a.scale.has_value() ? s.rows_out : 0}, opts.dtype(at::kFloat));
  return {x, row_idx, tokens, scale};
}

// The kernel reads the experts as int32: values past int32 (only possible for dropped experts outside the span,
// which the checks allowed) are clamped, which keeps them outside it.
at::Tensor experts_as_int32(const at::Tensor& expert_idx, const std::vector<int64_t>& values) {
  const at::Tensor flat = expert_idx.reshape({-1});
  const bool wide = std::any_of(values.begin(), values.end(), [](int64_t v) { return v > INT32_MAX; });
  return (wide ? flat.clamp_max(INT32_MAX) : flat).to(at::kInt).contiguous();
}

}  // namespace

Outputs moe_init_routing_v2_npu(const MoeInitRoutingV2Args& args) {
  const char* op = "moe_init_routing_v2";
  const moe::InitRoutingV2Shape s = moe::check_init_routing_v2(op, args);
  tot_ascendc::MoeInitRoutingV2Tiling t;
  const std::vector<int64_t> experts = moe::read_index(args.expert_idx);
  const KernelExperts kx = s.quant || s.hi < 0 ? KernelExperts{} : kernel_experts(args, s, experts);
  const std::string refusal = s.pairs == 0 && !s.quant ? "" : init_routing_refusal(args, s, kx.sort_width, &t);
  if (!refusal.empty()) return npu_host::fallback_to_cpu(op, refusal, args, moe_init_routing_v2_cpu, args.x.device());
  // The experts are validated on the host, as the CPU op does (the same errors on both backends).
  moe::init_routing_v2_keys(op, s, experts);
  Outputs out = allocate_outputs(args, s);
  if (s.pairs == 0) {  // nothing routed: zero rows, zero counts, zero scales
    for (at::Tensor* o : {&std::get<0>(out), &std::get<2>(out), &std::get<3>(out)}) o->zero_();
    return out;
  }
  const at::Tensor xc = args.x.contiguous();
  const at::Tensor idx = kx.ids.empty()
                             ? experts_as_int32(args.expert_idx, experts)
                             : at::tensor(at::ArrayRef<int32_t>(kx.ids), at::kInt).to(args.x.device());
  const std::optional<at::Tensor> scale =
      args.scale.has_value() ? std::optional<at::Tensor>(args.scale->contiguous()) : std::nullopt;
  auto& [ex, row_idx, tokens, ex_scale] = out;
  ascendc::Launch launch(op);
  TOT_ASCENDC_RUN(launch, moe_init_routing_v2_kernel, t.block_dim, AscendC::KernelMode::AIV_MODE, launch.Gm(xc),
                  launch.Gm(idx), launch.Gm(scale), launch.Gm(ex), launch.Gm(row_idx),
                  t.tokens_flag ? launch.Gm(tokens) : nullptr, t.has_scale ? launch.Gm(ex_scale) : nullptr,
                  launch.Workspace(t.workspace_bytes, args.x.options()), launch.Tiling(t, args.x.options()));
  return out;
}

}  // namespace npu_fa
