// The host side of CANN's CPU debug mode, same names and use (docs: 调试接口/CPU孪生调试/ICPU_RUN_KF.md, GmAlloc.md,
// GmFree.md, SetKernelMode.md): a host program written for tikicpulib builds unchanged against this runtime.
//
//   AscendC::SetKernelMode(KernelMode::AIV_MODE);        // or MIX_MODE for cube + vector kernels
//   uint8_t* x = (uint8_t*)AscendC::GmAlloc(bytes);      // every pointer argument must be GM
//   ICPU_RUN_KF(my_kernel, blockDim, x, y, tiling);      // runs blockDim cores concurrently, then checks them
//   AscendC::GmFree(x);
//
// Unlike CANN (which forks a process per core and aborts on a failed check), cores are threads of the calling
// process and a failed check throws AscendC::cpu::KernelCheckError from ICPU_RUN_KF, naming the kernel, the core
// and the check — so PyTorch can turn it into a Python exception.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "kernel_operator.h"

namespace AscendC {

void* GmAlloc(size_t size);
void GmFree(void* ptr);
void SetKernelMode(KernelMode mode);

namespace cpu {
KernelMode CurrentKernelMode();
// Runs body on every core of the launch (see tikicpulib.h); throws the first failed check.
void RunOnCores(const char* name, uint64_t numBlocks, const std::vector<const void*>& gm_args,
                const std::function<void()>& body);
LaunchStats LastLaunchStats();

template <typename P, typename A>
void CollectPointer(std::vector<const void*>& out, const A& arg) {
  if constexpr (std::is_pointer_v<P>) out.push_back(static_cast<const void*>(arg));
}
}  // namespace cpu

template <typename... P, typename... A>
void RunKernelFunctionOnCpu(void (*func)(P...), const char* name, uint64_t numBlocks, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "ICPU_RUN_KF: argument count differs from the kernel's parameters");
  static_assert(sizeof...(P) <= 32, "ICPU_RUN_KF: at most 32 kernel arguments");
  std::vector<const void*> pointers;
  (cpu::CollectPointer<P>(pointers, args), ...);
  auto call = [&] { func(static_cast<P>(args)...); };
  cpu::RunOnCores(name, numBlocks, pointers, call);
}

}  // namespace AscendC

#define ICPU_RUN_KF(func, numBlocks, ...) \
  do { ::AscendC::RunKernelFunctionOnCpu(func, #func, numBlocks, ##__VA_ARGS__); } while (0)
