// Sparse flash attention (CANN SparseFlashAttention, DeepSeek-V3.2's DSA) as a vector-only Ascend C kernel
// (AIV_MODE).
//
// Each item (query row t, KV head n2) attends to the cache rows its row of sparse_indices selects: entry v >= 0
// selects the tokens [v * sparse_block_size, (v + 1) * sparse_block_size) of the row's sequence, clipped to the
// row's visible limit (the KV length, or the right-down causal limit of sparse_mode 3, computed by the host into
// row_info); -1 selects nothing. The selected rows are gathered slot by slot into a UB tile ([latent | rope] per
// row, each part zero-padded to 32 bytes), one DataCopyPad per run of consecutive tokens (a sparse block never
// crosses a cache block: sparse_block_size divides block_size). Scores are a GEMV per query head (as in the decode
// kernel): Mul with the query row broadcast over the tile's rows, a fold of the 64-lane chunks, one WholeReduceSum
// per row. Softmax is online in fp32 with per-head statistics in the [heads, 8] layout; P·V is batched over the
// tile (Brcb + Mul + halving Adds). With value_is_key (the MLA cache: value is key's memory) the key tile's latent
// columns are the value rows, so nothing is read twice.
//
// Sinks: a head's running max starts at its sink and the final sum gains exp(sink - m), so
// out = sum_j e^{s_j - m} v_j / (sum_j e^{s_j - m} + e^{sink - m}). A row without keys gives zeros, softmax_max
// -inf and softmax_sum 0 (with a sink: max = sink, sum = 1); padding rows (row_info batch -1) give zeros, -inf, 0.
//
// Arguments: query [T1, N1, dn], query_rope [T1, N1, dr], key [kv_rows, N2, dn], key_rope [kv_rows, N2, dr],
// value [kv_rows, N2, dv] (paged caches: kv_rows = blocks * block_size), sparse_indices int32 [T1, N2, K],
// block_table int32 [B, max_blocks] (paged), row_info int32 [T1, 4] = (sequence or -1, visible limit, first cache
// row of the sequence (unpaged), 0), sinks fp32 [N1], out [T1, N1, dv], softmax_max / softmax_sum fp32 in the op's
// layout (BSND [B, N2, S1, G], TND [N2, T1, G]). Absent tensors may be any GM buffer (never read).
#include "kernel_operator.h"

#include "common/vector_helpers.h"

#include "sparse_attention/sparse_flash_attention_tiling.h"
#include "sparse_attention/sparse_flash_attention_kernel.h"

using namespace AscendC;
using tot_ascendc::PipeSync;

namespace {

constexpr float kNoMax = -3.0e38f;  // finite "minus infinity": exp(kNoMax - m) is 0 without inf - inf = NaN
constexpr uint32_t kStat = 8;       // floats per statistics row (one DataBlock)
constexpr uint32_t kLanes = 64;     // fp32 elements per vector repeat
constexpr uint32_t kRowInfo = 4;    // int32 entries per query row in row_info

template <typename T>
class SparseAttention {
 public:
  __aicore__ inline void Init(GM_ADDR query, GM_ADDR query_rope, GM_ADDR key, GM_ADDR key_rope, GM_ADDR value,
                              GM_ADDR sparse_indices, GM_ADDR block_table, GM_ADDR row_info, GM_ADDR sinks,
                              GM_ADDR out, GM_ADDR softmax_max, GM_ADDR softmax_sum,
                              const tot_ascendc::SparseFlashAttentionTiling& t) {
    t_ = t;
    const uint64_t qRows = uint64_t(t.rows) * t.q_heads, kvRows = t.kv_rows * t.kv_heads;
    qGm_.SetGlobalBuffer((__gm__ T*)query, qRows * t.dn);
    kGm_.SetGlobalBuffer((__gm__ T*)key, kvRows * t.dn);
    if (t.dr > 0) {
      qrGm_.SetGlobalBuffer((__gm__ T*)query_rope, qRows * t.dr);
      krGm_.SetGlobalBuffer((__gm__ T*)key_rope, kvRows * t.dr);
    }
    if (!t.value_is_key) vGm_.SetGlobalBuffer((__gm__ T*)value, kvRows * t.dv);
    if (t.slots > 0) idxGm_.SetGlobalBuffer((__gm__ int32_t*)sparse_indices, uint64_t(t.rows) * t.kv_heads * t.slots);
    if (t.paged) tableGm_.SetGlobalBuffer((__gm__ int32_t*)block_table, uint64_t(t.batch) * t.max_blocks);
    rowGm_.SetGlobalBuffer((__gm__ int32_t*)row_info, uint64_t(t.rows) * kRowInfo);
    if (t.has_sinks) sinkGm_.SetGlobalBuffer((__gm__ float*)sinks, t.q_heads);
    outGm_.SetGlobalBuffer((__gm__ T*)out, qRows * t.dv);
    if (t.return_stats) {
      maxGm_.SetGlobalBuffer((__gm__ float*)softmax_max, qRows);
      sumGm_.SetGlobalBuffer((__gm__ float*)softmax_sum, qRows);
    }
    InitBuffers();
  }

