// The lightning indexer (CANN LightningIndexer, DeepSeek-V3.2's indexer forward) as a vector-only Ascend C kernel
// (AIV_MODE).
//
// Each item (query row t, key head n2) scores the keys its row may see — the first `limit` tokens of its sequence,
// the KV length or the right-down causal limit of sparse_mode 3, resolved by the host into row_info — in ascending
// position, `tile_rows` keys per UB tile: one DataCopyPad per run of consecutive cache rows (a whole tile for BSND /
// TND keys, the part within one cache block for a paged cache). For each of the G query heads of n2 the tile's dot
// products are a GEMV as in the sparse attention kernel (Mul with the query row broadcast over the tile's rows, a
// fold of the 64-lane chunks, one WholeReduceSum per row); Relu and an Axpy by the head's weight add the head's
// share to the tile's fp32 scores.
//
// Few items (decode): each item's keys are split into ranges over the idle cores (tiling: splits). A range no longer
// than K writes its scores straight to the GM workspace (every key is a candidate; its position is implied by the
// slot); a longer one writes its top-k (the heap array). After a SyncAll the item's core merges the ranges'
// candidates through the same heap and writes the row.
//
// Top-k: a running selection of K (score, position) pairs in UB, kept as a binary heap whose root is the worst
// pair (lower score, or the same score at a higher position). The tile's positions all follow the heap's, so a key
// enters a full heap only with a strictly larger score than the root: equal scores keep the lower position, as the
// CPU op ranks them. A tile whose ReduceMax does not beat the root is skipped without scalar work. At the end the
// heap is sorted in place (best first) and written out; slots past the visible keys get -1 (value -inf). NaN scores
// rank as -inf, as on CPU. The heap is scalar work (GetValue / SetValue): the runtime's subset has no Sort.
//
// Arguments: query [T1, N1, d], key [kv_rows, N2, d] (paged: kv_rows = blocks * block_size), weights fp32 [T1, N1],
// block_table int32 [B, max_blocks] (paged), row_info int32 [T1, 4] = (sequence or -1, visible keys, first key row
// of the sequence (unpaged), 0), sparse_indices int32 [T1, N2, K], sparse_values [T1, N2, K] in the input dtype
// (return_value), workspace (split ranges only): fp32 scores [units, k_pad] then int32 positions [units, k_pad].
// Absent tensors may be any GM buffer (never read).
#include "kernel_operator.h"

#include "common/vector_helpers.h"

#include "sparse_attention/lightning_indexer_tiling.h"
#include "sparse_attention/lightning_indexer_kernel.h"

using namespace AscendC;
using tot_ascendc::PipeSync;

namespace {

constexpr uint32_t kLanes = 64;   // fp32 elements per vector repeat
constexpr uint32_t kRowInfo = 4;  // int32 entries per query row in row_info

template <typename T>
class LightningIndexer {
 public:
  __aicore__ inline void Init(GM_ADDR query, GM_ADDR key, GM_ADDR weights, GM_ADDR block_table, GM_ADDR row_info,
                              GM_ADDR sparse_indices, GM_ADDR sparse_values, GM_ADDR workspace,
                              const tot_ascendc::LightningIndexerTiling& t) {
    t_ = t;
    const uint64_t qRows = uint64_t(t.rows) * t.q_heads, outLen = uint64_t(t.rows) * t.kv_heads * t.sparse_count;
    qGm_.SetGlobalBuffer((__gm__ T*)query, qRows * t.d);
    kGm_.SetGlobalBuffer((__gm__ T*)key, t.kv_rows * t.kv_heads * t.d);
    wGm_.SetGlobalBuffer((__gm__ float*)weights, qRows);
    if (t.paged) tableGm_.SetGlobalBuffer((__gm__ int32_t*)block_table, uint64_t(t.batch) * t.max_blocks);
    rowGm_.SetGlobalBuffer((__gm__ int32_t*)row_info, uint64_t(t.rows) * kRowInfo);
    idxGm_.SetGlobalBuffer((__gm__ int32_t*)sparse_indices, outLen);
    if (t.return_value) valGm_.SetGlobalBuffer((__gm__ T*)sparse_values, outLen);
    if (t.splits > 1) {
      const uint64_t lists = uint64_t(t.units) * t.k_pad;
      wsScore_.SetGlobalBuffer((__gm__ float*)GetUserWorkspace(workspace), lists);
      wsPos_.SetGlobalBuffer((__gm__ int32_t*)(GetUserWorkspace(workspace) + lists * sizeof(float)), lists);
    }
    InitBuffers();
  }

