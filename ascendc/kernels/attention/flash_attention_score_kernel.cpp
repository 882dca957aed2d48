// FlashAttention forward (CANN FlashAttentionScore) as an Ascend C MIX kernel: 1 AIC : 2 AIV per AI Core group.
// The AIC serves the Matmul objects (REGIST_MATMUL_OBJ); each AIV owns a range of (b, n, s1-block) tasks
// (flash_attention_score_tiling.h) and, per key block of a task:
//   1. cube  S = Q·Kᵀ            (Matmul, K transposed)            -> this AIV's GM workspace slice (fp32)
//   2. vector, per chunk of vec_rows rows: S*scale, mask (explicit bool mask and/or the causal/band limits, as
//      -inf via Select), online softmax with per-row max/sum in the [rows, 8] fp32 layout (level-0 row folds +
//      WholeReduce + Brcb; broadcasts through BinaryRepeatParams with a 0 block stride), P = exp(S - max) cast to
//      the input dtype -> workspace
//   3. cube  O_part = P·V                                         -> workspace (fp32)
//   4. vector acc = acc * exp(m_old - m_new) + O_part (fp32 accumulator in UB for the whole task)
// At the end of a task: out = acc / sum in the input dtype (DataCopyPad, any head dim), softmax_max/sum [.., 8].
// Inputs are BNSD-contiguous (the glue copies other layouts). Rows that see no key give out 0, max -inf, sum 0,
// like the CPU kernel.
#include "kernel_operator.h"

#include "attention/flash_attention_score_tiling.h"
#include "attention/flash_attention_score_kernel.h"

using namespace AscendC;
using tot_ascendc::FlashAttentionScoreTilingData;

namespace {

constexpr float kNegInf = -__builtin_inff();
constexpr float kLowestFinite = -3.40282347e+38f;  // the softmax shift of a row that has seen no key yet
constexpr float kTinySum = 1e-30f;                 // divisor floor: rows with sum 0 have acc 0 -> out 0
constexpr uint32_t kFp32PerRepeat = 64;            // fp32 lanes of one 256-byte vector repeat
constexpr uint32_t kFp32PerBlock = 8;              // fp32 values per 32-byte DataBlock

template <typename A, typename B>
struct IsSame { static constexpr bool value = false; };
template <typename A>
struct IsSame<A, A> { static constexpr bool value = true; };

__aicore__ inline uint32_t Min(uint32_t a, uint32_t b) { return a < b ? a : b; }
__aicore__ inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__aicore__ inline int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

// dst[r, :] = src[r, :] (op) stats[r, 0] for rows r < rows of a [rows, width] fp32 tile (row pitch `width`, a
// multiple of 8) and a [rows, 8] stats tile: one repeat per row and 64-column chunk, stats block stride 0.
template <void (*Op)(const LocalTensor<float>&, const LocalTensor<float>&, const LocalTensor<float>&, uint64_t,
                     const uint8_t, const BinaryRepeatParams&)>
__aicore__ inline void RowBroadcast(const LocalTensor<float>& dst, const LocalTensor<float>& src,
                                    const LocalTensor<float>& stats8, uint32_t rows, uint32_t width) {
  const uint8_t pitch = uint8_t(width / kFp32PerBlock);
  const BinaryRepeatParams rp(1, 1, 0, pitch, pitch, 1);
  for (uint32_t c = 0; c < width; c += kFp32PerRepeat) Op(dst[c], src[c], stats8, Min(kFp32PerRepeat, width - c), uint8_t(rows), rp);
}

template <typename T>
__aicore__ inline void MulOp(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, uint64_t m,
                             const uint8_t r, const BinaryRepeatParams& p) { Mul(d, a, b, m, r, p); }
template <typename T>
__aicore__ inline void SubOp(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, uint64_t m,
                             const uint8_t r, const BinaryRepeatParams& p) { Sub(d, a, b, m, r, p); }
template <typename T>
__aicore__ inline void DivOp(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, uint64_t m,
                             const uint8_t r, const BinaryRepeatParams& p) { Div(d, a, b, m, r, p); }

// Orders the vector pipe before / after MTE3 (UB -> GM copies of buffers the vector unit wrote / rewrites).
template <HardEvent E>
__aicore__ inline void WaitPipe() {
  const event_t id = static_cast<event_t>(GetTPipePtr()->FetchEventID(E));
  SetFlag<E>(id);
  WaitFlag<E>(id);
}

template <typename T>
class FlashAttentionScoreKernel {
 public:
  using QType = MatmulType<TPosition::GM, CubeFormat::ND, T>;
  using KtType = MatmulType<TPosition::GM, CubeFormat::ND, T, true>;
  using FType = MatmulType<TPosition::GM, CubeFormat::ND, float>;
  Matmul<QType, KtType, FType> mm1;  // S = Q·Kᵀ
  Matmul<QType, QType, FType> mm2;   // O_part = P·V

