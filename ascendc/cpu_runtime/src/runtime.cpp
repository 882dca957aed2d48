// The non-inline half of the CPU runtime: per-core contexts, the GM registry, queues, the launcher (threads per
// core, MIX groups), the Matmul server, SyncAll and cross-core flags, and launch statistics.
#include <algorithm>
#include <cstdlib>
#include <exception>
#include <map>
#include <thread>

#include "tikicpulib.h"

namespace AscendC::cpu {

namespace {
thread_local CoreContext* t_core = nullptr;
std::atomic<KernelMode> g_mode{KernelMode::AIV_MODE};
std::atomic<bool> g_count_only{false};
std::mutex g_launch_mu;          // one launch at a time: the simulator is a test and development tool
std::mutex g_stats_mu;
LaunchStats g_last_stats;

struct GmRegion {
  uintptr_t begin, end;
};
std::mutex g_gm_mu;
std::multimap<uintptr_t, GmRegion> g_gm;  // keyed by begin; regions may overlap (views of one tensor)
std::mutex g_atomic_mu;

const char* CoreTypeName(CoreType t) { return t == CoreType::AIC ? "AIC" : "AIV"; }
}  // namespace

void SetCountOnly(bool on) { g_count_only = on; }
bool CountOnly() { return g_count_only.load(std::memory_order_relaxed); }

// ---- errors, core identity ----

void Fail(const char* api, const std::string& message) {
  throw KernelCheckError(Str(api, ": ", message));
}

std::string CoreContext::Name() const {
  return Str(CoreTypeName(type), " ", BlockIdx(), " (block ", block, type == CoreType::AIV && sub_num > 1
             ? Str(", sub-block ", sub_idx) : std::string(), ")");
}

Arena::Arena(const char* n, uint32_t cap) : name(n), capacity(cap), storage(new uint8_t[cap + kDataBlock]) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(storage.get());
  base = reinterpret_cast<uint8_t*>((p + kDataBlock - 1) / kDataBlock * kDataBlock);
}

Arena& CoreContext::ArenaFor(TPosition pos) {
  switch (pos) {
    case TPosition::A1: case TPosition::B1: case TPosition::C1: return l1;
    case TPosition::A2: return l0a;
    case TPosition::B2: return l0b;
    case TPosition::CO1: return l0c;
    case TPosition::GM: Fail("TPipe", "GM is not an on-chip position");
    default: return ub;
  }
}

CoreContext& Core() {
  if (!t_core) throw KernelCheckError("Ascend C API called outside a kernel launched by ICPU_RUN_KF");
  return *t_core;
}
CoreContext* CoreOrNull() { return t_core; }

void LaunchState::Abort() {
  {
    std::lock_guard<std::mutex> g(mu);
    aborted = true;
  }
  cv.notify_all();
}

// ---- GM ----

void GmRegister(const void* ptr, size_t bytes) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> g(g_gm_mu);
  g_gm.emplace(b, GmRegion{b, b + bytes});
}

void GmUnregister(const void* ptr) {
  std::lock_guard<std::mutex> g(g_gm_mu);
  auto it = g_gm.find(reinterpret_cast<uintptr_t>(ptr));
  if (it != g_gm.end()) g_gm.erase(it);
}

bool GmContains(const void* ptr, size_t bytes) {
  const uintptr_t b = reinterpret_cast<uintptr_t>(ptr), e = b + bytes;
  std::lock_guard<std::mutex> g(g_gm_mu);
  for (auto it = g_gm.begin(); it != g_gm.end() && it->first <= b; ++it)
    if (b >= it->second.begin && e <= it->second.end) return true;
  return false;
}

template <typename T>
static void AtomicAdd(T* dst, const T* src, size_t n) {
  std::lock_guard<std::mutex> g(g_atomic_mu);
  for (size_t i = 0; i < n; ++i) dst[i] = FromFloat<T>(ToFloat(dst[i]) + ToFloat(src[i]));
}
void AtomicAddToGm(float* dst, const float* src, size_t n) { AtomicAdd(dst, src, n); }
void AtomicAddToGm(half* dst, const half* src, size_t n) { AtomicAdd(dst, src, n); }
void AtomicAddToGm(bfloat16_t* dst, const bfloat16_t* src, size_t n) { AtomicAdd(dst, src, n); }

// ---- queues ----

