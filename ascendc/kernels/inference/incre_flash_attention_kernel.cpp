// Decode attention (IncreFlashAttention) as a vector-only Ascend C kernel (AIV_MODE).
//
// One query token per sequence: q·Kᵀ is a GEMV, so it runs on the vector unit (Mul with the query row broadcast
// over the tile's rows, then a row-wise reduction) instead of the cube. Each task (b, n2, KV split) reads every
// K/V tile once for the whole GQA group of query heads sharing KV head n2. Softmax is online in fp32 with
// per-head statistics in the [rows, 8] layout (one DataBlock per query head). Paged caches are addressed through
// block_table (block ids read with GlobalTensor::GetValue); tiles never cross a cache block.
//
// With tiling.splits > 1 (few (b, n2) pairs) each task writes its partial (m, l, unnormalised acc) to the
// workspace, all cores meet at SyncAll, and the second phase merges each query-head row:
//   M = max_s m_s, w_s = exp(m_s - M), out = (sum_s w_s acc_s) / (sum_s w_s l_s)
// (the log-sum-exp merge of partial softmax results; a row with no visible key is all zeros).
//
// Arguments: query/out [B, N1, D] (any of the op's query layouts: Sq = 1), key/value cache (strides in tiling),
// block_table int32 [B, max_blocks] (paged) or any GM buffer, seq_info int32 [B, 2] = (first cache position,
// length) per sequence.
#include "kernel_operator.h"

#include "common/vector_helpers.h"

#include "inference/incre_flash_attention_tiling.h"
#include "inference/incre_flash_attention_kernel.h"

using namespace AscendC;
using tot_ascendc::PipeSync;

namespace {

constexpr float kNoMax = -3.0e38f;  // finite "minus infinity": exp(kNoMax - m) is 0 without inf - inf = NaN
constexpr uint32_t kStat = 8;       // floats per statistics row (one DataBlock)
constexpr uint32_t kLanes = 64;     // fp32 elements per vector repeat

template <typename T>
class DecodeAttention {
 public:
  __aicore__ inline void Init(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR block_table, GM_ADDR seq_info,
                              GM_ADDR out, GM_ADDR workspace, const tot_ascendc::IncreFlashAttentionTiling& t) {
    t_ = t;
    dp_ = t.head_dim_pad;
    qGm_.SetGlobalBuffer((__gm__ T*)query, t.q_elems);
    outGm_.SetGlobalBuffer((__gm__ T*)out, t.q_elems);
    kGm_.SetGlobalBuffer((__gm__ T*)key, t.kv_elems);
    vGm_.SetGlobalBuffer((__gm__ T*)value, t.kv_elems);
    if (t.paged) tableGm_.SetGlobalBuffer((__gm__ int32_t*)block_table, uint64_t(t.batch) * t.max_blocks);
    seqGm_.SetGlobalBuffer((__gm__ int32_t*)seq_info, uint64_t(t.batch) * 2);
    if (t.splits > 1) {
      const uint64_t partials = uint64_t(t.rows) * t.splits;
      wsAcc_.SetGlobalBuffer((__gm__ float*)(workspace + t.ws_acc_offset), partials * dp_);
      wsStat_.SetGlobalBuffer((__gm__ float*)(workspace + t.ws_stat_offset), partials * 2 * kStat);
    }
    InitBuffers();
  }

  __aicore__ inline void Process() {
    const uint32_t core = uint32_t(GetBlockIdx());
    const uint32_t end = tot_ascendc::TaskBegin(t_, core + 1);
    for (uint32_t task = tot_ascendc::TaskBegin(t_, core); task < end; ++task) RunTask(task);
    if (t_.splits == 1) return;
    PipeSync<HardEvent::MTE3_S>();
    SyncAll();  // every partial is in the workspace
    const uint32_t row_end = tot_ascendc::RowBegin(t_, core + 1);
    for (uint32_t row = tot_ascendc::RowBegin(t_, core); row < row_end; ++row) MergeRow(row);
  }

