// Every vector instruction of the CPU runtime against a scalar reference written here from the documented
// semantics: level 2 (first count elements) and level 0 (mask / repeat / block and repeat strides, incl. stride 0
// broadcast), per-instruction rounding to fp16/bf16, Cast under each RoundMode, reductions, Gather, Brcb.
#include <algorithm>
#include <map>

#include "rt_test_util.h"

using namespace AscendC;
using rtt::Rng;

namespace {

// Bump allocator over one TBuf: each Get returns a 32-byte aligned UB tensor pre-filled with a sentinel.
struct Ub {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  uint32_t used = 0;
  Ub() { pipe.InitBuffer(buf, 160 * 1024); }
  template <typename T>
  LocalTensor<T> Get(uint32_t n) {
    LocalTensor<T> t = buf.GetWithOffset<T>(n, used);
    used += (n * sizeof(T) + 31) / 32 * 32;
    for (uint32_t i = 0; i < n; ++i) t.SetValue(i, T(-7.0f));
    return t;
  }
};

template <typename T>
float F(T v) { return static_cast<float>(v); }
// Round a double result the way the vector unit does: fp32 arithmetic, then to T.
template <typename T>
float R(double v) { return F(T(float(v))); }

template <typename T>
double Ulp() { return std::is_same_v<T, float> ? 1.2e-7 : std::is_same_v<T, half> ? 9.8e-4 : 7.9e-3; }

template <typename T>
void Fill(LocalTensor<T>& t, uint32_t n, Rng& rng, float lo, float hi) {
  for (uint32_t i = 0; i < n; ++i) t.SetValue(i, T(rng.Uniform(lo, hi)));
}
template <typename T>
std::vector<float> Read(const LocalTensor<T>& t, uint32_t n) {
  std::vector<float> out(n);
  for (uint32_t i = 0; i < n; ++i) out[i] = F(t.GetValue(i));
  return out;
}

// ---- level 2 ----

template <typename T>
void Level2Binary() {
  const uint32_t n = 200;  // not a multiple of a repeat
  using Op = double (*)(double, double);
  const std::map<std::string, Op> ops = {{"Add", [](double a, double b) { return a + b; }},
                                         {"Sub", [](double a, double b) { return a - b; }},
                                         {"Mul", [](double a, double b) { return a * b; }},
                                         {"Div", [](double a, double b) { return a / b; }},
                                         {"Max", [](double a, double b) { return std::max(a, b); }},
                                         {"Min", [](double a, double b) { return std::min(a, b); }}};
  for (auto& [name, op] : ops) {
    std::vector<float> a, b, got;
    rtt::RunAiv([&] {
      Ub ub;
      Rng rng(3);
      auto x = ub.Get<T>(n), y = ub.Get<T>(n), z = ub.Get<T>(n + 16);
      Fill(x, n, rng, -3, 3);
      Fill(y, n, rng, 0.5f, 4);
      if (name == "Add") Add(z, x, y, n);
      if (name == "Sub") Sub(z, x, y, n);
      if (name == "Mul") Mul(z, x, y, n);
      if (name == "Div") Div(z, x, y, n);
      if (name == "Max") Max(z, x, y, n);
      if (name == "Min") Min(z, x, y, n);
      a = Read(x, n), b = Read(y, n), got = Read(z, n + 16);
    });
    for (uint32_t i = 0; i < n; ++i)
      EXPECT(got[i] == R<T>(op(a[i], b[i])), name, "<", cpu::TypeName<T>(), "> i=", i, " got ", got[i], " want ",
             R<T>(op(a[i], b[i])));
    for (uint32_t i = n; i < n + 16; ++i) EXPECT(got[i] == -7.0f, name, " wrote beyond count at ", i);
  }
}
RT_TEST(level2_binary_float) { Level2Binary<float>(); }
RT_TEST(level2_binary_half) { Level2Binary<half>(); }
RT_TEST(level2_binary_bf16) { Level2Binary<bfloat16_t>(); }

template <typename T>
void Level2Unary() {
  const uint32_t n = 130;
  using Op = double (*)(double);
  const std::map<std::string, Op> ops = {{"Exp", [](double x) { return std::exp(x); }},
                                         {"Ln", [](double x) { return std::log(x); }},
                                         {"Abs", [](double x) { return std::fabs(x); }},
                                         {"Sqrt", [](double x) { return std::sqrt(x); }},
                                         {"Rsqrt", [](double x) { return 1 / std::sqrt(x); }},
                                         {"Reciprocal", [](double x) { return 1 / x; }},
                                         {"Relu", [](double x) { return x > 0 ? x : 0.0; }}};
  for (auto& [name, op] : ops) {
    const bool positive = name == "Ln" || name == "Sqrt" || name == "Rsqrt";
    std::vector<float> a, got;
    rtt::RunAiv([&] {
      Ub ub;
      Rng rng(5);
      auto x = ub.Get<T>(n), z = ub.Get<T>(n);
      Fill(x, n, rng, positive ? 0.1f : -4.0f, 4.0f);
      if (name == "Exp") Exp(z, x, n);
      if (name == "Ln") Ln(z, x, n);
      if (name == "Abs") Abs(z, x, n);
      if (name == "Sqrt") Sqrt(z, x, n);
      if (name == "Rsqrt") Rsqrt(z, x, n);
      if (name == "Reciprocal") Reciprocal(z, x, n);
      if (name == "Relu") Relu(z, x, n);
      a = Read(x, n), got = Read(z, n);
    });
    for (uint32_t i = 0; i < n; ++i) {
      const double want = R<T>(op(a[i]));  // exp/log/sqrt: within one ulp of T of the rounded exact value
      EXPECT(std::fabs(got[i] - want) <= Ulp<T>() * std::fabs(want) + 1e-30, name, "<", cpu::TypeName<T>(),
             "> i=", i, " x=", a[i], " got ", got[i], " want ", want);
    }
  }
}
RT_TEST(level2_unary_float) { Level2Unary<float>(); }
RT_TEST(level2_unary_half) { Level2Unary<half>(); }
RT_TEST(level2_unary_bf16) { Level2Unary<bfloat16_t>(); }

template <typename T>
void Level2Scalar() {
  const uint32_t n = 70;
  const T s = T(1.3f);
  const double sv = F(s);
  for (const char* name : {"Adds", "Muls", "Maxs", "Mins", "Axpy", "Duplicate"}) {
    std::vector<float> a, d0, got;
    const std::string nm = name;
    rtt::RunAiv([&] {
      Ub ub;
      Rng rng(7);
      auto x = ub.Get<T>(n), z = ub.Get<T>(n + 8);
      Fill(x, n, rng, -3, 3);
      Fill(z, n, rng, -1, 1);
      d0 = Read(z, n);
      if (nm == "Adds") Adds(z, x, s, n);
      if (nm == "Muls") Muls(z, x, s, n);
      if (nm == "Maxs") Maxs(z, x, s, n);
      if (nm == "Mins") Mins(z, x, s, n);
      if (nm == "Axpy") Axpy(z, x, s, n);
      if (nm == "Duplicate") Duplicate(z, s, n);
      a = Read(x, n), got = Read(z, n + 8);
    });
    for (uint32_t i = 0; i < n; ++i) {
      double want = nm == "Adds" ? a[i] + sv : nm == "Muls" ? a[i] * sv : nm == "Maxs" ? std::max<double>(a[i], sv)
                  : nm == "Mins" ? std::min<double>(a[i], sv) : nm == "Axpy" ? a[i] * sv + d0[i] : sv;
      want = R<T>(want);
      const double tol = nm == "Axpy" ? Ulp<T>() * std::fabs(want) : 0.0;  // fp32 a*s+d rounds twice
      EXPECT(std::fabs(got[i] - want) <= tol, nm, "<", cpu::TypeName<T>(), "> i=", i, " got ", got[i], " want ",
             want);
    }
    for (uint32_t i = n; i < n + 8; ++i) EXPECT(got[i] == -7.0f, nm, " wrote beyond count");
  }
}
RT_TEST(level2_scalar_axpy_duplicate_float) { Level2Scalar<float>(); }
RT_TEST(level2_scalar_axpy_duplicate_half) { Level2Scalar<half>(); }
RT_TEST(level2_scalar_axpy_duplicate_bf16) { Level2Scalar<bfloat16_t>(); }

// ---- level 0 ----

// Element j of repeat r of an operand, from the docs' definition (blocks of 32 B, strides in blocks).
template <typename T>
uint64_t Addr(uint32_t r, uint32_t j, uint32_t blk, uint32_t rep) {
  const uint32_t per_block = 32 / sizeof(T);
  return uint64_t(r) * rep * per_block + uint64_t(j / per_block) * blk * per_block + j % per_block;
}

struct Strides { uint8_t dstBlk, s0Blk, s1Blk, dstRep, s0Rep, s1Rep; };

template <typename T>
void Level0Binary(const Strides& st, bool bitwise) {
  constexpr uint32_t lanes = 256 / sizeof(T);
  const uint8_t repeat = 3;
  uint64_t bits[2] = {0x9249249249249249ull, sizeof(T) == 2 ? 0xF0F0000000000001ull : 0};
  const uint64_t count_mask = lanes - 5;
  auto on = [&](uint32_t j) { return bitwise ? ((bits[j / 64] >> (j % 64)) & 1) != 0 : j < count_mask; };
  const uint32_t n = 4096 / sizeof(T);  // 4 KB per operand covers every footprint used below
  std::vector<float> a, b, got, got_mul;
  rtt::RunAiv([&] {
    Ub ub;
    Rng rng(11);
    auto x = ub.Get<T>(n), y = ub.Get<T>(n), z = ub.Get<T>(n), w = ub.Get<T>(n);
    Fill(x, n, rng, -2, 2);
    Fill(y, n, rng, -2, 2);
    BinaryRepeatParams p(st.dstBlk, st.s0Blk, st.s1Blk, st.dstRep, st.s0Rep, st.s1Rep);
    if (bitwise) { Add(z, x, y, bits, repeat, p); Mul(w, x, y, bits, repeat, p); }
    else { Add(z, x, y, count_mask, repeat, p); Mul(w, x, y, count_mask, repeat, p); }
    a = Read(x, n), b = Read(y, n), got = Read(z, n), got_mul = Read(w, n);
  });
  std::vector<float> want(n, -7.0f), want_mul(n, -7.0f);
  for (uint32_t r = 0; r < repeat; ++r)
    for (uint32_t j = 0; j < lanes; ++j)
      if (on(j)) {
        const double xa = a[Addr<T>(r, j, st.s0Blk, st.s0Rep)], yb = b[Addr<T>(r, j, st.s1Blk, st.s1Rep)];
        want[Addr<T>(r, j, st.dstBlk, st.dstRep)] = R<T>(xa + yb);
        want_mul[Addr<T>(r, j, st.dstBlk, st.dstRep)] = R<T>(xa * yb);
      }
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT(got[i] == want[i], "Add<", cpu::TypeName<T>(), "> level0 i=", i, " got ", got[i], " want ", want[i]);
    EXPECT(got_mul[i] == want_mul[i], "Mul level0 i=", i, " got ", got_mul[i], " want ", want_mul[i]);
  }
}
const Strides kContiguous{1, 1, 1, 8, 8, 8};
const Strides kGapsAndBroadcast{2, 1, 0, 17, 8, 0};  // dst: every other block; src1: one block broadcast
RT_TEST(level0_binary_float_count_mask) { Level0Binary<float>(kContiguous, false); Level0Binary<float>(kGapsAndBroadcast, false); }
RT_TEST(level0_binary_float_bitwise_mask) { Level0Binary<float>(kContiguous, true); Level0Binary<float>(kGapsAndBroadcast, true); }
RT_TEST(level0_binary_half_count_mask) { Level0Binary<half>(kContiguous, false); Level0Binary<half>(kGapsAndBroadcast, false); }
RT_TEST(level0_binary_half_bitwise_mask) { Level0Binary<half>(kContiguous, true); Level0Binary<half>(kGapsAndBroadcast, true); }
RT_TEST(level0_binary_bf16) { Level0Binary<bfloat16_t>(kGapsAndBroadcast, true); }

