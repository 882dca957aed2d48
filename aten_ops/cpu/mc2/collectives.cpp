// Functional collectives through the dispatcher, process-group lookup and cross-rank validation (collectives.h).
#include "cpu/mc2/collectives.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

#include <atomic>
#include <cstdlib>
#include <sstream>

namespace npu_fa {
namespace mc2 {
namespace {

c10::OperatorHandle functional_op(const char* name) {
  // Looked up on every call (a hash lookup, negligible next to a collective): the c10d library may load after us.
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

// Boxed call: the group_name argument is typed `Any` in recent schemas, which the unboxed typed<> API rejects.
at::Tensor call(const char* name, std::vector<c10::IValue> stack) {
  functional_op(name).callBoxed(&stack);
  return stack.at(0).toTensor();
}

// Whether `pg` can run collectives on tensors of `type` itself (the lookup throws when it has no backend for it).
bool has_backend(c10d::ProcessGroup& pg, c10::DeviceType type) {
  try {
    pg.getBackend(type);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The tensor a functional collective of `g` sends: contiguous, and a host copy when `g` communicates via the host.
at::Tensor for_group(const at::Tensor& t, const Group& g) {
  return g.via_host ? t.to(c10::kCPU).contiguous() : t.contiguous();
}

bool validation_default() {
  const char* env = std::getenv("TOT_MC2_VALIDATE");
  return env == nullptr || std::string(env) != "0";
}

std::atomic<bool>& validation_flag() {
  static std::atomic<bool> flag{validation_default()};
  return flag;
}

}  // namespace

Group resolve_group(const char* op, c10::string_view group_name, int64_t world_size, const c10::Device& device) {
  const std::string name(group_name.data(), group_name.size());
  TORCH_CHECK_VALUE(!name.empty(), op, ": argument 'group_name' is empty; pass the name of an initialised process "
                    "group (ProcessGroup.group_name, e.g. torch.distributed.group.WORLD.group_name)");
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = c10d::resolve_process_group(name);
  } catch (const std::exception&) {
    pg.reset();
  }
  TORCH_CHECK_VALUE(pg, op, ": argument 'group_name' ('", name, "') names no registered process group; initialise "
                    "torch.distributed (init_process_group / new_group) and pass that group's group_name");
  const int64_t size = pg->getSize();
  TORCH_CHECK_VALUE(world_size < 0 || world_size == size, op, ": argument 'world_size' (", world_size,
                    ") must equal the size of group '", name, "' (", size, ")");
  bool via_host = false;
  if (device.type() != c10::DeviceType::CPU && !has_backend(*pg, device.type())) {
    TORCH_CHECK_VALUE(has_backend(*pg, c10::DeviceType::CPU), op, ": process group '", name,
                      "' has no backend for the inputs' device (", device, ") nor for the CPU");
    via_host = true;
  }
  return {name, size, static_cast<int64_t>(pg->getRank()), device, via_host};
}

at::Tensor all_gather_async(const at::Tensor& input, const Group& g) {
  return call("_c10d_functional::all_gather_into_tensor", {for_group(input, g), g.size, g.name});
}

at::Tensor reduce_scatter_async(const at::Tensor& input, const Group& g) {
  return call("_c10d_functional::reduce_scatter_tensor", {for_group(input, g), std::string("sum"), g.size, g.name});
}

at::Tensor all_reduce_async(const at::Tensor& input, const Group& g) {
  return call("_c10d_functional::all_reduce", {for_group(input, g), std::string("sum"), g.name});
}

at::Tensor wait(const at::Tensor& pending, const Group& g) {
  const at::Tensor done = call("_c10d_functional::wait_tensor", {pending});
  return g.via_host ? done.to(g.device) : done;
}

bool validation_enabled() { return validation_flag().load(); }
void set_validation(bool enabled) { validation_flag().store(enabled); }

void validate_across_ranks(const char* op, const Group& g, const Signature& sig) {
  if (!validation_enabled() || g.size == 1) return;
  const int64_t n = static_cast<int64_t>(sig.values.size());
  const at::Tensor mine = at::tensor(sig.values, at::TensorOptions().dtype(at::kLong)).to(g.device);
  const at::Tensor all = wait(all_gather_async(mine, g), g).view({g.size, n}).cpu();
  const auto a = all.accessor<int64_t, 2>();
  for (int64_t f = 0; f < n; ++f) {
    for (int64_t r = 0; r < g.size; ++r) {
      if (a[r][f] == a[0][f]) continue;
      std::ostringstream per_rank;
      for (int64_t q = 0; q < g.size; ++q) {
        const bool is_dtype = sig.fields[f].find("dtype") != std::string::npos;
        per_rank << (q ? ", " : "") << "rank " << q << ": ";
        if (is_dtype) per_rank << c10::toString(static_cast<at::ScalarType>(a[q][f]));
        else per_rank << a[q][f];
      }
      TORCH_CHECK_VALUE(false, op, ": ranks of group '", g.name, "' disagree on ", sig.fields[f], " (", per_rank.str(),
                        "); every rank must call the op with the same ", sig.fields[f]);
    }
  }
}

}  // namespace mc2
}  // namespace npu_fa