 private:
  __aicore__ inline void InitBuffers() {
    const uint32_t tile = t_.tile_rows, g = t_.group_chunk;
    const uint32_t tileIn = tile * dp_ * sizeof(T), tileF = tile * dp_ * sizeof(float);
    const uint32_t groupIn = (g * dp_ * sizeof(T) + 31) / 32 * 32;
    pipe_.InitBuffer(kQue_, 2, tileIn);
    pipe_.InitBuffer(vQue_, 2, tileIn);
    pipe_.InitBuffer(kF_, tileF);
    pipe_.InitBuffer(vF_, tileF);
    pipe_.InitBuffer(prod_, tileF);
    pipe_.InitBuffer(scores_, g * tile * sizeof(float));
    pipe_.InitBuffer(pBlocks_, tile * 32);
    pipe_.InitBuffer(qQue_, 1, groupIn);
    pipe_.InitBuffer(qF_, g * dp_ * sizeof(float));
    pipe_.InitBuffer(acc_, g * dp_ * sizeof(float));
    pipe_.InitBuffer(outQue_, 1, groupIn);
    pipe_.InitBuffer(m_, g * kStat * sizeof(float));
    pipe_.InitBuffer(l_, g * kStat * sizeof(float));
    pipe_.InitBuffer(mNew_, g * kStat * sizeof(float));
    pipe_.InitBuffer(alpha_, g * kStat * sizeof(float));
    pipe_.InitBuffer(redTmp_, (tile * sizeof(float) + 31) / 32 * 32);
    pipe_.InitBuffer(red_, 32);
    if (t_.splits > 1) {
      pipe_.InitBuffer(mAcc_, t_.splits * dp_ * sizeof(float));
      pipe_.InitBuffer(mStat_, t_.splits * 2 * kStat * sizeof(float));
      pipe_.InitBuffer(mW_, t_.splits * kStat * sizeof(float));
      pipe_.InitBuffer(mRow_, dp_ * sizeof(float));
      pipe_.InitBuffer(mOutQue_, 1, (dp_ * sizeof(T) + 31) / 32 * 32);
    }
  }

  // ---- phase 1: one (b, n2, split) task ----

  __aicore__ inline void RunTask(uint32_t task) {
    const uint32_t split = task % t_.splits;
    const uint32_t bn = task / t_.splits;
    const uint32_t n2 = bn % t_.kv_heads, b = bn / t_.kv_heads;
    const uint32_t first = uint32_t(seqGm_.GetValue(2 * b));
    const uint32_t len = uint32_t(seqGm_.GetValue(2 * b + 1));
    const uint32_t lo = split * t_.split_len;
    const uint32_t hi = lo + t_.split_len < len ? lo + t_.split_len : len;
    for (g0_ = 0; g0_ < t_.group; g0_ += t_.group_chunk) {
      gn_ = t_.group - g0_ < t_.group_chunk ? t_.group - g0_ : t_.group_chunk;
      LoadQuery(b, n2);
      RunHeads(b, n2, first, lo, hi);
      if (t_.splits == 1) WriteOutput(b, n2);
      else WritePartial(b, n2, split);
    }
  }

  // Heads [g0_, g0_ + gn_) of the group over KV positions [lo, hi) of sequence b.
  __aicore__ inline void RunHeads(uint32_t b, uint32_t n2, uint32_t first, uint32_t lo, uint32_t hi) {
    LocalTensor<float> m = m_.Get<float>(), l = l_.Get<float>(), acc = acc_.Get<float>();
    Duplicate(m, kNoMax, int32_t(gn_ * kStat));
    Duplicate(l, 0.f, int32_t(gn_ * kStat));
    Duplicate(acc, 0.f, int32_t(gn_ * dp_));
    for (uint32_t pos = lo; pos < hi;) {
      uint32_t rows = hi - pos < t_.tile_rows ? hi - pos : t_.tile_rows;
      uint64_t offset;
      if (t_.paged) {
        const uint32_t inBlock = pos % t_.block_size;
        if (t_.block_size - inBlock < rows) rows = t_.block_size - inBlock;
        const int32_t blk = tableGm_.GetValue(uint64_t(b) * t_.max_blocks + pos / t_.block_size);
        offset = uint64_t(blk) * t_.k_blk + uint64_t(n2) * t_.k_head + uint64_t(inBlock) * t_.k_seq;
      } else {
        offset = uint64_t(b) * t_.k_blk + uint64_t(n2) * t_.k_head + uint64_t(first + pos) * t_.k_seq;
      }
      CopyInTile(offset, rows);
      ComputeTile(rows);
      pos += rows;
    }
  }

