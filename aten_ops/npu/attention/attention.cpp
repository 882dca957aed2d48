// PrivateUse1 (npu) kernel of flash_attention_score: validates like the CPU op (shared parser, identical
// messages), makes q/k/v BNSD-contiguous, computes the tiling and launches the Ascend C kernel
// (ascendc/kernels/flash_attention). Calls the kernel does not cover (pse of any pse_type, softcap, dropout, sink,
// TND, an empty key sequence, head dim > 512) run the CPU kernel on CPU aliases of the npu tensors — simulated
// device only (docs/ascendc_attention.md lists them).
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <string>

#include "common/attention/params.h"
#include "attention/flash_attention_score_tiling.h"
#include "generated/kernels.h"
#include "npu/ascendc_control.h"
#include "npu/ascendc_launch.h"
#include "npu/attention/bnsd_layout.h"
#include "npu/attention/flash_forward.h"
#include "npu/host_alias.h"
#include "npu/injected_fault.h"

#ifndef TOT_WITH_CANN  // with CANN, ascendc_launch.h includes the generated aclrtlaunch_<kernel>.h launchers
#include "attention/flash_attention_score_kernel.h"
#endif

namespace npu_fa {
namespace {

using attention::AttentionParams;
using attention::Layout;
using npu_host::from_bnsd;
using npu_host::to_bnsd;
using ScoreOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
constexpr const char* kOp = "flash_attention_score";
constexpr int64_t kMaxHeadDim = 512;

// Arguments the kernel has no path for, decided from the raw arguments so that the CPU op (which validates
// them) runs exactly once — a seed drawn for dropout is drawn once, as on CPU. TND covers softmax_layout (it only
// applies to TND) and keep_prob < 1 covers dropout_mask (read only with dropout).
const char* unsupported_before_parsing(const FlashAttentionScoreArgs& args) {
  if (args.input_layout == "TND") return "TND (variable-length) layout";
  if (args.pse.has_value()) return "pse";
  if (args.keep_prob < 1.0) return "dropout (keep_prob < 1)";
  if (args.sink.has_value()) return "sink";
  if (args.softcap > 0.0) return "softcap";
  return nullptr;
}

ScoreOutputs run_cpu_kernel(const char* reason, const FlashAttentionScoreArgs& args) {
  return npu_host::fallback_to_cpu(kOp, reason, args, flash_attention_score_cpu, args.query.device());
}

tot_ascendc::FaDtype kernel_dtype(at::ScalarType t) {
  if (t == at::kHalf) return tot_ascendc::FA_FLOAT16;
  if (t == at::kBFloat16) return tot_ascendc::FA_BFLOAT16;
  return tot_ascendc::FA_FLOAT32;
}

// The explicit mask as contiguous uint8 [B or 1, N or 1, S1, S2] (the parser accepted its shape): a 2-D [S1, S2]
// mask is shared by every batch and head, and a 3-D one — only the prefill ops take it — is [B or 1, S1, S2],
// shared by the heads (the kernel would otherwise read its S1 axis as heads, past the end of the buffer).
at::Tensor kernel_mask(const at::Tensor& m, tot_ascendc::FlashAttentionTilingInput& in) {
  at::Tensor u8 = m.scalar_type() == at::kBool ? m.to(at::kByte) : m;
  if (u8.dim() == 2) u8 = u8.unsqueeze(0).unsqueeze(0);
  if (u8.dim() == 3) u8 = u8.unsqueeze(1);
  in.mask_kind = tot_ascendc::FA_MASK_EXPLICIT;
  in.mask_per_batch = u8.size(0) != 1;
  in.mask_per_head = u8.size(1) != 1;
  return u8.contiguous();
}

// TOT_NPU_SIM_FAULT (npu/injected_fault.h, simulated device only, for testing the differential oracle): the forward
// kernel's faults — "scale" (5% too large), "window" (one more key visible above the band: an off-by-one window) or
// "mask_tail" (the explicit mask ignored from key 512, or the second half of shorter key sequences, on).
void inject_fault(tot_ascendc::FlashAttentionTilingInput& in, at::Tensor& mask) {
  const std::string fault = npu_host::injected_fault();
  if (fault == "scale") in.scale *= 1.05f;
  if (fault == "window") in.band_hi = npu_host::widened_band_hi(in.band_hi);
  if (fault == "mask_tail" && mask.defined()) {
    const int64_t from = std::min<int64_t>(512, (mask.size(-1) + 1) / 2);
    mask = mask.clone();
    mask.narrow(-1, from, mask.size(-1) - from).zero_();
  }
}

at::Tensor host_long(uint64_t v, const c10::Device& device) {
  return at::scalar_tensor(static_cast<int64_t>(v), at::kLong).to(device);
}

}  // namespace

namespace npu_host {

const char* flash_forward_refusal(const attention::AttentionParams& p) {
  if (p.max_kv_len == 0) return "an empty key sequence";
  if (p.head_dim > kMaxHeadDim) return "head dim > 512";
  return nullptr;
}

at::Tensor run_flash_forward(const char* op, const attention::AttentionParams& p, const at::Tensor& query,
                             const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& atten_mask, const at::Tensor& smax,
                             const at::Tensor& ssum) {
  const auto opts = query.options();
  tot_ascendc::FlashAttentionTilingInput in;
  in.batch = uint32_t(p.batch);
  in.q_heads = uint32_t(p.q_heads);
  in.group = uint32_t(p.group);
  in.s1 = uint32_t(p.max_q_len);
  in.s2 = uint32_t(p.max_kv_len);
  in.head_dim = uint32_t(p.head_dim);
  in.v_head_dim = uint32_t(p.v_head_dim);
  in.dtype = kernel_dtype(query.scalar_type());
  in.scale = p.scale;
  const attention::Band band = p.band(0);  // dense layouts: every sequence has the same lengths
  in.band_lo = band.lo;
  in.band_hi = band.hi;
  at::Tensor mask;
  if (p.mask) mask = kernel_mask(*atten_mask, in);
  inject_fault(in, mask);
  tot_ascendc::FlashAttentionTilingOptions options;
  ascendc::FlashAttentionBlocks(&options.s1_block, &options.s2_block);
  tot_ascendc::FlashAttentionScoreTilingData tiling;
  const std::string err = tot_ascendc::FlashAttentionScoreTiling(in, options, tot_ascendc::Ascend910B(), &tiling);
  TORCH_CHECK(err.empty(), op, ": ", err);

  const at::Tensor q = to_bnsd(query, p.layout, p.q_heads);
  const at::Tensor k = to_bnsd(key, p.layout, p.kv_heads);
  const at::Tensor v = to_bnsd(value, p.layout, p.kv_heads);
  at::Tensor out = at::empty({p.batch, p.q_heads, p.max_q_len, p.v_head_dim}, opts);
  ascendc::Launch launch(op);
  uint8_t* mask_gm = mask.defined() ? launch.Gm(mask) : nullptr;
  TOT_ASCENDC_RUN(launch, flash_attention_score, tiling.block_dim, AscendC::KernelMode::MIX_MODE, launch.Gm(q),
                  launch.Gm(k), launch.Gm(v), mask_gm, launch.Gm(out), launch.Gm(smax), launch.Gm(ssum),
                  launch.Workspace(int64_t(tiling.workspace_bytes), opts), launch.Tiling(tiling, opts));
  return out;
}

}  // namespace npu_host

ScoreOutputs flash_attention_score_npu(const FlashAttentionScoreArgs& args) {
  auto fallback = [&](const char* reason) {
    return run_cpu_kernel(reason, args);
  };
  if (const char* reason = unsupported_before_parsing(args)) return fallback(reason);
  attention::AttentionInputs parsed;
  const AttentionParams p = attention::parse_attention_params(kOp, args, parsed);
  const auto opts = args.query.options();
  at::Tensor smax = at::empty(attention::stats_shape(p, args.query), opts.dtype(at::kFloat));
  at::Tensor ssum = at::empty_like(smax);
  const c10::Device device = args.query.device();
  if (p.batch == 0 || p.max_q_len == 0) {  // nothing to compute; shapes as the CPU op returns them
    return {at::empty(attention::output_shape(p, args.query), opts), smax, ssum, at::empty({0}, opts),
            host_long(p.seed, device), host_long(p.offset, device)};
  }
  if (const char* reason = npu_host::flash_forward_refusal(p)) return fallback(reason);

  const at::Tensor out = npu_host::run_flash_forward(kOp, p, args.query, args.key, args.value, args.atten_mask,
                                                      smax, ssum);
  return {from_bnsd(out, p.layout), smax, ssum, at::empty({0}, opts), host_long(p.seed, device),
          host_long(p.offset, device)};
}

}  // namespace npu_fa
