// MoE gating top-k softmax (CANN MoeGatingTopKSoftmax / V2) as an Ascend C vector kernel (AIV_MODE).
//
// Every AIV takes a contiguous share of the N rows (tiling: moe_gating_top_k_softmax_tiling.h) and walks it in UB
// tiles: CopyIn (DataCopyPad of `tile_rows` rows of E logits, each row padded to a DataBlock with -inf) ->
// Compute -> CopyOut (DataCopyPad of the [rows, k] outputs and, for V2, the fp32 softmax), through TQue's.
// Per row, in fp32:
//   softmax  (renorm 0): ReduceMax -> Adds(-max) -> Exp -> ReduceSum -> Muls(1/sum)
//   top-k:   k rounds of ReduceMax(calIndex) over the logits, the winner then masked with -inf. ReduceMax returns
//            the first (lowest-index) maximum, so ties go to the lower expert exactly as the CPU op. Selection is
//            on the logits, not the probabilities (softmax is monotone; fp32 rounding could tie distinct logits).
//            When a round's maximum is -inf, every remaining logit is -inf (original or masked): the remaining
//            picks are then the lowest unchosen experts, found by a scalar scan (the CPU op's order for ties).
//   renorm 1: softmax over the k selected logits.
// Rows of at most 64 experts (tiling `batched`) are computed a tile at a time: each step is one level-0 instruction
// with one repeat per row (WholeReduceMax / WholeReduceSum per row, Brcb of the row values into [rows, 8], the
// broadcast Sub / Mul with a 0 block stride), and each top-k round is one WholeReduceMax(value, index) over all
// rows followed by a scalar pass that records the winners and masks them — k + 10 vector instructions per tile
// instead of about (k + 6) per row.
// Finished rows get expert index E; row_idx[i, j] = j*N + i (scalar writes: exact in int32 for any N*k).
// NaN logits are outside the kernel's contract (the hardware ReduceMax gives them no defined rank); the glue runs
// the CPU kernel for them on the simulated device (docs/ascendc_moe.md).
#include "kernel_operator.h"
#include "moe/moe_gating_top_k_softmax_tiling.h"
#include "moe/moe_gating_top_k_softmax_kernel.h"

using namespace AscendC;

namespace moe_gating_kernel {

using Tiling = tot_ascendc::MoeGatingTopKSoftmaxTiling;

__aicore__ inline float NegInf() { return -__builtin_huge_valf(); }
__aicore__ inline uint32_t MinU32(uint32_t a, uint32_t b) { return a < b ? a : b; }

// The scalar unit reads vector results / the vector unit reads scalar writes: order the two pipes.
__aicore__ inline void VectorToScalar() {
  event_t e = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_S));
  SetFlag<HardEvent::V_S>(e);
  WaitFlag<HardEvent::V_S>(e);
}
__aicore__ inline void ScalarToVector() {
  event_t e = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::S_V));
  SetFlag<HardEvent::S_V>(e);
  WaitFlag<HardEvent::S_V>(e);
}

__aicore__ inline void CopyToScalar() {
  event_t e = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::MTE2_S));
  SetFlag<HardEvent::MTE2_S>(e);
  WaitFlag<HardEvent::MTE2_S>(e);
}

template <typename T>
class KernelMoeGating {
 public:
  static constexpr bool kIsFloat = sizeof(T) == 4;