void QueueBase::Init(Arena& arena, uint8_t num, uint32_t len) {
  ASCENDC_CPU_CHECK(slots_.empty(), "TPipe::InitBuffer", "this TQue already has buffers");
  ASCENDC_CPU_CHECK(num >= 1, "TPipe::InitBuffer", "num (buffers) must be >= 1");
  ASCENDC_CPU_CHECK(len >= 1, "TPipe::InitBuffer", "len (bytes per buffer) must be >= 1");
  len_ = RoundUp(len, kDataBlock);
  uint8_t* base = TPipe::Carve(arena, uint32_t(num) * len_, "TPipe::InitBuffer(TQue)");
  slots_.resize(num);
  for (uint8_t i = 0; i < num; ++i) slots_[i] = BufferSlot{base + i * len_, len_, SlotState::FREE, this};
}

BufferSlot* QueueBase::Alloc() {
  ASCENDC_CPU_CHECK(!slots_.empty(), "TQue::AllocTensor", "the queue has no buffers (TPipe::InitBuffer first)");
  for (auto& s : slots_)
    if (s.state == SlotState::FREE) {
      s.state = SlotState::ALLOCATED;
      return &s;
    }
  Fail("TQue::AllocTensor", Str("all ", slots_.size(), " buffers of the queue are in use (FreeTensor one first)"));
}

void QueueBase::Push(BufferSlot* slot) {
  ASCENDC_CPU_CHECK(slot != nullptr, "TQue::EnQue", "the tensor was not allocated from a queue (AllocTensor)");
  ASCENDC_CPU_CHECK(slot->state == SlotState::ALLOCATED, "TQue::EnQue", "the tensor is ",
                    slot->state == SlotState::FREE ? "freed" : slot->state == SlotState::ENQUEUED
                        ? "already enqueued" : "dequeued (EnQue needs a freshly allocated tensor)");
  ASCENDC_CPU_CHECK(fifo_.size() < size_t(std::max<int32_t>(depth_, int32_t(slots_.size()))), "TQue::EnQue",
                    "the queue is full (depth ", depth_, ")");
  slot->state = SlotState::ENQUEUED;
  fifo_.push_back(slot);
}

BufferSlot* QueueBase::Pop() {
  ASCENDC_CPU_CHECK(!fifo_.empty(), "TQue::DeQue", "the queue is empty (EnQue a tensor before DeQue)");
  BufferSlot* s = fifo_.front();
  fifo_.pop_front();
  s->state = SlotState::DEQUEUED;
  return s;
}

void QueueBase::Free(BufferSlot* slot) {
  ASCENDC_CPU_CHECK(slot != nullptr, "TQue::FreeTensor", "the tensor was not allocated from a queue");
  ASCENDC_CPU_CHECK(slot->owner == this, "TQue::FreeTensor", "the tensor belongs to another queue");
  ASCENDC_CPU_CHECK(slot->state != SlotState::FREE, "TQue::FreeTensor", "the tensor is already freed");
  ASCENDC_CPU_CHECK(slot->state != SlotState::ENQUEUED, "TQue::FreeTensor",
                    "the tensor is still enqueued (DeQue it first)");
  slot->state = SlotState::FREE;
}

QueueBase::~QueueBase() {
  if (pipe) {
    Release();
    pipe->Detach(this);
  }
}

void QueueBase::Release() {
  size_t live = 0;
  for (auto& s : slots_) live += s.state != SlotState::FREE;
  if (live && t_core)
    t_core->deferred_errors.push_back(Str("TPipe: ", live, " tensor(s) of a queue were never freed (missing "
                                          "FreeTensor or DeQue) when the pipe was destroyed"));
  slots_.clear();
  fifo_.clear();
}

// ---- launcher ----

KernelMode CurrentKernelMode() { return g_mode.load(); }

LaunchStats LastLaunchStats() {
  std::lock_guard<std::mutex> g(g_stats_mu);
  return g_last_stats;
}

namespace {

struct CoreRun {
  std::unique_ptr<CoreContext> ctx;
  std::string error;
  bool primary_error = false;   // a check failed here (not merely stopped because another core failed)
  int error_order = 0;          // when, among the launch's failures
};


void RunCore(CoreRun& run, LaunchState& launch, const std::function<void()>& body) {
  t_core = run.ctx.get();
  try {
    body();
  } catch (const LaunchAborted&) {
    // another core failed first; its error is the one reported
  } catch (const std::exception& e) {
    run.error = e.what();
    run.primary_error = true;
  }
  CoreContext& c = *run.ctx;
  if (c.pipe) {  // a TPipe that outlived the kernel body cannot happen with scoped pipes; keep the state sane
    c.pipe = nullptr;
  }
  if (run.error.empty() && !c.deferred_errors.empty()) {
    run.error = c.deferred_errors.front();
    run.primary_error = true;
  }
  if (run.primary_error) {
    run.error_order = launch.error_seq++;
    launch.Abort();
  }
  {
    std::lock_guard<std::mutex> g(launch.mu);
    ++launch.finished_all;
    if (c.type == CoreType::AIV) ++launch.finished_aiv;
    if (c.mailbox) {
      if (c.type == CoreType::AIV) --c.mailbox->clients_left;
      else c.mailbox->server_gone = true;
    }
  }
  launch.cv.notify_all();
  t_core = nullptr;
}

}  // namespace

