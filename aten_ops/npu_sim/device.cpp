// The simulated NPU: PrivateUse1 backed by CPU memory, for tests and development without Ascend hardware.
//
// Nothing here runs when the library is loaded: every registration (device guard, hooks, aten kernels, the boxed
// CPU fallback, npu_fa kernels) is installed by tot_npu_sim_enable(), which Python calls through ctypes from
// torch_ops_transformer.npu_sim.enable() only after checking that torch_npu is absent. A process that never enables
// the simulator (or that uses a real torch_npu) sees no PrivateUse1 registration from this file.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "generated/simulated_npu_ops.h"
#include "npu/host_alias.h"

namespace {

constexpr c10::DeviceType kSim = c10::DeviceType::PrivateUse1;

// ---- devices: `count` of them (TOT_NPU_SIM_DEVICES, set once by tot_npu_sim_enable), a current one per thread ----

// The most devices the simulator offers: an Ascend host has at most 16 NPUs, and torch_npu's tests ask for 16 at most.
constexpr int kMaxDevices = 16;
std::atomic<c10::DeviceIndex> g_device_count{1};
thread_local c10::DeviceIndex t_current_device = 0;  // like a CUDA or ACL context: each host thread has its own

c10::DeviceIndex device_count() { return g_device_count.load(std::memory_order_relaxed); }

// The index `index` names a simulated device; raises ValueError naming it and the count otherwise.
void check_index(int index) {
  TORCH_CHECK_VALUE(index >= 0 && index < device_count(), "npu_sim: device index ", index,
                    " is out of range: the simulated NPU has ", static_cast<int>(device_count()), " device(s) (npu:0",
                    device_count() > 1 ? " to npu:" + std::to_string(device_count() - 1) : std::string(),
                    "; set TOT_NPU_SIM_DEVICES for more)");
}

c10::Device current_device() { return c10::Device(kSim, t_current_device); }

// Index -1 ("npu" without an index) means the current device.
void set_current_device(c10::DeviceIndex index) {
  if (index == -1) return;
  check_index(index);
  t_current_device = index;
}

// ---- memory: plain host memory whose DataPtr says "PrivateUse1" on the current device ----

void free_host(void* ptr) { std::free(ptr); }

struct SimAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nbytes ? std::malloc(nbytes) : nullptr;
    TORCH_CHECK(!nbytes || ptr, "npu_sim: out of host memory allocating ", nbytes, " bytes");
    return {ptr, ptr, &free_host, current_device()};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_host; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

SimAllocator& allocator() {
  static SimAllocator instance;
  return instance;
}

// ---- device guard: a current device per thread, one stream per device, events are no-ops (everything is
// synchronous host code) ----

struct SimGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kSim; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = current_device();
    set_current_device(d.index());
    return old;
  }
  c10::Device getDevice() const override { return current_device(); }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) t_current_device = d.index();
  }
  // The default stream of device `d` (the current device for "npu" without an index): the only stream there is.
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d.index() == -1 ? current_device() : d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override { return getStream(d); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getStream(d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return getStream(s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {}
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override { return true; }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

// ---- hooks: what the autograd engine and at::Context ask of an accelerator ----

struct SimHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  c10::DeviceIndex getCurrentDevice() const override { return t_current_device; }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device(index); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const c10::DeviceIndex old = t_current_device;
    set_current_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }
  // Random numbers on every simulated device come from the CPU generator (the CPU fallback runs the ops).
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  // All devices share host memory, so a bare pointer does not say which one allocated it: the current one.
  at::Device getDeviceFromPtr(void*) const override { return current_device(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override;
};

// ---- aliasing between the two views of the same host memory ----

// A CPU tensor over the memory of a simulated-NPU tensor (no copy; keeps the original storage alive).
at::Tensor as_cpu(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kSim) return t;
  c10::Storage keep = t.storage();
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, t.options().device(at::kCPU));
}

// A simulated-NPU tensor over the memory of a CPU tensor (no copy; keeps the CPU storage alive).
at::Tensor as_sim(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || t.device().type() == kSim) return t;
  c10::Storage keep = t.storage();
  // target_device: otherwise from_blob asks getDeviceFromPtr, which answers the current device, not `device`
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, t.options().device(device), device);
}

void grow_storage(const c10::Storage& storage, size_t nbytes) {
  if (nbytes <= storage.nbytes()) return;
  const c10::DeviceGuard guard(storage.device());  // the new memory stays on the storage's device
  c10::DataPtr fresh = allocator().allocate(nbytes);
  if (storage.nbytes()) std::memcpy(fresh.get(), storage.data(), storage.nbytes());
  const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(fresh));
  const_cast<c10::Storage&>(storage).set_nbytes(nbytes);
}