  __aicore__ inline void Init(GM_ADDR x, GM_ADDR finished, GM_ADDR y, GM_ADDR expertIdx, GM_ADDR rowIdx,
                              GM_ADDR softmaxOut, const Tiling& tiling, TPipe* pipe) {
    t_ = tiling;
    const uint32_t core = uint32_t(GetBlockIdx());
    rowStart_ = core * t_.rows_per_core + MinU32(core, t_.rows_remainder);
    rowCount_ = t_.rows_per_core + (core < t_.rows_remainder ? 1 : 0);
    const uint64_t e = t_.experts, k = t_.k;
    xGm_.SetGlobalBuffer((__gm__ T*)x + rowStart_ * e, rowCount_ * e);
    yGm_.SetGlobalBuffer((__gm__ T*)y + rowStart_ * k, rowCount_ * k);
    idxGm_.SetGlobalBuffer((__gm__ int32_t*)expertIdx + rowStart_ * k, rowCount_ * k);
    if (t_.has_finished) finGm_.SetGlobalBuffer((__gm__ uint8_t*)finished + rowStart_, rowCount_);
    if (t_.want_row_idx) rowGm_.SetGlobalBuffer((__gm__ int32_t*)rowIdx + rowStart_ * k, rowCount_ * k);
    if (t_.want_softmax) smGm_.SetGlobalBuffer((__gm__ float*)softmaxOut + rowStart_ * e, rowCount_ * e);

    // The same layout as tot_ascendc::MoeGatingUbBytes (the tiling's budget).
    const uint32_t r = t_.tile_rows, bn = t_.buffer_num;
    pipe->InitBuffer(inX_, bn, r * t_.x_row_stride * sizeof(T));
    if (t_.has_finished) pipe->InitBuffer(inFin_, bn, (r + 31) / 32 * 32);
    if (!kIsFloat) pipe->InitBuffer(keysBuf_, r * t_.x_row_stride * sizeof(float));
    if (t_.batched) {
      const uint32_t r8 = (r + 7) / 8 * 8;
      pipe->InitBuffer(expBuf_, r * t_.x_row_stride * sizeof(float));
      pipe->InitBuffer(rowVals_, 3 * r8 * sizeof(float));
      pipe->InitBuffer(rowBcast_, r8 * 8 * sizeof(float));
      pipe->InitBuffer(rowDone_, r8 * sizeof(int32_t));
    } else {
      pipe->InitBuffer(expBuf_, t_.x_row_stride * sizeof(float));
    }
    pipe->InitBuffer(outY_, bn, r * t_.y_row_stride * sizeof(T));
    if (!kIsFloat) pipe->InitBuffer(yFloatBuf_, r * t_.y_row_stride * sizeof(float));
    pipe->InitBuffer(outIdx_, bn, r * t_.idx_row_stride * sizeof(int32_t));
    if (t_.want_row_idx) pipe->InitBuffer(outRow_, bn, r * t_.idx_row_stride * sizeof(int32_t));
    if (t_.want_softmax) pipe->InitBuffer(outSm_, bn, r * t_.sm_row_stride * sizeof(float));
    pipe->InitBuffer(tmpBuf_, t_.reduce_tmp_bytes);
    pipe->InitBuffer(resBuf_, 64);
  }

  __aicore__ inline void Process() {
    for (uint32_t first = 0; first < rowCount_; first += t_.tile_rows) {
      const uint32_t rows = MinU32(t_.tile_rows, rowCount_ - first);  // the last tile is the tail
      CopyIn(first, rows);
      Compute(first, rows);
      CopyOut(first, rows);
    }
  }

 private:
  __aicore__ inline void CopyIn(uint32_t first, uint32_t rows) {
    LocalTensor<T> x = inX_.AllocTensor<T>();
    const DataCopyExtParams rowsOfE(uint16_t(rows), t_.experts * uint32_t(sizeof(T)), 0, 0, 0);
    const DataCopyPadExtParams<T> padNegInf(true, 0, uint8_t(t_.x_row_stride - t_.experts), T(NegInf()));
    DataCopyPad(x, xGm_[uint64_t(first) * t_.experts], rowsOfE, padNegInf);
    inX_.EnQue(x);
    if (t_.has_finished) {
      LocalTensor<uint8_t> fin = inFin_.AllocTensor<uint8_t>();
      const DataCopyExtParams flags(1, rows, 0, 0, 0);
      const DataCopyPadExtParams<uint8_t> noPad(false, 0, 0, 0);
      DataCopyPad(fin, finGm_[first], flags, noPad);
      inFin_.EnQue(fin);
    }
  }