void RunOnCores(const char* name, uint64_t numBlocks, const std::vector<const void*>& gm_args,
                const std::function<void()>& body) {
  const KernelMode mode = g_mode.load();
  const bool aiv_only = mode == KernelMode::AIV_MODE;
  const uint64_t limit = aiv_only ? kMaxAivBlocks : kMaxMixBlocks;
  if (numBlocks < 1 || numBlocks > limit)
    throw KernelCheckError(Str("ICPU_RUN_KF(", name, "): numBlocks ", numBlocks, " must be in [1, ", limit,
                               "] for this kernel mode"));
  for (size_t i = 0; i < gm_args.size(); ++i)
    if (gm_args[i] && !GmContains(gm_args[i], 1))
      throw KernelCheckError(Str("ICPU_RUN_KF(", name, "): pointer argument ", i,
                                 " is not GM (allocate it with AscendC::GmAlloc)"));

  std::lock_guard<std::mutex> one_launch(g_launch_mu);
  LaunchState launch;
  const int aiv_per_group = mode == KernelMode::MIX_MODE ? 2 : mode == KernelMode::MIX_AIC_1_1 ? 1 :
                            aiv_only ? 1 : 0;
  const bool has_aic = !aiv_only;
  std::vector<std::unique_ptr<MatmulMailbox>> mailboxes;
  std::vector<CoreRun> runs;
  for (uint64_t b = 0; b < numBlocks; ++b) {
    MatmulMailbox* box = nullptr;
    if (has_aic && aiv_per_group > 0) {
      mailboxes.push_back(std::make_unique<MatmulMailbox>());
      box = mailboxes.back().get();
      box->clients_left = aiv_per_group;
    }
    auto make = [&](CoreType type, int sub) {
      CoreRun r;
      r.ctx = std::make_unique<CoreContext>();
      CoreContext& c = *r.ctx;
      c.type = type;
      c.mode = mode;
      c.block = int(b);
      c.block_num = int(numBlocks);
      c.sub_idx = sub;
      c.sub_num = type == CoreType::AIV ? aiv_per_group : 1;
      c.launch = &launch;
      c.mailbox = box;
      runs.push_back(std::move(r));
    };
    if (has_aic) make(CoreType::AIC, 0);
    for (int s = 0; s < aiv_per_group; ++s) make(CoreType::AIV, s);
  }
  launch.all_cores = int(runs.size());
  launch.aiv_cores = int(std::count_if(runs.begin(), runs.end(),
                                       [](const CoreRun& r) { return r.ctx->type == CoreType::AIV; }));
  launch.sync_flags.resize(size_t(numBlocks) * 64 * 3, 0);

  std::vector<std::thread> threads;
  threads.reserve(runs.size());
  for (auto& r : runs) threads.emplace_back(RunCore, std::ref(r), std::ref(launch), std::cref(body));
  for (auto& t : threads) t.join();

  LaunchStats stats;
  stats.kernel = name;
  stats.mode = mode;
  stats.num_blocks = int(numBlocks);
  for (auto& r : runs) stats.cores.push_back(CoreStats{r.ctx->type, r.ctx->BlockIdx(), r.ctx->counters});
  {
    std::lock_guard<std::mutex> g(g_stats_mu);
    g_last_stats = stats;
  }
  const CoreRun* first = nullptr;
  for (auto& r : runs)
    if (r.primary_error && (!first || r.error_order < first->error_order)) first = &r;
  if (first) throw KernelCheckError(Str("Ascend C kernel '", name, "' on ", first->ctx->Name(), ": ", first->error));
}

// ---- Matmul client/server ----

bool MatmulInline() {
  CoreContext& c = Core();
  if (c.type == CoreType::AIC) return true;
  ASCENDC_CPU_CHECK(c.mailbox != nullptr, "Matmul",
                    "this AIV core has no cube: launch the kernel in MIX_MODE (SetKernelMode) to use Matmul");
  return false;
}

