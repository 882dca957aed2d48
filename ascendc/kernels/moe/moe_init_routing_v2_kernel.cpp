// MoE dispatch (CANN MoeInitRoutingV2, unquantised) as an Ascend C vector kernel (AIV_MODE): a stable counting sort
// of the N*k (token, expert) pairs by expert, then the rows of x copied to their sorted positions.
//
// Every AIV owns a contiguous, ordered share of the pairs (tiling: moe_init_routing_v2_tiling.h):
//   1. histogram: the scalar unit reads each pair's expert from GM and counts it into a UB counter of its bucket
//      (expert - first_expert inside the span [0, width) and, for row_idx_type 1, above it up to `sort_width`, so
//      the dropped pairs above the span sort by expert; `sort_width` for the rest: below the span, sorted last);
//      MTE3 writes the core's counters to its row of the GM workspace.                                 -> SyncAll
//   2. ranks: every core streams the block_dim histogram rows back (MTE2) and adds them up on the vector unit
//      (int32 Add: each bucket's total and its count in earlier shares); then one scalar scan over the buckets:
//      base[b] = pairs in buckets < b, next[b] = base[b] + the earlier shares' count.
//   3. scatter: the core walks its pairs again; pair f goes to position p = next[key]++ (stable: earlier shares and
//      earlier pairs first). Dropless: row p when p < rows_out (routed pairs come before dropped ones); capacity:
//      slot key*C + (p - base[key]) when that is < C. The row x[f / k] is moved GM -> UB -> GM in chunks through two
//      ping-pong buffers (MTE2 of one chunk overlaps MTE3 of the other), scale[f / k] follows it, and the index is
//      written as the NPU writes it: row_idx_type 0 stages per pair its slot, or (dropless) its sorted position
//      when routed, also past rows_out, else -1 (one DataCopyPad per 1024); type 1 writes f at position p for every
//      pair, dropped ones included (a 4-byte DataCopyPad): the whole sorted order.
//   4. fill: the core's share of the output rows gets zeros where no pair landed (dropless: rows >= the kept count;
//      capacity: slots past an expert's count); core 0 writes the token counts.
// Rows are moved as bytes, so every dtype of x takes the kernel (T is the integer type of the element size).
#include "kernel_operator.h"
#include "moe/moe_init_routing_v2_kernel.h"
#include "moe/moe_init_routing_v2_tiling.h"

using namespace AscendC;