  __aicore__ inline void Compute(uint32_t first, uint32_t rows) {
    LocalTensor<T> x = inX_.DeQue<T>();
    LocalTensor<float> keys = Keys(x, rows);
    LocalTensor<uint8_t> fin;
    if (t_.has_finished) {
      fin = inFin_.DeQue<uint8_t>();
      CopyToScalar();  // the flags are read by the scalar unit
    }
    LocalTensor<T> y = outY_.AllocTensor<T>();
    LocalTensor<float> yf = YFloat(y);
    LocalTensor<int32_t> idx = outIdx_.AllocTensor<int32_t>();
    LocalTensor<int32_t> rowIdx;
    if (t_.want_row_idx) rowIdx = outRow_.AllocTensor<int32_t>();
    LocalTensor<float> sm;
    if (t_.want_softmax) sm = outSm_.AllocTensor<float>();

    if (t_.batched) ComputeTile(keys, rows, yf, idx, sm);
    else ComputeRowByRow(keys, rows, yf, idx, sm);
    FlagsAndRowIdx(first, rows, fin, idx, rowIdx);
    if constexpr (!kIsFloat) Cast(y, yf, RoundMode::CAST_RINT, rows * t_.y_row_stride);

    outY_.EnQue(y);
    outIdx_.EnQue(idx);
    if (t_.want_row_idx) outRow_.EnQue(rowIdx);
    if (t_.want_softmax) outSm_.EnQue(sm);
    if (t_.has_finished) inFin_.FreeTensor(fin);
    inX_.FreeTensor(x);
  }

  // Rows of more than 64 experts: level-2 instructions over one row at a time.
  __aicore__ inline void ComputeRowByRow(const LocalTensor<float>& keys, uint32_t rows, const LocalTensor<float>& yf,
                                         const LocalTensor<int32_t>& idx, const LocalTensor<float>& sm) {
    for (uint32_t r = 0; r < rows; ++r) {
      LocalTensor<float> logits = keys[r * t_.x_row_stride];
      LocalTensor<float> yRow = yf[r * t_.y_row_stride];
      LocalTensor<int32_t> idxRow = idx[r * t_.idx_row_stride];
      float inv = 0.0f;
      if (t_.renorm == 0) inv = SoftmaxRow(logits, t_.want_softmax ? sm[r * t_.sm_row_stride] : sm);
      SelectTopK(logits, yRow, idxRow);
      if (t_.renorm == 0) {
        Muls(yRow, yRow, inv, int32_t(t_.k));
      } else {
        inv = SoftmaxInPlace(yRow, t_.k);
        Muls(yRow, yRow, inv, int32_t(t_.k));
      }
    }
  }

  __aicore__ inline void CopyOut(uint32_t first, uint32_t rows) {
    const uint64_t at = uint64_t(first) * t_.k;
    LocalTensor<T> y = outY_.DeQue<T>();
    DataCopyPad(yGm_[at], y, DataCopyExtParams(uint16_t(rows), t_.k * uint32_t(sizeof(T)), 0, 0, 0));
    outY_.FreeTensor(y);
    LocalTensor<int32_t> idx = outIdx_.DeQue<int32_t>();
    DataCopyPad(idxGm_[at], idx, DataCopyExtParams(uint16_t(rows), t_.k * 4, 0, 0, 0));
    outIdx_.FreeTensor(idx);
    if (t_.want_row_idx) {
      LocalTensor<int32_t> rowIdx = outRow_.DeQue<int32_t>();
      DataCopyPad(rowGm_[at], rowIdx, DataCopyExtParams(uint16_t(rows), t_.k * 4, 0, 0, 0));
      outRow_.FreeTensor(rowIdx);
    }
    if (t_.want_softmax) {
      LocalTensor<float> sm = outSm_.DeQue<float>();
      DataCopyPad(smGm_[uint64_t(first) * t_.experts], sm,
                  DataCopyExtParams(uint16_t(rows), t_.experts * 4, 0, 0, 0));
      outSm_.FreeTensor(sm);
    }
  }