void PostMatmul(MatmulJob* job) {
  CoreContext& c = Core();
  LaunchState& l = *c.launch;
  {
    std::lock_guard<std::mutex> g(l.mu);
    ASCENDC_CPU_CHECK(!c.mailbox->server_gone, "Matmul::IterateAll",
                      "the group's AIC returned without serving matmuls (its branch must run REGIST_MATMUL_OBJ)");
    c.mailbox->jobs.push_back(job);
  }
  l.cv.notify_all();
}

void WaitMatmul(MatmulJob* job) {
  CoreContext& c = Core();
  LaunchState& l = *c.launch;
  std::unique_lock<std::mutex> lock(l.mu);
  l.WaitUntil(lock, [&] { return job->done || c.mailbox->server_gone; });
  if (!job->done && l.aborted) throw LaunchAborted("stopped: another core failed");  // the AIC failed first
  ASCENDC_CPU_CHECK(job->done, "Matmul::WaitIterateAll",
                    "the group's AIC returned without running this matmul (REGIST_MATMUL_OBJ missing on the AIC)");
}

void DropMatmul(MatmulJob* job) noexcept {
  CoreContext* c = CoreOrNull();
  if (!c || !c->mailbox) return;
  LaunchState& l = *c->launch;
  std::unique_lock<std::mutex> lock(l.mu);
  auto& jobs = c->mailbox->jobs;
  auto it = std::find(jobs.begin(), jobs.end(), job);
  if (it != jobs.end()) {
    jobs.erase(it);
    return;
  }
  // Taken by the AIC: it finishes (or fails and returns) in finite time, aborted launch or not.
  l.cv.wait(lock, [&] { return job->done || c->mailbox->server_gone; });
}

bool ServeMatmuls() {
  CoreContext& c = Core();
  LaunchState& l = *c.launch;
  MatmulMailbox& box = *c.mailbox;
  for (;;) {
    MatmulJob* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(l.mu);
      l.WaitUntil(lock, [&] { return !box.jobs.empty() || box.clients_left == 0; });
      if (box.jobs.empty()) return true;
      job = box.jobs.front();
      box.jobs.pop_front();
    }
    job->run();  // on this AIC's context: its counters, its checks
    {
      std::lock_guard<std::mutex> g(l.mu);
      job->done = true;
    }
    l.cv.notify_all();
  }
}

// ---- SyncAll and cross-core flags ----

void SyncAllCores(bool aiv_only) {
  CoreContext& c = Core();
  LaunchState& l = *c.launch;
  ASCENDC_CPU_CHECK(!aiv_only || c.type == CoreType::AIV, "SyncAll", "SyncAll<true> is for AIV cores");
  const int parties = aiv_only ? l.aiv_cores : l.all_cores;
  const int& finished = aiv_only ? l.finished_aiv : l.finished_all;
  std::unique_lock<std::mutex> lock(l.mu);
  const uint64_t gen = l.barrier_generation;
  if (++l.barrier_count == parties) {
    l.barrier_count = 0;
    ++l.barrier_generation;
    lock.unlock();
    l.cv.notify_all();
    return;
  }
  // A core that returned from the kernel never arrives: the hardware would hang, here the waiters fail.
  auto stuck = [&] { return l.barrier_generation == gen && l.barrier_count + finished >= parties; };
  l.WaitUntil(lock, [&] { return l.barrier_generation != gen || stuck(); });
  if (l.barrier_generation == gen) {
    --l.barrier_count;
    Fail("SyncAll", Str(finished, " of the ", parties, " cores it waits for returned from the kernel without "
                        "reaching this SyncAll (the hardware would hang)"));
  }
}

// Counters per block: [0..63] AIC->AIV0, [64..127] AIC->AIV1 (AIV1 slot unused with 1:1), [128..191] AIV->AIC.
static uint8_t& FlagSlot(LaunchState& l, int block, int lane, uint16_t id) {
  ASCENDC_CPU_CHECK(id < 64, "CrossCoreFlag", "flagId ", id, " must be < 64");
  return l.sync_flags[(size_t(block) * 3 + lane) * 64 + id];
}

// Cross-core flags connect the AIC and the AIVs of one MIX group.
static void CheckGroup(const CoreContext& c, const char* api) {
  ASCENDC_CPU_CHECK(c.mailbox != nullptr, api, "needs a MIX launch (an AIC and its AIVs in one group); the "
                    "kernel mode is ", c.mode == KernelMode::AIV_MODE ? "AIV_MODE" : "AIC_MODE");
}

