// F.scaled_dot_product_attention on the npu device: PyTorch asks the DispatchStub `_fused_sdp_choice_stub` for
// PrivateUse1 which backend to run (math = 0, overrideable = 4). That stub is a plain function pointer, not an
// operator, so Python cannot register it; this file points it at the dispatcher operator aten::_fused_sdp_choice
// at the PrivateUse1 key, whose kernel torch_ops_transformer.npu_sim.sdpa registers from Python (the support rules
// live there, next to torch_ops_transformer.integrations.sdpa's). Nothing happens at load time: Python calls
// tot_sdpa_install_choice_stub() through ctypes when it enables the route (docs/npu_sdpa.md).
#include <ATen/ATen.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>

#include <cstdio>
#include <exception>

namespace {

// Redispatch straight to the PrivateUse1 kernel. Calling at::_fused_sdp_choice would re-enter the Python/Fake key
// under torch.compile, whose Meta kernel calls this stub again (endless recursion).
int64_t choice_from_dispatcher(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                               const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                               std::optional<double> scale, bool enable_gqa) {
  return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), query, key,
                                                  value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace

// Returns 0 on success, else writes the error into `error`. Replaces any stub a backend installed before (torch_npu
// registers its own at import; npu_sdpa.enable() warns about that in Python). Only the inline setter of the stub is
// used: DispatchStub's query functions depend on libtorch's build-time CPU-capability macros, which an extension
// does not see.
extern "C" __attribute__((visibility("default"))) int tot_sdpa_install_choice_stub(char* error, int error_len) {
  try {
    at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&choice_from_dispatcher);
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, static_cast<size_t>(error_len), "%s", e.what());
    return 1;
  }
}