template <typename T>
void Level0Unary(uint16_t dstBlk, uint16_t srcBlk, uint8_t dstRep, uint8_t srcRep) {
  constexpr uint32_t lanes = 256 / sizeof(T);
  const uint8_t repeat = 4;
  const uint64_t mask = lanes / 2 + 3;
  const uint32_t n = 4096 / sizeof(T);
  const T s = T(0.75f);
  std::vector<float> a, relu, muls, adds;
  rtt::RunAiv([&] {
    Ub ub;
    Rng rng(13);
    auto x = ub.Get<T>(n), z1 = ub.Get<T>(n), z2 = ub.Get<T>(n), z3 = ub.Get<T>(n);
    Fill(x, n, rng, -2, 2);
    UnaryRepeatParams p(dstBlk, srcBlk, dstRep, srcRep);
    Relu(z1, x, mask, repeat, p);
    Muls(z2, x, s, mask, repeat, p);
    Adds(z3, x, s, mask, repeat, p);
    a = Read(x, n), relu = Read(z1, n), muls = Read(z2, n), adds = Read(z3, n);
  });
  std::vector<float> w1(n, -7.0f), w2(n, -7.0f), w3(n, -7.0f);
  for (uint32_t r = 0; r < repeat; ++r)
    for (uint32_t j = 0; j < mask; ++j) {
      const double x = a[Addr<T>(r, j, srcBlk, srcRep)];
      const uint64_t d = Addr<T>(r, j, dstBlk, dstRep);
      w1[d] = R<T>(x > 0 ? x : 0), w2[d] = R<T>(x * F(s)), w3[d] = R<T>(x + F(s));
    }
  for (uint32_t i = 0; i < n; ++i)
    EXPECT(relu[i] == w1[i] && muls[i] == w2[i] && adds[i] == w3[i], "level0 unary <", cpu::TypeName<T>(), "> i=", i,
           " got ", relu[i], "/", muls[i], "/", adds[i], " want ", w1[i], "/", w2[i], "/", w3[i]);
}
// Every binary instruction's level-0 form (both mask kinds) with gaps and a broadcast operand.
template <typename T>
void Level0AllBinary(bool bitwise) {
  constexpr uint32_t lanes = 256 / sizeof(T);
  const Strides st = kGapsAndBroadcast;
  const uint8_t repeat = 2;
  uint64_t bits[2] = {0xF0F0F0F00F0F0F0Full, sizeof(T) == 2 ? 0x8000000000000001ull : 0};
  const uint64_t count_mask = lanes - 9;
  auto on = [&](uint32_t j) { return bitwise ? ((bits[j / 64] >> (j % 64)) & 1) != 0 : j < count_mask; };
  const uint32_t n = 4096 / sizeof(T);
  const char* names[6] = {"Add", "Sub", "Mul", "Div", "Max", "Min"};
  std::vector<float> a, b, got[6];
  rtt::RunAiv([&] {
    Ub ub;
    Rng rng(59);
    auto x = ub.Get<T>(n), y = ub.Get<T>(n);
    Fill(x, n, rng, -2, 2);
    Fill(y, n, rng, 0.5f, 2);
    BinaryRepeatParams p(st.dstBlk, st.s0Blk, st.s1Blk, st.dstRep, st.s0Rep, st.s1Rep);
    for (int op = 0; op < 6; ++op) {
      auto z = ub.Get<T>(n);
      switch (op) {
        case 0: bitwise ? Add(z, x, y, bits, repeat, p) : Add(z, x, y, count_mask, repeat, p); break;
        case 1: bitwise ? Sub(z, x, y, bits, repeat, p) : Sub(z, x, y, count_mask, repeat, p); break;
        case 2: bitwise ? Mul(z, x, y, bits, repeat, p) : Mul(z, x, y, count_mask, repeat, p); break;
        case 3: bitwise ? Div(z, x, y, bits, repeat, p) : Div(z, x, y, count_mask, repeat, p); break;
        case 4: bitwise ? Max(z, x, y, bits, repeat, p) : Max(z, x, y, count_mask, repeat, p); break;
        default: bitwise ? Min(z, x, y, bits, repeat, p) : Min(z, x, y, count_mask, repeat, p); break;
      }
      got[op] = Read(z, n);
    }
    a = Read(x, n), b = Read(y, n);
  });
  for (int op = 0; op < 6; ++op) {
    std::vector<float> want(n, -7.0f);
    for (uint32_t r = 0; r < repeat; ++r)
      for (uint32_t j = 0; j < lanes; ++j)
        if (on(j)) {
          const double p = a[Addr<T>(r, j, st.s0Blk, st.s0Rep)], q = b[Addr<T>(r, j, st.s1Blk, st.s1Rep)];
          const double v = op == 0 ? p + q : op == 1 ? p - q : op == 2 ? p * q : op == 3 ? p / q
                         : op == 4 ? std::max(p, q) : std::min(p, q);
          want[Addr<T>(r, j, st.dstBlk, st.dstRep)] = R<T>(v);
        }
    for (uint32_t i = 0; i < n; ++i)
      EXPECT(got[op][i] == want[i], names[op], "<", cpu::TypeName<T>(), "> level0 i=", i, " got ", got[op][i],
             " want ", want[i]);
  }
}
RT_TEST(level0_every_binary_instruction) {
  Level0AllBinary<float>(false);
  Level0AllBinary<float>(true);
  Level0AllBinary<half>(true);
  Level0AllBinary<bfloat16_t>(false);
}