void SimHooks::resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const {
  grow_storage(storage, newsize);
}

// ---- aten kernels the CPU fallback cannot provide ----

// Factories allocate on the device they are given ("npu:k"), or on the current one ("npu", or no device).
at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device> device, std::optional<bool>) {
  const c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_strided_generic(size, stride, &allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                               std::optional<at::Device> device, std::optional<bool>,
                               std::optional<at::MemoryFormat> memory_format) {
  const c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_generic(size, &allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

// Both sides live in host memory, so any copy (npu<->npu, npu<->cpu) is a CPU copy between aliases.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  as_cpu(dst).copy_(as_cpu(self), non_blocking);
  return dst;
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size, std::optional<at::MemoryFormat> format) {
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(sizes);
  const int64_t needed = (impl->numel() + self.storage_offset()) * static_cast<int64_t>(self.dtype().itemsize());
  grow_storage(self.storage(), static_cast<size_t>(needed));
  if (format.has_value() && *format != at::MemoryFormat::Preserve) impl->empty_tensor_restride(*format);
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) {
    at::Tensor d = dst;
    resize_(d, c10::fromIntArrayRefSlow(self.sizes()), std::nullopt);
  }
  return copy_from(self, dst, false);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(source));
  self.unsafeGetTensorImpl()->set_sizes_and_strides(size, stride, offset);
  return self;
}

// Every other aten op: PyTorch's CPU fallback, which puts the results on the first tensor argument's device. As on a
// real device, tensors of two different npu devices in one op are refused (the CPU copies would hide it).
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n_args = op.schema().arguments().size();
  std::optional<c10::Device> first;
  auto check = [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kSim) return;
    if (!first) first = t.device();
    TORCH_CHECK(t.device() == *first, "Expected all tensors to be on the same device, but found at least two "
                "devices, ", *first, " and ", t.device(), "! (", op.schema().operator_name(),
                " on the simulated npu device)");
  };
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n_args); it != stack->end(); ++it) {
    if (it->isTensor()) {
      check(it->toTensor());
    } else if (it->isTensorList()) {
      for (const at::Tensor& t : it->toTensorVector()) check(t);
    } else if (it->isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : it->toOptionalTensorVector()) {
        if (t) check(*t);
      }
    }
  }
  const c10::OptionalDeviceGuard guard(first);
  at::native::cpu_fallback(op, stack);
}

// ---- npu_fa ops on the simulated device: their CPU kernel, run on CPU aliases of the same memory ----

void check_device(const c10::OperatorHandle& op, const c10::Argument& arg, const at::Tensor& t,
                  std::optional<c10::Device>& device) {
  // The op's host_tensors (native_functions.yaml: lengths read on the host) may stay on the CPU.
  if (!t.defined() || (t.device().is_cpu() && npu_fa::is_host_tensor(op.schema().name(), arg.name()))) return;
  if (!device) device = t.device();
  TORCH_CHECK_VALUE(t.device() == *device, op.schema().name(), ": argument '", arg.name(), "' must be on device ",
                    *device, " like the op's first tensor; got a tensor on device ", t.device());
}

void run_cpu_kernel_on_sim(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  // Like a CANN build, which has no kernel for these ops: tests use the switch to prove which kernel ran.
  TORCH_CHECK(!npu_fa::npu_host::fallback_forbidden(), schema.name(),
              ": has no Ascend C kernel; on the simulated npu device its CPU kernel runs, which "
              "TOT_NPU_SIM_NO_FALLBACK=1 forbids");
  const size_t n_args = schema.arguments().size();
  const size_t first = stack->size() - n_args;
  std::vector<c10::IValue> originals(stack->begin() + first, stack->end());
  std::optional<c10::Device> device;
  for (size_t i = 0; i < n_args; ++i) {
    c10::IValue& v = (*stack)[first + i];
    const auto& arg = schema.arguments()[i];
    if (v.isTensor()) {
      check_device(op, arg, v.toTensor(), device);
      v = as_cpu(v.toTensor());
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> cpu;
      for (const at::Tensor& t : v.toTensorVector()) {
        check_device(op, arg, t, device);
        cpu.push_back(as_cpu(t));
      }
      v = c10::IValue(cpu);
    }
  }
  const c10::Device target = device.value_or(current_device());
  {
    const c10::DeviceGuard guard(target);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  const size_t n_ret = schema.returns().size();
  const size_t ret0 = stack->size() - n_ret;
  for (size_t r = 0; r < n_ret; ++r) {
    c10::IValue& v = (*stack)[ret0 + r];
    // A return that aliases a mutated input is that input itself.
    const auto* alias = schema.returns()[r].alias_info();
    bool replaced = false;
    if (alias) {
      for (size_t i = 0; i < n_args && !replaced; ++i) {
        const auto* in = schema.arguments()[i].alias_info();
        if (in && in->beforeSets() == alias->beforeSets()) {
          v = originals[i];
          replaced = true;
        }
      }
    }
    if (replaced) continue;
    if (v.isTensor()) {
      v = as_sim(v.toTensor(), target);
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorVector()) out.push_back(as_sim(t, target));
      v = c10::IValue(out);
    }
  }
}

