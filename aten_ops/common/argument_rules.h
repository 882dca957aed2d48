#pragma once
// The device and memory-overlap rules every op's generated wrapper applies before its kernel runs
// (aten_ops/generated/register_ops.cpp; the rules are declared in native_functions.yaml: `host_tensors`, and
// `Tensor(a!)` for written tensors). Kernels can then assume: every tensor is on the op's device (host tensors on
// the device or the CPU), and no written tensor shares an element with itself or with any other argument.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <string>

namespace npu_fa {

// Pins the op's device to the first non-host tensor it sees and rejects tensors on any other device: a mask on
// `meta` next to CPU inputs, a CPU index next to npu inputs. Host tensors may also be on the CPU.
class DeviceRule {
 public:
  explicit DeviceRule(const char* op) : op_(op) {}
  void device_tensor(const char* arg, const at::Tensor& t);
  void device_tensor(const char* arg, const std::optional<at::Tensor>& t);
  void device_tensor(const char* arg, at::TensorList ts);
  void host_tensor(const char* arg, const at::Tensor& t);
  void host_tensor(const char* arg, const std::optional<at::Tensor>& t);
  void host_tensor(const char* arg, at::TensorList ts);
  // The pinned device (the CPU when every tensor argument was absent).
  c10::Device device() const { return device_.value_or(c10::Device(c10::kCPU)); }

 private:
  const char* op_;
  std::string first_;  // the argument that pinned the device
  std::optional<c10::Device> device_;
};

// A written tensor may not alias itself (expand()ed or overlapping strides): two of its elements would be one.
void check_no_self_overlap(const char* op, const char* arg, const at::Tensor& t);
// A written tensor may not share any element with another argument (a view of the same memory): the kernel would
// read values it already overwrote, or write one element twice. Exact for strided views of one buffer (q and k
// split from a fused qkv projection, or the two halves of one KV cache, are accepted).
void check_no_overlap(const char* op, const char* written_arg, const at::Tensor& written, const char* other_arg,
                      const at::Tensor& other);
void check_no_overlap(const char* op, const char* written_arg, const at::Tensor& written, const char* other_arg,
                      const std::optional<at::Tensor>& other);
void check_no_overlap(const char* op, const char* written_arg, const at::Tensor& written, const char* other_arg,
                      at::TensorList others);

}  // namespace npu_fa