  __aicore__ inline void Process() {
    const uint32_t core = uint32_t(GetBlockIdx());
    const uint32_t end = tot_ascendc::ItemBegin(t_, core + 1);
    for (uint32_t item = tot_ascendc::ItemBegin(t_, core); item < end; ++item) RunItem(item);
  }

 private:
  __aicore__ inline void InitBuffers() {
    const uint32_t tile = t_.tile_rows, c = t_.group_chunk, dq = t_.dq_pad, dv = t_.dv_pad;
    const uint32_t widest = dq > dv ? dq : dv;
    pipe_.InitBuffer(kQue_, 1, tile * dq * sizeof(T));
    pipe_.InitBuffer(kF_, tile * dq * sizeof(float));
    if (!t_.value_is_key) {
      pipe_.InitBuffer(vQue_, 1, tile * dv * sizeof(T));
      pipe_.InitBuffer(vF_, tile * dv * sizeof(float));
    }
    pipe_.InitBuffer(prod_, tile * widest * sizeof(float));
    pipe_.InitBuffer(scores_, c * tile * sizeof(float));
    pipe_.InitBuffer(pBlocks_, tile * 32);
    pipe_.InitBuffer(qQue_, 1, (c * dq * sizeof(T) + 31) / 32 * 32);
    pipe_.InitBuffer(qF_, c * dq * sizeof(float));
    pipe_.InitBuffer(acc_, c * dv * sizeof(float));
    pipe_.InitBuffer(outQue_, 1, (c * dv * sizeof(T) + 31) / 32 * 32);
    pipe_.InitBuffer(m_, c * kStat * sizeof(float));
    pipe_.InitBuffer(l_, c * kStat * sizeof(float));
    pipe_.InitBuffer(mNew_, c * kStat * sizeof(float));
    pipe_.InitBuffer(alpha_, c * kStat * sizeof(float));
    pipe_.InitBuffer(sinkTerm_, c * kStat * sizeof(float));
    pipe_.InitBuffer(maxOut_, (c * sizeof(float) + 31) / 32 * 32);
    pipe_.InitBuffer(sumOut_, (c * sizeof(float) + 31) / 32 * 32);
    pipe_.InitBuffer(redTmp_, (tile * sizeof(float) + 31) / 32 * 32);
    pipe_.InitBuffer(red_, 32);
  }

  // ---- one (query row, KV head) item ----

  __aicore__ inline void RunItem(uint32_t item) {
    const uint32_t t = item / t_.kv_heads, n2 = item % t_.kv_heads;
    const int32_t b = rowGm_.GetValue(uint64_t(t) * kRowInfo);
    const int32_t limit = rowGm_.GetValue(uint64_t(t) * kRowInfo + 1);
    const int32_t base = rowGm_.GetValue(uint64_t(t) * kRowInfo + 2);
    const bool valid = b >= 0;
    for (g0_ = 0; g0_ < t_.group; g0_ += t_.group_chunk) {
      gn_ = t_.group - g0_ < t_.group_chunk ? t_.group - g0_ : t_.group_chunk;
      StartHeads(n2, valid);
      if (valid && limit > 0) {
        LoadQuery(t, n2);
        GatherAndAttend(t, n2, uint32_t(b), uint32_t(limit), uint32_t(base));
      }
      Finish(t, n2, valid && t_.has_sinks);
    }
  }