  __aicore__ inline void Init(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR mask, GM_ADDR out, GM_ADDR smax,
                              GM_ADDR ssum, GM_ADDR workspace, const FlashAttentionScoreTilingData& t, TPipe* pipe) {
    t_ = t;
    aiv_ = uint32_t(GetBlockIdx());
    const uint64_t bn = uint64_t(t.batch) * t.q_heads, bkv = uint64_t(t.batch) * t.kv_heads;
    qGm_.SetGlobalBuffer((__gm__ T*)q, bn * t.s1 * t.head_dim);
    kGm_.SetGlobalBuffer((__gm__ T*)k, bkv * t.s2 * t.head_dim);
    vGm_.SetGlobalBuffer((__gm__ T*)v, bkv * t.s2 * t.v_head_dim);
    outGm_.SetGlobalBuffer((__gm__ T*)out, bn * t.s1 * t.v_head_dim);
    maxGm_.SetGlobalBuffer((__gm__ float*)smax, bn * t.s1 * kFp32PerBlock);
    sumGm_.SetGlobalBuffer((__gm__ float*)ssum, bn * t.s1 * kFp32PerBlock);
    if (t.mask_kind == tot_ascendc::FA_MASK_EXPLICIT) {
      const uint64_t mb = t.mask_batch_stride ? t.batch : 1;
      const uint64_t mn = t.mask_head_stride ? t.q_heads : 1;
      maskGm_.SetGlobalBuffer((__gm__ uint8_t*)mask, mb * mn * t.s1 * t.s2);
    }
    GM_ADDR ws = GetUserWorkspace(workspace) + t.ws_per_aiv * aiv_;
    sWs_.SetGlobalBuffer((__gm__ float*)(ws + t.ws_s_offset), 2 * SliceElems());
    pWs_.SetGlobalBuffer((__gm__ T*)(ws + t.ws_p_offset), uint64_t(t.s1_block) * t.s2_block);
    oWs_.SetGlobalBuffer((__gm__ float*)(ws + t.ws_o_offset), uint64_t(t.s1_block) * t.v_dim_pad);
    InitBuffers(pipe);
  }

  __aicore__ inline void Process() {
    if (aiv_ >= t_.aiv_num) return;
    for (uint32_t task = t_.task_begin[aiv_]; task < t_.task_begin[aiv_ + 1]; ++task) ProcessTask(task);
    mm1.End();
    mm2.End();
  }