  __aicore__ inline void Process() {
    const uint32_t core = uint32_t(GetBlockIdx());
    if (t_.splits == 1) {
      const uint32_t end = tot_ascendc::IndexerItemBegin(t_, core + 1);
      for (uint32_t item = tot_ascendc::IndexerItemBegin(t_, core); item < end; ++item) {
        const uint32_t t = item / t_.kv_heads, n2 = item % t_.kv_heads;
        SelectKeys(t, n2, 0, 0xffffffffu);
        WriteSelection(t, n2);
      }
      return;
    }
    const uint32_t unitEnd = tot_ascendc::IndexerUnitBegin(t_, core + 1);
    for (uint32_t unit = tot_ascendc::IndexerUnitBegin(t_, core); unit < unitEnd; ++unit) {
      const uint32_t item = unit / t_.splits, range = unit % t_.splits;
      unit_ = unit;
      SelectKeys(item / t_.kv_heads, item % t_.kv_heads, range * t_.split_keys, t_.split_keys);
      if (!Direct()) WritePartial(unit);
    }
    PipeBarrier<PIPE_ALL>();
    SyncAll();  // every range's partial list is in the workspace
    const uint32_t end = tot_ascendc::IndexerItemBegin(t_, core + 1);
    for (uint32_t item = tot_ascendc::IndexerItemBegin(t_, core); item < end; ++item) {
      Merge(item);
      WriteSelection(item / t_.kv_heads, item % t_.kv_heads);
    }
  }

 private:
  __aicore__ inline void InitBuffers() {
    const uint32_t tile = t_.tile_rows, d = t_.d_pad, g = t_.group, k = t_.k_pad;
    pipe_.InitBuffer(kQue_, 1, tile * d * sizeof(T));
    pipe_.InitBuffer(kF_, tile * d * sizeof(float));
    pipe_.InitBuffer(prod_, tile * d * sizeof(float));
    pipe_.InitBuffer(qQue_, 1, (g * d * sizeof(T) + 31) / 32 * 32);
    pipe_.InitBuffer(qF_, g * d * sizeof(float));
    pipe_.InitBuffer(dots_, (tile * sizeof(float) + 31) / 32 * 32);
    pipe_.InitBuffer(scores_, (tile * sizeof(float) + 31) / 32 * 32);
    pipe_.InitBuffer(redTmp_, (tile * sizeof(float) + 31) / 32 * 32);
    pipe_.InitBuffer(red_, 32);
    pipe_.InitBuffer(heapScore_, k * sizeof(float));
    pipe_.InitBuffer(heapPos_, k * sizeof(int32_t));
    if (t_.return_value && sizeof(T) != sizeof(float)) pipe_.InitBuffer(valOut_, (k * sizeof(T) + 31) / 32 * 32);
  }

  // ---- one (query row, key head) item, or one range of its keys ----

  // The running top-k of row t, key head n2 over the keys [begin, begin + count) it sees, in ascending position.
  __aicore__ inline void SelectKeys(uint32_t t, uint32_t n2, uint32_t begin, uint32_t count) {
    const int32_t b = rowGm_.GetValue(uint64_t(t) * kRowInfo);
    const int32_t limit = rowGm_.GetValue(uint64_t(t) * kRowInfo + 1);
    const int32_t base = rowGm_.GetValue(uint64_t(t) * kRowInfo + 2);
    size_ = 0;
    if (b < 0 || limit <= int32_t(begin)) return;
    const uint32_t end = uint32_t(limit) - begin < count ? uint32_t(limit) : begin + count;
    LoadQuery(t, n2);
    for (uint32_t j0 = begin; j0 < end; j0 += t_.tile_rows) {
      const uint32_t n = end - j0 < t_.tile_rows ? end - j0 : t_.tile_rows;
      GatherTile(uint32_t(b), uint32_t(base), n2, j0, n);
      ScoreTile(t, n2, n);
      if (Direct()) WriteScores(j0 - begin, n);
      else SelectFromTile(j0, n);
    }
  }