  // Running statistics of heads [g0_, g0_ + gn_): max = the head's sink (valid rows with sinks) or kNoMax, sum 0.
  __aicore__ inline void StartHeads(uint32_t n2, bool valid) {
    LocalTensor<float> m = m_.Get<float>(), l = l_.Get<float>(), acc = acc_.Get<float>();
    Duplicate(l, 0.f, int32_t(gn_ * kStat));
    Duplicate(acc, 0.f, int32_t(gn_ * t_.dv_pad));
    if (!(valid && t_.has_sinks)) {
      Duplicate(m, kNoMax, int32_t(gn_ * kStat));
      return;
    }
    for (uint32_t g = 0; g < gn_; ++g)
      Duplicate(m[g * kStat], sinkGm_.GetValue(uint64_t(n2) * t_.group + g0_ + g), int32_t(kStat));
  }

  // Query rows of the chunk as [gn_, dq_pad] = [latent | rope], in fp32.
  __aicore__ inline void LoadQuery(uint32_t t, uint32_t n2) {
    const uint64_t row0 = uint64_t(t) * t_.q_heads + uint64_t(n2) * t_.group + g0_;
    LocalTensor<T> q = qQue_.template AllocTensor<T>();
    CopyRows(q, 0, qGm_[row0 * t_.dn], gn_, t_.dn, t_.dn, t_.dn_pad, t_.dr_pad);
    if (t_.dr > 0) CopyRows(q, t_.dn_pad, qrGm_[row0 * t_.dr], gn_, t_.dr, t_.dr, t_.dr_pad, t_.dn_pad);
    qQue_.EnQue(q);
    q = qQue_.template DeQue<T>();
    ToFloat(qF_.Get<float>(), q, gn_ * t_.dq_pad);
    qQue_.FreeTensor(q);
  }

  // `count` GM rows of `len` elements (GM row pitch `pitch`) into UB at element `at`, each zero-padded to `len_pad`
  // and followed by a gap of `gap` elements (the other part of a [latent | rope] row).
  __aicore__ inline void CopyRows(const LocalTensor<T>& dst, uint32_t at, const GlobalTensor<T>& src, uint32_t count,
                                  uint32_t len, uint64_t pitch, uint32_t len_pad, uint32_t gap) {
    const DataCopyExtParams params(uint16_t(count), uint32_t(len * sizeof(T)), uint32_t((pitch - len) * sizeof(T)),
                                   uint32_t(gap * sizeof(T) / 32), 0);
    const DataCopyPadExtParams<T> pad(true, 0, uint8_t(len_pad - len), T(0.f));
    DataCopyPad(dst[at], src, params, pad);
  }

  // Walks the item's slots in order; consecutive tokens of one slot are one copy (they are consecutive cache rows);
  // a full tile is computed before the next is gathered.
  __aicore__ inline void GatherAndAttend(uint32_t t, uint32_t n2, uint32_t b, uint32_t limit, uint32_t base) {
    const uint64_t slot0 = (uint64_t(t) * t_.kv_heads + n2) * t_.slots;
    filled_ = 0;
    for (uint32_t s = 0; s < t_.slots; ++s) {
      const int32_t v = idxGm_.GetValue(slot0 + s);
      if (v < 0) continue;
      const uint64_t start = uint64_t(v) * t_.sparse_block_size;
      if (start >= limit) continue;
      const uint32_t end = start + t_.sparse_block_size < limit ? uint32_t(start + t_.sparse_block_size) : limit;
      for (uint32_t j = uint32_t(start); j < end;) {
        const uint32_t room = t_.tile_rows - filled_;
        const uint32_t n = end - j < room ? end - j : room;
        AppendRows(PhysicalRow(b, base, j), n2, n);
        j += n;
        if (filled_ == t_.tile_rows) ComputeTile();
      }
    }
    if (filled_ > 0) ComputeTile();
  }