 private:
  __aicore__ inline void InitBuffers(TPipe* pipe) {
    const tot_ascendc::FaUbPlan p = tot_ascendc::FaPlanUb(t_.s1_block, t_.s2_block, t_.vec_rows, t_.v_dim_pad,
                                                          sizeof(T), t_.mask_kind == tot_ascendc::FA_MASK_EXPLICIT);
    pipe->InitBuffer(sIn_, 2, p.s_in);
    if (p.p_out) pipe->InitBuffer(pOut_, 1, p.p_out);
    if (p.mask_u8) {
      pipe->InitBuffer(maskIn_, 1, p.mask_u8);
      pipe->InitBuffer(maskHalf_, p.mask_f16);
    }
    pipe->InitBuffer(selBits_, p.sel_bits);
    pipe->InitBuffer(colIdx_, p.col_idx);
    pipe->InitBuffer(fold_, p.fold);
    pipe->InitBuffer(rowVec_, p.row_vec);
    pipe->InitBuffer(tmpA_, p.tmp8);
    pipe->InitBuffer(tmpB_, p.tmp8);
    pipe->InitBuffer(max8_, p.stats8);
    pipe->InitBuffer(sum8_, p.stats8);
    pipe->InitBuffer(alpha8_, p.stats8);
    pipe->InitBuffer(acc_, p.acc);
    pipe->InitBuffer(oIn_, 2, p.o_in);
    if (p.o_out) pipe->InitBuffer(oOut_, 1, p.o_out);
    // Column indices 0..s2_block-1, compared against each row's band limits.
    ArithProgression(colIdx_.Get<float>(), 0.0f, 1.0f, int32_t(t_.s2_block));
  }

  // Block [j0, j0 + nk) vs rows [i0, i0 + rows): 0 = no key visible, 1 = all visible, 2 = needs the band limits.
  __aicore__ inline int Classify(int64_t i0, int64_t rows, int64_t j0, int64_t nk) const {
    if (t_.band_hi < t_.band_lo || j0 + nk - 1 < i0 + t_.band_lo || j0 > i0 + rows - 1 + t_.band_hi) return 0;
    const bool inside = j0 >= i0 + rows - 1 + t_.band_lo && j0 + nk - 1 <= i0 + t_.band_hi;
    return inside ? 1 : 2;
  }

  __aicore__ inline void ProcessTask(uint32_t task) {
    const uint32_t s1b = task % t_.s1_blocks, bn = task / t_.s1_blocks;
    b_ = bn / t_.q_heads;
    n_ = bn % t_.q_heads;
    i0_ = s1b * t_.s1_block;
    rows_ = s1b + 1 == t_.s1_blocks ? t_.s1_tail : t_.s1_block;
    rowsPad_ = (rows_ + 7) / 8 * 8;
    const uint64_t kv_head = uint64_t(b_) * t_.kv_heads + n_ / t_.group;
    const uint64_t q_off = (uint64_t(bn) * t_.s1 + i0_) * t_.head_dim;
    const uint64_t k_base = kv_head * t_.s2 * t_.head_dim, v_base = kv_head * t_.s2 * t_.v_head_dim;

    WaitPipe<HardEvent::MTE3_V>();  // the previous task's statistics have left UB
    Duplicate(max8_.Get<float>(), kNegInf, int32_t(rowsPad_ * kFp32PerBlock));
    Duplicate(sum8_.Get<float>(), 0.0f, int32_t(rowsPad_ * kFp32PerBlock));
    Duplicate(acc_.Get<float>(), 0.0f, int32_t(rowsPad_ * t_.v_dim_pad));
    // Software pipeline over the visible key blocks: while the vector units run softmax on block kb (one S slice),
    // the cube computes Q·Kᵀ of the next visible block into the other slice (IterateAll<false>).
    uint32_t kb = NextVisible(0), slice = 0;
    if (kb < t_.s2_blocks) IssueScores(q_off, k_base, kb, slice);
    while (kb < t_.s2_blocks) {
      const uint32_t next = NextVisible(kb + 1);
      const uint32_t j0 = kb * t_.s2_block, nk = BlockKeys(kb);
      const int kind = Classify(i0_, rows_, j0, nk);
      mm1.WaitIterateAll();  // S of block kb is in its slice
      if (next < t_.s2_blocks) IssueScores(q_off, k_base, next, slice ^ 1u);
      sCur_ = sWs_[uint64_t(slice) * SliceElems()];
      // A tail block's vector passes cover its columns rounded up to 64 (whole fp32 repeats for the count-form
      // compares, whole mask bytes and P DataBlocks in every dtype), not the full block width.
      w_ = nk == t_.s2_block ? t_.s2_block : Min(t_.s2_block, (nk + 63) / 64 * 64);
      // softmax, chunk by chunk; band limits for partial blocks and for the columns past a tail block.
      const bool limits = kind == 2 || nk < t_.s2_block;
      for (uint32_t c0 = 0; c0 < rowsPad_; c0 += t_.vec_rows) SoftmaxChunk(c0, Min(t_.vec_rows, rowsPad_ - c0), j0, nk, limits);
      PipeBarrier<PIPE_ALL>();  // P is in GM before the cube reads it
      // O_part = P·V, row pitch v_dim_pad.
      mm2.SetTensorA(pWs_);
      mm2.SetTensorB(vGm_[v_base + uint64_t(j0) * t_.v_head_dim]);
      mm2.SetOrgShape(int(rows_), int(t_.v_head_dim), int(t_.s2_block), int(nk), int(t_.v_dim_pad));
      mm2.SetSingleShape(int(rows_), int(t_.v_head_dim), int(nk));
      mm2.IterateAll(oWs_);
      // acc = acc * alpha + O_part.
      for (uint32_t c0 = 0; c0 < rowsPad_; c0 += t_.vec_rows) AccumulateChunk(c0, Min(t_.vec_rows, rowsPad_ - c0));
      kb = next;
      slice ^= 1u;
    }
    for (uint32_t c0 = 0; c0 < rowsPad_; c0 += t_.vec_rows) WriteChunk(c0, Min(t_.vec_rows, rowsPad_ - c0));
  }