namespace moe_init_routing_kernel {

using Tiling = tot_ascendc::MoeInitRoutingV2Tiling;
constexpr uint32_t kIndexChunk = tot_ascendc::kInitRoutingIndexChunk;

__aicore__ inline uint32_t MinU32(uint32_t a, uint32_t b) { return a < b ? a : b; }

// Orders two pipes of this core (producer -> consumer) at a point where nothing overlaps them anyway.
template <HardEvent E>
__aicore__ inline void Order() {
  event_t e = static_cast<event_t>(GetTPipePtr()->FetchEventID(E));
  SetFlag<E>(e);
  WaitFlag<E>(e);
}

template <typename T>
class KernelMoeInitRouting {
 public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR expertIdx, GM_ADDR scale, GM_ADDR expandedX, GM_ADDR rowIdx,
                              GM_ADDR tokens, GM_ADDR expandedScale, GM_ADDR workspace, const Tiling& tiling,
                              TPipe* pipe) {
    t_ = tiling;
    core_ = uint32_t(GetBlockIdx());
    pairStart_ = core_ * t_.pairs_per_core + MinU32(core_, t_.pairs_remainder);
    pairEnd_ = pairStart_ + t_.pairs_per_core + (core_ < t_.pairs_remainder ? 1 : 0);
    rowStart_ = core_ * t_.rows_per_core + MinU32(core_, t_.rows_remainder);
    rowEnd_ = rowStart_ + t_.rows_per_core + (core_ < t_.rows_remainder ? 1 : 0);
    if (t_.hidden > 0) {  // H = 0: only the indices and counts
      xGm_.SetGlobalBuffer((__gm__ T*)x, uint64_t(t_.tokens) * t_.hidden);
      outGm_.SetGlobalBuffer((__gm__ T*)expandedX, uint64_t(t_.rows_out) * t_.hidden);
    }
    expertGm_.SetGlobalBuffer((__gm__ int32_t*)expertIdx, t_.pairs);
    rowIdxGm_.SetGlobalBuffer((__gm__ int32_t*)rowIdx, t_.pairs);
    histGm_.SetGlobalBuffer((__gm__ int32_t*)GetUserWorkspace(workspace), uint64_t(t_.block_dim) * t_.buckets_aligned);
    if (t_.has_scale) {
      scaleGm_.SetGlobalBuffer((__gm__ float*)scale, t_.tokens);
      expandedScaleGm_.SetGlobalBuffer((__gm__ float*)expandedScale, t_.rows_out);
    }
    if (t_.tokens_flag)
      tokensGm_.SetGlobalBuffer((__gm__ int64_t*)tokens, t_.tokens_type == 2 ? 2ull * t_.expert_num : t_.width);

    // The same layout as tot_ascendc::MoeInitRoutingV2UbBytes (the tiling's budget).
    const uint32_t counters = t_.buckets_aligned * 4, row = (t_.h_tile * t_.elem_bytes + 31) / 32 * 32;
    pipe->InitBuffer(hist_, counters);
    pipe->InitBuffer(total_, counters);
    pipe->InitBuffer(next_, counters);
    pipe->InitBuffer(base_, counters);
    pipe->InitBuffer(rows_, 2 * row);
    pipe->InitBuffer(zeros_, row);
    pipe->InitBuffer(stage_, kIndexChunk * 4);
    pipe->InitBuffer(slots_, 2 * 32);
    rowBytes_ = row;
  }

  __aicore__ inline void Process() {
    CountShare();
    PipeBarrier<PIPE_ALL>();
    SyncAll();  // every core's histogram row is in GM
    RankBuckets();
    PrepareZeros();
    ScatterShare();
    FillShare();
    if (core_ == 0 && t_.tokens_flag) WriteTokenCounts();
    DrainRowCopies();
  }

 private:
  __aicore__ inline uint32_t KeyOf(uint32_t f) {
    const int32_t e = expertGm_.GetValue(f);
    const int64_t rel = int64_t(e) - t_.first_expert;
    return rel >= 0 && rel < int64_t(t_.sort_width) ? uint32_t(rel) : t_.sort_width;
  }

  // Zero `count` int32 counters (bit pattern 0 = 0.0f: one Duplicate on the float view).
  __aicore__ inline void ZeroCounters(const LocalTensor<int32_t>& c) {
    Duplicate(c.template ReinterpretCast<float>(), 0.0f, int32_t(t_.buckets_aligned));
  }

  // 1. This share's histogram, to row core_ of the GM workspace.
  __aicore__ inline void CountShare() {
    LocalTensor<int32_t> hist = hist_.Get<int32_t>();
    ZeroCounters(hist);
    Order<HardEvent::V_S>();
    for (uint32_t f = pairStart_; f < pairEnd_; ++f) {
      const uint32_t key = KeyOf(f);
      hist.SetValue(key, hist.GetValue(key) + 1);
    }
    Order<HardEvent::S_MTE3>();
    DataCopy(histGm_[uint64_t(core_) * t_.buckets_aligned], hist, t_.buckets_aligned);
  }