// Every unary and tensor-scalar instruction's level-0 form, strided, on positive inputs (Ln, Sqrt, Rsqrt).
template <typename T>
void Level0AllUnary() {
  constexpr uint32_t lanes = 256 / sizeof(T);
  const uint8_t repeat = 3;
  const uint64_t mask = lanes - 3;
  const uint16_t dstBlk = 2, srcBlk = 1;
  const uint8_t dstRep = 16, srcRep = 8;
  const uint32_t n = 4096 / sizeof(T);
  const T s = T(1.25f);
  const char* names[11] = {"Exp", "Ln", "Abs", "Sqrt", "Rsqrt", "Reciprocal", "Relu", "Adds", "Muls", "Maxs", "Mins"};
  std::vector<float> a, got[11];
  rtt::RunAiv([&] {
    Ub ub;
    Rng rng(61);
    auto x = ub.Get<T>(n);
    Fill(x, n, rng, 0.25f, 2.5f);
    UnaryRepeatParams p(dstBlk, srcBlk, dstRep, srcRep);
    for (int op = 0; op < 11; ++op) {
      auto z = ub.Get<T>(n);
      switch (op) {
        case 0: Exp(z, x, mask, repeat, p); break;
        case 1: Ln(z, x, mask, repeat, p); break;
        case 2: Abs(z, x, mask, repeat, p); break;
        case 3: Sqrt(z, x, mask, repeat, p); break;
        case 4: Rsqrt(z, x, mask, repeat, p); break;
        case 5: Reciprocal(z, x, mask, repeat, p); break;
        case 6: Relu(z, x, mask, repeat, p); break;
        case 7: Adds(z, x, s, mask, repeat, p); break;
        case 8: Muls(z, x, s, mask, repeat, p); break;
        case 9: Maxs(z, x, s, mask, repeat, p); break;
        default: Mins(z, x, s, mask, repeat, p); break;
      }
      got[op] = Read(z, n);
    }
    a = Read(x, n);
  });
  const double sv = F(s);
  for (int op = 0; op < 11; ++op) {
    std::vector<float> want(n, -7.0f);
    for (uint32_t r = 0; r < repeat; ++r)
      for (uint32_t j = 0; j < mask; ++j) {
        const double x = a[Addr<T>(r, j, srcBlk, srcRep)];
        const double v = op == 0 ? std::exp(x) : op == 1 ? std::log(x) : op == 2 ? std::fabs(x) : op == 3 ? std::sqrt(x)
                       : op == 4 ? 1 / std::sqrt(x) : op == 5 ? 1 / x : op == 6 ? std::max(x, 0.0) : op == 7 ? x + sv
                       : op == 8 ? x * sv : op == 9 ? std::max(x, sv) : std::min(x, sv);
        want[Addr<T>(r, j, dstBlk, dstRep)] = R<T>(v);
      }
    for (uint32_t i = 0; i < n; ++i)
      EXPECT(std::fabs(got[op][i] - want[i]) <= Ulp<T>() * std::fabs(want[i]), names[op], "<", cpu::TypeName<T>(),
             "> level0 i=", i, " got ", got[op][i], " want ", want[i]);
  }
}
RT_TEST(level0_every_unary_and_scalar_instruction) {
  Level0AllUnary<float>();
  Level0AllUnary<half>();
  Level0AllUnary<bfloat16_t>();
}

