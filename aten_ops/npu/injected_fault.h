// TOT_NPU_SIM_FAULT: a deliberately broken variant of a kernel's arguments, so that tests can prove the
// differential oracle (torch_ops_transformer/oracle, docs/oracle.md) catches a wrong device kernel. One value at a
// time, read at every call; the glue that owns a kernel applies the faults that name it:
//   FlashAttention forward (attention/attention.cpp, also the prefill ops through attention/flash_forward.h):
//     "scale"     the scale 5% too large
//     "window"    one more key visible above the band (an off-by-one window), where a band applies
//     "mask_tail" the explicit mask ignored from key 512 (or the second half of shorter key sequences) on
//   FlashAttention backward (attention/attention_grad.cpp):
//     "bwd_scale"  the scale 5% too large
//     "bwd_window" one more key visible above the band, where a band applies
//   one-token decode (inference/inference.cpp: incre_flash_attention, and fused_infer_attention_score's decode
//   route):
//     "decode_scale" the scale 5% too large
//     "decode_tail"  the last key of every sequence ignored (its length one short)
//   sparse flash attention (sparse_attention/sparse_attention.cpp):
//     "sfa_scale"  the scale 5% too large
//     "sfa_causal" one more token visible past sparse_mode 3's causal limit (when a row selects it)
//   recurrent gated delta rule (linear_attention/recurrent_gated_delta_rule.cpp, both forms):
//     "gdr_scale"    the scale 5% too large (the outputs)
//     "gdr_accepted" every sequence starts from its first token's slot (num_accepted_tokens ignored)
//     "gdr_slot"     the last token of every sequence of two or more tokens writes its state over its
//                    predecessor's slot (the state cache, not the outputs)
// Simulated device only: a CANN build never reads the variable.
#pragma once

#include <cstdlib>
#include <string>

namespace npu_fa::npu_host {

inline std::string injected_fault() {
#ifdef TOT_WITH_CANN
  return "";
#else
  const char* env = std::getenv("TOT_NPU_SIM_FAULT");
  return env ? std::string(env) : "";
#endif
}

// The upper band edge one key wider, unless the band is unbounded above (the kernels' tilings take anything from
// 2^40 on as "no band").
inline int64_t widened_band_hi(int64_t hi) { return hi >= (int64_t(1) << 40) ? hi : hi + 1; }

}  // namespace npu_fa::npu_host