  // 2. Totals per bucket, the pairs of each bucket in earlier shares (vector adds of the histogram rows; the
  // counts are below 2^24, the tiling's limit, so they stay exact however the adds round), then base / next.
  __aicore__ inline void RankBuckets() {
    LocalTensor<int32_t> row = hist_.Get<int32_t>(), total = total_.Get<int32_t>(), next = next_.Get<int32_t>(),
                         base = base_.Get<int32_t>();
    ZeroCounters(total);
    ZeroCounters(next);
    const int32_t lanes = int32_t(t_.buckets_aligned);
    for (uint32_t c = 0; c < t_.block_dim; ++c) {
      Order<HardEvent::V_MTE2>();  // the row buffer is refilled only after the adds read it
      DataCopy(row, histGm_[uint64_t(c) * t_.buckets_aligned], t_.buckets_aligned);
      Order<HardEvent::MTE2_V>();
      Add(total, total, row, lanes);
      if (c < core_) Add(next, next, row, lanes);
    }
    Order<HardEvent::V_S>();
    const uint32_t buckets = t_.sort_width + 1;
    int32_t run = 0;
    for (uint32_t b = 0; b < buckets; ++b) {
      base.SetValue(b, run);
      next.SetValue(b, run + next.GetValue(b));
      run += total.GetValue(b);
    }
    const uint32_t routed = uint32_t(base.GetValue(t_.width));  // the pairs in the span's buckets
    kept_ = t_.capacity ? 0 : MinU32(routed, t_.rows_out);
  }

  __aicore__ inline void PrepareZeros() {
    Duplicate(zeros_.Get<float>(), 0.0f, int32_t(rowBytes_ / 4));
    Order<HardEvent::V_MTE3>();
  }

  // The row of expanded_x the pair at sorted position p of bucket key is copied to, or -1 (none).
  __aicore__ inline int32_t Destination(uint32_t key, uint32_t p) {
    if (key >= t_.width) return -1;  // outside the span
    if (!t_.capacity) return p < t_.rows_out ? int32_t(p) : -1;
    const uint32_t pos = p - uint32_t(base_.Get<int32_t>().GetValue(key));
    return pos < t_.expert_capacity ? int32_t(key * t_.expert_capacity + pos) : -1;
  }

  // 3. Every pair of the share to its position: row, scale and index.
  __aicore__ inline void ScatterShare() {
    LocalTensor<int32_t> next = next_.Get<int32_t>(), stage = stage_.Get<int32_t>();
    uint32_t staged = 0, stagedFrom = pairStart_;
    for (uint32_t f = pairStart_; f < pairEnd_; ++f) {
      const uint32_t key = KeyOf(f);
      const uint32_t p = uint32_t(next.GetValue(key));
      next.SetValue(key, int32_t(p + 1));
      const int32_t dest = Destination(key, p);
      if (dest >= 0) {
        const uint32_t token = f / t_.k;
        MoveRow(token, uint32_t(dest));
        if (t_.has_scale) WriteOne(expandedScaleGm_, uint32_t(dest), scaleGm_.GetValue(token));
      }
      if (t_.row_idx_type == 1) WriteOne(rowIdxGm_, p, int32_t(f));
      if (t_.row_idx_type == 0) {
        // Dropless: a routed pair's sorted position, also past rows_out (active_num); capacity: its slot.
        stage.SetValue(staged++, t_.capacity || key >= t_.width ? dest : int32_t(p));
        if (staged == kIndexChunk) {
          FlushStage(rowIdxGm_, stage, stagedFrom, staged);
          stagedFrom += staged;
          staged = 0;
        }
      }
    }
    if (staged > 0) FlushStage(rowIdxGm_, stage, stagedFrom, staged);
  }

  template <typename V>
  __aicore__ inline void FlushStage(const GlobalTensor<V>& gm, const LocalTensor<V>& stage, uint32_t at,
                                    uint32_t count) {
    Order<HardEvent::S_MTE3>();
    DataCopyPad(gm[at], stage, DataCopyExtParams(1, count * uint32_t(sizeof(V)), 0, 0, 0));
    Order<HardEvent::MTE3_S>();  // the stage is rewritten only after MTE3 read it
  }

  // One 4-byte value to an arbitrary position (scattered writes: no staging order to exploit).
  template <typename V>
  __aicore__ inline void WriteOne(const GlobalTensor<V>& gm, uint32_t at, V value) {
    LocalTensor<V> slot = slots_.Get<V>();
    slot.SetValue(0, value);
    Order<HardEvent::S_MTE3>();
    DataCopyPad(gm[at], slot, DataCopyExtParams(1, uint32_t(sizeof(V)), 0, 0, 0));
    Order<HardEvent::MTE3_S>();
  }