// ---- installation (once per process; the libraries are leaked on purpose so they stay registered) ----

void install(int devices) {
  TORCH_CHECK_VALUE(devices >= 1 && devices <= kMaxDevices, "npu_sim: the number of simulated devices must be "
                    "between 1 and ", kMaxDevices, "; got ", devices);
  TORCH_CHECK(!c10::impl::hasDeviceGuardImpl(kSim),
              "npu_sim: a PrivateUse1 device guard is already registered (is torch_npu or another backend loaded?)");
  TORCH_CHECK(!at::isPrivateUse1HooksRegistered(),
              "npu_sim: PrivateUse1 hooks are already registered (is torch_npu or another backend loaded?)");
  g_device_count = static_cast<c10::DeviceIndex>(devices);
  static c10::impl::DeviceGuardImplRegistrar guard_registrar(kSim, new SimGuardImpl());
  at::RegisterPrivateUse1HooksInterface(new SimHooks());
  c10::SetAllocator(kSim, &allocator());

  auto* aten = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  aten->impl("empty_strided", TORCH_FN(empty_strided));
  aten->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  aten->impl("_copy_from", TORCH_FN(copy_from));
  aten->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  aten->impl("resize_", TORCH_FN(resize_));
  aten->impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  // Views must alias: the CPU fallback would return a copy.
  aten->impl("view", TORCH_FN(at::native::view));
  aten->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  aten->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  aten->impl("unfold", TORCH_FN(at::native::unfold));

  auto* fallback = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  fallback->fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());

  auto* ops = new torch::Library(torch::Library::IMPL, "npu_fa", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  for (const char* name : npu_fa::kSimulatedNpuCpuKernelOps) {
    ops->impl(name, torch::CppFunction::makeFromBoxedFunction<&run_cpu_kernel_on_sim>());
  }
}

}  // namespace

// Called from Python (ctypes) by npu_sim.enable() with the number of devices; returns 0 on success, else writes the
// error into `error`. The ops served by their CPU kernel come from the generated list (native_functions.yaml: a CPU
// kernel, no PrivateUse1 one).
extern "C" __attribute__((visibility("default"))) int tot_npu_sim_enable(int devices, char* error, int error_len) {
  try {
    install(devices);
    return 0;
  } catch (const c10::Error& e) {
    std::snprintf(error, static_cast<size_t>(error_len), "%s", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::snprintf(error, static_cast<size_t>(error_len), "%s", e.what());
    return 1;
  }
}

// The most devices tot_npu_sim_enable accepts (npu_sim.enable() checks TOT_NPU_SIM_DEVICES against it).
extern "C" __attribute__((visibility("default"))) int tot_npu_sim_max_devices() { return kMaxDevices; }

// torch.npu.current_device(): the calling thread's current device.
extern "C" __attribute__((visibility("default"))) int tot_npu_sim_current_device() { return t_current_device; }

namespace {

// 0 when `index` names a device (then `then` runs), else 1 with the error in `error`.
template <class Then>
int with_index(int index, char* error, int error_len, Then then) {
  try {
    check_index(index);
    then();
    return 0;
  } catch (const c10::Error& e) {
    std::snprintf(error, static_cast<size_t>(error_len), "%s", e.what_without_backtrace());
    return 1;
  }
}

}  // namespace

// Whether `index` names a simulated device (torch.npu.* functions taking a device check with it).
extern "C" __attribute__((visibility("default"))) int tot_npu_sim_check_device(int index, char* error, int error_len) {
  return with_index(index, error, error_len, [] {});
}

// torch.npu.set_device(index) for the calling thread.
extern "C" __attribute__((visibility("default"))) int tot_npu_sim_set_device(int index, char* error, int error_len) {
  return with_index(index, error, error_len, [index] { t_current_device = static_cast<c10::DeviceIndex>(index); });
}
