// TPipe / TQue / TBuf: on-chip buffer management and the queues that order a core's pipes
// (docs: 基础API/资源管理/TPipe.md, TQue.md, TBuf.md; 基础API/系统变量访问/GetTPipePtr.md).
// Stricter than hardware: capacity, double initialisation, Alloc/EnQue/DeQue/Free order, leaks at kernel end.
#pragma once

#include <deque>
#include <functional>
#include <vector>

#include "local_tensor.h"

namespace AscendC::cpu {

class QueueBase {
 public:
  QueueBase(TPosition pos, int32_t depth) : pos_(pos), depth_(depth) {}
  ~QueueBase();                 // a queue destroyed before its pipe reports its leaks then and detaches
  QueueBase(const QueueBase&) = delete;
  QueueBase& operator=(const QueueBase&) = delete;

  void Init(Arena& arena, uint8_t num, uint32_t len);
  BufferSlot* Alloc();
  void Push(BufferSlot* slot);
  BufferSlot* Pop();
  void Free(BufferSlot* slot);
  bool Vacant() const { return fifo_.size() < size_t(depth_); }
  size_t Queued() const { return fifo_.size(); }
  void Release();            // TPipe::Reset / destruction: report leaks, forget buffers
  TPipe* pipe = nullptr;     // the pipe that gave it buffers
  TPosition Position() const { return pos_; }
  uint32_t BufferBytes() const { return len_; }

 private:
  TPosition pos_;
  int32_t depth_;
  uint32_t len_ = 0;
  std::vector<BufferSlot> slots_;
  std::deque<BufferSlot*> fifo_;
};

}  // namespace AscendC::cpu

namespace AscendC {

template <TPosition pos, int32_t depth, auto mask = 0>
class TQue : public cpu::QueueBase {
 public:
  TQue() : cpu::QueueBase(pos, depth) {}
  template <typename T>
  __aicore__ inline LocalTensor<T> AllocTensor() {
    cpu::BufferSlot* s = Alloc();
    return LocalTensor<T>(reinterpret_cast<T*>(s->addr), s->bytes / sizeof(T), pos, s);
  }
  template <typename T>
  __aicore__ inline void FreeTensor(LocalTensor<T>& tensor) { Free(tensor.Slot()); }
  template <typename T>
  __aicore__ inline bool EnQue(const LocalTensor<T>& tensor) {
    Push(tensor.Slot());
    return true;
  }
  template <typename T>
  __aicore__ inline LocalTensor<T> DeQue() {
    cpu::BufferSlot* s = Pop();
    return LocalTensor<T>(reinterpret_cast<T*>(s->addr), s->bytes / sizeof(T), pos, s);
  }
  __aicore__ inline bool VacantInQue() { return Vacant(); }
  __aicore__ inline bool HasTensorInQue() { return Queued() > 0; }
  __aicore__ inline int32_t GetTensorCountInQue() { return int32_t(Queued()); }
};

template <TPosition pos = TPosition::VECCALC>
class TBuf {
 public:
  template <typename T>
  __aicore__ inline LocalTensor<T> Get() { return Get<T>(bytes_ / sizeof(T)); }
  template <typename T>
  __aicore__ inline LocalTensor<T> Get(uint32_t len) {
    ASCENDC_CPU_CHECK(addr_ != nullptr, "TBuf::Get", "the TBuf was never given memory by TPipe::InitBuffer");
    ASCENDC_CPU_CHECK(uint64_t(len) * sizeof(T) <= bytes_, "TBuf::Get", len, " elements of ", sizeof(T),
                      " bytes exceed the buffer's ", bytes_, " bytes");
    return LocalTensor<T>(reinterpret_cast<T*>(addr_), len, pos);
  }
  template <typename T>
  __aicore__ inline LocalTensor<T> GetWithOffset(uint32_t size, uint32_t bufOffset) {
    ASCENDC_CPU_CHECK(addr_ != nullptr, "TBuf::GetWithOffset", "the TBuf was never given memory by InitBuffer");
    ASCENDC_CPU_CHECK(bufOffset % cpu::kDataBlock == 0, "TBuf::GetWithOffset", "offset ", bufOffset,
                      " bytes is not 32-byte aligned");
    ASCENDC_CPU_CHECK(bufOffset + uint64_t(size) * sizeof(T) <= bytes_, "TBuf::GetWithOffset", "[", bufOffset,
                      ", +", uint64_t(size) * sizeof(T), ") bytes exceed the buffer's ", bytes_, " bytes");
    return LocalTensor<T>(reinterpret_cast<T*>(addr_ + bufOffset), size, pos);
  }
  // Sim: set by TPipe::InitBuffer.
  void Bind(uint8_t* addr, uint32_t bytes) {
    ASCENDC_CPU_CHECK(addr_ == nullptr, "TPipe::InitBuffer", "this TBuf already has a buffer");
    addr_ = addr;
    bytes_ = bytes;
  }
  void Unbind() { addr_ = nullptr; bytes_ = 0; }
  ~TBuf();
  TPipe* pipe_ = nullptr;