  // x[token] -> expanded_x[dest], chunk by chunk through the ping-pong buffers.
  __aicore__ inline void MoveRow(uint32_t token, uint32_t dest) {
    const uint32_t elemsPerBuf = rowBytes_ / t_.elem_bytes;
    for (uint32_t c0 = 0; c0 < t_.hidden; c0 += t_.h_tile) {
      const uint32_t len = MinU32(t_.h_tile, t_.hidden - c0);
      const uint32_t b = buf_;
      buf_ ^= 1;
      if (busy_[b]) WaitFlag<HardEvent::MTE3_MTE2>(event_t(b));  // MTE3 finished reading this buffer
      LocalTensor<T> chunk = rows_.Get<T>()[b * elemsPerBuf];
      DataCopyPad(chunk, xGm_[uint64_t(token) * t_.hidden + c0], DataCopyExtParams(1, len * t_.elem_bytes, 0, 0, 0),
                  DataCopyPadExtParams<T>(false, 0, 0, T(0)));
      SetFlag<HardEvent::MTE2_MTE3>(event_t(b));
      WaitFlag<HardEvent::MTE2_MTE3>(event_t(b));
      DataCopyPad(outGm_[uint64_t(dest) * t_.hidden + c0], chunk, DataCopyExtParams(1, len * t_.elem_bytes, 0, 0, 0));
      SetFlag<HardEvent::MTE3_MTE2>(event_t(b));
      busy_[b] = true;
    }
  }

  __aicore__ inline void DrainRowCopies() {
    for (uint32_t b = 0; b < 2; ++b)
      if (busy_[b]) WaitFlag<HardEvent::MTE3_MTE2>(event_t(b));
  }

  __aicore__ inline bool RowIsEmpty(uint32_t r) {
    if (!t_.capacity) return r >= kept_;
    const uint32_t e = r / t_.expert_capacity, pos = r % t_.expert_capacity;
    return pos >= uint32_t(total_.Get<int32_t>().GetValue(e));
  }

  // 4. Zeros in the empty rows of this core's row share (and their scales).
  __aicore__ inline void FillShare() {
    const LocalTensor<T> zeros = zeros_.Get<T>();
    const uint32_t zeroElems = rowBytes_ / t_.elem_bytes;
    for (uint32_t r = rowStart_; r < rowEnd_; ++r) {
      if (!RowIsEmpty(r)) continue;
      for (uint32_t c0 = 0; c0 < t_.hidden; c0 += zeroElems) {
        const uint32_t len = MinU32(zeroElems, t_.hidden - c0);
        DataCopyPad(outGm_[uint64_t(r) * t_.hidden + c0], zeros, DataCopyExtParams(1, len * t_.elem_bytes, 0, 0, 0));
      }
      if (t_.has_scale)
        DataCopyPad(expandedScaleGm_[r], zeros_.Get<float>(), DataCopyExtParams(1, 4, 0, 0, 0));
    }
  }

  // The routed pairs of bucket b that were kept (dropless: the first kept positions; capacity: before dropping).
  __aicore__ inline int64_t CountOf(uint32_t b) {
    const int64_t total = total_.Get<int32_t>().GetValue(b);
    if (t_.capacity) return total;
    const int64_t start = base_.Get<int32_t>().GetValue(b);
    const int64_t kept = int64_t(kept_) - start;
    return kept <= 0 ? 0 : (kept < total ? kept : total);
  }

