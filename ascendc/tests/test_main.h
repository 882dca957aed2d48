// How every test program under ascendc/tests reports (torch-free, no runtime needed): failures are printed as they
// are found ("FAIL ..." lines) and main ends with tot_test::Finish, whose last line is "ALL TESTS PASSED" with exit
// status 0, or "FAILED: <n> of <m> ..." with exit status 1. test/npu/ascendc_programs.py checks exactly that line.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>

namespace tot_test {

constexpr const char* kAllPassed = "ALL TESTS PASSED";

// The end of main: `failed` of `total` units ("checks", "cases") failed.
inline int Finish(int failed, int total, const char* unit) {
  if (failed)
    std::printf("FAILED: %d of %d %s\n", failed, total, unit);
  else
    std::printf("%d %s\n%s\n", total, unit, kAllPassed);
  std::fflush(stdout);
  return failed ? 1 : 0;
}

// Checks of the tiling tests, counted for FinishChecks.
struct Tally {
  int checks = 0, failures = 0;
};
inline Tally& Counts() {
  static Tally tally;
  return tally;
}

inline bool Check(bool ok, const std::string& what) {
  ++Counts().checks;
  if (!ok) {
    ++Counts().failures;
    std::printf("FAIL %s\n", what.c_str());
  }
  return ok;
}

// CHECK's body: "FAIL file:line: cond: <printf-formatted detail>".
__attribute__((format(printf, 5, 6))) inline bool CheckAt(bool ok, const char* file, int line, const char* cond,
                                                          const char* fmt, ...) {
  if (ok) return Check(true, "");
  char detail[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(detail, sizeof(detail), fmt, args);
  va_end(args);
  return Check(false, std::string(file) + ":" + std::to_string(line) + ": " + cond + ": " + detail);
}

inline int FinishChecks() { return Finish(Counts().failures, Counts().checks, "checks"); }

}  // namespace tot_test

// CHECK(condition, printf format, args...): one counted check.
#define CHECK(cond, ...) ::tot_test::CheckAt(static_cast<bool>(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)
