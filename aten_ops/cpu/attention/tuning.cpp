// Block-size tuning (tuning.h): the class keys, the candidate tiles, the measurement on a call's own inputs, the
// in-process table and the ops the Python package uses to load, read and clear it (attention_tuning_table,
// attention_tuning_stats). The per-machine JSON cache file is read and written by
// torch_ops_transformer/attention/tuning.py.
#include "cpu/attention/tuning.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

#include "generated/kernels.h"

namespace npu_fa::attention::tuning {
namespace {

constexpr const char* kEnv = "TORCH_OPS_TRANSFORMER_TUNE";
constexpr int64_t kMaxBlockQ = 4096, kMaxBlockKv = 8192;  // attention_tile_config's limits

thread_local std::optional<TileConfig> t_tiles;

struct Mode {
  enum Kind { Cache, Off, Tune, Forced } kind = Cache;
  TileConfig forced{0, 0};
};

// Parsed on every call (a few string operations next to an attention kernel), so changing the variable takes effect
// at once, as tests and notebooks expect.
Mode read_mode() {
  const char* env = std::getenv(kEnv);
  const std::string v = env ? env : "";
  if (v.empty()) return {};
  if (v == "0") return {Mode::Off};
  if (v == "1") return {Mode::Tune};
  const auto x = v.find_first_of("xX");
  auto number = [](const std::string& s, int64_t max) -> int64_t {
    if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
    const int64_t n = std::stoll(s);
    return n >= 1 && n <= max ? n : -1;
  };
  if (x != std::string::npos) {
    const int64_t q = number(v.substr(0, x), kMaxBlockQ), kv = number(v.substr(x + 1), kMaxBlockKv);
    if (q > 0 && kv > 0) return {Mode::Forced, {q, kv}};
  }
  TORCH_CHECK_VALUE(false, "environment variable ", kEnv, " must be unset (use the tuned tile sizes cached for this ",
                    "machine), \"0\" (built-in tile sizes), \"1\" (also tune each new shape class on its first call) ",
                    "or \"BQxBKV\" forcing the tiles, block_q in [1, ", kMaxBlockQ, "] and block_kv in [1, ",
                    kMaxBlockKv, "] (e.g. \"128x512\"); got \"", v, "\"");
  return {};
}

struct Candidate {
  TileConfig tiles;
  double ms;
};

struct Entry {
  TileConfig best{0, 0};             // {0, 0}: the kernels' built-in defaults
  std::vector<Candidate> measured;  // empty when loaded without timings or when nothing was worth measuring
};

std::mutex g_mutex;
std::map<std::string, Entry> g_table;
std::set<std::string> g_pending;  // classes being measured by some thread (others run with the defaults meanwhile)
std::atomic<int64_t> g_classes_measured{0}, g_timed_runs{0};

int64_t pow2_bucket(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}

const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return "fp32";
    case c10::ScalarType::Half: return "fp16";
    case c10::ScalarType::BFloat16: return "bf16";
    case c10::ScalarType::Char: return "int8";
    default: return "other";
  }
}

const char* family_name(Family f) {
  switch (f) {
    case Family::Forward: return "fwd";
    case Family::Backward: return "bwd";
    default: return "prefill";
  }
}

// none: every row sees every key; causal: the right side is bounded (top-left or bottom-right aligned); band: the
// left side is bounded too (sliding window); explicit: an element-wise atten_mask is applied.
const char* mask_kind(const AttentionParams& p) {
  if (p.mask) return "explicit";
  const Band r = p.band(0);
  const bool left_open = r.lo <= -(p.max_q_len - 1), right_open = r.hi >= p.max_kv_len - 1;
  if (left_open && right_open) return "none";
  return left_open ? "causal" : "band";
}

// The candidates around `center`: the built-in choice ({0, 0}) first, then the 7 grid points closest to it in
// log2 distance (query blocks of multiples of 16 rows and key blocks of multiples of 32 keys, which AMX tiles and
// the VNNI packing favour), capped at the length buckets.
std::vector<TileConfig> candidates(TileConfig center, int64_t q_cap, int64_t kv_cap) {
  static constexpr int64_t kQ[] = {32, 64, 128, 256}, kKv[] = {128, 256, 512, 1024};
  struct Scored {
    double dist;
    TileConfig t;
  };
  std::vector<Scored> grid;
  auto seen = [&](TileConfig t) {
    if (t.block_q == center.block_q && t.block_kv == center.block_kv) return true;
    for (const auto& s : grid)
      if (s.t.block_q == t.block_q && s.t.block_kv == t.block_kv) return true;
    return false;
  };
  for (int64_t q : kQ)
    for (int64_t kv : kKv) {
      const TileConfig t{std::min(q, q_cap), std::min(kv, kv_cap)};
      if (seen(t)) continue;
      const double d = std::abs(std::log2(double(t.block_q) / double(center.block_q))) +
                       std::abs(std::log2(double(t.block_kv) / double(center.block_kv)));
      grid.push_back({d, t});
    }
  std::stable_sort(grid.begin(), grid.end(), [](const Scored& a, const Scored& b) { return a.dist < b.dist; });
  std::vector<TileConfig> out{{0, 0}};
  for (size_t i = 0; i < grid.size() && out.size() < 8; ++i) out.push_back(grid[i].t);
  return out;
}