  // Row of key (as [kv_rows, N2, dn]) holding token j of sequence b.
  __aicore__ inline uint64_t PhysicalRow(uint32_t b, uint32_t base, uint32_t j) {
    if (!t_.paged) return uint64_t(base) + j;
    const int32_t blk = tableGm_.GetValue(uint64_t(b) * t_.max_blocks + j / t_.block_size);
    return uint64_t(blk) * t_.block_size + j % t_.block_size;
  }

  // Cache rows [row, row + n) of head n2 appended to the open tile (allocated by its first rows).
  __aicore__ inline void AppendRows(uint64_t row, uint32_t n2, uint32_t n) {
    if (filled_ == 0) {
      kIn_ = kQue_.template AllocTensor<T>();
      if (!t_.value_is_key) vIn_ = vQue_.template AllocTensor<T>();
    }
    const uint64_t cell = row * t_.kv_heads + n2, pitchRows = t_.kv_heads;
    CopyRows(kIn_, filled_ * t_.dq_pad, kGm_[cell * t_.dn], n, t_.dn, pitchRows * t_.dn, t_.dn_pad, t_.dr_pad);
    if (t_.dr > 0)
      CopyRows(kIn_, filled_ * t_.dq_pad + t_.dn_pad, krGm_[cell * t_.dr], n, t_.dr, pitchRows * t_.dr, t_.dr_pad,
               t_.dn_pad);
    if (!t_.value_is_key)
      CopyRows(vIn_, filled_ * t_.dv_pad, vGm_[cell * t_.dv], n, t_.dv, pitchRows * t_.dv, t_.dv_pad, 0);
    filled_ += n;
  }

  __aicore__ inline void ComputeTile() {
    const uint32_t rows = filled_;
    filled_ = 0;
    kQue_.EnQue(kIn_);
    LocalTensor<T> kIn = kQue_.template DeQue<T>();
    LocalTensor<float> k = kF_.Get<float>();
    ToFloat(k, kIn, rows * t_.dq_pad);
    kQue_.FreeTensor(kIn);
    LocalTensor<float> v = k;  // value_is_key: the latent columns of the key rows (pitch dq_pad)
    uint32_t vPitch = t_.dq_pad;
    if (!t_.value_is_key) {
      vQue_.EnQue(vIn_);
      LocalTensor<T> vIn = vQue_.template DeQue<T>();
      v = vF_.Get<float>();
      ToFloat(v, vIn, rows * t_.dv_pad);
      vQue_.FreeTensor(vIn);
      vPitch = t_.dv_pad;
    }
    for (uint32_t g = 0; g < gn_; ++g) {
      LocalTensor<float> s = scores_.Get<float>()[g * t_.tile_rows];
      Scores(s, k, g, rows);
      OnlineSoftmax(s, v, vPitch, g, rows);
    }
  }

  // s[j] = scale * q_g · k_j over [latent | rope] (the vector-unit GEMV of common/vector_helpers.h).
  __aicore__ inline void Scores(const LocalTensor<float>& s, const LocalTensor<float>& k, uint32_t g, uint32_t rows) {
    const uint32_t dq = t_.dq_pad;
    tot_ascendc::RowDots(s, k, qF_.Get<float>()[g * dq], prod_.Get<float>(), dq, rows);
    Muls(s, s, t_.scale, int32_t(rows));
  }

  // Flash-attention update of head g with this tile's scores: new max, rescale factor exp(m_old - m_new),
  // probabilities p = exp(s - m_new), l = alpha*l + sum(p), acc = alpha*acc + sum_j p_j v_j.
  __aicore__ inline void OnlineSoftmax(const LocalTensor<float>& s, const LocalTensor<float>& v, uint32_t vPitch,
                                       uint32_t g, uint32_t rows) {
    LocalTensor<float> m = m_.Get<float>()[g * kStat], l = l_.Get<float>()[g * kStat];
    LocalTensor<float> mNew = mNew_.Get<float>()[g * kStat], alpha = alpha_.Get<float>()[g * kStat];
    LocalTensor<float> red = red_.Get<float>(), tmp = redTmp_.Get<float>();
    LocalTensor<float> acc = acc_.Get<float>()[g * t_.dv_pad];
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
    Muls(acc, acc, a, int32_t(t_.dv_pad));
    WeightedRowSum(acc, v, vPitch, s, rows);
  }