  // A split range no longer than K: all its keys are candidates of the merge, no selection here.
  __aicore__ inline bool Direct() { return t_.splits > 1 && t_.split_keys <= t_.sparse_count; }

  // The tile's scores to the unit's workspace row at slot `at` (the range's key at + j).
  __aicore__ inline void WriteScores(uint32_t at, uint32_t n) {
    PipeSync<HardEvent::V_MTE3>();
    DataCopyPad(wsScore_[uint64_t(unit_) * t_.k_pad + at], scores_.Get<float>(),
                DataCopyExtParams(1, n * sizeof(float), 0, 0, 0));
    PipeSync<HardEvent::MTE3_V>();  // the next tile's scores overwrite the buffer
  }

  // The group's query rows [G, d_pad] in fp32 (zero-padded columns contribute nothing to the dot products).
  __aicore__ inline void LoadQuery(uint32_t t, uint32_t n2) {
    const uint64_t row0 = uint64_t(t) * t_.q_heads + uint64_t(n2) * t_.group;
    LocalTensor<T> q = qQue_.template AllocTensor<T>();
    CopyRows(q, 0, qGm_[row0 * t_.d], t_.group, t_.d);
    qQue_.EnQue(q);
    q = qQue_.template DeQue<T>();
    ToFloat(qF_.Get<float>(), q, t_.group * t_.d_pad);
    qQue_.FreeTensor(q);
  }

  // `count` GM rows of d elements (GM row pitch `pitch`) into UB at row `at`, each zero-padded to d_pad.
  __aicore__ inline void CopyRows(const LocalTensor<T>& dst, uint32_t at, const GlobalTensor<T>& src, uint32_t count,
                                  uint64_t pitch) {
    const DataCopyExtParams params(uint16_t(count), uint32_t(t_.d * sizeof(T)), uint32_t((pitch - t_.d) * sizeof(T)),
                                   0, 0);
    const DataCopyPadExtParams<T> pad(true, 0, uint8_t(t_.d_pad - t_.d), T(0.f));
    DataCopyPad(dst[at * t_.d_pad], src, params, pad);
  }

  // Keys [j0, j0 + n) of sequence b, head n2, into the key tile in fp32: one copy per run of consecutive cache rows.
  __aicore__ inline void GatherTile(uint32_t b, uint32_t base, uint32_t n2, uint32_t j0, uint32_t n) {
    LocalTensor<T> kIn = kQue_.template AllocTensor<T>();
    const uint64_t pitch = uint64_t(t_.kv_heads) * t_.d;
    for (uint32_t j = 0; j < n;) {
      uint32_t run = n - j;
      uint64_t row = uint64_t(base) + j0 + j;
      if (t_.paged) {
        const uint32_t s = j0 + j, off = s % t_.block_size;
        const int32_t blk = tableGm_.GetValue(uint64_t(b) * t_.max_blocks + s / t_.block_size);
        row = uint64_t(blk) * t_.block_size + off;
        if (t_.block_size - off < run) run = t_.block_size - off;
      }
      CopyRows(kIn, j, kGm_[(row * t_.kv_heads + n2) * t_.d], run, pitch);
      j += run;
    }
    kQue_.EnQue(kIn);
    kIn = kQue_.template DeQue<T>();
    ToFloat(kF_.Get<float>(), kIn, n * t_.d_pad);
    kQue_.FreeTensor(kIn);
  }

