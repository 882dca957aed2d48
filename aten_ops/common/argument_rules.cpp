#include "common/argument_rules.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace npu_fa {
namespace {

std::string element_name(const char* arg, size_t i) { return std::string(arg) + "[" + std::to_string(i) + "]"; }

// ---- memory: a tensor as the byte ranges it covers ----

struct Bytes {
  uintptr_t lo, hi;  // [lo, hi)
  bool operator<(const Bytes& o) const { return lo < o.lo; }
};

// The byte range from the tensor's first to its last element (strides are never negative in PyTorch).
Bytes extent(const at::Tensor& t) {
  const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
  uintptr_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += static_cast<uintptr_t>((t.size(d) - 1) * t.stride(d));
  return {base, base + (last + 1) * t.element_size()};
}

// The tensor as contiguous runs of bytes, sorted: inner dimensions that continue each other are one run, so a view
// with a contiguous last dimension has one run per row (T runs for a [T, N*D] slice of a fused qkv buffer).
std::vector<Bytes> runs(const at::Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dimensions of size > 1
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  int64_t run = 1;  // elements
  while (!dims.empty() && dims.back().first == run) {
    run *= dims.back().second;
    dims.pop_back();
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
  const auto item = static_cast<uintptr_t>(t.element_size());
  std::vector<Bytes> out;
  std::vector<int64_t> index(dims.size(), 0);
  for (;;) {
    int64_t offset = 0;
    for (size_t d = 0; d < dims.size(); ++d) offset += index[d] * dims[d].first;
    out.push_back({base + static_cast<uintptr_t>(offset) * item, base + static_cast<uintptr_t>(offset + run) * item});
    size_t d = dims.size();  // odometer over the outer dimensions, innermost first
    while (d > 0 && ++index[d - 1] == dims[d - 1].second) index[--d] = 0;
    if (d == 0) break;
  }
  if (!std::is_sorted(out.begin(), out.end())) std::sort(out.begin(), out.end());
  return out;
}

bool runs_intersect(const std::vector<Bytes>& a, const std::vector<Bytes>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].hi <= b[j].lo) {
      ++i;
    } else if (b[j].hi <= a[i].lo) {
      ++j;
    } else {
      return true;
    }
  }
  return false;
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return false;
  if (!a.has_storage() || !b.has_storage() || a.data_ptr() == nullptr || b.data_ptr() == nullptr) return false;
  const Bytes ea = extent(a), eb = extent(b);
  if (ea.hi <= eb.lo || eb.hi <= ea.lo) return false;  // the common case: disjoint memory, no enumeration
  return runs_intersect(runs(a), runs(b));
}

}  // namespace

// ---- device rule ----

void DeviceRule::device_tensor(const char* arg, const at::Tensor& t) {
  if (!t.defined()) return;
  if (!device_) {
    device_ = t.device();
    first_ = arg;
    return;
  }
  TORCH_CHECK_VALUE(t.device() == *device_, op_, ": argument '", arg, "' must be on device ", *device_,
                    " like argument '", first_, "'; got a tensor on device ", t.device());
}

void DeviceRule::device_tensor(const char* arg, const std::optional<at::Tensor>& t) {
  if (t.has_value()) device_tensor(arg, *t);
}

void DeviceRule::device_tensor(const char* arg, at::TensorList ts) {
  for (size_t i = 0; i < ts.size(); ++i) device_tensor(element_name(arg, i).c_str(), ts[i]);
}

void DeviceRule::host_tensor(const char* arg, const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu() || !device_) return;
  TORCH_CHECK_VALUE(t.device() == *device_, op_, ": argument '", arg, "' must be on device ", *device_,
                    " like argument '", first_, "' or on the host (cpu); got a tensor on device ", t.device());
}

void DeviceRule::host_tensor(const char* arg, const std::optional<at::Tensor>& t) {
  if (t.has_value()) host_tensor(arg, *t);
}

void DeviceRule::host_tensor(const char* arg, at::TensorList ts) {
  for (size_t i = 0; i < ts.size(); ++i) host_tensor(element_name(arg, i).c_str(), ts[i]);
}

// ---- overlap rules ----

void check_no_self_overlap(const char* op, const char* arg, const at::Tensor& t) {
  if (!t.defined() || t.numel() < 2) return;
  const at::MemOverlap status = at::has_internal_overlap(t);
  if (status == at::MemOverlap::No) return;
  bool self = status == at::MemOverlap::Yes;
  if (!self) {  // strides PyTorch cannot classify: compare the runs themselves
    const std::vector<Bytes> r = runs(t);
    for (size_t i = 1; i < r.size() && !self; ++i) self = r[i].lo < r[i - 1].hi;
  }
  TORCH_CHECK_VALUE(!self, op, ": argument '", arg, "' is written in place but some of its elements share memory (an ",
                    "expand()ed or overlapping-stride view, strides ", t.strides(), "); pass a tensor whose elements ",
                    "are distinct, e.g. its .clone()");
}

void check_no_overlap(const char* op, const char* written_arg, const at::Tensor& written, const char* other_arg,
                      const at::Tensor& other) {
  TORCH_CHECK_VALUE(!overlaps(written, other), op, ": argument '", written_arg, "' is written in place and shares ",
                    "memory with argument '", other_arg, "' (views of one buffer with common elements); the result ",
                    "would depend on the order of the writes. Pass non-overlapping tensors, e.g. a .clone() of '",
                    other_arg, "'");
}

void check_no_overlap(const char* op, const char* written_arg, const at::Tensor& written, const char* other_arg,
                      const std::optional<at::Tensor>& other) {
  if (other.has_value()) check_no_overlap(op, written_arg, written, other_arg, *other);
}

void check_no_overlap(const char* op, const char* written_arg, const at::Tensor& written, const char* other_arg,
                      at::TensorList others) {
  for (size_t i = 0; i < others.size(); ++i)
    check_no_overlap(op, written_arg, written, element_name(other_arg, i).c_str(), others[i]);
}

}  // namespace npu_fa
