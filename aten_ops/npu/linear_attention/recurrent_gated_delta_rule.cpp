// recurrent_gated_delta_rule and its _functional form on the npu device (PrivateUse1): the Ascend C kernel
// (ascendc/kernels/linear_attention/recurrent_gated_delta_rule_kernel.cpp), validated exactly like the CPU op (shared
// common/linear_attention/recurrent_gated_delta_rule_params.h). The host resolves the sequences and slots into two
// small int32 tables — per sequence (first token, first slot), per token its slot — and hands the gates to the kernel
// in fp32 (the accumulation dtype, as the CPU op converts them); the kernel runs the recurrence and writes the outputs
// and every token's state. What the kernel does not cover (float64, a key head dim of 0 or beyond one vector repeat
// stride, key rows too wide for eight state rows in UB, 2^31 slots or tokens) goes to npu_host::fallback_to_cpu (the
// CPU kernel on the simulated device; an error on CANN builds and under TOT_NPU_SIM_NO_FALLBACK=1); see
// docs/ascendc_linear_attention.md.
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "common/linear_attention/recurrent_gated_delta_rule_params.h"
#include "generated/kernels.h"
#include "linear_attention/recurrent_gated_delta_rule_tiling.h"
#include "npu/ascendc_launch.h"
#include "npu/host_alias.h"
#include "npu/injected_fault.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "linear_attention/recurrent_gated_delta_rule_kernel.h"
#endif

