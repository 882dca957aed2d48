// Launching an Ascend C kernel from a PrivateUse1 (npu) op: the tensors become the kernel's GM arguments, the
// tiling struct is copied to GM, and the kernel runs on the backend this build targets:
//   - default (no CANN): the CPU runtime (ascendc/cpu_runtime) on the simulated npu device, via ICPU_RUN_KF;
//   - TOT_WITH_CANN (setup.py found CANN + torch_npu): the NPU stream via the generated aclrtlaunch_<kernel> entry.
// Usage in aten_ops/npu/<family>.cpp:
//   npu_fa::ascendc::Launch launch("rope");
//   TOT_ASCENDC_RUN(launch, rope_kernel, tiling.block_dim, AscendC::KernelMode::AIV_MODE,
//                   launch.Gm(x), launch.Gm(cos), launch.Gm(out), launch.Workspace(0, x.options()),
//                   launch.Tiling(tiling));
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <vector>

#ifdef TOT_WITH_CANN
#include <acl/acl.h>
#else
#include "tikicpulib.h"
#endif

namespace npu_fa::ascendc {

class Launch {
 public:
  explicit Launch(const char* kernel) : kernel_(kernel) {}

  // A tensor the kernel addresses as GM: must be contiguous (kernels compute offsets from shapes).
  uint8_t* Gm(const at::Tensor& t) {
    TORCH_CHECK(t.is_contiguous(), kernel_, ": internal error: GM argument is not contiguous");
    keep_.push_back(t);
    auto* p = static_cast<uint8_t*>(t.data_ptr());
#ifndef TOT_WITH_CANN
    regions_.push_back(std::make_unique<AscendC::cpu::ScopedGm>(p, size_t(t.nbytes())));
#endif
    return p;
  }
  uint8_t* Gm(const std::optional<at::Tensor>& t) { return t.has_value() ? Gm(*t) : nullptr; }

  // Scratch GM the kernel needs (bytes); on the device of `like`.
  uint8_t* Workspace(int64_t bytes, const at::TensorOptions& like) {
    return Gm(at::empty({std::max<int64_t>(bytes, 32)}, like.dtype(at::kByte)));
  }

  // The tiling struct, copied to GM (device memory on the NPU).
  template <typename T>
  uint8_t* Tiling(const T& tiling, const at::TensorOptions& like) {
    static_assert(std::is_trivially_copyable_v<T>, "tiling data must be a POD struct");
    at::Tensor host = at::empty({int64_t(sizeof(T))}, at::TensorOptions().dtype(at::kByte));
    std::memcpy(host.data_ptr(), &tiling, sizeof(T));
    return Gm(host.to(like.device()));
  }

  const char* name() const { return kernel_; }

 private:
  const char* kernel_;
  std::vector<at::Tensor> keep_;
#ifndef TOT_WITH_CANN
  std::vector<std::unique_ptr<AscendC::cpu::ScopedGm>> regions_;
#endif
};

#ifndef TOT_WITH_CANN
// Runs the launch and turns a failed runtime check into a c10::Error naming kernel, core and check.
template <typename Fn>
void RunChecked(const Launch& launch, Fn&& fn) {
  try {
    fn();
  } catch (const AscendC::cpu::KernelCheckError& e) {
    TORCH_CHECK(false, launch.name(), ": ", e.what());
  }
}
#endif

}  // namespace npu_fa::ascendc

#ifdef TOT_WITH_CANN
// The CANN build generates aclrtlaunch_<kernel>.h for every kernel; it launches on torch_npu's current stream.
#define TOT_ASCENDC_RUN(launch, kernel, block_dim, mode, ...) \
  ACLRT_LAUNCH_KERNEL(kernel)(block_dim, c10_npu::getCurrentNPUStream().stream(), __VA_ARGS__)
#else
#define TOT_ASCENDC_RUN(launch, kernel, block_dim, mode, ...)                 \
  ::npu_fa::ascendc::RunChecked(launch, [&] {                                 \
    ::AscendC::SetKernelMode(mode);                                           \
    ICPU_RUN_KF(kernel, block_dim, __VA_ARGS__);                              \
  })
#endif