RT_TEST(level0_unary_scalar_strides) {
  Level0Unary<float>(1, 1, 8, 8);
  Level0Unary<float>(1, 2, 8, 16);
  Level0Unary<half>(2, 1, 16, 8);
  Level0Unary<half>(1, 0, 8, 0);  // src: one block broadcast to every block and repeat
}

template <typename T>
void BrcbCase(uint16_t blk, uint16_t rep) {
  const uint8_t repeat = 3;
  constexpr uint32_t per_block = 32 / sizeof(T);
  const uint32_t n = 4096 / sizeof(T);
  std::vector<float> src, got;
  rtt::RunAiv([&] {
    Ub ub;
    Rng rng(17);
    auto x = ub.Get<T>(64), z = ub.Get<T>(n);
    Fill(x, 64, rng, -5, 5);
    Brcb(z, x, repeat, BrcbRepeatParams(blk, rep));
    src = Read(x, 64), got = Read(z, n);
  });
  std::vector<float> want(n, -7.0f);
  for (uint32_t r = 0; r < repeat; ++r)
    for (uint32_t b = 0; b < 8; ++b)
      for (uint32_t e = 0; e < per_block; ++e) want[(r * rep + b * blk) * per_block + e] = src[r * 8 + b];
  for (uint32_t i = 0; i < n; ++i) EXPECT(got[i] == want[i], "Brcb i=", i, " got ", got[i], " want ", want[i]);
}
RT_TEST(brcb) {
  BrcbCase<float>(1, 8);
  BrcbCase<float>(2, 16);
  BrcbCase<half>(1, 8);
}

