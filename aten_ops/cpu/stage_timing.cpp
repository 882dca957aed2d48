// The process totals behind cpu/stage_timing.h and the op attention_stage_ticks.
#include "cpu/stage_timing.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "generated/kernels.h"

namespace npu_fa::cpu::stage_timing {
namespace {

std::atomic<bool>& flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("NPU_FA_STAGE_TIMING");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }()};
  return on;
}

std::atomic<uint64_t> g_ticks[kCount];

// Counter ticks per second, measured once against the steady clock over ~20 ms (the time-stamp counter runs at a
// constant rate on current x86 CPUs; elsewhere the counter is the steady clock itself).
int64_t ticks_per_second() {
  static const int64_t rate = [] {
#if defined(__x86_64__) || defined(_M_X64)
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const uint64_t c0 = __rdtsc();
    while (clock::now() - t0 < std::chrono::milliseconds(20)) {
    }
    const uint64_t c1 = __rdtsc();
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    return static_cast<int64_t>(static_cast<double>(c1 - c0) / s);
#else
    using period = std::chrono::steady_clock::period;
    return static_cast<int64_t>(period::den / period::num);
#endif
  }();
  return rate;
}

}  // namespace

bool enabled() { return flag().load(std::memory_order_relaxed); }

void add(const uint64_t* ticks) {
  for (int s = 0; s < kCount; ++s)
    if (ticks[s]) g_ticks[s].fetch_add(ticks[s], std::memory_order_relaxed);
}

}  // namespace npu_fa::cpu::stage_timing

namespace npu_fa {

// [ticks per second, ticks of each stage...] since the last reset; enable 1 / 0 switches timing on / off, -1 keeps it.
std::vector<int64_t> attention_stage_ticks(int64_t enable, bool reset) {
  namespace st = cpu::stage_timing;
  TORCH_CHECK_VALUE(enable >= -1 && enable <= 1, "attention_stage_ticks: argument 'enable' must be -1, 0 or 1; got ",
                    enable);
  std::vector<int64_t> out{st::ticks_per_second()};
  for (int s = 0; s < st::kCount; ++s)
    out.push_back(static_cast<int64_t>(reset ? st::g_ticks[s].exchange(0) : st::g_ticks[s].load()));
  if (enable >= 0) st::flag().store(enable == 1);
  return out;
}

}  // namespace npu_fa
