// Cases an op's Ascend C kernel does not handle. On the simulated npu device tensors live in host memory, so the op
// can run its CPU kernel instead: CPU views over the npu tensors' memory in, npu views over the results out (no
// copies; each view keeps the other's storage alive). A CANN build raises instead, and so does the simulated device
// under TOT_NPU_SIM_NO_FALLBACK=1 — tests use it to prove which kernel ran. Every glue file goes through
// `fallback_to_cpu`, so the switch holds everywhere.
#pragma once

#include <ATen/ATen.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace npu_fa::npu_host {

// TOT_NPU_SIM_NO_FALLBACK=1: the simulated device behaves like a CANN build (no CPU kernel behind a kernel's back).
inline bool fallback_forbidden() {
#ifdef TOT_WITH_CANN
  return true;
#else
  const char* env = std::getenv("TOT_NPU_SIM_NO_FALLBACK");
  return env && std::string(env) == "1";
#endif
}

inline void check_fallback_allowed(const char* op, const std::string& why_not) {
  TORCH_CHECK(!fallback_forbidden(), op, ": the Ascend C kernel does not handle ", why_not,
#ifdef TOT_WITH_CANN
              " on the NPU");
#else
              " (TOT_NPU_SIM_NO_FALLBACK=1 forbids the CPU kernel fallback)");
#endif
}

inline at::Tensor cpu_alias(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  c10::Storage keep = t.storage();
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, t.options().device(at::kCPU));
}

inline std::optional<at::Tensor> cpu_alias(const std::optional<at::Tensor>& t) {
  return t.has_value() ? std::optional<at::Tensor>(cpu_alias(*t)) : std::nullopt;
}

inline std::vector<at::Tensor> cpu_alias(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(cpu_alias(t));
  return out;
}

// One argument of an op on its way to the CPU kernel: tensors become CPU aliases, other values pass through.
template <class T>
const T& cpu_arg(const T& v) { return v; }
inline at::Tensor cpu_arg(const at::Tensor& t) { return cpu_alias(t); }
inline std::optional<at::Tensor> cpu_arg(const std::optional<at::Tensor>& t) { return cpu_alias(t); }
inline std::vector<at::Tensor> cpu_arg(const std::vector<at::Tensor>& ts) { return cpu_alias(ts); }
inline std::vector<at::Tensor> cpu_arg(at::TensorList ts) { return cpu_alias(ts.vec()); }

// Runs an op's CPU kernel on its generated argument struct with every tensor replaced by its CPU alias.
template <class Args, class CpuKernel>
auto call_with_cpu_aliases(const Args& args, CpuKernel&& cpu_kernel) {
  return apply_args(args, [&](const auto&... a) { return cpu_kernel(Args{cpu_arg(a)...}); });
}

inline at::Tensor device_alias(const at::Tensor& t, const c10::Device& device) {
  if (!t.defined() || t.device() == device) return t;
  c10::Storage keep = t.storage();
  // target_device: with several simulated devices the memory's device is not the current one to ask
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, t.options().device(device), device);
}

inline std::vector<at::Tensor> device_alias(const std::vector<at::Tensor>& ts, const c10::Device& device) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(device_alias(t, device));
  return out;
}

template <class... T>
std::tuple<T...> device_alias(const std::tuple<T...>& ts, const c10::Device& device) {
  return std::apply([&](const auto&... t) { return std::tuple<T...>(device_alias(t, device)...); }, ts);
}

// The CPU kernel for a call the Ascend C kernel cannot run (`why_not` says why, as "... does not handle <why_not>"),
// results on `device`; raises on CANN builds and under TOT_NPU_SIM_NO_FALLBACK=1. An op without results (in place)
// has written its npu tensors through their CPU aliases.
template <class Args, class CpuKernel>
auto fallback_to_cpu(const char* op, const std::string& why_not, const Args& args, CpuKernel&& cpu_kernel,
                     const c10::Device& device) {
  check_fallback_allowed(op, why_not);
  if constexpr (std::is_void_v<decltype(call_with_cpu_aliases(args, cpu_kernel))>) {
    call_with_cpu_aliases(args, cpu_kernel);
  } else {
    return device_alias(call_with_cpu_aliases(args, cpu_kernel), device);
  }
}

}  // namespace npu_fa::npu_host
