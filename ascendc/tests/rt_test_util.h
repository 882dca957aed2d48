// A minimal harness for the CPU runtime's own test programs (ascendc/tests/rt_*.cpp), run from
// test/npu/test_ascendc_runtime.py. Each RT_TEST(name) is one pytest case: the program prints "PASS name" or
// "FAIL name: why" per case (all cases, or those named on the command line), then ends like every program here
// (test_main.h).
//
// Kernels here are host lambdas run by one generic kernel entry, so a test states its kernel next to its
// checks; the runtime cannot tell the difference (it sees an ordinary ICPU_RUN_KF launch).
#pragma once

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "test_main.h"
#include "tikicpulib.h"

namespace rtt {

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Case {
  const char* name;
  void (*fn)();
};
inline std::vector<Case>& Cases() {
  static std::vector<Case> cases;
  return cases;
}
struct Register {
  Register(const char* name, void (*fn)()) { Cases().push_back({name, fn}); }
};

#define RT_TEST(name)                                  \
  static void name();                                  \
  static ::rtt::Register rt_register_##name(#name, name); \
  static void name()

#define EXPECT(cond, ...)                                                                                   \
  do {                                                                                                      \
    if (!(cond))                                                                                            \
      throw ::rtt::Failure(::AscendC::cpu::Str(__FILE__, ":", __LINE__, ": expected ", #cond, "; ", ##__VA_ARGS__)); \
  } while (0)

// The kernel body of the current launch (read by every core thread, written only between launches).
inline std::function<void()>& Body() {
  static std::function<void()> body;
  return body;
}
extern "C" inline __global__ __aicore__ void rt_kernel() { Body()(); }

// Launches body on numBlocks blocks in the given mode; a failed runtime check throws KernelCheckError.
inline void Launch(AscendC::KernelMode mode, int numBlocks, std::function<void()> body) {
  Body() = std::move(body);
  AscendC::SetKernelMode(mode);
  ICPU_RUN_KF(rt_kernel, numBlocks);
}
inline void RunAiv(std::function<void()> body) { Launch(AscendC::KernelMode::AIV_MODE, 1, std::move(body)); }

// The message of the KernelCheckError the launch raised ("" when it ran cleanly).
inline std::string LaunchError(AscendC::KernelMode mode, int numBlocks, std::function<void()> body) {
  try {
    Launch(mode, numBlocks, std::move(body));
  } catch (const AscendC::cpu::KernelCheckError& e) {
    return e.what();
  }
  return "";
}

// A seeded fault: the launch must throw KernelCheckError whose message contains every given fragment.
inline void ExpectFault(const std::string& error, std::initializer_list<const char*> fragments) {
  EXPECT(!error.empty(), "the kernel ran without a KernelCheckError");
  for (const char* f : fragments) EXPECT(error.find(f) != std::string::npos, "message lacks '", f, "': ", error);
}

// GM buffer of n elements of T, freed at scope end.
template <typename T>
struct Gm {
  T* p;
  size_t n;
  explicit Gm(size_t count) : p(static_cast<T*>(AscendC::GmAlloc(count * sizeof(T)))), n(count) {}
  ~Gm() { AscendC::GmFree(p); }
  Gm(const Gm&) = delete;
  T& operator[](size_t i) { return p[i]; }
  GM_ADDR addr() const { return reinterpret_cast<GM_ADDR>(p); }
};

// Deterministic pseudo-random values in [lo, hi).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  float Uniform(float lo, float hi) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * float((s >> 40) & 0xffffff) / float(1 << 24);
  }
};

inline int RunAll(int argc, char** argv) {
  int failed = 0, ran = 0;
  for (const Case& c : Cases()) {
    bool wanted = argc <= 1;
    for (int i = 1; i < argc; ++i) wanted |= std::strcmp(argv[i], c.name) == 0;
    if (!wanted) continue;
    ++ran;
    try {
      c.fn();
      std::printf("PASS %s\n", c.name);
    } catch (const std::exception& e) {
      ++failed;
      std::string msg = e.what();
      for (char& ch : msg) if (ch == '\n') ch = ' ';
      std::printf("FAIL %s: %s\n", c.name, msg.c_str());
    }
    std::fflush(stdout);
  }
  return tot_test::Finish(failed, ran, "cases");
}

}  // namespace rtt

#define RT_MAIN \
  int main(int argc, char** argv) { return ::rtt::RunAll(argc, argv); }