  // ---- batched rows (E <= 64): one repeat per row ---------------------------------------------------------------
  // Per row of a [rows, stride] fp32 tile (n values each): dst = exp(src - rowmax); returns the [rows, 8] broadcast
  // of 1 / rowsum (for a Mul with a 0 block stride).
  __aicore__ inline LocalTensor<float> SoftmaxRows(const LocalTensor<float>& dst, const LocalTensor<float>& src,
                                                   uint32_t stride, uint32_t n, uint32_t rows) {
    const uint32_t r8 = (rows + 7) / 8 * 8, rep = stride / 8;
    LocalTensor<float> vals = rowVals_.Get<float>(), sums = vals[2 * r8], b8 = rowBcast_.Get<float>();
    WholeReduceMax(vals, src, int32_t(n), int32_t(rows), 1, 1, int32_t(rep), ReduceOrder::ORDER_ONLY_VALUE);
    Brcb(b8, vals, uint8_t(r8 / 8), BrcbRepeatParams(1, 8));
    Sub(dst, src, b8, uint64_t(n), uint8_t(rows), BinaryRepeatParams(1, 1, 0, uint8_t(rep), uint8_t(rep), 1));
    Exp(dst, dst, uint64_t(n), uint8_t(rows), UnaryRepeatParams(1, 1, uint8_t(rep), uint8_t(rep)));
    WholeReduceSum(sums, dst, int32_t(n), int32_t(rows), 1, 1, int32_t(rep));
    Reciprocal(sums, sums, int32_t(rows));
    Brcb(b8, sums, uint8_t(r8 / 8), BrcbRepeatParams(1, 8));
    return b8;
  }

  // rows[r, :n] *= inv8[r] for a [rows, stride] fp32 tile.
  __aicore__ inline void ScaleRows(const LocalTensor<float>& dst, const LocalTensor<float>& src,
                                   const LocalTensor<float>& inv8, uint32_t dstStride, uint32_t srcStride, uint32_t n,
                                   uint32_t rows) {
    Mul(dst, src, inv8, uint64_t(n), uint8_t(rows),
        BinaryRepeatParams(1, 1, 0, uint8_t(dstStride / 8), uint8_t(srcStride / 8), 1));
  }

  __aicore__ inline void ComputeTile(const LocalTensor<float>& keys, uint32_t rows, const LocalTensor<float>& yf,
                                     const LocalTensor<int32_t>& idx, const LocalTensor<float>& sm) {
    const uint32_t xs = t_.x_row_stride, ys = t_.y_row_stride;
    LocalTensor<float> ex = expBuf_.Get<float>();
    if (t_.renorm == 0) {
      const LocalTensor<float> inv8 = SoftmaxRows(ex, keys, xs, t_.experts, rows);
      if (t_.want_softmax) ScaleRows(sm, ex, inv8, t_.sm_row_stride, xs, t_.experts, rows);
      SelectTopKRows(keys, ex, yf, idx, rows);
      ScaleRows(yf, yf, inv8, ys, ys, t_.k, rows);
    } else {
      SelectTopKRows(keys, ex, yf, idx, rows);
      const LocalTensor<float> inv8 = SoftmaxRows(yf, yf, ys, t_.k, rows);
      ScaleRows(yf, yf, inv8, ys, ys, t_.k, rows);
    }
  }

  // k rounds; each: one WholeReduceMax(value, index) over every row, then the scalar unit records each row's
  // winner (expert, and its exp or logit) and masks it with -inf. A row whose maximum is -inf has only -inf left:
  // its remaining picks are the lowest unchosen experts (FillLowestUnchosen) and it takes no further rounds.
  __aicore__ inline void SelectTopKRows(const LocalTensor<float>& keys, const LocalTensor<float>& ex,
                                        const LocalTensor<float>& yf, const LocalTensor<int32_t>& idx, uint32_t rows) {
    const uint32_t xs = t_.x_row_stride, ys = t_.y_row_stride, is = t_.idx_row_stride;
    const bool gatherExp = t_.renorm == 0;
    LocalTensor<float> vals = rowVals_.Get<float>();
    LocalTensor<uint32_t> bits = vals.template ReinterpretCast<uint32_t>();
    LocalTensor<int32_t> done = rowDone_.Get<int32_t>();
    VectorToScalar();
    for (uint32_t r = 0; r < rows; ++r) done.SetValue(r, 0);
    ScalarToVector();
    for (uint32_t j = 0; j < t_.k; ++j) {
      WholeReduceMax(vals, keys, int32_t(t_.experts), int32_t(rows), 1, 1, int32_t(xs / 8),
                     ReduceOrder::ORDER_VALUE_INDEX);
      VectorToScalar();
      for (uint32_t r = 0; r < rows; ++r) {
        if (done.GetValue(r) != 0) continue;
        const float best = vals.GetValue(2 * r);
        if (best == NegInf()) {
          FillLowestUnchosen(j, yf[r * ys], idx[r * is], gatherExp, ex[r * xs]);
          done.SetValue(r, 1);
          continue;
        }
        const uint32_t e = bits.GetValue(2 * r + 1);
        idx.SetValue(r * is + j, int32_t(e));
        yf.SetValue(r * ys + j, gatherExp ? ex.GetValue(r * xs + e) : best);
        keys.SetValue(r * xs + e, NegInf());
      }
      ScalarToVector();
    }
  }