// ---- Cast ----

// Every finite value of a 16-bit float format, sorted: the reference rounds by search, not by arithmetic.
template <typename T>
const std::vector<std::pair<float, uint16_t>>& Table() {
  static std::vector<std::pair<float, uint16_t>> t = [] {
    std::vector<std::pair<float, uint16_t>> v;
    for (uint32_t b = 0; b < 65536; ++b) {
      T x;
      uint16_t bits = uint16_t(b);
      std::memcpy(&x, &bits, 2);
      const float f = F(x);
      if (std::isfinite(f) && !(f == 0 && (bits & 0x8000))) v.push_back({f, bits});
    }
    std::sort(v.begin(), v.end());
    return v;
  }();
  return t;
}

template <typename T>
float RefRound(float x, RoundMode m) {
  const auto& t = Table<T>();
  auto it = std::lower_bound(t.begin(), t.end(), std::make_pair(x, uint16_t(0)));
  if (it != t.end() && it->first == x) return x;
  const auto hi = *it, lo = *(it - 1);  // test inputs stay inside the finite range
  const double dl = double(x) - lo.first, dh = double(hi.first) - x;
  switch (m) {
    case RoundMode::CAST_FLOOR: return lo.first;
    case RoundMode::CAST_CEIL: return hi.first;
    case RoundMode::CAST_TRUNC: return x > 0 ? lo.first : hi.first;
    case RoundMode::CAST_ODD: return (lo.second & 1) ? lo.first : hi.first;
    case RoundMode::CAST_ROUND: return dl < dh ? lo.first : dh < dl ? hi.first : (x > 0 ? hi.first : lo.first);
    default: return dl < dh ? lo.first : dh < dl ? hi.first : ((lo.second & 1) ? hi.first : lo.first);  // RINT, NONE
  }
}

