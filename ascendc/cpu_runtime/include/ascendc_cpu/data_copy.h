// Data movement GM <-> UB and UB <-> UB (docs: 基础API/数据搬运/DataCopy.md, DataCopyPad.md, SetAtomicAdd.md).
// Stricter than hardware: DataCopy(count) whose byte size is not a multiple of 32 is an error (the hardware silently
// rounds it down), as is any unaligned UB address or a copy beyond either tensor.
#pragma once

#include "global_tensor.h"
#include "local_tensor.h"

namespace AscendC {

// Docs: DataCopy.md — blockLen and strides in DataBlocks (32 B).
struct DataCopyParams {
  uint16_t blockCount = 1;
  uint16_t blockLen = 0;
  uint16_t srcStride = 0;
  uint16_t dstStride = 0;
  DataCopyParams() = default;
  DataCopyParams(uint16_t count, uint16_t len, uint16_t srcStrideIn, uint16_t dstStrideIn)
      : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
};

// Docs: DataCopyPad.md — blockLen in bytes; the GM-side stride in bytes, the UB-side stride in DataBlocks.
struct DataCopyExtParams {
  uint16_t blockCount = 1;
  uint32_t blockLen = 0;
  uint32_t srcStride = 0;
  uint32_t dstStride = 0;
  uint32_t rsv = 0;
  DataCopyExtParams() = default;
  DataCopyExtParams(uint16_t count, uint32_t len, uint32_t srcStrideIn, uint32_t dstStrideIn, uint32_t rsvIn)
      : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
};

template <typename T>
struct DataCopyPadExtParams {
  bool isPad = false;
  uint8_t leftPadding = 0;
  uint8_t rightPadding = 0;
  T paddingValue = T(0);
  DataCopyPadExtParams() = default;
  DataCopyPadExtParams(bool isPadIn, uint8_t left, uint8_t right, T value)
      : isPad(isPadIn), leftPadding(left), rightPadding(right), paddingValue(value) {}
};

namespace cpu {

template <typename T>
void CheckWholeBlocks(uint64_t count, const char* api) {
  ASCENDC_CPU_CHECK(count * sizeof(T) % kDataBlock == 0, api, "count ", count, " x ", sizeof(T),
                    " bytes = ", count * sizeof(T),
                    " bytes is not a multiple of 32 (the hardware would silently drop the tail; use DataCopyPad)");
}

template <typename T>
void WriteGm(T* dst, const T* src, size_t n) {
  CoreContext& c = Core();
  c.counters.gm_write_bytes += n * sizeof(T);
  if (CountOnly()) return;
  if (!c.atomic_add) {
    std::memcpy(dst, src, n * sizeof(T));
  } else if constexpr (kIsFloating<T>) {
    AtomicAddToGm(dst, src, n);
  } else {  // integer outputs (indices) are plain copies; atomic accumulation is only in the subset for floats
    Fail("DataCopy(UB->GM)", Str("SetAtomicAdd is active but the copied data is ", TypeName<T>(),
                                 " (this runtime accumulates float, half and bfloat16_t only)"));
  }
}

}  // namespace cpu

// GM -> UB, `count` elements.
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const uint32_t count) {
  cpu::CheckWholeBlocks<T>(count, "DataCopy(GM->UB)");
  dst.CheckAligned("DataCopy(GM->UB)", "dst");
  dst.CheckRange(0, count, "DataCopy(GM->UB)", "dst");
  src.CheckRange(0, count, "DataCopy(GM->UB)", "src");
  if (!cpu::CountOnly()) std::memcpy(dst.Data(), src.Data(), size_t(count) * sizeof(T));
  auto& k = cpu::Core().counters;
  k.gm_read_bytes += uint64_t(count) * sizeof(T);
  k.copies += 1;
}