  // Finished rows get expert E; row_idx[i, j] = j*N + i (scalar writes, after the tile's vector work; both paths).
  __aicore__ inline void FlagsAndRowIdx(uint32_t first, uint32_t rows, const LocalTensor<uint8_t>& fin,
                                        const LocalTensor<int32_t>& idx, const LocalTensor<int32_t>& rowIdx) {
    if (!t_.has_finished && !t_.want_row_idx) return;
    VectorToScalar();
    for (uint32_t r = 0; r < rows; ++r) {
      const uint32_t row = rowStart_ + first + r;
      if (t_.has_finished && fin.GetValue(r) != 0)
        for (uint32_t j = 0; j < t_.k; ++j) idx.SetValue(r * t_.idx_row_stride + j, int32_t(t_.experts));
      if (t_.want_row_idx)
        for (uint32_t j = 0; j < t_.k; ++j) rowIdx.SetValue(r * t_.idx_row_stride + j, int32_t(j * t_.rows + row));
    }
    ScalarToVector();
  }

  // The logits as fp32 selection keys (row stride x_row_stride): the input tile itself for fp32, a cast copy
  // (exact: every fp16/bf16 value is an fp32 value) otherwise. The -inf padding is cast along.
  __aicore__ inline LocalTensor<float> Keys(const LocalTensor<T>& x, uint32_t rows) {
    if constexpr (kIsFloat) {
      return x;
    } else {
      LocalTensor<float> keys = keysBuf_.Get<float>();
      Cast(keys, x, RoundMode::CAST_NONE, rows * t_.x_row_stride);
      return keys;
    }
  }

  __aicore__ inline LocalTensor<float> YFloat(const LocalTensor<T>& y) {
    if constexpr (kIsFloat) return y;
    else return yFloatBuf_.Get<float>();
  }

  // exp(logits - max) into expBuf_ (kept for the gather of y); returns 1/sum. With `smRow` non-empty also writes
  // the probabilities there.
  __aicore__ inline float SoftmaxRow(const LocalTensor<float>& logits, const LocalTensor<float>& smRow) {
    LocalTensor<float> ex = expBuf_.Get<float>();
    LocalTensor<float> res = resBuf_.Get<float>();
    LocalTensor<float> tmp = tmpBuf_.Get<float>();
    const int32_t e = int32_t(t_.experts);
    ReduceMax(res, logits, tmp, e, false);
    VectorToScalar();
    const float rowMax = res.GetValue(0);
    Adds(ex, logits, -rowMax, e);
    Exp(ex, ex, e);
    ReduceSum(res[8], ex, tmp, e);
    VectorToScalar();
    const float inv = 1.0f / res.GetValue(8);
    if (t_.want_softmax) Muls(smRow, ex, inv, e);
    return inv;
  }

  // v <- exp(v - max(v)) over n elements; returns 1/sum.
  __aicore__ inline float SoftmaxInPlace(const LocalTensor<float>& v, uint32_t n) {
    LocalTensor<float> res = resBuf_.Get<float>();
    LocalTensor<float> tmp = tmpBuf_.Get<float>();
    ReduceMax(res, v, tmp, int32_t(n), false);
    VectorToScalar();
    Adds(v, v, -res.GetValue(0), int32_t(n));
    Exp(v, v, int32_t(n));
    ReduceSum(res[8], v, tmp, int32_t(n));
    VectorToScalar();
    return 1.0f / res.GetValue(8);
  }

