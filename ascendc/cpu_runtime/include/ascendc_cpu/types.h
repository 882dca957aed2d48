// Scalar types, qualifiers and enums of the Ascend C API subset, for a host compiler.
// Pinned interface: CANN 8.3.RC1, Ascend C API docs (asc-devkit docs/zh/api/SIMD-API/...), arch 2201 (Atlas A2 /
// Ascend 910B). Every declaration here and in its sibling headers names the docs page it was transcribed from; see
// ascendc/cpu_runtime/SIGNATURES.md for the full table. Written from the documented interface, not from CANN code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

// Kernel qualifiers are meaningful only to the CANN device compiler; on the host they vanish, as in CANN's own
// CPU-debug mode (docs: 编程指南/语言扩展层/SIMD-BuiltIn关键字.md).
#define __aicore__
#define __global__
#define __gm__
#define __ubuf__
#define GM_ADDR __gm__ uint8_t*

// fp16: the compiler's IEEE binary16 (conversions from float round to nearest even).
using half = _Float16;

// bf16: g++ 12 has no usable __bf16 arithmetic, so a 16-bit struct; float -> bf16 rounds to nearest even.
struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  bfloat16_t(float f) { bits = FromFloat(f); }  // NOLINT: implicit like the device type
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t FromFloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
};

namespace AscendC {

// Docs: 基础API/.../通用说明和约束/TPosition (common_types.h). Only the positions our kernels use are declared.
enum class TPosition : uint8_t { GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC };
using QuePosition = TPosition;

// Docs: 矢量计算/精度转换指令/Cast.md.
enum class RoundMode { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
// Docs: 矢量计算/比较与选择/Compare.md, Select.md.
enum class CMPMODE { LT = 0, GT, EQ, LE, GE, NE };
enum class SELMODE { VSEL_CMPMASK_SPR = 0, VSEL_TENSOR_SCALAR_MODE, VSEL_TENSOR_TENSOR_MODE };
// Docs: 矢量计算/归约计算/WholeReduceMax.md.
enum class ReduceOrder { ORDER_VALUE_INDEX = 0, ORDER_INDEX_VALUE, ORDER_ONLY_VALUE, ORDER_ONLY_INDEX };
constexpr ReduceOrder ORDER_VALUE_INDEX = ReduceOrder::ORDER_VALUE_INDEX;
constexpr ReduceOrder ORDER_INDEX_VALUE = ReduceOrder::ORDER_INDEX_VALUE;
constexpr ReduceOrder ORDER_ONLY_VALUE = ReduceOrder::ORDER_ONLY_VALUE;
constexpr ReduceOrder ORDER_ONLY_INDEX = ReduceOrder::ORDER_ONLY_INDEX;

// Docs: 同步控制/SetFlag-WaitFlag.md, PipeBarrier.md.
enum class HardEvent : uint8_t { MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M,
                                 V_V, MTE3_MTE1, MTE1_MTE3, MTE1_V, MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2,
                                 MTE2_MTE3, S_V, V_S, S_MTE2, MTE2_S, S_MTE3, MTE3_S, MTE2_FIX, FIX_MTE2, FIX_S,
                                 M_S, FIX_MTE3, MAX };
enum pipe_t { PIPE_S = 0, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL, PIPE_FIX = 10 };
using event_t = int32_t;
using TEventID = int8_t;

// Docs: 调试接口/CPU孪生调试/SetKernelMode.md.
enum class KernelMode { MIX_MODE = 0, AIC_MODE, AIV_MODE, MIX_AIC_1_1 };

}  // namespace AscendC

namespace AscendC::cpu {

// Every vector instruction computes in fp32 and rounds its result to the destination type, as the hardware's
// fp16/bf16 pipelines do per instruction.
template <typename T>
inline float ToFloat(T v) { return static_cast<float>(v); }
template <typename T>
inline T FromFloat(float v) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(std::nearbyint(v));
  else return static_cast<T>(v);
}

template <typename T>
constexpr bool kIsFloating = std::is_same_v<T, float> || std::is_same_v<T, half> || std::is_same_v<T, bfloat16_t>;

template <typename T>
const char* TypeName() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, half>) return "half";
  else if constexpr (std::is_same_v<T, bfloat16_t>) return "bfloat16_t";
  else if constexpr (std::is_same_v<T, int32_t>) return "int32_t";
  else if constexpr (std::is_same_v<T, uint32_t>) return "uint32_t";
  else if constexpr (std::is_same_v<T, int64_t>) return "int64_t";
  else if constexpr (std::is_same_v<T, uint8_t>) return "uint8_t";
  else if constexpr (std::is_same_v<T, int8_t>) return "int8_t";
  else if constexpr (std::is_same_v<T, int16_t>) return "int16_t";
  else if constexpr (std::is_same_v<T, uint16_t>) return "uint16_t";
  else return "T";
}

}  // namespace AscendC::cpu