  __aicore__ inline uint64_t SliceElems() const { return uint64_t(t_.s1_block) * t_.s2_block; }
  __aicore__ inline uint32_t BlockKeys(uint32_t kb) const { return kb + 1 == t_.s2_blocks ? t_.s2_tail : t_.s2_block; }

  // The first key block at or after kb that the band leaves (partly) visible; s2_blocks when none.
  __aicore__ inline uint32_t NextVisible(uint32_t kb) const {
    while (kb < t_.s2_blocks && Classify(i0_, rows_, kb * t_.s2_block, BlockKeys(kb)) == 0) ++kb;
    return kb;
  }

  // S = Q·Kᵀ of key block kb into S slice `slice` (fp32, row pitch s2_block), asynchronously.
  __aicore__ inline void IssueScores(uint64_t q_off, uint64_t k_base, uint32_t kb, uint32_t slice) {
    const uint32_t nk = BlockKeys(kb);
    mm1.SetTensorA(qGm_[q_off]);
    mm1.SetTensorB(kGm_[k_base + uint64_t(kb) * t_.s2_block * t_.head_dim], true);
    mm1.SetOrgShape(int(rows_), int(nk), int(t_.head_dim), int(t_.head_dim), int(t_.s2_block));
    mm1.SetSingleShape(int(rows_), int(nk), int(t_.head_dim));
    mm1.template IterateAll<false>(sWs_[uint64_t(slice) * SliceElems()]);
  }

  // Rows of chunk [c0, c0 + cr) that exist (the last chunk of a tail block is padded to 8 rows).
  __aicore__ inline uint32_t RealRows(uint32_t c0, uint32_t cr) const { return c0 >= rows_ ? 0 : Min(cr, rows_ - c0); }