  // acc += sum_j p_j v_j: Brcb spreads each p_j over one DataBlock, one Mul per 64-lane chunk scales every row of the
  // tile (src1 block stride 0, repeat stride one block) into [rows, dv_pad] products, halving Adds fold the rows.
  __aicore__ inline void WeightedRowSum(const LocalTensor<float>& acc, const LocalTensor<float>& v, uint32_t vPitch,
                                        const LocalTensor<float>& p, uint32_t rows) {
    const uint32_t dv = t_.dv_pad;
    LocalTensor<float> pb = pBlocks_.Get<float>(), prod = prod_.Get<float>();
    Brcb(pb, p, uint8_t((rows + 7) / 8), BrcbRepeatParams(1, 8));
    const uint8_t outBlocks = uint8_t(dv / 8), vBlocks = uint8_t(vPitch / 8);
    for (uint32_t c = 0; c < dv; c += kLanes) {
      const uint64_t lanes = dv - c < kLanes ? dv - c : kLanes;
      Mul(prod[c], v[c], pb, lanes, uint8_t(rows), BinaryRepeatParams(1, 1, 0, outBlocks, vBlocks, 1));
    }
    for (uint32_t n = rows; n > 1;) {
      const uint32_t half = n / 2;
      Add(prod, prod, prod[(n - half) * dv], int32_t(half * dv));
      n -= half;
    }
    Add(acc, acc, prod, int32_t(dv));
  }

  // Final sums (plus the sink terms), out = acc / l (zeros without keys), statistics when asked.
  __aicore__ inline void Finish(uint32_t t, uint32_t n2, bool sinks) {
    LocalTensor<float> m = m_.Get<float>(), l = l_.Get<float>(), acc = acc_.Get<float>();
    if (sinks) {  // l += exp(sink - m), the sink's logit in the denominator (its value row is zero)
      LocalTensor<float> e = sinkTerm_.Get<float>();
      for (uint32_t g = 0; g < gn_; ++g)
        Duplicate(e[g * kStat], sinkGm_.GetValue(uint64_t(n2) * t_.group + g0_ + g), int32_t(kStat));
      Sub(e, e, m, int32_t(gn_ * kStat));
      Exp(e, e, int32_t(gn_ * kStat));
      Add(l, l, e, int32_t(gn_ * kStat));
    }
    PipeSync<HardEvent::V_S>();
    for (uint32_t g = 0; g < gn_; ++g) {
      const float sum = l.GetValue(g * kStat);
      Muls(acc[g * t_.dv_pad], acc[g * t_.dv_pad], sum > 0.f ? 1.f / sum : 0.f, int32_t(t_.dv_pad));
    }
    LocalTensor<T> o = outQue_.template AllocTensor<T>();
    FromFloat(o, acc, gn_ * t_.dv_pad);
    outQue_.EnQue(o);
    o = outQue_.template DeQue<T>();
    const uint64_t row0 = uint64_t(t) * t_.q_heads + uint64_t(n2) * t_.group + g0_;
    DataCopyPad(outGm_[row0 * t_.dv], o, DataCopyExtParams(uint16_t(gn_), t_.dv * sizeof(T), 0, 0, 0));
    outQue_.FreeTensor(o);
    if (t_.return_stats) WriteStats(t, n2, sinks);
  }