  // expert_tokens_count_or_cumsum (core 0): per expert of the span, or (expert, count) rows then zero rows.
  __aicore__ inline void WriteTokenCounts() {
    LocalTensor<int64_t> stage = stage_.Get<int64_t>();
    const uint32_t chunk = kIndexChunk / 2;
    const uint32_t total = t_.tokens_type == 2 ? 2 * t_.expert_num : t_.width;
    uint32_t staged = 0, written = 0, b = 0;
    int64_t run = 0;
    while (written + staged < total) {
      int64_t value = 0;
      if (t_.tokens_type == 2) {
        // Pairs (expert, count) for the experts with tokens, in expert order; zeros after the last one.
        while (b < t_.width && CountOf(b) == 0) ++b;
        if (b < t_.width) {
          stage.SetValue(staged++, int64_t(t_.first_expert) + b);
          if (staged == chunk) { FlushStage(tokensGm_, stage, written, staged); written += staged; staged = 0; }
          value = CountOf(b++);
        }
      } else {
        const int64_t count = CountOf(written + staged);
        run += count;
        value = t_.tokens_type == 0 ? run : count;
      }
      stage.SetValue(staged++, value);
      if (staged == chunk) { FlushStage(tokensGm_, stage, written, staged); written += staged; staged = 0; }
    }
    if (staged > 0) FlushStage(tokensGm_, stage, written, staged);
  }

  Tiling t_;
  uint32_t core_ = 0, pairStart_ = 0, pairEnd_ = 0, rowStart_ = 0, rowEnd_ = 0, kept_ = 0, rowBytes_ = 0;
  uint32_t buf_ = 0;
  bool busy_[2] = {false, false};
  GlobalTensor<T> xGm_, outGm_;
  GlobalTensor<int32_t> expertGm_, rowIdxGm_, histGm_;
  GlobalTensor<float> scaleGm_, expandedScaleGm_;
  GlobalTensor<int64_t> tokensGm_;
  TBuf<TPosition::VECCALC> hist_, total_, next_, base_, rows_, zeros_, stage_, slots_;
};

template <typename T>
__aicore__ inline void Run(GM_ADDR x, GM_ADDR expertIdx, GM_ADDR scale, GM_ADDR expandedX, GM_ADDR rowIdx,
                           GM_ADDR tokens, GM_ADDR expandedScale, GM_ADDR workspace, const Tiling& tiling) {
  TPipe pipe;
  KernelMoeInitRouting<T> op;
  op.Init(x, expertIdx, scale, expandedX, rowIdx, tokens, expandedScale, workspace, tiling, &pipe);
  op.Process();
}

}  // namespace moe_init_routing_kernel

// x [N, H] (any dtype, moved as bytes), expert_idx [N*k] int32, scale [N] fp32 or null -> expanded_x [rows_out, H],
// expanded_row_idx [N*k] int32, expert_tokens int64 (or null), expanded_scale [rows_out] fp32 (or null).
extern "C" __global__ __aicore__ void moe_init_routing_v2_kernel(GM_ADDR x, GM_ADDR expertIdx, GM_ADDR scale,
                                                                 GM_ADDR expandedX, GM_ADDR expandedRowIdx,
                                                                 GM_ADDR expertTokens, GM_ADDR expandedScale,
                                                                 GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  const moe_init_routing_kernel::Tiling t = *reinterpret_cast<__gm__ moe_init_routing_kernel::Tiling*>(tiling);
  if (t.elem_bytes == 1)
    moe_init_routing_kernel::Run<int8_t>(x, expertIdx, scale, expandedX, expandedRowIdx, expertTokens, expandedScale,
                                         workspace, t);
  else if (t.elem_bytes == 2)
    moe_init_routing_kernel::Run<int16_t>(x, expertIdx, scale, expandedX, expandedRowIdx, expertTokens, expandedScale,
                                          workspace, t);
  else if (t.elem_bytes == 8)
    moe_init_routing_kernel::Run<int64_t>(x, expertIdx, scale, expandedX, expandedRowIdx, expertTokens, expandedScale,
                                          workspace, t);
  else
    moe_init_routing_kernel::Run<int32_t>(x, expertIdx, scale, expandedX, expandedRowIdx, expertTokens, expandedScale,
                                          workspace, t);
}