  __aicore__ inline void SoftmaxChunk(uint32_t c0, uint32_t cr, uint32_t j0, uint32_t nk, bool limits) {
    const uint32_t w = w_, n = cr * w, n8 = cr * kFp32PerBlock;
    LocalTensor<float> s = sIn_.AllocTensor<float>();
    if (w == t_.s2_block) {
      DataCopy(s, sCur_[uint64_t(c0) * w], n);
    } else {  // the first w columns of each workspace row (pitch s2_block)
      DataCopy(s, sCur_[uint64_t(c0) * t_.s2_block],
               DataCopyParams(uint16_t(cr), uint16_t(w / kFp32PerBlock), uint16_t((t_.s2_block - w) / kFp32PerBlock), 0));
    }
    sIn_.EnQue(s);
    s = sIn_.DeQue<float>();
    Muls(s, s, t_.scale, int32_t(n));
    if (t_.mask_kind == tot_ascendc::FA_MASK_EXPLICIT) ApplyMask(s, c0, cr, j0, nk);
    if (limits) ApplyBand(s, c0, cr, j0, nk);

    // Online softmax: m_new = max(m_old, rowmax); shift = max(m_new, lowest finite) so that rows with no visible
    // key yet get exp(-inf) = 0 instead of NaN; alpha = exp(m_old - shift) rescales the old sum and accumulator.
    LocalTensor<float> rowMax8 = tmpA_.Get<float>(), shift8 = tmpB_.Get<float>();
    LocalTensor<float> m8 = max8_.Get<float>()[c0 * kFp32PerBlock], l8 = sum8_.Get<float>()[c0 * kFp32PerBlock];
    LocalTensor<float> alpha8 = alpha8_.Get<float>()[c0 * kFp32PerBlock];
    RowReduce(rowMax8, s, cr, true);
    Max(rowMax8, m8, rowMax8, int32_t(n8));                 // m_new
    Maxs(shift8, rowMax8, kLowestFinite, int32_t(n8));
    Sub(alpha8, m8, shift8, int32_t(n8));
    Exp(alpha8, alpha8, int32_t(n8));
    DataCopy(m8, rowMax8, n8);
    RowBroadcast<SubOp<float>>(s, s, shift8, cr, w);
    Exp(s, s, int32_t(n));
    LocalTensor<float> rowSum8 = tmpA_.Get<float>();
    RowReduce(rowSum8, s, cr, false);
    Mul(l8, l8, alpha8, int32_t(n8));
    Add(l8, l8, rowSum8, int32_t(n8));
    StoreP(s, c0, cr);
    sIn_.FreeTensor(s);
  }

  // P in the input dtype -> workspace rows [c0, c0 + cr), w_ columns each (row pitch s2_block).
  __aicore__ inline void StoreP(const LocalTensor<float>& s, uint32_t c0, uint32_t cr) {
    if constexpr (IsSame<T, float>::value) {
      WaitPipe<HardEvent::V_MTE3>();
      CopyPRows(s, c0, cr);
    } else {
      LocalTensor<T> p = pOut_.AllocTensor<T>();
      Cast(p, s, RoundMode::CAST_RINT, cr * w_);
      pOut_.EnQue(p);
      p = pOut_.DeQue<T>();
      CopyPRows(p, c0, cr);
      pOut_.FreeTensor(p);
    }
  }

  __aicore__ inline void CopyPRows(const LocalTensor<T>& p, uint32_t c0, uint32_t cr) {
    if (w_ == t_.s2_block) {
      DataCopy(pWs_[uint64_t(c0) * t_.s2_block], p, cr * w_);
    } else {
      constexpr uint32_t perBlock = 32 / sizeof(T);
      DataCopy(pWs_[uint64_t(c0) * t_.s2_block], p,
               DataCopyParams(uint16_t(cr), uint16_t(w_ / perBlock), 0, uint16_t((t_.s2_block - w_) / perBlock)));
    }
  }