  // Rows of `rows` cache positions (stride k_seq) into [rows, dp_] UB tiles, zero-padded to dp_.
  __aicore__ inline void CopyInTile(uint64_t offset, uint32_t rows) {
    const DataCopyExtParams params(uint16_t(rows), t_.head_dim * sizeof(T),
                                   uint32_t((t_.k_seq - t_.head_dim) * sizeof(T)), 0, 0);
    const DataCopyPadExtParams<T> pad(true, 0, uint8_t(dp_ - t_.head_dim), T(0.f));
    LocalTensor<T> k = kQue_.template AllocTensor<T>();
    LocalTensor<T> v = vQue_.template AllocTensor<T>();
    DataCopyPad(k, kGm_[offset], params, pad);
    DataCopyPad(v, vGm_[offset], params, pad);
    kQue_.EnQue(k);
    vQue_.EnQue(v);
  }

  __aicore__ inline void LoadQuery(uint32_t b, uint32_t n2) {
    const uint64_t row0 = (uint64_t(b) * t_.q_heads + uint64_t(n2) * t_.group + g0_) * t_.head_dim;
    const DataCopyExtParams params(uint16_t(gn_), t_.head_dim * sizeof(T), 0, 0, 0);
    const DataCopyPadExtParams<T> pad(true, 0, uint8_t(dp_ - t_.head_dim), T(0.f));
    LocalTensor<T> q = qQue_.template AllocTensor<T>();
    DataCopyPad(q, qGm_[row0], params, pad);
    qQue_.EnQue(q);
    q = qQue_.template DeQue<T>();
    ToFloat(qF_.Get<float>(), q, gn_ * dp_);
    qQue_.FreeTensor(q);
  }

  __aicore__ inline void ComputeTile(uint32_t rows) {
    LocalTensor<T> kIn = kQue_.template DeQue<T>();
    LocalTensor<T> vIn = vQue_.template DeQue<T>();
    LocalTensor<float> k = kF_.Get<float>(), v = vF_.Get<float>();
    ToFloat(k, kIn, rows * dp_);
    ToFloat(v, vIn, rows * dp_);
    kQue_.FreeTensor(kIn);
    vQue_.FreeTensor(vIn);
    for (uint32_t g = 0; g < gn_; ++g) {
      LocalTensor<float> s = scores_.Get<float>()[g * t_.tile_rows];
      Scores(s, k, g, rows);
      OnlineSoftmax(s, v, g, rows);
    }
  }

  // s[j] = scale * q_g · k_j (the vector-unit GEMV of common/vector_helpers.h).
  __aicore__ inline void Scores(const LocalTensor<float>& s, const LocalTensor<float>& k, uint32_t g, uint32_t rows) {
    tot_ascendc::RowDots(s, k, qF_.Get<float>()[g * dp_], prod_.Get<float>(), dp_, rows);
    Muls(s, s, t_.scale, int32_t(rows));
  }

  // Flash-attention update of head g with this tile's scores: new max, rescale factor exp(m_old - m_new),
  // probabilities p = exp(s - m_new), l = alpha*l + sum(p), acc = alpha*acc + sum_j p_j v_j.
  __aicore__ inline void OnlineSoftmax(const LocalTensor<float>& s, const LocalTensor<float>& v, uint32_t g,
                                       uint32_t rows) {
    LocalTensor<float> m = m_.Get<float>()[g * kStat], l = l_.Get<float>()[g * kStat];
    LocalTensor<float> mNew = mNew_.Get<float>()[g * kStat], alpha = alpha_.Get<float>()[g * kStat];
    LocalTensor<float> red = red_.Get<float>(), tmp = redTmp_.Get<float>();
    LocalTensor<float> acc = acc_.Get<float>()[g * dp_];
    ReduceMax(red, s, tmp, int32_t(rows));
    PipeSync<HardEvent::V_S>();
    const float tileMax = red.GetValue(0), oldMax = m.GetValue(0);
    const float newMax = tileMax > oldMax ? tileMax : oldMax;
    Duplicate(mNew, newMax, int32_t(kStat));
    Sub(alpha, m, mNew, int32_t(kStat));
    Exp(alpha, alpha, int32_t(kStat));
    Adds(s, s, -newMax, int32_t(rows));
    Exp(s, s, int32_t(rows));
    ReduceSum(red, s, tmp, int32_t(rows));
    PipeSync<HardEvent::V_S>();
    const float a = alpha.GetValue(0);
    Muls(l, l, a, int32_t(kStat));
    Adds(l, l, red.GetValue(0), int32_t(kStat));
    DataCopy(m, mNew, kStat);
    Muls(acc, acc, a, int32_t(dp_));
    WeightedRowSum(acc, v, s, rows);
  }