// Random values plus exact ties between two neighbours of T.
template <typename T>
std::vector<float> CastInputs() {
  std::vector<float> v;
  Rng rng(19);
  for (int i = 0; i < 96; ++i) v.push_back(rng.Uniform(-300, 300));
  const auto& t = Table<T>();
  for (size_t k : {size_t(40000), size_t(50000), size_t(60000), size_t(20000), size_t(100)}) {
    const size_t i = std::min(k, t.size() - 2);
    v.push_back(float((double(t[i].first) + t[i + 1].first) / 2));
  }
  v.push_back(2.5f), v.push_back(-2.5f), v.push_back(3.5f), v.push_back(1.0f);
  while (v.size() % 8) v.push_back(0.125f);
  return v;
}

template <typename T>
void CastNarrow() {
  const std::vector<float> in = CastInputs<T>();
  const uint32_t n = in.size();
  for (RoundMode m : {RoundMode::CAST_NONE, RoundMode::CAST_RINT, RoundMode::CAST_FLOOR, RoundMode::CAST_CEIL,
                      RoundMode::CAST_ROUND, RoundMode::CAST_TRUNC, RoundMode::CAST_ODD}) {
    std::vector<float> got;
    rtt::RunAiv([&] {
      Ub ub;
      auto x = ub.Get<float>(n);
      auto z = ub.Get<T>(n);
      for (uint32_t i = 0; i < n; ++i) x.SetValue(i, in[i]);
      Cast(z, x, m, n);
      got = Read(z, n);
    });
    for (uint32_t i = 0; i < n; ++i)
      EXPECT(got[i] == RefRound<T>(in[i], m), "Cast float->", cpu::TypeName<T>(), " mode ", int(m), " x=", in[i],
             " got ", got[i], " want ", RefRound<T>(in[i], m));
  }
}
RT_TEST(cast_float_to_half_each_round_mode) { CastNarrow<half>(); }
RT_TEST(cast_float_to_bf16_each_round_mode) { CastNarrow<bfloat16_t>(); }

RT_TEST(cast_float_to_int32_each_round_mode) {
  const std::vector<float> in = {2.5f, -2.5f, 3.5f, -3.5f, 0.4f, -0.6f, 7.0f, 1e6f + 0.5f, -123.75f, 0.5f, 1.5f, 99.99f,
                                 -0.0f, 5.49f, -5.51f, 8.0f};
  const uint32_t n = in.size();
  for (RoundMode m : {RoundMode::CAST_RINT, RoundMode::CAST_FLOOR, RoundMode::CAST_CEIL, RoundMode::CAST_ROUND,
                      RoundMode::CAST_TRUNC}) {
    std::vector<int32_t> got(n);
    rtt::RunAiv([&] {
      Ub ub;
      auto x = ub.Get<float>(n);
      auto z = ub.Get<int32_t>(n);
      for (uint32_t i = 0; i < n; ++i) x.SetValue(i, in[i]);
      Cast(z, x, m, n);
      for (uint32_t i = 0; i < n; ++i) got[i] = z.GetValue(i);
    });
    for (uint32_t i = 0; i < n; ++i) {
      const double x = in[i], fl = std::floor(x), frac = x - fl;
      double want = m == RoundMode::CAST_FLOOR ? fl : m == RoundMode::CAST_CEIL ? std::ceil(x)
                  : m == RoundMode::CAST_TRUNC ? (x < 0 ? std::ceil(x) : fl)
                  : m == RoundMode::CAST_ROUND ? (frac == 0.5 ? (x > 0 ? fl + 1 : fl) : std::floor(x + 0.5))
                  : (frac == 0.5 ? (std::fmod(fl, 2) == 0 ? fl : fl + 1) : std::floor(x + 0.5));
      EXPECT(got[i] == int32_t(want), "Cast float->int32 mode ", int(m), " x=", x, " got ", got[i], " want ", want);
    }
  }
}

RT_TEST(cast_widening_half_bf16_to_float_exact) {
  const uint32_t n = 64;
  std::vector<float> h, b, gh, gb;
  rtt::RunAiv([&] {
    Ub ub;
    Rng rng(23);
    auto xh = ub.Get<half>(n);
    auto xb = ub.Get<bfloat16_t>(n);
    auto zh = ub.Get<float>(n), zb = ub.Get<float>(n);
    Fill(xh, n, rng, -100, 100);
    Fill(xb, n, rng, -100, 100);
    Cast(zh, xh, RoundMode::CAST_NONE, n);
    Cast(zb, xb, RoundMode::CAST_NONE, n);
    h = Read(xh, n), b = Read(xb, n), gh = Read(zh, n), gb = Read(zb, n);
  });
  for (uint32_t i = 0; i < n; ++i) EXPECT(gh[i] == h[i] && gb[i] == b[i], "widening cast changed value at ", i);
}