  // dst8[r, :] = max (or sum) of s[r, 0:w_] for r < cr: fold 64-column chunks with level-0 Max/Add into
  // [cr, 64], WholeReduce each row to one value, Brcb to the [cr, 8] layout.
  __aicore__ inline void RowReduce(const LocalTensor<float>& dst8, const LocalTensor<float>& s, uint32_t cr, bool max) {
    const uint32_t w = w_;
    const uint8_t pitch = uint8_t(w / kFp32PerBlock);
    LocalTensor<float> rowVec = rowVec_.Get<float>();
    LocalTensor<float> src = s;
    uint8_t srcPitch = pitch;
    uint32_t lanes = Min(w, kFp32PerRepeat);
    if (w > kFp32PerRepeat) {
      LocalTensor<float> fold = fold_.Get<float>();
      Adds(fold, s, 0.0f, kFp32PerRepeat, uint8_t(cr), UnaryRepeatParams(1, 1, 8, pitch));
      const BinaryRepeatParams rp(1, 1, 1, 8, 8, pitch);
      for (uint32_t c = kFp32PerRepeat; c < w; c += kFp32PerRepeat) {
        if (max) Max(fold, fold, s[c], Min(kFp32PerRepeat, w - c), uint8_t(cr), rp);
        else Add(fold, fold, s[c], Min(kFp32PerRepeat, w - c), uint8_t(cr), rp);
      }
      src = fold;
      srcPitch = 8;
      lanes = kFp32PerRepeat;
    }
    if (max) WholeReduceMax(rowVec, src, int32_t(lanes), int32_t(cr), 1, 1, srcPitch, ReduceOrder::ORDER_ONLY_VALUE);
    else WholeReduceSum(rowVec, src, int32_t(lanes), int32_t(cr), 1, 1, srcPitch);
    Brcb(dst8, rowVec, uint8_t(cr / 8), BrcbRepeatParams(1, 8));
  }

  // Explicit mask: uint8 tile (1 = masked) -> half -> Select bits (1 = visible) -> -inf where masked.
  __aicore__ inline void ApplyMask(const LocalTensor<float>& s, uint32_t c0, uint32_t cr, uint32_t j0, uint32_t nk) {
    const uint32_t w = w_, real = RealRows(c0, cr);
    LocalTensor<uint8_t> m = maskIn_.AllocTensor<uint8_t>();
    if (real > 0) {
      const uint64_t off = b_ * t_.mask_batch_stride + n_ * t_.mask_head_stride + uint64_t(i0_ + c0) * t_.s2 + j0;
      const uint32_t ub_row = (nk + 31) / 32 * 32;
      DataCopyExtParams cp(uint16_t(real), nk, t_.s2 - nk, (w - ub_row) / 32, 0);
      DataCopyPad(m, maskGm_[off], cp, DataCopyPadExtParams<uint8_t>(false, 0, 0, 0));
    }
    maskIn_.EnQue(m);
    m = maskIn_.DeQue<uint8_t>();
    // Padding rows/columns hold stale bytes: they are never output (rows) or are cut by the band limits (columns).
    LocalTensor<half> mh = maskHalf_.Get<half>();
    Cast(mh, m, RoundMode::CAST_NONE, cr * w);
    LocalTensor<uint8_t> bits = selBits_.Get<uint8_t>();
    CompareScalar(bits, mh, half(0.5f), CMPMODE::LT, cr * w);
    Select(s, bits, s, kNegInf, SELMODE::VSEL_TENSOR_SCALAR_MODE, cr * w);
    maskIn_.FreeTensor(m);
  }