// Times `run` under each candidate, interleaved round by round so a change of machine load hits all of them, and
// keeps each candidate's fastest run. A candidate must beat the built-in choice by 2%, also after a confirmation
// (timing noise on a loaded machine must not flip the choice).
// The first candidate is the built-in choice ({0, 0}), recorded as the tiles it stands for (`builtin`).
Entry measure(const std::vector<TileConfig>& cands, TileConfig builtin, const std::function<void()>& run,
              const std::function<void()>& reset) {
  using clock = std::chrono::steady_clock;
  auto timed = [&](TileConfig t) {
    if (reset) reset();
    ScopedTiles scope(t.block_q > 0 ? std::optional<TileConfig>(t) : std::nullopt);
    const auto t0 = clock::now();
    run();
    g_timed_runs.fetch_add(1);
    return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
  };
  // At least kMinRounds rounds and kBudgetMs of timing (up to kMaxRounds): a short call gets many samples, so one
  // that is not disturbed by other processes (a descheduled worker thread costs a whole time slice) is among them.
  constexpr int kMinRounds = 3, kMaxRounds = 50;
  constexpr double kBudgetMs = 400;
  std::vector<double> best(cands.size(), std::numeric_limits<double>::infinity());
  for (const TileConfig& t : cands) timed(t);  // warm-up: packing buffers, page faults, caches
  double spent = 0;
  for (int r = 0; r < kMaxRounds && (r < kMinRounds || spent < kBudgetMs); ++r)
    for (size_t c = 0; c < cands.size(); ++c) {
      const double ms = timed(cands[c]);
      spent += ms;
      best[c] = std::min(best[c], ms);
    }
  size_t win = 0;
  for (size_t c = 1; c < cands.size(); ++c)
    if (best[c] < best[win] && best[c] < 0.98 * best[0]) win = c;
  // A switch away from the built-in choice is cached for good: confirm it in a few more rounds of the two alone
  // (each keeps its fastest run, so a built-in choice that was unlucky before gets more chances).
  for (int r = 0; r < kMinRounds && win != 0; ++r)
    for (size_t c : {size_t(0), win}) best[c] = std::min(best[c], timed(cands[c]));
  if (win != 0 && !(best[win] < 0.98 * best[0])) win = 0;
  Entry e;
  e.best = cands[win];
  for (size_t c = 0; c < cands.size(); ++c) e.measured.push_back({c == 0 ? builtin : cands[c], best[c]});
  return e;
}

std::string format_entry(const std::string& key, const Entry& e) {
  std::ostringstream s;
  s << key << ' ' << e.best.block_q << ' ' << e.best.block_kv;
  for (const auto& c : e.measured) s << ' ' << c.tiles.block_q << ':' << c.tiles.block_kv << ':' << c.ms;
  return s.str();
}

// One line of format_entry's format; the Python side validates the cache file before handing lines over.
std::pair<std::string, Entry> parse_entry(const std::string& line) {
  static constexpr const char* op = "attention_tuning_table";
  std::istringstream s(line);
  std::pair<std::string, Entry> r;
  auto& e = r.second;
  TORCH_CHECK_VALUE(static_cast<bool>(s >> r.first >> e.best.block_q >> e.best.block_kv), op,
                    ": argument 'entries': each line must be 'key block_q block_kv [q:kv:ms ...]'; got \"", line, "\"");
  auto check = [&](TileConfig t) {
    TORCH_CHECK_VALUE(t.block_q >= 0 && t.block_q <= kMaxBlockQ && t.block_kv >= 0 && t.block_kv <= kMaxBlockKv &&
                          (t.block_q == 0) == (t.block_kv == 0),
                      op, ": argument 'entries': tiles must be 0 0 (built-in) or block_q in [1, ", kMaxBlockQ,
                      "] and block_kv in [1, ", kMaxBlockKv, "]; got \"", line, "\"");
  };
  check(e.best);
  std::string tok;
  while (s >> tok) {
    Candidate c{};
    char c1 = 0, c2 = 0;
    std::istringstream t(tok);
    TORCH_CHECK_VALUE(static_cast<bool>(t >> c.tiles.block_q >> c1 >> c.tiles.block_kv >> c2 >> c.ms) && c1 == ':' &&
                          c2 == ':',
                      op, ": argument 'entries': a measurement must be 'block_q:block_kv:ms'; got \"", tok, "\"");
    check(c.tiles);
    e.measured.push_back(c);
  }
  return r;
}

}  // namespace