  // scores[j] = sum_h w_h * ReLU(q_h . k_j) over the group's heads, in fp32.
  __aicore__ inline void ScoreTile(uint32_t t, uint32_t n2, uint32_t rows) {
    LocalTensor<float> sc = scores_.Get<float>(), dots = dots_.Get<float>();
    Duplicate(sc, 0.f, int32_t(rows));
    const uint64_t w0 = uint64_t(t) * t_.q_heads + uint64_t(n2) * t_.group;
    for (uint32_t h = 0; h < t_.group; ++h) {
      const float w = wGm_.GetValue(w0 + h);
      Dots(dots, h, rows);
      Relu(dots, dots, int32_t(rows));
      Axpy(sc, dots, w, int32_t(rows));
    }
  }

  // dots[j] = q_h . k_j (the vector-unit GEMV of common/vector_helpers.h).
  __aicore__ inline void Dots(const LocalTensor<float>& dots, uint32_t h, uint32_t rows) {
    const uint32_t d = t_.d_pad;
    tot_ascendc::RowDots(dots, kF_.Get<float>(), qF_.Get<float>()[h * d], prod_.Get<float>(), d, rows);
  }

  // ---- the running top-k (a heap with the worst pair at the root) ----

  // Merges the tile's scores (positions j0 ...) into the selection.
  __aicore__ inline void SelectFromTile(uint32_t j0, uint32_t rows) {
    LocalTensor<float> sc = scores_.Get<float>();
    if (size_ == t_.sparse_count) {  // a full heap: skip the tile unless its best beats the root
      LocalTensor<float> red = red_.Get<float>();
      ReduceMax(red, sc, redTmp_.Get<float>(), int32_t(rows));
      PipeSync<HardEvent::V_S>();
      const float best = red.GetValue(0);  // NaN: look at the keys one by one (NaN ranks as -inf)
      if (best == best && !(best > heapScore_.Get<float>().GetValue(0))) return;
    } else {
      PipeSync<HardEvent::V_S>();
    }
    for (uint32_t j = 0; j < rows; ++j) Offer(Rank(sc.GetValue(j)), int32_t(j0 + j));
  }

  // NaN ranks as -inf (as on CPU).
  __aicore__ inline float Rank(float x) { return x != x ? t_.neg_inf : x; }

  // A pair enters while the heap is not full, else only when it ranks above the root. For the keys of a tile (later
  // than every pair in the heap) that is a strictly larger score: an equal score at a later position ranks lower.
  __aicore__ inline void Offer(float score, int32_t pos) {
    LocalTensor<float> hs = heapScore_.Get<float>();
    LocalTensor<int32_t> hp = heapPos_.Get<int32_t>();
    if (size_ < t_.sparse_count) {
      uint32_t i = size_++;
      while (i > 0) {  // sift up while the new pair ranks below its parent
        const uint32_t parent = (i - 1) / 2;
        if (!Worse(score, pos, hs.GetValue(parent), hp.GetValue(parent))) break;
        hs.SetValue(i, hs.GetValue(parent));
        hp.SetValue(i, hp.GetValue(parent));
        i = parent;
      }
      hs.SetValue(i, score);
      hp.SetValue(i, pos);
      return;
    }
    if (!Worse(hs.GetValue(0), hp.GetValue(0), score, pos)) return;
    SiftDown(score, pos, size_);
  }

  // a ranks below b: lower score, or the same score at a higher position.
  __aicore__ inline bool Worse(float sa, int32_t pa, float sb, int32_t pb) {
    return sa < sb || (sa == sb && pa > pb);
  }

  // Places (score, pos) at the root of the heap [0, n) and sifts it down to its place.
  __aicore__ inline void SiftDown(float score, int32_t pos, uint32_t n) {
    LocalTensor<float> hs = heapScore_.Get<float>();
    LocalTensor<int32_t> hp = heapPos_.Get<int32_t>();
    uint32_t i = 0;
    for (;;) {
      uint32_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && Worse(hs.GetValue(c + 1), hp.GetValue(c + 1), hs.GetValue(c), hp.GetValue(c))) ++c;
      if (!Worse(hs.GetValue(c), hp.GetValue(c), score, pos)) break;
      hs.SetValue(i, hs.GetValue(c));
      hp.SetValue(i, hp.GetValue(c));
      i = c;
    }
    hs.SetValue(i, score);
    hp.SetValue(i, pos);
  }