  // softmax_max / softmax_sum of the chunk's heads: G consecutive floats per (row, KV head) in the op's layout.
  __aicore__ inline void WriteStats(uint32_t t, uint32_t n2, bool sinks) {
    LocalTensor<float> m = m_.Get<float>(), l = l_.Get<float>();
    LocalTensor<float> mo = maxOut_.Get<float>(), so = sumOut_.Get<float>();
    for (uint32_t g = 0; g < gn_; ++g) {
      const float sum = l.GetValue(g * kStat);
      mo.SetValue(g, !sinks && sum == 0.f ? t_.neg_inf : m.GetValue(g * kStat));
      so.SetValue(g, sum);
    }
    uint64_t at;
    if (t_.q_tnd) {
      at = (uint64_t(n2) * t_.rows + t) * t_.group + g0_;
    } else {
      const uint32_t b = t / t_.s1, pos = t % t_.s1;
      at = ((uint64_t(b) * t_.kv_heads + n2) * t_.s1 + pos) * t_.group + g0_;
    }
    PipeSync<HardEvent::S_MTE3>();
    const DataCopyExtParams one(1, gn_ * sizeof(float), 0, 0, 0);
    DataCopyPad(maxGm_[at], mo, one);
    DataCopyPad(sumGm_[at], so, one);
    PipeSync<HardEvent::MTE3_S>();  // the staging is rewritten by the next item's scalar writes
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

  tot_ascendc::SparseFlashAttentionTiling t_;
  uint32_t g0_ = 0, gn_ = 0;  // the chunk of query heads (within the group) being processed
  uint32_t filled_ = 0;       // rows gathered into the open tile
  LocalTensor<T> kIn_, vIn_;  // the open tile (allocated from the queues by its first rows)
  TPipe pipe_;
  TQue<TPosition::VECIN, 1> kQue_, vQue_, qQue_;
  TQue<TPosition::VECOUT, 1> outQue_;
  TBuf<TPosition::VECCALC> kF_, vF_, prod_, pBlocks_, scores_, qF_, acc_, m_, l_, mNew_, alpha_, sinkTerm_;
  TBuf<TPosition::VECCALC> maxOut_, sumOut_, redTmp_, red_;
  GlobalTensor<T> qGm_, qrGm_, kGm_, krGm_, vGm_, outGm_;
  GlobalTensor<int32_t> idxGm_, tableGm_, rowGm_;
  GlobalTensor<float> sinkGm_, maxGm_, sumGm_;
};

template <typename T>
__aicore__ inline void RunSparse(GM_ADDR query, GM_ADDR query_rope, GM_ADDR key, GM_ADDR key_rope, GM_ADDR value,
                                 GM_ADDR sparse_indices, GM_ADDR block_table, GM_ADDR row_info, GM_ADDR sinks,
                                 GM_ADDR out, GM_ADDR softmax_max, GM_ADDR softmax_sum,
                                 const tot_ascendc::SparseFlashAttentionTiling& t) {
  SparseAttention<T> op;
  op.Init(query, query_rope, key, key_rope, value, sparse_indices, block_table, row_info, sinks, out, softmax_max,
          softmax_sum, t);
  op.Process();
}

}  // namespace

extern "C" __global__ __aicore__ void sparse_flash_attention(GM_ADDR query, GM_ADDR query_rope, GM_ADDR key,
                                                             GM_ADDR key_rope, GM_ADDR value, GM_ADDR sparse_indices,
                                                             GM_ADDR block_table, GM_ADDR row_info, GM_ADDR sinks,
                                                             GM_ADDR out, GM_ADDR softmax_max, GM_ADDR softmax_sum,
                                                             GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  const tot_ascendc::SparseFlashAttentionTiling t =
      *reinterpret_cast<__gm__ tot_ascendc::SparseFlashAttentionTiling*>(tiling);
  if (t.dtype == uint32_t(tot_ascendc::SparseDtype::FP16))
    RunSparse<half>(query, query_rope, key, key_rope, value, sparse_indices, block_table, row_info, sinks, out,
                    softmax_max, softmax_sum, t);
  else if (t.dtype == uint32_t(tot_ascendc::SparseDtype::BF16))
    RunSparse<bfloat16_t>(query, query_rope, key, key_rope, value, sparse_indices, block_table, row_info, sinks, out,
                          softmax_max, softmax_sum, t);
  else
    RunSparse<float>(query, query_rope, key, key_rope, value, sparse_indices, block_table, row_info, sinks, out,
                     softmax_max, softmax_sum, t);
}
