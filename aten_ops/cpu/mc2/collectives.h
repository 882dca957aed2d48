// MC2 building blocks: the process group behind a name, and PyTorch's functional collectives called through the
// dispatcher (torch.ops._c10d_functional.*), so the same code runs on gloo, hccl and nccl.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <string>
#include <vector>

namespace npu_fa {
namespace mc2 {

struct Group {
  std::string name;
  int64_t size;
  int64_t rank;
  c10::Device device;      // where the op's tensors live
  bool via_host = false;   // the group has no backend for `device`: collectives run on host copies
};

// Resolves `group_name` to a registered c10d process group for tensors on `device`; `world_size` (< 0: not given)
// must equal its size. A group without a backend for `device` but with a CPU one (a gloo group and tensors on an
// NPU, e.g. the simulated npu device) communicates through host copies of the tensors.
Group resolve_group(const char* op, c10::string_view group_name, int64_t world_size, const c10::Device& device);

// Asynchronous collectives: return the output tensor at once; wait() blocks until its data is there and returns it
// on the group's device.
at::Tensor all_gather_async(const at::Tensor& input, const Group& g);                 // rows concatenated rank-major
at::Tensor reduce_scatter_async(const at::Tensor& input, const Group& g);             // sum, rows split rank-major
at::Tensor all_reduce_async(const at::Tensor& input, const Group& g);                 // sum
at::Tensor wait(const at::Tensor& pending, const Group& g);

// Cross-rank validation: every rank all-gathers a small signature of its call (op, dtype, the shape of what it
// communicates, chunk count) and raises the same error when any rank differs. On by default (one tiny collective
// per op call; on a device (hccl/nccl) also a device-to-host copy, i.e. a host sync); set_validation(false) or
// TOT_MC2_VALIDATE=0 turns it off. The signature travels like the op's tensors (on their device, or on the host when
// the group communicates through host copies), since a device backend (hccl, nccl) only moves tensors of its device.
struct Signature {
  std::vector<std::string> fields;  // what each value means, for the error message
  std::vector<int64_t> values;
};
void validate_across_ranks(const char* op, const Group& g, const Signature& sig);
bool validation_enabled();
void set_validation(bool enabled);

}  // namespace mc2
}  // namespace npu_fa
