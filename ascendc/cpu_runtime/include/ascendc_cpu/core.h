// The simulated AI Core a kernel thread runs on: identity, on-chip memories, counters, and the error channel.
// Sim-only (namespace AscendC::cpu); kernels never name anything here directly.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "types.h"

namespace AscendC {
class TPipe;
}

namespace AscendC::cpu {

using AscendC::TPipe;

// Arch 2201 (Ascend 910B) on-chip sizes (asc-devkit docs 硬件实现/架构规格/NPU架构版本2201.md).
constexpr uint32_t kUbBytes = 192 * 1024;
constexpr uint32_t kL1Bytes = 512 * 1024;
constexpr uint32_t kL0ABytes = 64 * 1024;
constexpr uint32_t kL0BBytes = 64 * 1024;
constexpr uint32_t kL0CBytes = 128 * 1024;
constexpr uint32_t kDataBlock = 32;     // bytes: the unit of UB addressing and of most copy lengths
constexpr uint32_t kRepeatBytes = 256;  // bytes one vector repeat reads (8 DataBlocks)
constexpr int kMaxMixBlocks = 25;       // numBlocks limit of CANN's CPU debug for MIX/AIC launches
constexpr int kMaxAivBlocks = 50;       // ... and for vector-only launches

// A check the runtime enforces failed. The launcher reports the first one, with the core that raised it.
struct KernelCheckError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Another core failed; this core was stopped while waiting on it.
struct LaunchAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... A>
std::string Str(const A&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

[[noreturn]] void Fail(const char* api, const std::string& message);

#define ASCENDC_CPU_CHECK(cond, api, ...)                                    \
  do {                                                                       \
    if (!(cond)) ::AscendC::cpu::Fail(api, ::AscendC::cpu::Str(__VA_ARGS__)); \
  } while (0)

enum class CoreType : uint8_t { AIC, AIV };

// What one core did, for the performance model (bench npu-model): bytes across the GM boundary, cube
// multiply-accumulates, and vector work as elements and as 256-byte repeats (the unit the vector unit issues).
struct Counters {
  uint64_t gm_read_bytes = 0;
  uint64_t gm_write_bytes = 0;
  uint64_t cube_macs = 0;
  uint64_t vector_elements = 0;
  uint64_t vector_repeats = 0;
  uint64_t copies = 0;  // DataCopy/DataCopyPad instructions issued (each pays a fixed latency on hardware)
  uint64_t vector_instrs = 0;  // vector instructions issued (each pays a fixed issue cost however many repeats)
  uint64_t cube_jobs = 0;      // Matmul jobs an AIC served (each is an AIC<->AIV hand-off in MIX mode)
  uint64_t scalar_gm = 0;      // GlobalTensor GetValue/SetValue: scalar accesses to GM (through the data cache)
  uint64_t scalar_ub = 0;      // LocalTensor GetValue/SetValue/operator(): scalar accesses to UB
  void Add(const Counters& o) {
    gm_read_bytes += o.gm_read_bytes;
    gm_write_bytes += o.gm_write_bytes;
    cube_macs += o.cube_macs;
    vector_elements += o.vector_elements;
    vector_repeats += o.vector_repeats;
    copies += o.copies;
    vector_instrs += o.vector_instrs;
    cube_jobs += o.cube_jobs;
    scalar_gm += o.scalar_gm;
    scalar_ub += o.scalar_ub;
  }
};

struct CoreStats {
  CoreType type;
  int block_idx;      // GetBlockIdx() of that core
  Counters counters;
};

struct LaunchStats {
  std::string kernel;
  KernelMode mode = KernelMode::AIV_MODE;
  int num_blocks = 0;
  std::vector<CoreStats> cores;
};

struct LaunchState;
struct MatmulMailbox;

// One on-chip memory of a core: a 32-byte aligned arena handed out bottom-up by TPipe::InitBuffer.
struct Arena {
  const char* name;
  uint32_t capacity;
  uint32_t used = 0;
  std::unique_ptr<uint8_t[]> storage;
  uint8_t* base = nullptr;
  Arena(const char* n, uint32_t cap);
};

struct CoreContext {
  CoreType type = CoreType::AIV;
  KernelMode mode = KernelMode::AIV_MODE;
  int block = 0;        // physical AI Core (group) index
  int block_num = 1;
  int sub_idx = 0;      // AIV index inside its group (0/1 in MIX 1:2)
  int sub_num = 1;
  Arena ub{"UB", kUbBytes}, l1{"L1", kL1Bytes}, l0a{"L0A", kL0ABytes}, l0b{"L0B", kL0BBytes},
      l0c{"L0C", kL0CBytes};
  Counters counters;
  TPipe* pipe = nullptr;
  LaunchState* launch = nullptr;
  MatmulMailbox* mailbox = nullptr;  // this group's cube server (MIX mode)
  int flags[int(HardEvent::MAX)][8] = {};
  bool atomic_add = false;
  std::vector<std::string> deferred_errors;  // found in destructors, which must not throw

  int BlockIdx() const { return type == CoreType::AIV ? block * sub_num + sub_idx : block; }
  std::string Name() const;
  Arena& ArenaFor(TPosition pos);
};

// Count-only mode (performance model at full scale): instructions are checked and counted but move and compute
// nothing. Set on the host between launches.
void SetCountOnly(bool on);
bool CountOnly();

// The calling thread's core; fails when called outside a kernel launch.
CoreContext& Core();
CoreContext* CoreOrNull();

// Shared by every core of one launch: abort flag (a failed core stops the others' waits) and SyncAll barrier.
struct LaunchState {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> aborted{false};
  int barrier_count = 0;
  uint64_t barrier_generation = 0;
  int aiv_cores = 0;
  int all_cores = 0;
  int finished_aiv = 0;  // cores whose kernel body returned (they can never reach a SyncAll again)
  int finished_all = 0;
  std::vector<uint8_t> sync_flags;  // CrossCore flag counters: [block][lane][flag id]
  std::atomic<int> error_seq{0};    // order in which cores failed: the first failure is the one reported
  void Abort();
  // Waits on cv until pred() holds; throws LaunchAborted when another core failed.
  template <typename Pred>
  void WaitUntil(std::unique_lock<std::mutex>& lock, Pred pred) {
    cv.wait(lock, [&] { return aborted.load() || pred(); });
    // Aborted wins even when pred() also holds: what this core would do next (or report) is a consequence.
    if (aborted.load()) throw LaunchAborted("stopped: another core failed");
  }
};

inline uint32_t RoundUp(uint32_t v, uint32_t to) { return (v + to - 1) / to * to; }

}  // namespace AscendC::cpu