 private:
  uint8_t* addr_ = nullptr;
  uint32_t bytes_ = 0;
};

class TPipe {
 public:
  TPipe();
  ~TPipe();
  TPipe(const TPipe&) = delete;
  TPipe& operator=(const TPipe&) = delete;

  // Docs: TPipe.md InitBuffer(T& que, uint8_t num, uint32_t len) — len in bytes per buffer, rounded up to 32 B.
  template <class T>
  __aicore__ inline bool InitBuffer(T& que, uint8_t num, uint32_t len) {
    static_assert(std::is_base_of_v<cpu::QueueBase, T>, "InitBuffer(que, num, len) takes a TQue");
    que.Init(cpu::Core().ArenaFor(que.Position()), num, len);
    que.pipe = this;
    queues_.push_back(&que);
    return true;
  }
  template <TPosition pos>
  __aicore__ inline bool InitBuffer(TBuf<pos>& buf, uint32_t len) {
    buf.Bind(Carve(cpu::Core().ArenaFor(pos), cpu::RoundUp(len, cpu::kDataBlock), "TPipe::InitBuffer(TBuf)"),
             len);
    buf.pipe_ = this;
    bufs_.push_back(&buf);
    unbind_.push_back([&buf] { buf.Unbind(); buf.pipe_ = nullptr; });
    return true;
  }
  template <HardEvent evt>
  __aicore__ inline TEventID AllocEventID() {
    for (int i = 0; i < 8; ++i) {
      if (!(event_used_[int(evt)] & (1u << i))) {
        event_used_[int(evt)] |= 1u << i;
        return TEventID(i);
      }
    }
    cpu::Fail("TPipe::AllocEventID", "all 8 event ids of this HardEvent are allocated (missing ReleaseEventID)");
  }
  template <HardEvent evt>
  __aicore__ inline void ReleaseEventID(TEventID id) { event_used_[int(evt)] &= ~(1u << id); }
  __aicore__ inline TEventID FetchEventID(HardEvent evt) {
    for (int i = 0; i < 8; ++i)
      if (!(event_used_[int(evt)] & (1u << i))) return TEventID(i);
    cpu::Fail("TPipe::FetchEventID", "no free event id for this HardEvent");
  }
  template <HardEvent evt>
  __aicore__ inline TEventID FetchEventID() { return FetchEventID(evt); }
  __aicore__ inline void Destroy() { Release(); }
  __aicore__ inline void Reset() { Release(); }

  // Sim: hand out a 32-byte aligned block of an arena (shared by TQue::Init).
  static uint8_t* Carve(cpu::Arena& arena, uint32_t bytes, const char* api);
  // Sim: a queue or TBuf going out of scope before the pipe.
  void Detach(const void* member);

 private:
  void Release();
  std::vector<cpu::QueueBase*> queues_;
  std::vector<const void*> bufs_;
  std::vector<std::function<void()>> unbind_;
  uint32_t event_used_[int(HardEvent::MAX)] = {};
};

template <TPosition pos>
TBuf<pos>::~TBuf() {
  if (pipe_) pipe_->Detach(this);
}

__aicore__ inline TPipe* GetTPipePtr() {
  TPipe* p = cpu::Core().pipe;
  ASCENDC_CPU_CHECK(p != nullptr, "GetTPipePtr", "no TPipe exists on this core");
  return p;
}

}  // namespace AscendC