  // acc += sum_j p_j v_j in a few batched vector instructions, not one Axpy per KV row: Brcb spreads each p_j over
  // one DataBlock, one Mul per 64-lane chunk scales every row of the tile (src1 block stride 0, repeat stride one
  // block), then halving Adds fold the rows onto the first.
  __aicore__ inline void WeightedRowSum(const LocalTensor<float>& acc, const LocalTensor<float>& v,
                                        const LocalTensor<float>& p, uint32_t rows) {
    LocalTensor<float> pb = pBlocks_.Get<float>(), prod = prod_.Get<float>();
    Brcb(pb, p, uint8_t((rows + 7) / 8), BrcbRepeatParams(1, 8));
    const uint8_t rowBlocks = uint8_t(dp_ / 8);
    for (uint32_t c = 0; c < dp_; c += kLanes) {
      const uint64_t lanes = dp_ - c < kLanes ? dp_ - c : kLanes;
      Mul(prod[c], v[c], pb, lanes, uint8_t(rows), BinaryRepeatParams(1, 1, 0, rowBlocks, rowBlocks, 1));
    }
    for (uint32_t n = rows; n > 1;) {
      const uint32_t half = n / 2;
      Add(prod, prod, prod[(n - half) * dp_], int32_t(half * dp_));
      n -= half;
    }
    Add(acc, acc, prod, int32_t(dp_));
  }

  // Single split: out rows of the group = acc / l (zeros when no key was visible).
  __aicore__ inline void WriteOutput(uint32_t b, uint32_t n2) {
    LocalTensor<float> acc = acc_.Get<float>(), l = l_.Get<float>();
    PipeSync<HardEvent::V_S>();
    for (uint32_t g = 0; g < gn_; ++g) {
      const float sum = l.GetValue(g * kStat);
      Muls(acc[g * dp_], acc[g * dp_], sum > 0.f ? 1.f / sum : 0.f, int32_t(dp_));
    }
    LocalTensor<T> o = outQue_.template AllocTensor<T>();
    FromFloat(o, acc, gn_ * dp_);
    outQue_.EnQue(o);
    o = outQue_.template DeQue<T>();
    const uint64_t row0 = (uint64_t(b) * t_.q_heads + uint64_t(n2) * t_.group + g0_) * t_.head_dim;
    DataCopyPad(outGm_[row0], o, DataCopyExtParams(uint16_t(gn_), t_.head_dim * sizeof(T), 0, 0, 0));
    outQue_.FreeTensor(o);
  }

  // Several splits: (m, l) blocks and acc rows of the group to slot `split` of their rows in the workspace.
  __aicore__ inline void WritePartial(uint32_t b, uint32_t n2, uint32_t split) {
    const uint64_t row0 = uint64_t(b) * t_.q_heads + uint64_t(n2) * t_.group + g0_;
    const uint64_t slot = row0 * t_.splits + split;
    const uint16_t rowBlocks = uint16_t(dp_ / 8);
    PipeSync<HardEvent::V_MTE3>();
    DataCopy(wsAcc_[slot * dp_], acc_.Get<float>(),
             DataCopyParams(uint16_t(gn_), rowBlocks, 0, uint16_t((t_.splits - 1) * rowBlocks)));
    const uint16_t statGap = uint16_t(t_.splits * 2 - 1);
    DataCopy(wsStat_[slot * 2 * kStat], m_.Get<float>(), DataCopyParams(uint16_t(gn_), 1, 0, statGap));
    DataCopy(wsStat_[slot * 2 * kStat + kStat], l_.Get<float>(), DataCopyParams(uint16_t(gn_), 1, 0, statGap));
  }

  // ---- phase 2: merge the splits of one query-head row ----

