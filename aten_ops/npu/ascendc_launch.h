// Launching an Ascend C kernel from a PrivateUse1 (npu) op: the tensors become the kernel's GM arguments, the
// tiling struct is copied to GM, and the kernel runs on the backend this build targets:
//   - default (no CANN): the CPU runtime (ascendc/cpu_runtime) on the simulated npu device, via ICPU_RUN_KF;
//   - TOT_WITH_CANN (setup.py found CANN + torch_npu, docs/ascendc_cann_build.md): the current torch_npu stream via
//     the generated aclrtlaunch_<kernel> entry. Launches are asynchronous there: the GM tensors this object keeps
//     are released when the glue returns, which is safe because torch_npu's caching allocator reuses a block only
//     for work queued later on the same stream.
// Usage in the glue of a family, aten_ops/npu/<family>/*.cpp:
//   npu_fa::ascendc::Launch launch("rope");
//   TOT_ASCENDC_RUN(launch, rope_kernel, tiling.block_dim, AscendC::KernelMode::AIV_MODE,
//                   launch.Gm(x), launch.Gm(cos), launch.Gm(out), launch.Workspace(0, x.options()),
//                   launch.Tiling(tiling));
#pragma once

#include <ATen/ATen.h>

#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#ifdef TOT_WITH_CANN
#include <acl/acl.h>
#include <torch_npu/csrc/core/npu/NPUStream.h>  // c10_npu::getCurrentNPUStream

#include "tot_aclrtlaunch_all.h"  // every aclrtlaunch_<kernel>.h of the CANN kernel build (tools/cann_build.py)
#else
#include "tikicpulib.h"
#endif

namespace npu_fa::ascendc {

#ifdef TOT_WITH_CANN
// GetLibApiWorkSpaceSize() of Ascend 910B (platform_ascendc): 16 MiB in front of every kernel's workspace.
constexpr int64_t kSystemWorkspaceBytes = 16 * 1024 * 1024;
#else
constexpr int64_t kSystemWorkspaceBytes = 0;
#endif

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

  // Scratch GM the kernel needs (bytes); on the device of `like`. On the NPU the Ascend C library (Matmul in MIX
  // kernels) owns the first kSystemWorkspaceBytes and kernels find theirs with GetUserWorkspace(workspace); the CPU
  // runtime keeps its system workspace elsewhere, so there the user part starts at the argument.
  uint8_t* Workspace(int64_t bytes, const at::TensorOptions& like) {
    return Gm(at::empty({std::max<int64_t>(bytes, 32) + kSystemWorkspaceBytes}, like.dtype(at::kByte)));
  }

  // The tiling struct, copied to GM: through the device's copy (`.to`), so on the NPU it lands in device memory
  // (a blocking host-to-device copy on the current stream, complete before the launch is queued).
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
// The CANN build generates aclrtlaunch_<kernel>.h for every kernel (the core type of a MIX/AIV kernel is recorded in
// its binary, so `mode` is not needed); it queues the kernel on torch_npu's current stream and returns an ACL error
// code. GM_ADDR arguments are device pointers; aclrtlaunch takes them as void*.
#define TOT_ASCENDC_RUN(launch, kernel, block_dim, mode, ...)                                                   \
  do {                                                                                                        \
    const uint32_t tot_acl_status_ =                                                                          \
        ACLRT_LAUNCH_KERNEL(kernel)(block_dim, c10_npu::getCurrentNPUStream().stream(), __VA_ARGS__);        \
    TORCH_CHECK(tot_acl_status_ == ACL_SUCCESS, (launch).name(), ": aclrtlaunch_" #kernel " failed with ACL error ", \
                tot_acl_status_);                                                                             \
  } while (0)
#else
#define TOT_ASCENDC_RUN(launch, kernel, block_dim, mode, ...)                 \
  ::npu_fa::ascendc::RunChecked(launch, [&] {                                 \
    ::AscendC::SetKernelMode(mode);                                           \
    ICPU_RUN_KF(kernel, block_dim, __VA_ARGS__);                              \
  })
#endif
