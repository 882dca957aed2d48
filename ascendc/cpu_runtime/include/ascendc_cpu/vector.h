// Vector instructions (docs: 基础API/矢量计算/*). Two forms, as on the device:
//  - level 2, "first count elements":   Add(dst, src0, src1, count)
//  - level 0, mask / repeat / strides:  Add(dst, src0, src1, mask, repeatTime, BinaryRepeatParams)
// Every instruction computes in fp32 and rounds to the destination type; checks 32-byte aligned operands, tensor
// bounds of the whole footprint, mask and repeat ranges. Counters feed the performance model.
#pragma once

#include <algorithm>

#include "local_tensor.h"

namespace AscendC {

// Docs: 矢量计算/基础算术/Add.md (BinaryRepeatParams), Exp.md (UnaryRepeatParams), Brcb.md (BrcbRepeatParams).
struct BinaryRepeatParams {
  uint32_t blockNumber = 8;
  uint8_t dstBlkStride = 1, src0BlkStride = 1, src1BlkStride = 1;
  uint8_t dstRepStride = 8, src0RepStride = 8, src1RepStride = 8;
  bool repeatStrideMode = false, strideSizeMode = false;
  BinaryRepeatParams() = default;
  BinaryRepeatParams(uint8_t dstBlk, uint8_t src0Blk, uint8_t src1Blk, uint8_t dstRep, uint8_t src0Rep,
                     uint8_t src1Rep)
      : dstBlkStride(dstBlk), src0BlkStride(src0Blk), src1BlkStride(src1Blk), dstRepStride(dstRep),
        src0RepStride(src0Rep), src1RepStride(src1Rep) {}
};
struct UnaryRepeatParams {
  uint32_t blockNumber = 8;
  uint16_t dstBlkStride = 1, srcBlkStride = 1;
  uint8_t dstRepStride = 8, srcRepStride = 8;
  bool repeatStrideMode = false, strideSizeMode = false;
  UnaryRepeatParams() = default;
  UnaryRepeatParams(uint16_t dstBlk, uint16_t srcBlk, uint8_t dstRep, uint8_t srcRep)
      : dstBlkStride(dstBlk), srcBlkStride(srcBlk), dstRepStride(dstRep), srcRepStride(srcRep) {}
};
struct BrcbRepeatParams {
  uint16_t dstBlkStride = 1;
  uint16_t dstRepStride = 8;
  BrcbRepeatParams() = default;
  BrcbRepeatParams(uint16_t dstBlk, uint16_t dstRep) : dstBlkStride(dstBlk), dstRepStride(dstRep) {}
};

namespace cpu {

inline void CountVector(uint64_t elements, size_t elem_bytes) {
  auto& k = Core().counters;
  k.vector_elements += elements;
  k.vector_repeats += (elements * elem_bytes + kRepeatBytes - 1) / kRepeatBytes;
  ++k.vector_instrs;
}

template <typename T>
void Operand(const LocalTensor<T>& t, uint64_t count, const char* api, const char* what) {
  t.CheckAligned(api, what);
  t.CheckRange(0, count, api, what);
}

inline void CheckCount(int64_t count, const char* api) {
  ASCENDC_CPU_CHECK(count >= 0, api, "count must be >= 0; got ", count);
}

template <typename T, typename F>
void Map1(const LocalTensor<T>& dst, const LocalTensor<T>& src, int64_t count, const char* api, F f) {
  CheckCount(count, api);
  Operand(dst, count, api, "dst");
  Operand(src, count, api, "src");
  T* d = dst.Data();
  const T* s = src.Data();
  if (!CountOnly()) for (int64_t i = 0; i < count; ++i) d[i] = FromFloat<T>(f(ToFloat(s[i])));
  CountVector(count, sizeof(T));
}

template <typename T, typename F>
void Map2(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, int64_t count,
          const char* api, F f) {
  CheckCount(count, api);
  Operand(dst, count, api, "dst");
  Operand(a, count, api, "src0");
  Operand(b, count, api, "src1");
  T* d = dst.Data();
  const T* x = a.Data();
  const T* y = b.Data();
  if (!CountOnly()) for (int64_t i = 0; i < count; ++i) d[i] = FromFloat<T>(f(ToFloat(x[i]), ToFloat(y[i])));
  CountVector(count, sizeof(T));
}

// Level-0 addressing: element j of repeat r of an operand with (blkStride, repStride) in DataBlocks.
template <typename T>
struct Strided {
  static constexpr uint32_t kPerBlock = kDataBlock / sizeof(T);
  static constexpr uint32_t kPerRepeat = kRepeatBytes / sizeof(T);
  uint32_t blk, rep;
  uint64_t At(uint32_t r, uint32_t j) const {
    return uint64_t(r) * rep * kPerBlock + uint64_t(j / kPerBlock) * blk * kPerBlock + j % kPerBlock;
  }
};

// The elements of one repeat a mask selects: continuous (first n) or bitwise (two 64-bit words).
template <typename T>
struct Mask {
  static constexpr uint32_t kPerRepeat = kRepeatBytes / sizeof(T);
  uint64_t bits[2] = {0, 0};
  Mask(uint64_t n, const char* api) {
    ASCENDC_CPU_CHECK(n >= 1 && n <= kPerRepeat, api, "mask ", n, " must be in [1, ", kPerRepeat, "] for ",
                      sizeof(T) * 8, "-bit data");
    for (uint32_t j = 0; j < n; ++j) bits[j / 64] |= 1ull << (j % 64);
  }
  Mask(const uint64_t m[], const char* api) {
    bits[0] = m[0];
    bits[1] = m[1];
    ASCENDC_CPU_CHECK(sizeof(T) == 2 || bits[1] == 0, api, "mask[1] must be 0 for 32-bit data (64 lanes)");
    ASCENDC_CPU_CHECK(bits[0] || bits[1], api, "mask selects no element");
  }
  bool On(uint32_t j) const { return (bits[j / 64] >> (j % 64)) & 1; }
  uint32_t Last() const {
    for (int j = int(kPerRepeat) - 1; j >= 0; --j) if (On(j)) return j;
    return 0;
  }
};

template <typename T>
void CheckFootprint(const LocalTensor<T>& t, const Strided<T>& s, const Mask<T>& m, uint8_t repeat,
                    const char* api, const char* what) {
  t.CheckAligned(api, what);
  if (repeat == 0) return;
  uint64_t hi = 0;
  for (uint32_t r : {0u, uint32_t(repeat - 1)})
    for (uint32_t j = 0; j < Mask<T>::kPerRepeat; ++j) if (m.On(j)) hi = std::max(hi, s.At(r, j));
  t.CheckRange(0, hi + 1, api, what);
}

template <typename T, typename F>
void Level0Binary(const LocalTensor<T>& dst, const LocalTensor<T>& a, const LocalTensor<T>& b, const Mask<T>& m,
                  uint8_t repeat, const BinaryRepeatParams& p, const char* api, F f) {
  Strided<T> sd{p.dstBlkStride, p.dstRepStride}, sa{p.src0BlkStride, p.src0RepStride},
      sb{p.src1BlkStride, p.src1RepStride};
  CheckFootprint(dst, sd, m, repeat, api, "dst");
  CheckFootprint(a, sa, m, repeat, api, "src0");
  CheckFootprint(b, sb, m, repeat, api, "src1");
  uint64_t n = 0;
  for (uint32_t j = 0; j < Mask<T>::kPerRepeat; ++j) n += m.On(j) ? repeat : 0;
  if (!CountOnly())
    for (uint32_t r = 0; r < repeat; ++r)
      for (uint32_t j = 0; j < Mask<T>::kPerRepeat; ++j)
        if (m.On(j))
          dst.Data()[sd.At(r, j)] = FromFloat<T>(f(ToFloat(a.Data()[sa.At(r, j)]), ToFloat(b.Data()[sb.At(r, j)])));
  auto& k = Core().counters;
  k.vector_elements += n;
  k.vector_repeats += repeat;
  ++k.vector_instrs;
}

template <typename T, typename F>
void Level0Unary(const LocalTensor<T>& dst, const LocalTensor<T>& src, const Mask<T>& m, uint8_t repeat,
                 const UnaryRepeatParams& p, const char* api, F f) {
  Strided<T> sd{p.dstBlkStride, p.dstRepStride}, ss{p.srcBlkStride, p.srcRepStride};
  CheckFootprint(dst, sd, m, repeat, api, "dst");
  CheckFootprint(src, ss, m, repeat, api, "src");
  uint64_t n = 0;
  for (uint32_t j = 0; j < Mask<T>::kPerRepeat; ++j) n += m.On(j) ? repeat : 0;
  if (!CountOnly())
    for (uint32_t r = 0; r < repeat; ++r)
      for (uint32_t j = 0; j < Mask<T>::kPerRepeat; ++j)
        if (m.On(j)) dst.Data()[sd.At(r, j)] = FromFloat<T>(f(ToFloat(src.Data()[ss.At(r, j)])));
  auto& k = Core().counters;
  k.vector_elements += n;
  k.vector_repeats += repeat;
  ++k.vector_instrs;
}

template <typename T>
T RoundTo(float x, RoundMode mode);

}  // namespace cpu

// ---- Binary: Add, Sub, Mul, Div, Max, Min (docs: 矢量计算/基础算术/{Add,Sub,Mul,Div,Max,Min}.md) ----
#define ASCENDC_CPU_BINARY(Name, expr)                                                                           \
  template <typename T>                                                                                          \
  __aicore__ inline void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
                              const int32_t& count) {                                                            \
    cpu::Map2(dst, src0, src1, count, #Name, [](float a, float b) { return expr; });                             \
  }                                                                                                              \
  template <typename T, bool isSetMask = true>                                                                   \
  __aicore__ inline void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
                              uint64_t mask, const uint8_t repeatTime, const BinaryRepeatParams& repeatParams) { \
    static_assert(isSetMask, #Name ": isSetMask=false (SetVectorMask) is outside this runtime's subset");        \
    cpu::Level0Binary(dst, src0, src1, cpu::Mask<T>(mask, #Name), repeatTime, repeatParams, #Name,               \
                      [](float a, float b) { return expr; });                                                    \
  }                                                                                                              \
  template <typename T, bool isSetMask = true>                                                                   \
  __aicore__ inline void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1, \
                              uint64_t mask[], const uint8_t repeatTime, const BinaryRepeatParams& repeatParams) { \
    static_assert(isSetMask, #Name ": isSetMask=false (SetVectorMask) is outside this runtime's subset");        \
    cpu::Level0Binary(dst, src0, src1, cpu::Mask<T>(mask, #Name), repeatTime, repeatParams, #Name,               \
                      [](float a, float b) { return expr; });                                                    \
  }

ASCENDC_CPU_BINARY(Add, a + b)
ASCENDC_CPU_BINARY(Sub, a - b)
ASCENDC_CPU_BINARY(Mul, a * b)
ASCENDC_CPU_BINARY(Div, a / b)
ASCENDC_CPU_BINARY(Max, std::max(a, b))
ASCENDC_CPU_BINARY(Min, std::min(a, b))
#undef ASCENDC_CPU_BINARY

// ---- Unary: Exp, Ln, Abs, Sqrt, Rsqrt, Reciprocal, Relu (docs: 矢量计算/基础算术/{Exp,Ln,...}.md) ----
#define ASCENDC_CPU_UNARY(Name, expr)                                                                         \
  template <typename T>                                                                                       \
  __aicore__ inline void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t& count) {    \
    cpu::Map1(dst, src, count, #Name, [](float x) { return expr; });                                         \
  }                                                                                                           \
  template <typename T, bool isSetMask = true>                                                                \
  __aicore__ inline void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src, uint64_t mask,            \
                              const uint8_t repeatTime, const UnaryRepeatParams& repeatParams) {              \
    static_assert(isSetMask, #Name ": isSetMask=false (SetVectorMask) is outside this runtime's subset");     \
    cpu::Level0Unary(dst, src, cpu::Mask<T>(mask, #Name), repeatTime, repeatParams, #Name,                    \
                     [](float x) { return expr; });                                                           \
  }

ASCENDC_CPU_UNARY(Exp, std::exp(x))
ASCENDC_CPU_UNARY(Ln, std::log(x))
ASCENDC_CPU_UNARY(Abs, std::fabs(x))
ASCENDC_CPU_UNARY(Sqrt, std::sqrt(x))
ASCENDC_CPU_UNARY(Rsqrt, 1.0f / std::sqrt(x))
ASCENDC_CPU_UNARY(Reciprocal, 1.0f / x)
ASCENDC_CPU_UNARY(Relu, x > 0.0f ? x : 0.0f)
#undef ASCENDC_CPU_UNARY

// ---- Tensor-scalar: Adds, Muls, Maxs, Mins (docs: 矢量计算/标量双目/{Adds,Muls,Maxs,Mins}.md) ----
#define ASCENDC_CPU_SCALAR(Name, expr)                                                                           \
  template <typename T>                                                                                          \
  __aicore__ inline void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,        \
                              const int32_t& count) {                                                            \
    const float s = cpu::ToFloat(scalarValue);                                                                   \
    cpu::Map1(dst, src, count, #Name, [s](float a) { return expr; });                                           \
  }                                                                                                              \
  template <typename T, bool isSetMask = true>                                                                   \
  __aicore__ inline void Name(const LocalTensor<T>& dst, const LocalTensor<T>& src, const T& scalarValue,        \
                              uint64_t mask, const uint8_t repeatTime, const UnaryRepeatParams& repeatParams) {  \
    static_assert(isSetMask, #Name ": isSetMask=false (SetVectorMask) is outside this runtime's subset");        \
    const float s = cpu::ToFloat(scalarValue);                                                                   \
    cpu::Level0Unary(dst, src, cpu::Mask<T>(mask, #Name), repeatTime, repeatParams, #Name,                       \
                     [s](float a) { return expr; });                                                             \
  }

ASCENDC_CPU_SCALAR(Adds, a + s)
ASCENDC_CPU_SCALAR(Muls, a * s)
ASCENDC_CPU_SCALAR(Maxs, std::max(a, s))
ASCENDC_CPU_SCALAR(Mins, std::min(a, s))
#undef ASCENDC_CPU_SCALAR

// Docs: 矢量计算/基础算术/Axpy.md — dst = src * scalar + dst.
template <typename T, typename U>
__aicore__ inline void Axpy(const LocalTensor<T>& dst, const LocalTensor<U>& src, const U scalarValue,
                            const int32_t& count) {
  static_assert(std::is_same_v<T, U>, "Axpy: mixed precision is outside this runtime's subset");
  const float s = cpu::ToFloat(scalarValue);
  cpu::Map2(dst, src, dst, count, "Axpy", [s](float x, float d) { return x * s + d; });
}

// Docs: 矢量计算/数据填充/Duplicate.md.
template <typename T>
__aicore__ inline void Duplicate(const LocalTensor<T>& dst, const T& scalarValue, const int32_t& count) {
  cpu::CheckCount(count, "Duplicate");
  cpu::Operand(dst, count, "Duplicate", "dst");
  if (!cpu::CountOnly()) std::fill(dst.Data(), dst.Data() + count, scalarValue);
  cpu::CountVector(count, sizeof(T));
}

// Docs: 矢量计算/数据填充/Brcb.md — each repeat broadcasts 8 consecutive src elements, one per dst DataBlock.
template <typename T>
__aicore__ inline void Brcb(const LocalTensor<T>& dst, const LocalTensor<T>& src, const uint8_t repeatTime,
                            const BrcbRepeatParams& repeatParams) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "Brcb: T must be 16- or 32-bit");
  constexpr uint32_t per_block = cpu::kDataBlock / sizeof(T);
  src.CheckAligned("Brcb", "src");
  dst.CheckAligned("Brcb", "dst");
  if (repeatTime == 0) return;
  src.CheckRange(0, uint64_t(repeatTime) * 8, "Brcb", "src");
  const uint64_t last = (uint64_t(repeatTime - 1) * repeatParams.dstRepStride + 7ull * repeatParams.dstBlkStride) *
                        per_block + per_block;
  dst.CheckRange(0, last, "Brcb", "dst");
  if (!cpu::CountOnly())
  for (uint32_t r = 0; r < repeatTime; ++r)
    for (uint32_t b = 0; b < 8; ++b) {
      T* out = dst.Data() + (uint64_t(r) * repeatParams.dstRepStride + uint64_t(b) * repeatParams.dstBlkStride) *
                                per_block;
      std::fill(out, out + per_block, src.Data()[r * 8 + b]);
    }
  auto& k = cpu::Core().counters;
  k.vector_elements += uint64_t(repeatTime) * 8 * per_block;
  k.vector_repeats += repeatTime;
  ++k.vector_instrs;
}

// Docs: 矢量计算/精度转换指令/Cast.md.
template <typename T, typename U>
__aicore__ inline void Cast(const LocalTensor<T>& dst, const LocalTensor<U>& src, const RoundMode& round_mode,
                            const uint32_t count) {
  cpu::Operand(dst, count, "Cast", "dst");
  cpu::Operand(src, count, "Cast", "src");
  // CAST_NONE means CAST_RINT where the conversion loses precision (docs: RoundMode); to an integer the mode
  // must be explicit.
  ASCENDC_CPU_CHECK(!std::is_integral_v<T> || round_mode != RoundMode::CAST_NONE, "Cast",
                    "round_mode CAST_NONE is not allowed for a conversion to an integer ", cpu::TypeName<U>(), " -> ",
                    cpu::TypeName<T>());
  if (!cpu::CountOnly())
  for (uint32_t i = 0; i < count; ++i) {
    const float x = cpu::ToFloat(src.Data()[i]);
    dst.Data()[i] = cpu::RoundTo<T>(x, round_mode);
  }
  cpu::CountVector(count, std::max(sizeof(T), sizeof(U)));
}

// Docs: 矢量计算/比较与选择/Compare.md, CompareScalar.md — one result bit per element (LSB first).
template <typename T, typename U>
__aicore__ inline void Compare(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                               CMPMODE cmpMode, uint32_t count);
template <typename T, typename U>
__aicore__ inline void CompareScalar(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar,
                                     CMPMODE cmpMode, uint32_t count);

namespace cpu {
inline bool Cmp(float a, float b, CMPMODE m) {
  switch (m) {
    case CMPMODE::LT: return a < b;
    case CMPMODE::GT: return a > b;
    case CMPMODE::EQ: return a == b;
    case CMPMODE::LE: return a <= b;
    case CMPMODE::GE: return a >= b;
    default: return a != b;
  }
}
template <typename T, typename U, typename Rhs>
void CompareImpl(const LocalTensor<U>& dst, const LocalTensor<T>& a, Rhs rhs, CMPMODE m, uint32_t count,
                 const char* api) {
  static_assert(std::is_same_v<U, uint8_t>, "Compare: the result tensor is a uint8_t bit mask here");
  ASCENDC_CPU_CHECK(uint64_t(count) * sizeof(T) % kRepeatBytes == 0, api, "count ", count, " x ", sizeof(T),
                    " bytes is not a multiple of 256 (the docs require whole repeats for the count form)");
  Operand(a, count, api, "src0");
  Operand(dst, (count + 7) / 8, api, "dst");
  CountVector(count, sizeof(T));
  if (CountOnly()) return;
  uint8_t* bits = dst.Data();
  std::fill(bits, bits + (count + 7) / 8, uint8_t(0));
  for (uint32_t i = 0; i < count; ++i)
    if (Cmp(ToFloat(a.Data()[i]), rhs(i), m)) bits[i / 8] |= uint8_t(1u << (i % 8));
}
}  // namespace cpu

template <typename T, typename U>
__aicore__ inline void Compare(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const LocalTensor<T>& src1,
                               CMPMODE cmpMode, uint32_t count) {
  cpu::Operand(src1, count, "Compare", "src1");
  cpu::CompareImpl(dst, src0, [&](uint32_t i) { return cpu::ToFloat(src1.Data()[i]); }, cmpMode, count,
                   "Compare");
}
template <typename T, typename U>
__aicore__ inline void CompareScalar(const LocalTensor<U>& dst, const LocalTensor<T>& src0, const T src1Scalar,
                                     CMPMODE cmpMode, uint32_t count) {
  const float s = cpu::ToFloat(src1Scalar);
  cpu::CompareImpl(dst, src0, [s](uint32_t) { return s; }, cmpMode, count, "CompareScalar");
}

// Docs: 矢量计算/比较与选择/Select.md — where the mask bit is 1 take src0, else src1 (tensor or scalar).
template <typename T, typename U>
__aicore__ inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                              const LocalTensor<T>& src1, SELMODE selMode, uint32_t count) {
  ASCENDC_CPU_CHECK(selMode == SELMODE::VSEL_TENSOR_TENSOR_MODE, "Select",
                    "two source tensors need selMode VSEL_TENSOR_TENSOR_MODE");
  cpu::Operand(dst, count, "Select", "dst");
  cpu::Operand(src0, count, "Select", "src0");
  cpu::Operand(src1, count, "Select", "src1");
  const auto bits = selMask.template ReinterpretCast<uint8_t>();
  cpu::Operand(bits, (count + 7) / 8, "Select", "selMask");
  if (!cpu::CountOnly())
    for (uint32_t i = 0; i < count; ++i)
      dst.Data()[i] = (bits.Data()[i / 8] >> (i % 8)) & 1 ? src0.Data()[i] : src1.Data()[i];
  cpu::CountVector(count, sizeof(T));
}
template <typename T, typename U>
__aicore__ inline void Select(const LocalTensor<T>& dst, const LocalTensor<U>& selMask, const LocalTensor<T>& src0,
                              T src1, SELMODE selMode, uint32_t count) {
  ASCENDC_CPU_CHECK(selMode == SELMODE::VSEL_TENSOR_SCALAR_MODE, "Select",
                    "a scalar src1 needs selMode VSEL_TENSOR_SCALAR_MODE");
  cpu::Operand(dst, count, "Select", "dst");
  cpu::Operand(src0, count, "Select", "src0");
  const auto bits = selMask.template ReinterpretCast<uint8_t>();
  cpu::Operand(bits, (count + 7) / 8, "Select", "selMask");
  if (!cpu::CountOnly())
    for (uint32_t i = 0; i < count; ++i) dst.Data()[i] = (bits.Data()[i / 8] >> (i % 8)) & 1 ? src0.Data()[i] : src1;
  cpu::CountVector(count, sizeof(T));
}

// Docs: 矢量计算/归约计算/ReduceMax.md, ReduceSum.md — reduce the first `count` elements to dst[0] (ReduceMax with
// calIndex also writes the index, as the bits of an integer of T's width, to dst[1]). Sums accumulate in fp32.
template <typename T>
__aicore__ inline void ReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                                 const LocalTensor<T>& sharedTmpBuffer, const int32_t count, bool calIndex = 0) {
  ASCENDC_CPU_CHECK(count >= 1, "ReduceMax", "count must be >= 1; got ", count);
  cpu::Operand(src, count, "ReduceMax", "src");
  cpu::Operand(dst, calIndex ? 2 : 1, "ReduceMax", "dst");
  ASCENDC_CPU_CHECK(!sharedTmpBuffer.Empty(), "ReduceMax", "sharedTmpBuffer has no buffer");
  cpu::CountVector(count, sizeof(T));
  if (cpu::CountOnly()) return;
  int32_t best = 0;
  for (int32_t i = 1; i < count; ++i)
    if (cpu::ToFloat(src.Data()[i]) > cpu::ToFloat(src.Data()[best])) best = i;
  dst.Data()[0] = src.Data()[best];
  if (calIndex) {
    if constexpr (sizeof(T) == 4) { uint32_t idx = uint32_t(best); std::memcpy(&dst.Data()[1], &idx, 4); }
    else { uint16_t idx = uint16_t(best); std::memcpy(&dst.Data()[1], &idx, 2); }
  }
}
template <typename T>
__aicore__ inline void ReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                                 const LocalTensor<T>& sharedTmpBuffer, const int32_t count) {
  ASCENDC_CPU_CHECK(count >= 1, "ReduceSum", "count must be >= 1; got ", count);
  cpu::Operand(src, count, "ReduceSum", "src");
  cpu::Operand(dst, 1, "ReduceSum", "dst");
  ASCENDC_CPU_CHECK(!sharedTmpBuffer.Empty(), "ReduceSum", "sharedTmpBuffer has no buffer");
  cpu::CountVector(count, sizeof(T));
  if (cpu::CountOnly()) return;
  float s = 0;
  for (int32_t i = 0; i < count; ++i) s += cpu::ToFloat(src.Data()[i]);
  dst.Data()[0] = cpu::FromFloat<T>(s);
}

// Docs: 矢量计算/归约计算/WholeReduceMax.md, WholeReduceSum.md (CANN 8.3 public interface) — each repeat reduces
// its masked elements to one result: dst[r * dstRepStride] (Sum, or Max with ORDER_ONLY_VALUE), or a
// (value, index) pair at dst[2 * r * dstRepStride] (Max with ORDER_VALUE_INDEX; index bits as T-wide integer).
template <typename T, bool isSetMask = true>
__aicore__ inline void WholeReduceMax(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                                      const int32_t repeatTime, const int32_t dstRepStride,
                                      const int32_t srcBlkStride, const int32_t srcRepStride,
                                      ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX) {
  static_assert(isSetMask, "WholeReduceMax: isSetMask=false is outside this runtime's subset");
  ASCENDC_CPU_CHECK(repeatTime >= 0 && repeatTime <= 255, "WholeReduceMax", "repeatTime ", repeatTime,
                    " must be in [0, 255]");
  ASCENDC_CPU_CHECK(order == ReduceOrder::ORDER_VALUE_INDEX || order == ReduceOrder::ORDER_ONLY_VALUE,
                    "WholeReduceMax", "only ORDER_VALUE_INDEX and ORDER_ONLY_VALUE are in this runtime's subset");
  const cpu::Mask<T> m(uint64_t(mask), "WholeReduceMax");
  const cpu::Strided<T> s{uint32_t(srcBlkStride), uint32_t(srcRepStride)};
  cpu::CheckFootprint(src, s, m, uint8_t(repeatTime), "WholeReduceMax", "src");
  const int per = order == ReduceOrder::ORDER_VALUE_INDEX ? 2 : 1;
  dst.CheckAligned("WholeReduceMax", "dst");
  if (repeatTime > 0) dst.CheckRange(0, uint64_t(repeatTime - 1) * dstRepStride * per + per, "WholeReduceMax", "dst");
  for (int32_t r = 0; r < (cpu::CountOnly() ? 0 : repeatTime); ++r) {
    uint32_t best = 0;
    float v = -std::numeric_limits<float>::infinity();
    bool first = true;
    for (uint32_t j = 0; j < cpu::Mask<T>::kPerRepeat; ++j)
      if (m.On(j)) {
        const float x = cpu::ToFloat(src.Data()[s.At(r, j)]);
        if (first || x > v) { v = x; best = j; first = false; }
      }
    T* out = dst.Data() + uint64_t(r) * dstRepStride * per;
    out[0] = cpu::FromFloat<T>(v);
    if (per == 2) {
      if constexpr (sizeof(T) == 4) { uint32_t idx = best; std::memcpy(&out[1], &idx, 4); }
      else { uint16_t idx = uint16_t(best); std::memcpy(&out[1], &idx, 2); }
    }
  }
  auto& k = cpu::Core().counters;
  k.vector_repeats += repeatTime;
  ++k.vector_instrs;
  k.vector_elements += uint64_t(repeatTime) * cpu::Mask<T>::kPerRepeat;
}
template <typename T, bool isSetMask = true>
__aicore__ inline void WholeReduceSum(const LocalTensor<T>& dst, const LocalTensor<T>& src, const int32_t mask,
                                      const int32_t repeatTime, const int32_t dstRepStride,
                                      const int32_t srcBlkStride, const int32_t srcRepStride) {
  static_assert(isSetMask, "WholeReduceSum: isSetMask=false is outside this runtime's subset");
  ASCENDC_CPU_CHECK(repeatTime >= 0 && repeatTime <= 255, "WholeReduceSum", "repeatTime ", repeatTime,
                    " must be in [0, 255]");
  const cpu::Mask<T> m(uint64_t(mask), "WholeReduceSum");
  const cpu::Strided<T> s{uint32_t(srcBlkStride), uint32_t(srcRepStride)};
  cpu::CheckFootprint(src, s, m, uint8_t(repeatTime), "WholeReduceSum", "src");
  dst.CheckAligned("WholeReduceSum", "dst");
  if (repeatTime > 0) dst.CheckRange(0, uint64_t(repeatTime - 1) * dstRepStride + 1, "WholeReduceSum", "dst");
  for (int32_t r = 0; r < (cpu::CountOnly() ? 0 : repeatTime); ++r) {
    float acc = 0;
    for (uint32_t j = 0; j < cpu::Mask<T>::kPerRepeat; ++j) if (m.On(j)) acc += cpu::ToFloat(src.Data()[s.At(r, j)]);
    dst.Data()[uint64_t(r) * dstRepStride] = cpu::FromFloat<T>(acc);
  }
  auto& k = cpu::Core().counters;
  k.vector_repeats += repeatTime;
  ++k.vector_instrs;
  k.vector_elements += uint64_t(repeatTime) * cpu::Mask<T>::kPerRepeat;
}

namespace cpu {
template <typename T>
void Progression(const LocalTensor<T>& dst, const T firstValue, const T diffValue, const int32_t count,
                 const char* api) {
  CheckCount(count, api);
  Operand(dst, count, api, "dst");
  if (!CountOnly())
    for (int32_t i = 0; i < count; ++i) dst.Data()[i] = FromFloat<T>(ToFloat(firstValue) + float(i) * ToFloat(diffValue));
  CountVector(count, sizeof(T));
}
}  // namespace cpu

// Docs: 高阶API/索引计算/Arange-94.md (CANN 8.3 name) — dst[i] = firstValue + i * diffValue.
template <typename T>
__aicore__ inline void Arange(const LocalTensor<T>& dst, const T firstValue, const T diffValue, const int32_t count) {
  cpu::Progression(dst, firstValue, diffValue, count, "Arange");
}
// The same instruction under its older name (GetArithProgressionMaxMinTmpSize is documented as deprecated in favour
// of the Arange one); kept because kernels call it.
template <typename T>
__aicore__ inline void ArithProgression(const LocalTensor<T>& dst, const T firstValue, const T diffValue,
                                        const int32_t count) {
  cpu::Progression(dst, firstValue, diffValue, count, "ArithProgression");
}

// Docs: 矢量计算/数据重排/Gather.md — dst[i] = element at byte offset srcOffset[i] + srcBaseAddr of src.
template <typename T>
__aicore__ inline void Gather(const LocalTensor<T>& dst, const LocalTensor<T>& src,
                              const LocalTensor<uint32_t>& srcOffset, const uint32_t srcBaseAddr,
                              const uint32_t count) {
  cpu::Operand(dst, count, "Gather", "dst");
  cpu::Operand(srcOffset, count, "Gather", "srcOffset");
  src.CheckAligned("Gather", "src");
  for (uint32_t i = 0; i < (cpu::CountOnly() ? 0 : count); ++i) {  // offsets are data: not read in count-only mode
    const uint32_t byte = srcOffset.Data()[i] + srcBaseAddr;
    ASCENDC_CPU_CHECK(byte % sizeof(T) == 0, "Gather", "srcOffset[", i, "] + srcBaseAddr = ", byte,
                      " bytes is not a multiple of sizeof T");
    src.CheckRange(byte / sizeof(T), 1, "Gather", "src");
    dst.Data()[i] = src.Data()[byte / sizeof(T)];
  }
  cpu::CountVector(count, sizeof(T));
}

namespace cpu {

template <typename T>
T NextToward(T v, bool up) {
  if constexpr (std::is_same_v<T, float>) return std::nextafter(v, up ? INFINITY : -INFINITY);
  else {
    uint16_t bits;
    std::memcpy(&bits, &v, 2);
    const bool neg = bits & 0x8000;
    if ((bits & 0x7fff) == 0) bits = up ? 0x0001 : 0x8001;
    else if (up != neg) ++bits;
    else --bits;
    T out;
    std::memcpy(&out, &bits, 2);
    return out;
  }
}

// float -> T under an Ascend RoundMode: candidates are the two representable neighbours of x.
template <typename T>
T RoundTo(float x, RoundMode mode) {
  if constexpr (std::is_integral_v<T>) {
    switch (mode) {
      case RoundMode::CAST_FLOOR: return T(std::floor(x));
      case RoundMode::CAST_CEIL: return T(std::ceil(x));
      case RoundMode::CAST_ROUND: return T(std::round(x));
      case RoundMode::CAST_TRUNC: return T(std::trunc(x));
      default: return T(std::nearbyint(x));
    }
  } else if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    const T nearest = FromFloat<T>(x);
    const float n = ToFloat(nearest);
    if (n == x || std::isnan(x) || mode == RoundMode::CAST_NONE || mode == RoundMode::CAST_RINT) return nearest;
    const T lo = n < x ? nearest : NextToward(nearest, false), hi = n < x ? NextToward(nearest, true) : nearest;
    switch (mode) {
      case RoundMode::CAST_FLOOR: return lo;
      case RoundMode::CAST_CEIL: return hi;
      case RoundMode::CAST_TRUNC: return x > 0 ? lo : hi;
      case RoundMode::CAST_ROUND: {
        const float dl = x - ToFloat(lo), dh = ToFloat(hi) - x;
        return dl < dh ? lo : dh < dl ? hi : (x > 0 ? hi : lo);
      }
      default: {  // CAST_ODD: the neighbour with an odd last mantissa bit
        uint16_t b;
        std::memcpy(&b, &lo, 2);
        return (b & 1) ? lo : hi;
      }
    }
  }
}

}  // namespace cpu
}  // namespace AscendC
