// Global Memory: the registry of GM allocations and GlobalTensor (docs: 基础API/数据类型定义/GlobalTensor.md).
#pragma once

#include <cstddef>

#include "core.h"

namespace AscendC::cpu {

// GM is every buffer obtained from GmAlloc (or registered by the PyTorch glue for the duration of one launch).
// A GlobalTensor must lie inside one of them; every element access is checked against its own size.
void GmRegister(const void* ptr, size_t bytes);
void GmUnregister(const void* ptr);
bool GmContains(const void* ptr, size_t bytes);

// Registers [ptr, ptr + bytes) as GM for one scope (the glue's tensors).
class ScopedGm {
 public:
  ScopedGm(const void* ptr, size_t bytes) : ptr_(ptr) { if (ptr_) GmRegister(ptr, bytes); }
  ~ScopedGm() { if (ptr_) GmUnregister(ptr_); }
  ScopedGm(const ScopedGm&) = delete;
  ScopedGm& operator=(const ScopedGm&) = delete;
 private:
  const void* ptr_;
};

void AtomicAddToGm(float* dst, const float* src, size_t n);
void AtomicAddToGm(half* dst, const half* src, size_t n);
void AtomicAddToGm(bfloat16_t* dst, const bfloat16_t* src, size_t n);
template <typename T>
void AtomicAddToGm(T* dst, const T* src, size_t n) {
  static_assert(sizeof(T) == 0, "SetAtomicAdd supports float, half and bfloat16_t here");
}

}  // namespace AscendC::cpu

namespace AscendC {

template <typename T>
class GlobalTensor {
 public:
  using PrimType = T;
  // Docs: GlobalTensor.md — SetGlobalBuffer(__gm__ PrimType* buffer, uint64_t bufferSize) (size in elements).
  __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) {
    ASCENDC_CPU_CHECK(buffer != nullptr, "GlobalTensor::SetGlobalBuffer", "buffer is null");
    ASCENDC_CPU_CHECK(cpu::GmContains(buffer, bufferSize * sizeof(T)), "GlobalTensor::SetGlobalBuffer",
                      "[", static_cast<const void*>(buffer), ", +", bufferSize * sizeof(T),
                      " bytes) is not inside one GM allocation (GmAlloc / a kernel argument)");
    addr_ = buffer;
    size_ = bufferSize;
  }
  // Without a size the tensor may not be indexed beyond element 0 in this runtime: pass the size (stricter than
  // hardware, which does not know it either).
  __aicore__ inline void SetGlobalBuffer(__gm__ T* buffer) { SetGlobalBuffer(buffer, 1); }

  __aicore__ inline GlobalTensor operator[](const uint64_t offset) const {
    ASCENDC_CPU_CHECK(offset <= size_, "GlobalTensor::operator[]", "offset ", offset,
                      " is beyond the tensor's ", size_, " elements");
    GlobalTensor t;
    t.addr_ = addr_ + offset;
    t.size_ = size_ - offset;
    return t;
  }
  __aicore__ inline T GetValue(const uint64_t offset) const {
    CheckIndex(offset, "GlobalTensor::GetValue");
    cpu::Core().counters.gm_read_bytes += sizeof(T);
    ++cpu::Core().counters.scalar_gm;
    return addr_[offset];
  }
  __aicore__ inline void SetValue(const uint64_t offset, T value) {
    CheckIndex(offset, "GlobalTensor::SetValue");
    cpu::Core().counters.gm_write_bytes += sizeof(T);
    ++cpu::Core().counters.scalar_gm;
    addr_[offset] = value;
  }
  __aicore__ inline uint64_t GetSize() const { return size_; }
  __aicore__ inline const __gm__ T* GetPhyAddr() const { return addr_; }
  __aicore__ inline __gm__ T* GetPhyAddr(const uint64_t offset) const { return addr_ + offset; }

  // Sim: element range check used by DataCopy.
  void CheckRange(uint64_t first, uint64_t count, const char* api, const char* what) const {
    ASCENDC_CPU_CHECK(addr_ != nullptr, api, what, ": GlobalTensor has no buffer (SetGlobalBuffer was not called)");
    ASCENDC_CPU_CHECK(first + count <= size_, api, what, ": GM access of elements [", first, ", ", first + count,
                      ") is out of bounds of the GlobalTensor's ", size_, " elements");
  }
  T* Data() const { return addr_; }

 private:
  void CheckIndex(uint64_t offset, const char* api) const { CheckRange(offset, 1, api, "index"); }
  T* addr_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace AscendC