  // Band / causal limits and the columns past a tail block: row i keeps keys j0 + c with
  // i + band_lo <= j0 + c <= min(i + band_hi, j0 + nk - 1).
  __aicore__ inline void ApplyBand(const LocalTensor<float>& s, uint32_t c0, uint32_t cr, uint32_t j0, uint32_t nk) {
    const uint32_t w = w_, real = RealRows(c0, cr);
    LocalTensor<float> col = colIdx_.Get<float>();
    LocalTensor<uint8_t> bits = selBits_.Get<uint8_t>();
    for (uint32_t r = 0; r < real; ++r) {
      const int64_t i = int64_t(i0_) + c0 + r;
      const int64_t lo = i + t_.band_lo - int64_t(j0);
      const int64_t hi = Min64(i + t_.band_hi - int64_t(j0), int64_t(nk) - 1);
      LocalTensor<float> row = s[r * w];
      if (lo > 0) {
        CompareScalar(bits, col, float(Min64(lo, w)), CMPMODE::GE, w);
        Select(row, bits, row, kNegInf, SELMODE::VSEL_TENSOR_SCALAR_MODE, w);
      }
      if (hi < int64_t(w) - 1) {
        CompareScalar(bits, col, float(Max64(hi, -1)), CMPMODE::LE, w);
        Select(row, bits, row, kNegInf, SELMODE::VSEL_TENSOR_SCALAR_MODE, w);
      }
    }
  }

  __aicore__ inline void AccumulateChunk(uint32_t c0, uint32_t cr) {
    const uint32_t w = t_.v_dim_pad;
    LocalTensor<float> o = oIn_.AllocTensor<float>();
    DataCopy(o, oWs_[uint64_t(c0) * w], cr * w);
    oIn_.EnQue(o);
    o = oIn_.DeQue<float>();
    LocalTensor<float> acc = acc_.Get<float>()[c0 * w];
    RowBroadcast<MulOp<float>>(acc, acc, alpha8_.Get<float>()[c0 * kFp32PerBlock], cr, w);
    Add(acc, acc, o, int32_t(cr * w));
    oIn_.FreeTensor(o);
  }

  // out = acc / sum (any head dim through DataCopyPad), softmax_max / softmax_sum rows as [rows, 8].
  __aicore__ inline void WriteChunk(uint32_t c0, uint32_t cr) {
    const uint32_t w = t_.v_dim_pad, real = RealRows(c0, cr);
    if (real == 0) return;
    LocalTensor<float> l8 = sum8_.Get<float>()[c0 * kFp32PerBlock], safe8 = tmpA_.Get<float>();
    // softmax_max = max + 0·sum: NaN for a NaN row (its sum is NaN; the vector Max may have dropped the NaN score),
    // unchanged otherwise (the sum is finite, 0 for a row that saw no key).
    LocalTensor<float> max8 = tmpB_.Get<float>();
    Muls(max8, l8, 0.0f, int32_t(cr * kFp32PerBlock));
    Add(max8, max8, max8_.Get<float>()[c0 * kFp32PerBlock], int32_t(cr * kFp32PerBlock));
    Maxs(safe8, l8, kTinySum, int32_t(cr * kFp32PerBlock));
    LocalTensor<float> acc = acc_.Get<float>()[c0 * w];
    RowBroadcast<DivOp<float>>(acc, acc, safe8, cr, w);
    const uint64_t row0 = (uint64_t(b_) * t_.q_heads + n_) * t_.s1 + i0_ + c0;
    const uint32_t row_bytes = t_.v_head_dim * sizeof(T);
    const uint32_t ub_row = (row_bytes + 31) / 32 * 32;
    DataCopyExtParams cp(uint16_t(real), row_bytes, (w * sizeof(T) - ub_row) / 32, 0, 0);
    if constexpr (IsSame<T, float>::value) {
      WaitPipe<HardEvent::V_MTE3>();
      DataCopyPad(outGm_[row0 * t_.v_head_dim], acc, cp);
    } else {
      LocalTensor<T> out = oOut_.AllocTensor<T>();
      Cast(out, acc, RoundMode::CAST_RINT, cr * w);
      oOut_.EnQue(out);
      out = oOut_.DeQue<T>();
      DataCopyPad(outGm_[row0 * t_.v_head_dim], out, cp);
      oOut_.FreeTensor(out);
      WaitPipe<HardEvent::V_MTE3>();
    }
    DataCopy(maxGm_[row0 * kFp32PerBlock], max8, real * kFp32PerBlock);
    DataCopy(sumGm_[row0 * kFp32PerBlock], l8, real * kFp32PerBlock);
  }