// UB -> GM, `count` elements.
template <typename T>
__aicore__ inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  cpu::CheckWholeBlocks<T>(count, "DataCopy(UB->GM)");
  src.CheckAligned("DataCopy(UB->GM)", "src");
  src.CheckRange(0, count, "DataCopy(UB->GM)", "src");
  dst.CheckRange(0, count, "DataCopy(UB->GM)", "dst");
  cpu::WriteGm(dst.Data(), src.Data(), count);
  cpu::Core().counters.copies += 1;
}

// UB -> UB, `count` elements.
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint32_t count) {
  cpu::CheckWholeBlocks<T>(count, "DataCopy(UB->UB)");
  dst.CheckAligned("DataCopy(UB->UB)", "dst");
  src.CheckAligned("DataCopy(UB->UB)", "src");
  dst.CheckRange(0, count, "DataCopy(UB->UB)", "dst");
  src.CheckRange(0, count, "DataCopy(UB->UB)", "src");
  if (!cpu::CountOnly()) std::memmove(dst.Data(), src.Data(), size_t(count) * sizeof(T));
  cpu::Core().counters.copies += 1;
}

namespace cpu {
// The walk of the strided forms: blockCount blocks of blockLen DataBlocks, srcStride / dstStride DataBlocks apart.
// Checks every block against both tensors, then move(dst, src, elements).
template <typename T, typename Dst, typename Src, typename Move>
void CopyBlocks(const Dst& dst, const Src& src, const DataCopyParams& p, const char* api, Move move) {
  constexpr uint32_t e = kDataBlock / sizeof(T);
  const uint64_t len = uint64_t(p.blockLen) * e;
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    const uint64_t s = b * (len + uint64_t(p.srcStride) * e), d = b * (len + uint64_t(p.dstStride) * e);
    src.CheckRange(s, len, api, "src");
    dst.CheckRange(d, len, api, "dst");
    move(dst.Data() + d, src.Data() + s, len);
  }
}
}  // namespace cpu

// Strided forms: blockCount blocks of blockLen DataBlocks; gaps of srcStride / dstStride DataBlocks between blocks.
template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                                const DataCopyParams& p) {
  const char* api = "DataCopy(GM->UB, DataCopyParams)";
  dst.CheckAligned(api, "dst");
  cpu::CopyBlocks<T>(dst, src, p, api, [](T* d, const T* s, uint64_t n) {
    if (!cpu::CountOnly()) std::memcpy(d, s, n * sizeof(T));
  });
  auto& k = cpu::Core().counters;
  k.gm_read_bytes += uint64_t(p.blockCount) * p.blockLen * cpu::kDataBlock;
  k.copies += 1;
}

template <typename T>
__aicore__ inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                                const DataCopyParams& p) {
  const char* api = "DataCopy(UB->GM, DataCopyParams)";
  src.CheckAligned(api, "src");
  cpu::CopyBlocks<T>(dst, src, p, api, [](T* d, const T* s, uint64_t n) { cpu::WriteGm(d, s, n); });
  cpu::Core().counters.copies += 1;
}

template <typename T>
__aicore__ inline void DataCopy(const LocalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p) {
  const char* api = "DataCopy(UB->UB, DataCopyParams)";
  dst.CheckAligned(api, "dst");
  src.CheckAligned(api, "src");
  cpu::CopyBlocks<T>(dst, src, p, api, [](T* d, const T* s, uint64_t n) {
    if (!cpu::CountOnly()) std::memmove(d, s, n * sizeof(T));
  });
  cpu::Core().counters.copies += 1;
}

