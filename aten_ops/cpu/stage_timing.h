// Per-stage time of the CPU attention kernels (forward, backward, decode), for `bench stages`: how much of a call
// runs inside the matrix-product micro-kernels and how much in the vector work around them (row max, exponent,
// casts, rescaling, packing). Off by default; the op attention_stage_ticks (or NPU_FA_STAGE_TIMING=1 in the
// environment, read once) switches it on.
//
// How a kernel is measured: each worker owns a StageClock, which reads the enable flag once when it is made. Laps
// are chained: lap(s) charges the time since the previous lap (or mark) to stage s, so every cycle of a worker's
// loop lands in exactly one stage and the stages add up to the worker's time. When off, a lap is one predictable
// branch on a member (per tile, or per row of a tile in the online softmax), never per element. When on, a lap
// reads the time-stamp counter (rdtsc, ~10-40 cycles); the bench prints the instrumented and plain call times so the
// cost of the laps is visible.
#pragma once

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <x86intrin.h>
#else
#include <chrono>
#endif

namespace npu_fa::cpu {
namespace stage_timing {

// The order of attention_stage_ticks' result (after its first value); torch_ops_transformer/bench/stages.py names
// them in the same order.
enum Stage : int {
  kFwdPack,     // forward/prefill: K/V (and Q) packing for the micro-kernel
  kFwdQk,       // S = Q·Kᵀ (brgemm)
  kFwdMax,      // scale, mask, row max
  kFwdExp,      // exp, row sum, P stored in the product dtype (bf16 cast)
  kFwdRescale,  // acc *= exp(m_old - m_new)
  kFwdPv,       // acc += P·V (brgemm)
  kFwdFinish,   // out = acc / l, statistics, split-key merge, micro-kernel release
  kBwdPack,     // backward: Kᵀ, Vᵀ, K packing per key tile
  kBwdSdp,      // S = Q·Kᵀ and dP = dY·Vᵀ (brgemm)
  kBwdSoftmax,  // logits, mask, P = exp(S - m) / l, dS = P·(dP - Di)
  kBwdCast,     // P and dS cast to the product dtype and transposed, Q and dY packed
  kBwdGrad,     // dV += Pᵀ·dY, dK += dSᵀ·Q, dQ += dS·K (brgemm)
  kBwdFinish,   // dK, dV rows written, micro-kernel release
  kDecQk,       // decode: q·k dot products (vector FMAs over the cache stream)
  kDecMask,     // decode: scale, pse, mask of the scores
  kDecSoftmax,  // decode: row max, exp, row sum, rescale
  kDecPv,       // decode: acc += p·v (vector FMAs over the cache stream)
  kDecFinish,   // decode: query setup, merge of the key chunks, output
  kCount
};

// Whether timing is on (a relaxed atomic load; StageClock reads it once).
bool enabled();
// Adds a worker's ticks (kCount values) to the process totals.
void add(const uint64_t* ticks);

}  // namespace stage_timing
}  // namespace npu_fa::cpu

// Inline code lives in the per-ISA namespace like the kernels' other headers (see cpu/brgemm.h).
namespace npu_fa::cpu::CPU_CAPABILITY {

class StageClock {
 public:
  StageClock() : on_(stage_timing::enabled()) {
    if (on_) last_ = now();
  }
  ~StageClock() {
    if (on_) stage_timing::add(ticks_);
  }
  StageClock(const StageClock&) = delete;
  StageClock& operator=(const StageClock&) = delete;

  // Starts an interval without charging the time since the last lap (e.g. a worker idle between calls).
  void mark() {
    if (on_) last_ = now();
  }
  // Charges the time since the last lap or mark to stage s.
  void lap(stage_timing::Stage s) {
    if (on_) {
      const uint64_t t = now();
      ticks_[s] += t - last_;
      last_ = t;
    }
  }

 private:
  static uint64_t now() {
#if defined(__x86_64__) || defined(_M_X64)
    return __rdtsc();
#else
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
  }

  const bool on_;
  uint64_t last_ = 0;
  uint64_t ticks_[stage_timing::kCount] = {};
};

}  // namespace npu_fa::cpu::CPU_CAPABILITY