  // A range's selection to its rows of the workspace: the heap array as it is (the merge knows its length).
  __aicore__ inline void WritePartial(uint32_t unit) {
    LocalTensor<float> hs = heapScore_.Get<float>();
    LocalTensor<int32_t> hp = heapPos_.Get<int32_t>();
    const uint64_t at = uint64_t(unit) * t_.k_pad;
    PipeSync<HardEvent::S_MTE3>();
    DataCopyPad(wsScore_[at], hs, DataCopyExtParams(1, t_.sparse_count * sizeof(float), 0, 0, 0));
    DataCopyPad(wsPos_[at], hp, DataCopyExtParams(1, t_.sparse_count * sizeof(int32_t), 0, 0, 0));
    PipeSync<HardEvent::MTE3_S>();  // the heap is rewritten by the next unit's scalar writes
  }

  // The item's candidates, range by range, a tile at a time through the score and dot buffers, offered to an empty
  // heap: a direct range's scores (the position is the range's start + slot), else a range's top-k pairs. A range
  // holds as many as the row sees of its keys (at most K of them when it selected).
  __aicore__ inline void Merge(uint32_t item) {
    const uint32_t t = item / t_.kv_heads;
    const int32_t b = rowGm_.GetValue(uint64_t(t) * kRowInfo);
    const int32_t limit = b < 0 ? 0 : rowGm_.GetValue(uint64_t(t) * kRowInfo + 1);
    LocalTensor<float> sc = scores_.Get<float>();
    LocalTensor<int32_t> pos = dots_.Get<int32_t>();
    const DataCopyPadExtParams<float> noPadF(false, 0, 0, 0.f);
    const DataCopyPadExtParams<int32_t> noPadI(false, 0, 0, 0);
    const bool direct = Direct();
    size_ = 0;
    for (uint32_t r = 0; r < t_.splits; ++r) {
      const int32_t begin = int32_t(r * t_.split_keys);
      if (limit <= begin) break;
      uint32_t count = uint32_t(limit - begin) < t_.split_keys ? uint32_t(limit - begin) : t_.split_keys;
      if (!direct && count > t_.sparse_count) count = t_.sparse_count;
      const uint64_t at = (uint64_t(item) * t_.splits + r) * t_.k_pad;
      for (uint32_t j0 = 0; j0 < count; j0 += t_.tile_rows) {
        const uint32_t n = count - j0 < t_.tile_rows ? count - j0 : t_.tile_rows;
        PipeSync<HardEvent::S_MTE2>();  // the scalar reads of the previous pairs are done
        DataCopyPad(sc, wsScore_[at + j0], DataCopyExtParams(1, n * sizeof(float), 0, 0, 0), noPadF);
        if (!direct) DataCopyPad(pos, wsPos_[at + j0], DataCopyExtParams(1, n * sizeof(int32_t), 0, 0, 0), noPadI);
        PipeSync<HardEvent::MTE2_S>();
        for (uint32_t j = 0; j < n; ++j)
          Offer(Rank(sc.GetValue(j)), direct ? begin + int32_t(j0 + j) : pos.GetValue(j));
      }
    }
  }