  __aicore__ inline void MergeRow(uint32_t row) {
    const uint32_t n = t_.splits;
    LocalTensor<float> acc = mAcc_.Get<float>(), stat = mStat_.Get<float>(), w = mW_.Get<float>();
    LocalTensor<float> out = mRow_.Get<float>();
    DataCopy(acc, wsAcc_[uint64_t(row) * n * dp_], n * dp_);
    DataCopy(stat, wsStat_[uint64_t(row) * n * 2 * kStat], n * 2 * kStat);
    PipeSync<HardEvent::MTE2_S>();
    PipeSync<HardEvent::MTE2_V>();
    float top = kNoMax;
    for (uint32_t s = 0; s < n; ++s) {
      const float ms = stat.GetValue(s * 2 * kStat);
      top = ms > top ? ms : top;
    }
    for (uint32_t s = 0; s < n; ++s) Adds(w[s * kStat], stat[s * 2 * kStat], -top, int32_t(kStat));
    Exp(w, w, int32_t(n * kStat));
    float sum = 0.f;
    Duplicate(out, 0.f, int32_t(dp_));
    PipeSync<HardEvent::V_S>();
    for (uint32_t s = 0; s < n; ++s) {
      const float ws = w.GetValue(s * kStat);
      sum += ws * stat.GetValue(s * 2 * kStat + kStat);
      Axpy(out, acc[s * dp_], ws, int32_t(dp_));
    }
    Muls(out, out, sum > 0.f ? 1.f / sum : 0.f, int32_t(dp_));
    LocalTensor<T> o = mOutQue_.template AllocTensor<T>();
    FromFloat(o, out, dp_);
    mOutQue_.EnQue(o);
    o = mOutQue_.template DeQue<T>();
    DataCopyPad(outGm_[uint64_t(row) * t_.head_dim], o, DataCopyExtParams(1, t_.head_dim * sizeof(T), 0, 0, 0));
    mOutQue_.FreeTensor(o);
  }

  // ---- dtype conversions (fp32 inputs are copied: Cast has no fp32 -> fp32 form) ----

  __aicore__ inline void ToFloat(const LocalTensor<float>& dst, const LocalTensor<T>& src, uint32_t count) {
    if constexpr (sizeof(T) == sizeof(float)) DataCopy(dst, src.template ReinterpretCast<float>(), count);
    else Cast(dst, src, RoundMode::CAST_NONE, count);
  }
  __aicore__ inline void FromFloat(const LocalTensor<T>& dst, const LocalTensor<float>& src, uint32_t count) {
    if constexpr (sizeof(T) == sizeof(float)) DataCopy(dst.template ReinterpretCast<float>(), src, count);
    else Cast(dst, src, RoundMode::CAST_RINT, count);
  }

  tot_ascendc::IncreFlashAttentionTiling t_;
  uint32_t dp_ = 0;
  uint32_t g0_ = 0, gn_ = 0;  // the chunk of query heads (within the group) being processed
  TPipe pipe_;
  TQue<TPosition::VECIN, 2> kQue_, vQue_;
  TQue<TPosition::VECIN, 1> qQue_;
  TQue<TPosition::VECOUT, 1> outQue_, mOutQue_;
  TBuf<TPosition::VECCALC> kF_, vF_, prod_, pBlocks_, scores_, qF_, acc_, m_, l_, mNew_, alpha_, redTmp_, red_;
  TBuf<TPosition::VECCALC> mAcc_, mStat_, mW_, mRow_;
  GlobalTensor<T> qGm_, outGm_, kGm_, vGm_;
  GlobalTensor<int32_t> tableGm_, seqGm_;
  GlobalTensor<float> wsAcc_, wsStat_;
};

template <typename T>
__aicore__ inline void RunDecode(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR block_table, GM_ADDR seq_info,
                                 GM_ADDR out, GM_ADDR workspace, const tot_ascendc::IncreFlashAttentionTiling& t) {
  DecodeAttention<T> op;
  op.Init(query, key, value, block_table, seq_info, out, workspace, t);
  op.Process();
}

}  // namespace

extern "C" __global__ __aicore__ void incre_flash_attention(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                                            GM_ADDR block_table, GM_ADDR seq_info, GM_ADDR out,
                                                            GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  const tot_ascendc::IncreFlashAttentionTiling t = *reinterpret_cast<__gm__ tot_ascendc::IncreFlashAttentionTiling*>(tiling);
  GM_ADDR user = GetUserWorkspace(workspace);
  if (t.dtype == uint32_t(tot_ascendc::DecodeDtype::FP16)) RunDecode<half>(query, key, value, block_table, seq_info, out, user, t);
  else if (t.dtype == uint32_t(tot_ascendc::DecodeDtype::BF16))
    RunDecode<bfloat16_t>(query, key, value, block_table, seq_info, out, user, t);
  else RunDecode<float>(query, key, value, block_table, seq_info, out, user, t);
}