void CrossCoreSet(uint16_t id) {
  CoreContext& c = Core();
  LaunchState& l = *c.launch;
  CheckGroup(c, "CrossCoreSetFlag");
  {
    std::lock_guard<std::mutex> g(l.mu);
    if (c.type == CoreType::AIC) for (int s = 0; s < 2; ++s) ++FlagSlot(l, c.block, s, id);
    else ++FlagSlot(l, c.block, 2, id);
  }
  l.cv.notify_all();
}

void CrossCoreWait(uint16_t id) {
  CoreContext& c = Core();
  LaunchState& l = *c.launch;
  CheckGroup(c, "CrossCoreWaitFlag");
  MatmulMailbox& box = *c.mailbox;
  std::unique_lock<std::mutex> lock(l.mu);
  if (c.type == CoreType::AIC) {  // waits for every AIV of its group
    const int need = c.mode == KernelMode::MIX_AIC_1_1 ? 1 : 2;
    uint8_t& f = FlagSlot(l, c.block, 2, id);
    l.WaitUntil(lock, [&] { return f >= need || box.clients_left == 0; });
    ASCENDC_CPU_CHECK(f >= need, "CrossCoreWaitFlag", "flag ", id, " was set by ", int(f), " of the group's ", need,
                      " AIVs before they returned (the hardware would hang)");
    f -= need;
  } else {
    uint8_t& f = FlagSlot(l, c.block, c.sub_idx, id);
    l.WaitUntil(lock, [&] { return f >= 1 || box.server_gone; });
    ASCENDC_CPU_CHECK(f >= 1, "CrossCoreWaitFlag", "flag ", id,
                      " was never set by the group's AIC before it returned (the hardware would hang)");
    --f;
  }
}

}  // namespace AscendC::cpu

namespace AscendC {

// ---- TPipe ----

TPipe::TPipe() {
  cpu::CoreContext& c = cpu::Core();
  ASCENDC_CPU_CHECK(c.pipe == nullptr, "TPipe", "a core may have one TPipe at a time");
  c.pipe = this;
}

TPipe::~TPipe() {
  Release();
  if (cpu::CoreOrNull() && cpu::CoreOrNull()->pipe == this) cpu::CoreOrNull()->pipe = nullptr;
}

void TPipe::Release() {
  using namespace cpu;
  for (auto* q : queues_) {
    q->Release();
    q->pipe = nullptr;
  }
  for (auto& unbind : unbind_) unbind();
  unbind_.clear();
  queues_.clear();
  bufs_.clear();
  if (CoreContext* c = CoreOrNull()) for (Arena* a : {&c->ub, &c->l1, &c->l0a, &c->l0b, &c->l0c}) a->used = 0;
}

void TPipe::Detach(const void* member) {
  for (size_t i = 0; i < queues_.size(); ++i)
    if (queues_[i] == member) queues_.erase(queues_.begin() + i);
  for (size_t i = 0; i < bufs_.size(); ++i)
    if (bufs_[i] == member) {
      bufs_.erase(bufs_.begin() + i);
      unbind_.erase(unbind_.begin() + i);
    }
}

uint8_t* TPipe::Carve(cpu::Arena& arena, uint32_t bytes, const char* api) {
  using namespace cpu;
  ASCENDC_CPU_CHECK(uint64_t(arena.used) + bytes <= arena.capacity, api, arena.name, " overflow: ", arena.used,
                    " bytes already in use + ", bytes, " requested > ", arena.capacity,
                    " bytes of the Ascend 910B core");
  uint8_t* p = arena.base + arena.used;
  std::memset(p, 0xff, bytes);  // poison: NaN for float data, so reading unwritten memory shows in results
  arena.used += bytes;
  return p;
}


namespace {
constexpr size_t kGmHeader = 64;
uint8_t g_sys_workspace[1024];
}  // namespace

void* GmAlloc(size_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, 64, size + kGmHeader) != 0) throw std::bad_alloc();
  uint8_t* user = static_cast<uint8_t*>(p) + kGmHeader;
  std::memset(user, 0xff, size);  // poison, as on-chip buffers
  cpu::GmRegister(user, size);
  return user;
}

void GmFree(void* ptr) {
  if (!ptr) return;
  cpu::GmUnregister(ptr);
  std::free(static_cast<uint8_t*>(ptr) - kGmHeader);
}

void SetKernelMode(KernelMode mode) { cpu::g_mode = mode; }

GM_ADDR GetSysWorkSpacePtr() {
  static const bool registered = (cpu::GmRegister(g_sys_workspace, sizeof(g_sys_workspace)), true);
  (void)registered;
  return g_sys_workspace;
}

}  // namespace AscendC