namespace npu_fa {
namespace {

using linear_attention::GdrCall;
using linear_attention::GdrPlan;

tot_ascendc::GdrDtype kernel_dtype(at::ScalarType t) {
  if (t == at::kHalf) return tot_ascendc::GdrDtype::FP16;
  if (t == at::kBFloat16) return tot_ascendc::GdrDtype::BF16;
  return tot_ascendc::GdrDtype::FP32;
}

// Why the kernel cannot run this call ("" when it can), filling its tiling otherwise.
std::string plan_kernel(const at::Tensor& query, const at::Tensor& state, const GdrCall& c,
                        tot_ascendc::RecurrentGdrTiling& tiling) {
  if (query.scalar_type() == at::kDouble) return "float64 inputs";
  if (c.Dk == 0) return "a key head dim of 0";
  tot_ascendc::GdrShape s;
  s.tokens = uint32_t(std::min<int64_t>(c.T, int64_t(UINT32_MAX)));
  s.batch = uint32_t(c.plan.first_slot.size());
  s.k_heads = uint32_t(c.Nk);
  s.v_heads = uint32_t(c.Nv);
  s.dk = uint32_t(c.Dk);
  s.dv = uint32_t(c.Dv);
  s.slots = uint64_t(state.size(0));
  s.dtype = kernel_dtype(query.scalar_type());
  s.state_dtype = kernel_dtype(state.scalar_type());
  s.has_beta = c.beta.defined();
  s.has_g = c.g.defined();
  s.has_gk = c.gk.defined();
  s.scale = npu_host::injected_fault() == "gdr_scale" ? float(c.scale) * 1.05f : float(c.scale);
  return tot_ascendc::RecurrentGdrTilingFn(s, tot_ascendc::Ascend910B(), tiling);
}

// TOT_NPU_SIM_FAULT (npu/injected_fault.h, simulated device only, for testing the differential oracle): the
// recurrent kernel's faults in the tables the host gives it — "gdr_accepted" (every sequence starts from its first
// token's slot: num_accepted_tokens ignored) or "gdr_slot" (the last token of every sequence of two or more tokens
// writes its state over its predecessor's slot, an off-by-one in the slot table: the cache is wrong, the outputs
// are not). "gdr_scale" (5% too large) is applied to the tiling in plan_kernel.
GdrPlan with_injected_fault(GdrPlan p) {
  const std::string fault = npu_host::injected_fault();
  const int64_t B = int64_t(p.first_slot.size());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t first = p.seq_start[b], last = p.seq_start[b + 1] - 1;
    if (fault == "gdr_accepted") p.first_slot[b] = p.slot[first];
    if (fault == "gdr_slot" && last > first) p.slot[last] = p.slot[last - 1];
  }
  return p;
}

// int32 [B + 1, 2]: per sequence (first token, first slot); the last row (T, 0) ends the last sequence.
at::Tensor seq_table(const GdrPlan& p) {
  const int64_t B = int64_t(p.first_slot.size());
  at::Tensor host = at::zeros({B + 1, 2}, at::TensorOptions().dtype(at::kInt));
  int32_t* r = host.data_ptr<int32_t>();
  for (int64_t b = 0; b <= B; ++b) {
    r[2 * b] = int32_t(p.seq_start[b]);
    r[2 * b + 1] = b < B ? int32_t(p.first_slot[b]) : 0;
  }
  return host;
}

// int32 [T]: each token's slot.
at::Tensor slot_table(const GdrPlan& p) {
  at::Tensor host = at::empty({int64_t(p.slot.size())}, at::TensorOptions().dtype(at::kInt));
  int32_t* r = host.data_ptr<int32_t>();
  for (size_t t = 0; t < p.slot.size(); ++t) r[t] = int32_t(p.slot[t]);
  return host;
}

std::optional<at::Tensor> present(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// Runs the kernel on `state` (contiguous, on the npu device; updated in place) and returns the output.
template <typename Args>
at::Tensor run_kernel(const char* op, const Args& a, const GdrCall& c, const at::Tensor& state,
                      const tot_ascendc::RecurrentGdrTiling& tiling) {
  const c10::Device device = a.query.device();
  at::Tensor out = at::empty({c.T, c.Nv, c.Dv}, a.query.options());
  const at::Tensor q = a.query.contiguous(), k = a.key.contiguous(), v = a.value.contiguous();
  const GdrPlan plan = with_injected_fault(c.plan);
  const at::Tensor seqs = seq_table(plan).to(device), slots = slot_table(plan).to(device);
  npu_fa::ascendc::Launch launch(op);
  TOT_ASCENDC_RUN(launch, recurrent_gated_delta_rule, tiling.block_dim, AscendC::KernelMode::AIV_MODE, launch.Gm(q),
                  launch.Gm(k), launch.Gm(v), launch.Gm(present(c.beta)), launch.Gm(present(c.g)),
                  launch.Gm(present(c.gk)), launch.Gm(seqs), launch.Gm(slots), launch.Gm(state), launch.Gm(out),
                  launch.Workspace(0, a.query.options()), launch.Tiling(tiling, a.query.options()));
  return out;
}

}  // namespace

at::Tensor recurrent_gated_delta_rule_npu(const RecurrentGatedDeltaRuleArgs& args) {
  const char* op = "recurrent_gated_delta_rule";
  linear_attention::check_state_contiguous(op, args.state);
  const GdrCall c = linear_attention::validate_recurrent(op, args);
  if (c.T * c.Nv * c.Dv == 0) return at::empty({c.T, c.Nv, c.Dv}, args.query.options());
  tot_ascendc::RecurrentGdrTiling tiling;
  const std::string unsupported = plan_kernel(args.query, args.state, c, tiling);
  if (!unsupported.empty())
    return npu_host::fallback_to_cpu(op, unsupported, args, recurrent_gated_delta_rule_cpu, args.query.device());
  return run_kernel(op, args, c, args.state, tiling);
}

std::tuple<at::Tensor, at::Tensor> recurrent_gated_delta_rule_functional_npu(
    const RecurrentGatedDeltaRuleFunctionalArgs& args) {
  const char* op = "recurrent_gated_delta_rule_functional";
  const GdrCall c = linear_attention::validate_recurrent(op, args);
  if (c.T * c.Nv * c.Dv == 0)
    return {at::empty({c.T, c.Nv, c.Dv}, args.query.options()), args.state.clone(at::MemoryFormat::Contiguous)};
  tot_ascendc::RecurrentGdrTiling tiling;
  const std::string unsupported = plan_kernel(args.query, args.state, c, tiling);
  if (!unsupported.empty())
    return npu_host::fallback_to_cpu(op, unsupported, args, recurrent_gated_delta_rule_functional_cpu,
                                     args.query.device());
  at::Tensor new_state = args.state.clone(at::MemoryFormat::Contiguous);
  at::Tensor out = run_kernel(op, args, c, new_state, tiling);
  return {out, new_state};
}

}  // namespace npu_fa
