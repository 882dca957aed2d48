// Overflow-checked integer arithmetic for the argument parsers: lengths, paddings, capacities and byte counts that
// come from user-given integers. A sum or product that does not fit int64 would wrap and let a kernel index outside
// its tensors, and a huge but representable element count would make the allocator abort the process; both are
// turned into a ValueError naming the argument before anything is read or allocated.
#pragma once

#include <c10/util/Exception.h>

#include <unistd.h>

#include <cstdint>

namespace npu_fa {

// a + b, or a ValueError "<op>: <what> overflows int64 (a + b)".
inline int64_t checked_add(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t r = 0;
  TORCH_CHECK_VALUE(!__builtin_add_overflow(a, b, &r), op, ": ", what, " overflows int64 (", a, " + ", b, ")");
  return r;
}

// a * b, or a ValueError "<op>: <what> overflows int64 (a * b)".
inline int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t r = 0;
  TORCH_CHECK_VALUE(!__builtin_mul_overflow(a, b, &r), op, ": ", what, " overflows int64 (", a, " * ", b, ")");
  return r;
}

// The most an op allocates for one buffer sized by user-given integers: half the machine's physical memory (at most
// 2^40 bytes). A request beyond it is a wrong argument rather than a workload, and handing it to the allocator kills
// the process (or makes it swap to death) instead of raising; half leaves room for the op's other buffers.
inline int64_t max_alloc_bytes() {
  static const int64_t limit = [] {
    constexpr int64_t kCap = int64_t{1} << 40;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return kCap;
    const int64_t half = static_cast<int64_t>(pages) * static_cast<int64_t>(page) / 2;
    return half < kCap ? half : kCap;
  }();
  return limit;
}

// Checks that elements * element_size bytes (overflow-checked) fit max_alloc_bytes(); returns the byte count.
inline int64_t check_alloc(const char* op, const char* what, int64_t elements, int64_t element_size) {
  const int64_t bytes = checked_mul(op, what, elements, element_size);
  TORCH_CHECK_VALUE(bytes <= max_alloc_bytes(), op, ": ", what, " needs ", bytes, " bytes (", elements,
                    " elements); expected at most ", max_alloc_bytes(), " bytes (half the physical memory)");
  return bytes;
}

}  // namespace npu_fa