// ---- Compare / Select ----

RT_TEST(compare_select_bit_layout) {
  const uint32_t n = 128;  // Compare's count covers whole 256-byte repeats (docs)
  for (CMPMODE mode : {CMPMODE::LT, CMPMODE::GT, CMPMODE::EQ, CMPMODE::LE, CMPMODE::GE, CMPMODE::NE}) {
    std::vector<float> a, b, sel_tt, sel_ts;
    std::vector<uint8_t> bits(n / 8), bits_s(n / 8);
    const float s = 0.5f;
    rtt::RunAiv([&] {
      Ub ub;
      Rng rng(29);
      auto x = ub.Get<half>(n), y = ub.Get<half>(n), z = ub.Get<half>(n), zs = ub.Get<half>(n);
      for (uint32_t i = 0; i < n; ++i) x.SetValue(i, half(float(int(rng.Uniform(0, 4))) * 0.25f));
      for (uint32_t i = 0; i < n; ++i) y.SetValue(i, half(float(int(rng.Uniform(0, 4))) * 0.25f));
      auto m = ub.Get<uint8_t>(32), ms = ub.Get<uint8_t>(32);
      Compare(m, x, y, mode, n);
      CompareScalar(ms, x, half(s), mode, n);
      Select(z, m, x, y, SELMODE::VSEL_TENSOR_TENSOR_MODE, n);
      Select(zs, ms, x, half(-1.0f), SELMODE::VSEL_TENSOR_SCALAR_MODE, n);
      a = Read(x, n), b = Read(y, n), sel_tt = Read(z, n), sel_ts = Read(zs, n);
      for (uint32_t i = 0; i < n / 8; ++i) bits[i] = m.GetValue(i), bits_s[i] = ms.GetValue(i);
    });
    auto cmp = [&](float p, float q) {
      switch (mode) {
        case CMPMODE::LT: return p < q;
        case CMPMODE::GT: return p > q;
        case CMPMODE::EQ: return p == q;
        case CMPMODE::LE: return p <= q;
        case CMPMODE::GE: return p >= q;
        default: return p != q;
      }
    };
    for (uint32_t i = 0; i < n; ++i) {
      const bool bit = (bits[i / 8] >> (i % 8)) & 1, bit_s = (bits_s[i / 8] >> (i % 8)) & 1;  // LSB = element 0
      EXPECT(bit == cmp(a[i], b[i]), "Compare mode ", int(mode), " i=", i);
      EXPECT(bit_s == cmp(a[i], s), "CompareScalar mode ", int(mode), " i=", i);
      EXPECT(sel_tt[i] == (bit ? a[i] : b[i]), "Select tensor-tensor i=", i);
      EXPECT(sel_ts[i] == (bit_s ? a[i] : -1.0f), "Select tensor-scalar i=", i);
    }
  }
}

// ---- reductions ----

template <typename T>
void Reductions() {
  const int32_t n = 300;
  std::vector<float> a;
  float mx = 0, sum = 0;
  uint32_t idx = 0;
  rtt::RunAiv([&] {
    Ub ub;
    Rng rng(31);
    auto x = ub.Get<T>(n), d = ub.Get<T>(16), d2 = ub.Get<T>(16), tmp = ub.Get<T>(512);
    for (int32_t i = 0; i < n; ++i) x.SetValue(i, T(float(int(rng.Uniform(-64, 64))) / 4));  // exact sums
    x.SetValue(211, T(40.0f));
    ReduceMax(d, x, tmp, n, true);
    ReduceSum(d2, x, tmp, n);
    a = Read(x, n);
    mx = F(d.GetValue(0)), sum = F(d2.GetValue(0));
    if constexpr (sizeof(T) == 4) { uint32_t v; T t = d.GetValue(1); std::memcpy(&v, &t, 4); idx = v; }
    else { uint16_t v; T t = d.GetValue(1); std::memcpy(&v, &t, 2); idx = v; }
  });
  double want_sum = 0;
  for (float v : a) want_sum += v;
  EXPECT(mx == 40.0f && idx == 211, "ReduceMax<", cpu::TypeName<T>(), "> got ", mx, " at ", idx);
  EXPECT(sum == R<T>(want_sum), "ReduceSum got ", sum, " want ", want_sum);
}
RT_TEST(reduce_max_index_and_sum) {
  Reductions<float>();
  Reductions<half>();
}