  FlashAttentionScoreTilingData t_;
  uint32_t aiv_ = 0, b_ = 0, n_ = 0, i0_ = 0, rows_ = 0, rowsPad_ = 0;
  uint32_t w_ = 0;  // vector width (score columns) of the current S2 block
  GlobalTensor<T> qGm_, kGm_, vGm_, outGm_, pWs_;
  GlobalTensor<float> maxGm_, sumGm_, sWs_, sCur_, oWs_;  // sCur_: the S slice the vector reads
  GlobalTensor<uint8_t> maskGm_;
  TQue<TPosition::VECIN, 2> sIn_, oIn_;
  TQue<TPosition::VECIN, 1> maskIn_;
  TQue<TPosition::VECOUT, 1> pOut_, oOut_;
  TBuf<TPosition::VECCALC> maskHalf_, selBits_, colIdx_, fold_, rowVec_, tmpA_, tmpB_, max8_, sum8_, alpha8_, acc_;
};

// The Matmul tilings of the two products (the client sets the real shapes per call with SetOrgShape /
// SetSingleShape; these carry the largest ones and the base blocks for the cube).
__aicore__ inline void FillCubeTilings(const FlashAttentionScoreTilingData& t, TCubeTiling& c1, TCubeTiling& c2) {
  c1.M = int32_t(t.s1_block); c1.N = int32_t(t.s2_block); c1.Ka = c1.Kb = int32_t(t.head_dim);
  c1.singleCoreM = c1.M; c1.singleCoreN = c1.N; c1.singleCoreK = c1.Ka;
  c1.baseM = int32_t(Min(t.s1_block, 128)); c1.baseN = int32_t(Min(t.s2_block, 128)); c1.baseK = 64;
  c2.M = int32_t(t.s1_block); c2.N = int32_t(t.v_head_dim); c2.Ka = c2.Kb = int32_t(t.s2_block);
  c2.singleCoreM = c2.M; c2.singleCoreN = c2.N; c2.singleCoreK = c2.Ka;
  c2.baseM = int32_t(Min(t.s1_block, 128)); c2.baseN = int32_t(Min(t.v_head_dim, 128)); c2.baseK = 64;
}

template <typename T>
__aicore__ inline void RunFlashAttention(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR mask, GM_ADDR out, GM_ADDR smax,
                                         GM_ADDR ssum, GM_ADDR workspace, const FlashAttentionScoreTilingData& t) {
  TPipe pipe;
  FlashAttentionScoreKernel<T> op;
  TCubeTiling c1, c2;
  FillCubeTilings(t, c1, c2);
  REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), op.mm1, &c1, op.mm2, &c2);
  op.Init(q, k, v, mask, out, smax, ssum, workspace, t, &pipe);
  op.Process();
}

}  // namespace

extern "C" __global__ __aicore__ void flash_attention_score(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                                            GM_ADDR atten_mask, GM_ADDR attention_out,
                                                            GM_ADDR softmax_max, GM_ADDR softmax_sum,
                                                            GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  const FlashAttentionScoreTilingData t = *reinterpret_cast<__gm__ FlashAttentionScoreTilingData*>(tiling);
  if (t.dtype == tot_ascendc::FA_FLOAT16) {
    RunFlashAttention<half>(query, key, value, atten_mask, attention_out, softmax_max, softmax_sum, workspace, t);
  } else if (t.dtype == tot_ascendc::FA_BFLOAT16) {
    RunFlashAttention<bfloat16_t>(query, key, value, atten_mask, attention_out, softmax_max, softmax_sum, workspace, t);
  } else {
    RunFlashAttention<float>(query, key, value, atten_mask, attention_out, softmax_max, softmax_sum, workspace, t);
  }
}