// GM -> UB with any byte length: each of blockCount blocks of blockLen bytes lands at the next 32-byte boundary in
// UB, after leftPadding and before rightPadding elements (filled with paddingValue when isPad; otherwise the pad is
// left as NaN-poison so a kernel that reads it is caught by its results).
template <typename T>
__aicore__ inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                                   const DataCopyExtParams& p, const DataCopyPadExtParams<T>& pad) {
  const char* api = "DataCopyPad(GM->UB)";
  ASCENDC_CPU_CHECK(p.blockLen % sizeof(T) == 0, api, "blockLen ", p.blockLen, " bytes is not a multiple of ",
                    sizeof(T), " (sizeof T)");
  ASCENDC_CPU_CHECK(pad.leftPadding * sizeof(T) < cpu::kDataBlock && pad.rightPadding * sizeof(T) < cpu::kDataBlock,
                    api, "left/right padding must be under 32 bytes; got ", int(pad.leftPadding), " and ",
                    int(pad.rightPadding), " elements");
  dst.CheckAligned(api, "dst");
  const uint64_t n = p.blockLen / sizeof(T);
  const uint64_t ub_block = cpu::RoundUp(uint32_t((n + pad.leftPadding + pad.rightPadding) * sizeof(T)),
                                         cpu::kDataBlock) / sizeof(T);
  const uint64_t ub_pitch = ub_block + uint64_t(p.dstStride) * (cpu::kDataBlock / sizeof(T));
  const uint64_t gm_pitch_bytes = p.blockLen + uint64_t(p.srcStride);
  ASCENDC_CPU_CHECK(gm_pitch_bytes % sizeof(T) == 0, api, "srcStride ", p.srcStride,
                    " bytes is not a multiple of sizeof T");
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    const uint64_t s = b * (gm_pitch_bytes / sizeof(T)), d = b * ub_pitch;
    src.CheckRange(s, n, api, "src");
    dst.CheckRange(d, ub_block, api, "dst");
    T* out = dst.Data() + d;
    if (cpu::CountOnly()) continue;
    if (pad.isPad) for (uint64_t i = 0; i < ub_block; ++i) out[i] = pad.paddingValue;
    else std::memset(out, 0xff, ub_block * sizeof(T));
    if (!cpu::CountOnly()) std::memcpy(out + pad.leftPadding, src.Data() + s, n * sizeof(T));
  }
  auto& k = cpu::Core().counters;
  k.gm_read_bytes += uint64_t(p.blockCount) * p.blockLen;
  k.copies += 1;
}

// UB -> GM with any byte length: blockLen bytes of each 32-byte aligned UB block (UB gap srcStride DataBlocks) to
// GM blocks separated by dstStride bytes.
template <typename T>
__aicore__ inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                                   const DataCopyExtParams& p) {
  const char* api = "DataCopyPad(UB->GM)";
  ASCENDC_CPU_CHECK(p.blockLen % sizeof(T) == 0, api, "blockLen ", p.blockLen, " bytes is not a multiple of ",
                    sizeof(T), " (sizeof T)");
  src.CheckAligned(api, "src");
  const uint64_t n = p.blockLen / sizeof(T);
  const uint64_t ub_pitch = cpu::RoundUp(p.blockLen, cpu::kDataBlock) / sizeof(T) +
                            uint64_t(p.srcStride) * (cpu::kDataBlock / sizeof(T));
  const uint64_t gm_pitch_bytes = p.blockLen + uint64_t(p.dstStride);
  ASCENDC_CPU_CHECK(gm_pitch_bytes % sizeof(T) == 0, api, "dstStride ", p.dstStride,
                    " bytes is not a multiple of sizeof T");
  for (uint32_t b = 0; b < p.blockCount; ++b) {
    const uint64_t s = b * ub_pitch, d = b * (gm_pitch_bytes / sizeof(T));
    src.CheckRange(s, n, api, "src");
    dst.CheckRange(d, n, api, "dst");
    cpu::WriteGm(dst.Data() + d, src.Data() + s, n);
  }
  cpu::Core().counters.copies += 1;
}

// Docs: SetAtomicAdd.md / SetAtomicNone.md — later UB->GM copies add into GM instead of overwriting.
template <typename T>
__aicore__ inline void SetAtomicAdd() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>,
                "SetAtomicAdd<T>: T must be float, half or bfloat16_t");
  cpu::Core().atomic_add = true;
}
__aicore__ inline void SetAtomicNone() { cpu::Core().atomic_add = false; }

}  // namespace AscendC