  // Sorts the heap best first (repeatedly moving the worst pair to the end), pads the slots past it with -1 / -inf
  // and writes the row of sparse_indices (and sparse_values).
  __aicore__ inline void WriteSelection(uint32_t t, uint32_t n2) {
    LocalTensor<float> hs = heapScore_.Get<float>();
    LocalTensor<int32_t> hp = heapPos_.Get<int32_t>();
    for (uint32_t n = size_; n > 1; --n) {
      const float ws = hs.GetValue(0);
      const int32_t wp = hp.GetValue(0);
      SiftDown(hs.GetValue(n - 1), hp.GetValue(n - 1), n - 1);
      hs.SetValue(n - 1, ws);
      hp.SetValue(n - 1, wp);
    }
    for (uint32_t j = size_; j < t_.sparse_count; ++j) {
      hs.SetValue(j, t_.neg_inf);
      hp.SetValue(j, -1);
    }
    const uint64_t at = (uint64_t(t) * t_.kv_heads + n2) * t_.sparse_count;
    const DataCopyExtParams one(1, t_.sparse_count * sizeof(int32_t), 0, 0, 0);
    PipeSync<HardEvent::S_MTE3>();
    DataCopyPad(idxGm_[at], hp, one);
    if (t_.return_value) {
      const DataCopyExtParams vals(1, t_.sparse_count * sizeof(T), 0, 0, 0);
      if constexpr (sizeof(T) == sizeof(float)) {
        DataCopyPad(valGm_[at], hs.template ReinterpretCast<T>(), vals);
      } else {
        LocalTensor<T> v = valOut_.Get<T>();
        PipeSync<HardEvent::S_V>();
        Cast(v, hs, RoundMode::CAST_RINT, t_.sparse_count);
        PipeSync<HardEvent::V_MTE3>();
        DataCopyPad(valGm_[at], v, vals);
      }
    }
    PipeSync<HardEvent::MTE3_S>();  // the heap is rewritten by the next item's scalar writes
  }

  // ---- dtype conversions (fp32 inputs are copied: Cast has no fp32 -> fp32 form) ----

  __aicore__ inline void ToFloat(const LocalTensor<float>& dst, const LocalTensor<T>& src, uint32_t count) {
    if constexpr (sizeof(T) == sizeof(float)) DataCopy(dst, src.template ReinterpretCast<float>(), count);
    else Cast(dst, src, RoundMode::CAST_NONE, count);
  }

  tot_ascendc::LightningIndexerTiling t_;
  uint32_t size_ = 0;  // pairs in the running selection
  uint32_t unit_ = 0;  // the split range being scored (phase 1)
  TPipe pipe_;
  TQue<TPosition::VECIN, 1> kQue_, qQue_;
  TBuf<TPosition::VECCALC> kF_, prod_, qF_, dots_, scores_, redTmp_, red_, heapScore_, heapPos_, valOut_;
  GlobalTensor<T> qGm_, kGm_, valGm_;
  GlobalTensor<float> wGm_, wsScore_;
  GlobalTensor<int32_t> tableGm_, rowGm_, idxGm_, wsPos_;
};

template <typename T>
__aicore__ inline void RunIndexer(GM_ADDR query, GM_ADDR key, GM_ADDR weights, GM_ADDR block_table, GM_ADDR row_info,
                                  GM_ADDR sparse_indices, GM_ADDR sparse_values, GM_ADDR workspace,
                                  const tot_ascendc::LightningIndexerTiling& t) {
  LightningIndexer<T> op;
  op.Init(query, key, weights, block_table, row_info, sparse_indices, sparse_values, workspace, t);
  op.Process();
}

}  // namespace

extern "C" __global__ __aicore__ void lightning_indexer(GM_ADDR query, GM_ADDR key, GM_ADDR weights,
                                                        GM_ADDR block_table, GM_ADDR row_info, GM_ADDR sparse_indices,
                                                        GM_ADDR sparse_values, GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  const tot_ascendc::LightningIndexerTiling t = *reinterpret_cast<__gm__ tot_ascendc::LightningIndexerTiling*>(tiling);
  if (t.dtype == uint32_t(tot_ascendc::SparseDtype::FP16))
    RunIndexer<half>(query, key, weights, block_table, row_info, sparse_indices, sparse_values, workspace, t);
  else if (t.dtype == uint32_t(tot_ascendc::SparseDtype::BF16))
    RunIndexer<bfloat16_t>(query, key, weights, block_table, row_info, sparse_indices, sparse_values, workspace, t);
  else
    RunIndexer<float>(query, key, weights, block_table, row_info, sparse_indices, sparse_values, workspace, t);
}
