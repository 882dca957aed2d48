// Run-time choice of the per-instruction-set CPU kernels, in the manner of ATen's DispatchStub.
//
// Every aten_ops/**/*_isa.cpp is compiled three times by setup.py (-DCPU_CAPABILITY=DEFAULT|AVX2|AVX512, with that
// ISA's flags) and the objects are linked into _C. A family declares one stub per kernel in its kernel header:
//
//   NPU_FA_DECLARE_ISA_STUB(decode_attention_stub, void (*)(const DecodeParams&, ...));
//
// each *_isa.cpp registers its copy once (the macro expands to the ISA it is compiled for):
//
//   NPU_FA_REGISTER_ISA_KERNEL(decode_attention_stub, decode_attention);
//
// and the entry point calls decode_attention_stub(args...). The ISA is chosen once, from at::get_cpu_capability()
// (which honours ATEN_CPU_CAPABILITY): AVX512 -> the AVX512 copy, AVX2 -> AVX2, anything else -> DEFAULT; a copy
// that was not registered falls back to the next lower one.
#pragma once

#include <ATen/Version.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <string>
#include <utility>

namespace npu_fa::cpu {

enum class Isa : int { DEFAULT = 0, AVX2 = 1, AVX512 = 2 };
constexpr int kIsaCount = 3;

// The ISA the running CPU (or ATEN_CPU_CAPABILITY) asks for; read once per process.
inline Isa requested_isa() {
  static const Isa isa = [] {
    const std::string c = at::get_cpu_capability();
    if (c == "AVX512") return Isa::AVX512;
    if (c == "AVX2") return Isa::AVX2;
    return Isa::DEFAULT;
  }();
  return isa;
}

template <typename FnPtr>
struct IsaStub;

template <typename R, typename... Args>
struct IsaStub<R (*)(Args...)> {
  using FnPtr = R (*)(Args...);

  // constexpr, so a stub is constant-initialised: the *_isa.cpp objects may register into it during static
  // initialisation before the translation units that call it are initialised.
  constexpr explicit IsaStub(const char* stub_name) : name(stub_name) {}
  IsaStub(const IsaStub&) = delete;
  IsaStub& operator=(const IsaStub&) = delete;

  // The kernel's own parameter types (not a forwarding template), so braced arguments like {ptr, ld} work.
  R operator()(Args... args) { return kernel()(std::forward<Args>(args)...); }

  // The registered copy for this process, resolved on the first call.
  FnPtr kernel() {
    FnPtr fn = chosen.load(std::memory_order_acquire);
    if (fn == nullptr) {
      for (int i = static_cast<int>(requested_isa()); i >= 0 && fn == nullptr; --i) fn = slots[i];
      TORCH_CHECK(fn != nullptr, "npu_fa: no CPU kernel is registered for ", name, " (its *_isa.cpp objects are "
                  "not linked into the extension)");
      chosen.store(fn, std::memory_order_release);
    }
    return fn;
  }

  const char* name;
  FnPtr slots[kIsaCount] = {};  // indexed by Isa; written only by NPU_FA_REGISTER_ISA_KERNEL
  std::atomic<FnPtr> chosen{nullptr};
};

}  // namespace npu_fa::cpu

// In a family's kernel header, at namespace scope inside npu_fa::cpu. One definition for the whole library
// (an inline variable), whichever translation units include the header.
#define NPU_FA_DECLARE_ISA_STUB(stub, fn_ptr_type) inline ::npu_fa::cpu::IsaStub<fn_ptr_type> stub{#stub}

// Once in each *_isa.cpp, in fn's namespace (npu_fa::cpu::CPU_CAPABILITY). The registration is a plain store run by this
// object's static initialiser: no shared inline code is compiled with this ISA's flags, so nothing built for
// AVX-512 can run on a CPU without it. The objects are passed to the linker as objects (not an archive), so the
// initialiser is always kept.
#define NPU_FA_REGISTER_ISA_KERNEL(stub, fn)                                                                      \
  namespace {                                                                                                    \
  [[maybe_unused]] const bool npu_fa_registered_##stub =                                                         \
      (::npu_fa::cpu::stub.slots[static_cast<int>(::npu_fa::cpu::Isa::CPU_CAPABILITY)] = &fn, true);             \
  }
