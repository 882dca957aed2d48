// LocalTensor: a typed window on one core's on-chip memory (docs: 基础API/数据类型定义/LocalTensor.md).
#pragma once

#include "core.h"

namespace AscendC::cpu {

// State of one queue buffer; LocalTensors allocated from a TQue point at theirs so misuse is caught.
enum class SlotState : uint8_t { FREE, ALLOCATED, ENQUEUED, DEQUEUED };
class QueueBase;
struct BufferSlot {
  uint8_t* addr = nullptr;
  uint32_t bytes = 0;
  SlotState state = SlotState::FREE;
  QueueBase* owner = nullptr;
};

}  // namespace AscendC::cpu

namespace AscendC {

template <typename T>
class LocalTensor {
 public:
  using PrimType = T;
  LocalTensor() = default;
  LocalTensor(T* addr, uint32_t size, TPosition pos, cpu::BufferSlot* slot = nullptr)
      : addr_(addr), size_(size), pos_(pos), slot_(slot) {}

  __aicore__ inline LocalTensor operator[](const uint32_t offset) const {
    ASCENDC_CPU_CHECK(offset <= size_, "LocalTensor::operator[]", "offset ", offset, " is beyond the tensor's ",
                      size_, " elements");
    return LocalTensor(addr_ + offset, size_ - offset, pos_, slot_);
  }
  template <typename U>
  __aicore__ inline LocalTensor<U> ReinterpretCast() const {
    return LocalTensor<U>(reinterpret_cast<U*>(addr_), uint32_t(uint64_t(size_) * sizeof(T) / sizeof(U)), pos_,
                          slot_);
  }
  __aicore__ inline T GetValue(const uint32_t index) const {
    CheckIndex(index, "LocalTensor::GetValue");
    ++cpu::Core().counters.scalar_ub;
    return addr_[index];
  }
  template <typename S>
  __aicore__ inline void SetValue(const uint32_t index, const S value) const {
    CheckIndex(index, "LocalTensor::SetValue");
    ++cpu::Core().counters.scalar_ub;
    addr_[index] = static_cast<T>(value);
  }
  __aicore__ inline T& operator()(const uint32_t index) const {
    CheckIndex(index, "LocalTensor::operator()");
    ++cpu::Core().counters.scalar_ub;
    return addr_[index];
  }
  __aicore__ inline void SetSize(const uint32_t size) {
    ASCENDC_CPU_CHECK(size <= capacity(), "LocalTensor::SetSize", "size ", size, " exceeds the buffer's ",
                      capacity(), " elements");
    size_ = size;
  }
  __aicore__ inline uint32_t GetSize() const { return size_; }
  __aicore__ inline int32_t GetPosition() const { return int32_t(pos_); }

  // Sim helpers (not Ascend C API): raw access for the runtime's own instructions.
  T* Data() const { return addr_; }
  cpu::BufferSlot* Slot() const { return slot_; }
  TPosition Position() const { return pos_; }
  bool Empty() const { return addr_ == nullptr; }
  uint32_t capacity() const {
    if (!slot_) return size_;
    return uint32_t((slot_->addr + slot_->bytes - reinterpret_cast<uint8_t*>(addr_)) / sizeof(T));
  }
  // Checks that [first, first+count) lies in the tensor and that the slot is usable (not freed / in flight).
  void CheckRange(uint64_t first, uint64_t count, const char* api, const char* what) const {
    ASCENDC_CPU_CHECK(addr_ != nullptr, api, what, ": LocalTensor has no buffer (AllocTensor / Get was not called)");
    ASCENDC_CPU_CHECK(first + count <= size_, api, what, ": elements [", first, ", ", first + count,
                      ") are out of bounds of the LocalTensor's ", size_, " elements");
    if (slot_) {
      ASCENDC_CPU_CHECK(slot_->state != cpu::SlotState::FREE, api, what,
                        ": the tensor's queue buffer was freed (FreeTensor) and may be reused");
      ASCENDC_CPU_CHECK(slot_->state != cpu::SlotState::ENQUEUED, api, what,
                        ": the tensor is in a queue (EnQue'd and not yet DeQue'd)");
    }
  }
  // Vector instructions and UB copies address whole DataBlocks: a start address must be 32-byte aligned.
  void CheckAligned(const char* api, const char* what) const {
    auto& arena = cpu::Core().ArenaFor(pos_);
    const uint64_t off = reinterpret_cast<uint8_t*>(addr_) - arena.base;
    ASCENDC_CPU_CHECK(off % cpu::kDataBlock == 0, api, what, ": ", arena.name, " address offset ", off,
                      " is not 32-byte aligned");
  }

 private:
  void CheckIndex(uint32_t index, const char* api) const { CheckRange(index, 1, api, "index"); }
  T* addr_ = nullptr;
  uint32_t size_ = 0;
  TPosition pos_ = TPosition::VECCALC;
  cpu::BufferSlot* slot_ = nullptr;
};

}  // namespace AscendC