std::optional<TileConfig> thread_tiles() { return t_tiles; }

ScopedTiles::ScopedTiles(std::optional<TileConfig> t) : prev_(t_tiles) { t_tiles = t; }
ScopedTiles::~ScopedTiles() { t_tiles = prev_; }

std::string class_key(Family family, const AttentionParams& p, c10::ScalarType dtype, c10::ScalarType kv_dtype) {
  std::ostringstream s;
  s << family_name(family) << "|d" << p.head_dim;
  if (p.v_head_dim != p.head_dim) s << 'v' << p.v_head_dim;
  s << '|' << dtype_name(dtype);
  if (kv_dtype != dtype) s << '+' << dtype_name(kv_dtype) << "kv";
  s << '|' << mask_kind(p) << "|sq" << pow2_bucket(p.max_q_len) << "|skv" << pow2_bucket(p.max_kv_len) << "|t"
    << at::get_num_threads();
  return s.str();
}

void run_with_tiles(Family family, const AttentionParams& p, c10::ScalarType dtype, c10::ScalarType kv_dtype,
                    const std::function<void()>& run, const std::function<void()>& reset) {
  const Mode mode = read_mode();  // a bad value is an error even when an override makes it moot
  const std::vector<int64_t> over = attention_tile_config(0, 0);  // the explicit override, if any
  if (over[0] > 0 || over[1] > 0 || mode.kind == Mode::Off) return run();
  if (mode.kind == Mode::Forced) {
    ScopedTiles scope(mode.forced);
    return run();
  }
  const std::string key = class_key(family, p, dtype, kv_dtype);
  {
    std::unique_lock<std::mutex> lock(g_mutex);
    const auto it = g_table.find(key);
    if (it != g_table.end() || mode.kind != Mode::Tune || g_pending.count(key) || at::in_parallel_region()) {
      const std::optional<TileConfig> t =
          it != g_table.end() && it->second.best.block_q > 0 ? std::optional<TileConfig>(it->second.best) : std::nullopt;
      lock.unlock();
      ScopedTiles scope(t);
      return run();
    }
    g_pending.insert(key);
  }
  // Measured outside the lock: other classes (and other threads' calls of this class, with the defaults) proceed.
  Entry e;
  try {
    const int64_t elem = dtype == c10::ScalarType::Float ? 4 : 2;
    const TileConfig center = family == Family::Backward
                                  ? TileConfig{64, 128}  // the backward kernel's own defaults (backward.h)
                                  : tile_config(p.head_dim, elem);
    const auto cands = candidates(center, pow2_bucket(p.max_q_len), pow2_bucket(p.max_kv_len));
    if (cands.size() > 1) {
      e = measure(cands, center, run, reset);
      g_classes_measured.fetch_add(1);
    }
    if (reset) reset();
    ScopedTiles scope(e.best.block_q > 0 ? std::optional<TileConfig>(e.best) : std::nullopt);
    run();
  } catch (...) {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_pending.erase(key);
    throw;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pending.erase(key);
  g_table.emplace(key, std::move(e));
}

}  // namespace npu_fa::attention::tuning

namespace npu_fa {
using namespace attention::tuning;

// Lines "key block_q block_kv [q:kv:ms ...]": `entries` are added where the table has no entry for the key yet
// (what this process measured wins over a file); clear empties the table first. Returns the whole table.
std::string attention_tuning_table(c10::string_view entries, bool clear) {
  std::vector<std::pair<std::string, Entry>> parsed;
  std::istringstream in{std::string(entries)};
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) parsed.push_back(parse_entry(line));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (clear) g_table.clear();
  for (auto& kv : parsed) g_table.emplace(std::move(kv.first), std::move(kv.second));
  std::string out;
  for (const auto& kv : g_table) out += format_entry(kv.first, kv.second) + "\n";
  return out;
}

// [shape classes measured, kernel runs timed] since the process started.
std::vector<int64_t> attention_tuning_stats() { return {g_classes_measured.load(), g_timed_runs.load()}; }
}  // namespace npu_fa