  // k rounds of ReduceMax with index; idxRow gets the experts, yRow the exp (renorm 0) or the logit (renorm 1).
  // Destroys the row's logits (winners become -inf).
  __aicore__ inline void SelectTopK(const LocalTensor<float>& logits, const LocalTensor<float>& yRow,
                                    const LocalTensor<int32_t>& idxRow) {
    LocalTensor<float> res = resBuf_.Get<float>();
    LocalTensor<float> tmp = tmpBuf_.Get<float>();
    LocalTensor<float> ex = expBuf_.Get<float>();
    const bool gatherExp = t_.renorm == 0;
    for (uint32_t j = 0; j < t_.k; ++j) {
      ReduceMax(res, logits, tmp, int32_t(t_.experts), true);
      VectorToScalar();
      const float best = res.GetValue(0);
      if (best == NegInf()) {  // only -inf left: the lowest unchosen experts, in order
        FillLowestUnchosen(j, yRow, idxRow, gatherExp, ex);
        break;
      }
      const uint32_t e = res.template ReinterpretCast<uint32_t>().GetValue(1);
      idxRow.SetValue(j, int32_t(e));
      yRow.SetValue(j, gatherExp ? ex.GetValue(e) : best);
      logits.SetValue(e, NegInf());
      ScalarToVector();
    }
    ScalarToVector();
  }

  __aicore__ inline void FillLowestUnchosen(uint32_t from, const LocalTensor<float>& yRow,
                                            const LocalTensor<int32_t>& idxRow, bool gatherExp,
                                            const LocalTensor<float>& ex) {
    uint32_t j = from;
    for (uint32_t e = 0; e < t_.experts && j < t_.k; ++e) {
      bool chosen = false;
      for (uint32_t i = 0; i < from && !chosen; ++i) chosen = idxRow.GetValue(i) == int32_t(e);
      if (chosen) continue;
      idxRow.SetValue(j, int32_t(e));
      yRow.SetValue(j, gatherExp ? ex.GetValue(e) : NegInf());
      ++j;
    }
  }

  Tiling t_;
  uint32_t rowStart_ = 0, rowCount_ = 0;
  GlobalTensor<T> xGm_, yGm_;
  GlobalTensor<int32_t> idxGm_, rowGm_;
  GlobalTensor<uint8_t> finGm_;
  GlobalTensor<float> smGm_;
  TQue<TPosition::VECIN, 2> inX_, inFin_;
  TQue<TPosition::VECOUT, 2> outY_, outIdx_, outRow_, outSm_;
  TBuf<TPosition::VECCALC> keysBuf_, expBuf_, yFloatBuf_, tmpBuf_, resBuf_, rowVals_, rowBcast_, rowDone_;
};

template <typename T>
__aicore__ inline void Run(GM_ADDR x, GM_ADDR finished, GM_ADDR y, GM_ADDR expertIdx, GM_ADDR rowIdx,
                           GM_ADDR softmaxOut, const Tiling& tiling) {
  TPipe pipe;
  KernelMoeGating<T> op;
  op.Init(x, finished, y, expertIdx, rowIdx, softmaxOut, tiling, &pipe);
  op.Process();
}

}  // namespace moe_gating_kernel

// x [N, E] (fp32/fp16/bf16), finished [N] bool or null -> y [N, k] (x's dtype), expert_idx [N, k] int32,
// row_idx [N, k] int32 (when tiling.want_row_idx), softmax_out [N, E] fp32 (when tiling.want_softmax).
extern "C" __global__ __aicore__ void moe_gating_top_k_softmax_kernel(GM_ADDR x, GM_ADDR finished, GM_ADDR y,
                                                                      GM_ADDR expertIdx, GM_ADDR rowIdx,
                                                                      GM_ADDR softmaxOut, GM_ADDR workspace,
                                                                      GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  const moe_gating_kernel::Tiling t = *reinterpret_cast<__gm__ moe_gating_kernel::Tiling*>(tiling);
  if (t.dtype == uint32_t(tot_ascendc::GatingDtype::kFloat16))
    moe_gating_kernel::Run<half>(x, finished, y, expertIdx, rowIdx, softmaxOut, t);
  else if (t.dtype == uint32_t(tot_ascendc::GatingDtype::kBFloat16))
    moe_gating_kernel::Run<bfloat16_t>(x, finished, y, expertIdx, rowIdx, softmaxOut, t);
  else
    moe_gating_kernel::Run<float>(x, finished, y, expertIdx, rowIdx, softmaxOut, t);
}