template <typename T>
void WholeReduce(int32_t mask, int32_t dstRep, int32_t srcBlk, int32_t srcRep) {
  constexpr uint32_t lanes = 256 / sizeof(T);
  const int32_t repeat = 5;
  const uint32_t n = 8192 / sizeof(T);
  std::vector<float> a, vi, vo, sm;
  std::vector<uint32_t> index(repeat);
  rtt::RunAiv([&] {
    Ub ub;
    Rng rng(37);
    auto x = ub.Get<T>(n), d1 = ub.Get<T>(256), d2 = ub.Get<T>(256), d3 = ub.Get<T>(256);
    for (uint32_t i = 0; i < n; ++i) x.SetValue(i, T(float(int(rng.Uniform(-512, 512))) / 8));
    WholeReduceMax(d1, x, mask, repeat, dstRep, srcBlk, srcRep, ReduceOrder::ORDER_VALUE_INDEX);
    WholeReduceMax(d2, x, mask, repeat, dstRep, srcBlk, srcRep, ReduceOrder::ORDER_ONLY_VALUE);
    WholeReduceSum(d3, x, mask, repeat, dstRep, srcBlk, srcRep);
    a = Read(x, n), vi = Read(d1, 256), vo = Read(d2, 256), sm = Read(d3, 256);
    for (int32_t r = 0; r < repeat; ++r) {
      T t = d1.GetValue(2 * r * dstRep + 1);
      if constexpr (sizeof(T) == 4) std::memcpy(&index[r], &t, 4);
      else { uint16_t v; std::memcpy(&v, &t, 2); index[r] = v; }
    }
  });
  for (int32_t r = 0; r < repeat; ++r) {
    double best = -1e30, s = 0;
    uint32_t bi = 0;
    for (uint32_t j = 0; j < uint32_t(mask) && j < lanes; ++j) {
      const double v = a[Addr<T>(r, j, srcBlk, srcRep)];
      if (v > best) best = v, bi = j;
      s += v;
    }
    EXPECT(vi[2 * r * dstRep] == best && index[r] == bi, "WholeReduceMax VALUE_INDEX r=", r, " got ",
           vi[2 * r * dstRep], "@", index[r], " want ", best, "@", bi);
    EXPECT(vo[r * dstRep] == best, "WholeReduceMax ONLY_VALUE r=", r);
    EXPECT(sm[r * dstRep] == R<T>(s), "WholeReduceSum r=", r, " got ", sm[r * dstRep], " want ", s);
  }
}
RT_TEST(whole_reduce_max_sum) {
  WholeReduce<float>(64, 1, 1, 8);
  WholeReduce<float>(37, 2, 2, 16);
  WholeReduce<half>(128, 1, 1, 8);
  WholeReduce<half>(100, 3, 1, 0);
}

// ---- Gather, ArithProgression ----

RT_TEST(gather_and_arange) {
  const uint32_t n = 48;
  std::vector<float> src, got, prog, prog2;
  std::vector<uint32_t> off(n);
  rtt::RunAiv([&] {
    Ub ub;
    Rng rng(41);
    auto x = ub.Get<float>(128), z = ub.Get<float>(n), p = ub.Get<float>(n), p2 = ub.Get<float>(n);
    auto o = ub.Get<uint32_t>(n);
    Fill(x, 128, rng, -9, 9);
    for (uint32_t i = 0; i < n; ++i) o.SetValue(i, uint32_t((i * 37) % 120) * 4);  // byte offsets
    Gather(z, x, o, 32u, n);                                                     // + 8 elements of base
    Arange(p, 1.5f, -0.25f, n);
    ArithProgression(p2, 1.5f, -0.25f, n);
    src = Read(x, 128), got = Read(z, n), prog = Read(p, n), prog2 = Read(p2, n);
    for (uint32_t i = 0; i < n; ++i) off[i] = o.GetValue(i);
  });
  for (uint32_t i = 0; i < n; ++i) {
    EXPECT(got[i] == src[off[i] / 4 + 8], "Gather i=", i);
    EXPECT(prog[i] == float(1.5 - 0.25 * i) && prog2[i] == prog[i], "Arange / ArithProgression i=", i);
  }
}

// ---- counters ----

RT_TEST(vector_counters_exact) {
  rtt::RunAiv([&] {
    Ub ub;
    auto x = ub.Get<float>(256), y = ub.Get<float>(256);
    Add(y, x, x, 200);                                    // 200 floats = 800 B -> 4 repeats
    Exp(y, x, 64, 3, UnaryRepeatParams());                // level 0: 3 repeats, 192 elements
    Duplicate(y, 1.0f, 64);                               // 1 repeat
  });
  const auto st = cpu::LastLaunchStats();
  EXPECT(st.cores.size() == 1, "cores ", st.cores.size());
  const auto& k = st.cores[0].counters;
  EXPECT(k.vector_repeats == 8 && k.vector_elements == 200 + 192 + 64, "repeats ", k.vector_repeats, " elements ",
         k.vector_elements);
  EXPECT(k.gm_read_bytes == 0 && k.gm_write_bytes == 0 && k.copies == 0 && k.cube_macs == 0, "unexpected traffic");
}

}  // namespace

RT_MAIN
