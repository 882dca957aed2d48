// The simulated npu device keeps tensors in host memory, so an npu op can run the op's CPU kernel for arguments its
// Ascend C kernel has no path for: CPU views over the npu tensors' memory in, npu views over the results out (no
// copies; each view keeps the other's storage alive). Simulated device only: a CANN build raises instead.
#pragma once

#ifndef TOT_WITH_CANN
#include <ATen/ATen.h>

#include <optional>

namespace npu_fa::npu_host {

inline at::Tensor cpu_alias(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  c10::Storage keep = t.storage();
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, t.options().device(at::kCPU));
}

inline std::optional<at::Tensor> cpu_alias(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(cpu_alias(*t)) : std::nullopt;
}

// One argument of an op on its way to the CPU kernel: tensors become CPU aliases, other values pass through.
template <class T>
const T& cpu_arg(const T& v) { return v; }
inline at::Tensor cpu_arg(const at::Tensor& t) { return cpu_alias(t); }
inline std::optional<at::Tensor> cpu_arg(const std::optional<at::Tensor>& t) { return cpu_alias(t); }

// Runs an op's CPU kernel on its generated argument struct with every tensor replaced by its CPU alias.
template <class Args, class CpuKernel>
auto call_with_cpu_aliases(const Args& args, CpuKernel&& cpu_kernel) {
  return apply_args(args, [&](const auto&... a) { return cpu_kernel(Args{cpu_arg(a)...}); });
}

inline at::Tensor device_alias(const at::Tensor& t, const c10::Device& device) {
  if (!t.defined() || t.device() == device) return t;
  c10::Storage keep = t.storage();
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, t.options().device(device));
}

}  // namespace npu_fa::npu_host
#endif
