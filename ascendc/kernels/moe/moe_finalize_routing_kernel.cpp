// MoE combine (CANN MoeFinalizeRouting / V2) as an Ascend C vector kernel (AIV_MODE):
//   out[i] = skip1[i] + skip2[i] + sum_j scales[i, j] * (rows[r] + bias[expert[i, j]]),  r = src_to_dst[f],
// f = j*N + i (modes 0/1) or i*k + j (modes 2/3); r = -1 (a dropped pair) contributes nothing.
//
// Every AIV takes a contiguous share of the N tokens (tiling: moe_finalize_routing_tiling.h) and, per token, each
// chunk of `h_tile` hidden values: the skips start the fp32 accumulator, then for each routed pair the scalar unit
// reads r, the scale and the expert from GM, MTE2 brings the row chunk (and the bias chunk) through a TQue, and the
// vector unit adds scale * row (and scale * bias) with Axpy — in the CPU op's order, so results match it up to
// rounding. With double-buffered queues the next pair's chunks are copied in while the current pair is summed.
// The sum is cast once to the output dtype and written with DataCopyPad (the tail chunk is shorter, not padded).
#include "kernel_operator.h"
#include "moe/moe_finalize_routing_tiling.h"
#include "moe/moe_finalize_routing_kernel.h"

using namespace AscendC;

namespace moe_finalize_kernel {

using Tiling = tot_ascendc::MoeFinalizeRoutingTiling;

__aicore__ inline uint32_t MinU32(uint32_t a, uint32_t b) { return a < b ? a : b; }

template <typename T>
class KernelMoeFinalize {
 public:
  static constexpr bool kIsFloat = sizeof(T) == 4;

  __aicore__ inline void Init(GM_ADDR rows, GM_ADDR skip1, GM_ADDR skip2, GM_ADDR bias, GM_ADDR scales,
                              GM_ADDR srcToDst, GM_ADDR expertForRow, GM_ADDR out, const Tiling& tiling,
                              TPipe* pipe) {
    t_ = tiling;
    const uint32_t core = uint32_t(GetBlockIdx());
    tokenStart_ = core * t_.tokens_per_core + MinU32(core, t_.tokens_remainder);
    tokenCount_ = t_.tokens_per_core + (core < t_.tokens_remainder ? 1 : 0);
    const uint64_t h = t_.hidden, pairs = uint64_t(t_.tokens) * t_.k;
    rowsGm_.SetGlobalBuffer((__gm__ T*)rows, uint64_t(t_.rows) * h);
    outGm_.SetGlobalBuffer((__gm__ T*)out, uint64_t(t_.tokens) * h);
    dstGm_.SetGlobalBuffer((__gm__ int32_t*)srcToDst, pairs);
    if (t_.has_skip1) skip1Gm_.SetGlobalBuffer((__gm__ T*)skip1, uint64_t(t_.tokens) * h);
    if (t_.has_skip2) skip2Gm_.SetGlobalBuffer((__gm__ T*)skip2, uint64_t(t_.tokens) * h);
    if (t_.has_scales) scalesGm_.SetGlobalBuffer((__gm__ float*)scales, pairs);
    if (t_.has_bias) {
      biasGm_.SetGlobalBuffer((__gm__ T*)bias, uint64_t(t_.experts) * h);
      expertGm_.SetGlobalBuffer((__gm__ int32_t*)expertForRow, pairs);
    }

    // The same layout as tot_ascendc::MoeFinalizeUbBytes (the tiling's budget).
    const uint32_t bytes = t_.h_tile * uint32_t(sizeof(T)), bn = t_.buffer_num;
    pipe->InitBuffer(inRow_, bn, bytes);
    if (t_.has_bias) pipe->InitBuffer(inBias_, bn, bytes);
    if (t_.has_skip1 || t_.has_skip2) pipe->InitBuffer(inSkip_, bn, bytes);
    pipe->InitBuffer(outY_, bn, bytes);
    pipe->InitBuffer(acc_, t_.h_tile * uint32_t(sizeof(float)));
    if (!kIsFloat) pipe->InitBuffer(conv_, t_.h_tile * uint32_t(sizeof(float)));
  }

  __aicore__ inline void Process() {
    for (uint32_t n = 0; n < tokenCount_; ++n) {
      const uint32_t token = tokenStart_ + n;
      for (uint32_t c0 = 0; c0 < t_.hidden; c0 += t_.h_tile) {
        const uint32_t len = MinU32(t_.h_tile, t_.hidden - c0);  // the last chunk is the tail
        StartWithSkips(token, c0, len);
        AddPairs(token, c0, len);
        CopyOut(token, c0, len);
      }
    }
  }

 private:
  // One pair's operands as the scalar unit read them from GM.
  struct Pair {
    int32_t row = -1;
    int32_t expert = 0;
    float scale = 1.0f;
  };

  __aicore__ inline Pair ReadPair(uint32_t token, uint32_t j) {
    Pair p;
    const uint64_t f = t_.column_major ? uint64_t(j) * t_.tokens + token : uint64_t(token) * t_.k + j;
    p.row = dstGm_.GetValue(f);
    if (t_.has_scales) p.scale = scalesGm_.GetValue(uint64_t(token) * t_.k + j);
    if (t_.has_bias) p.expert = expertGm_.GetValue(uint64_t(token) * t_.k + j);
    return p;
  }

  // The next routed pair at or after j (k when none is left).
  __aicore__ inline uint32_t NextRouted(uint32_t token, uint32_t j, Pair* pair) {
    for (; j < t_.k; ++j) {
      *pair = ReadPair(token, j);
      if (pair->row >= 0) return j;
    }
    return t_.k;
  }

  __aicore__ inline void CopyChunk(TQue<TPosition::VECIN, 2>& que, const GlobalTensor<T>& gm, uint64_t offset,
                                   uint32_t len) {
    LocalTensor<T> ub = que.AllocTensor<T>();
    DataCopyPad(ub, gm[offset], DataCopyExtParams(1, len * uint32_t(sizeof(T)), 0, 0, 0),
                DataCopyPadExtParams<T>(false, 0, 0, T(0)));
    que.EnQue(ub);
  }

  __aicore__ inline void CopyInPair(const Pair& p, uint32_t c0, uint32_t len) {
    CopyChunk(inRow_, rowsGm_, uint64_t(p.row) * t_.hidden + c0, len);
    if (t_.has_bias) CopyChunk(inBias_, biasGm_, uint64_t(p.expert) * t_.hidden + c0, len);
  }

  // The fp32 values of a dequeued chunk: the chunk itself for fp32, else its cast into conv_.
  __aicore__ inline LocalTensor<float> AsFloat(const LocalTensor<T>& chunk, uint32_t len) {
    if constexpr (kIsFloat) {
      return chunk;
    } else {
      LocalTensor<float> f = conv_.Get<float>();
      Cast(f, chunk, RoundMode::CAST_NONE, int32_t(len));
      return f;
    }
  }

  // acc = skip1 + skip2 (each term optional; 0 without either), as the CPU op starts its sum: a lone skip is
  // added to 0 (so -0 becomes +0 there too).
  __aicore__ inline void StartWithSkips(uint32_t token, uint32_t c0, uint32_t len) {
    LocalTensor<float> acc = acc_.Get<float>();
    const uint64_t offset = uint64_t(token) * t_.hidden + c0;
    if (!t_.has_skip1 && !t_.has_skip2) {
      Duplicate(acc, 0.0f, int32_t(len));
      return;
    }
    if (t_.has_skip1) {
      CopyChunk(inSkip_, skip1Gm_, offset, len);
      LocalTensor<T> chunk = inSkip_.DeQue<T>();
      if (t_.has_skip2) Muls(acc, AsFloat(chunk, len), 1.0f, int32_t(len));
      else Adds(acc, AsFloat(chunk, len), 0.0f, int32_t(len));
      inSkip_.FreeTensor(chunk);
    }
    if (t_.has_skip2) {
      CopyChunk(inSkip_, skip2Gm_, offset, len);
      LocalTensor<T> chunk = inSkip_.DeQue<T>();
      if (t_.has_skip1) Add(acc, acc, AsFloat(chunk, len), int32_t(len));
      else Adds(acc, AsFloat(chunk, len), 0.0f, int32_t(len));
      inSkip_.FreeTensor(chunk);
    }
  }

  // acc += scale * row (+ scale * bias) for every routed pair; the next pair's chunks are in flight meanwhile.
  __aicore__ inline void AddPairs(uint32_t token, uint32_t c0, uint32_t len) {
    LocalTensor<float> acc = acc_.Get<float>();
    const bool prefetch = t_.buffer_num > 1;
    Pair cur, next;
    uint32_t j = NextRouted(token, 0, &cur);
    if (j < t_.k && prefetch) CopyInPair(cur, c0, len);
    while (j < t_.k) {
      const uint32_t after = NextRouted(token, j + 1, &next);
      if (after < t_.k && prefetch) CopyInPair(next, c0, len);
      if (!prefetch) CopyInPair(cur, c0, len);
      LocalTensor<T> row = inRow_.DeQue<T>();
      Axpy(acc, AsFloat(row, len), cur.scale, int32_t(len));
      inRow_.FreeTensor(row);
      if (t_.has_bias) {
        LocalTensor<T> b = inBias_.DeQue<T>();
        Axpy(acc, AsFloat(b, len), cur.scale, int32_t(len));
        inBias_.FreeTensor(b);
      }
      j = after;
      cur = next;
    }
  }

  __aicore__ inline void CopyOut(uint32_t token, uint32_t c0, uint32_t len) {
    LocalTensor<float> acc = acc_.Get<float>();
    LocalTensor<T> y = outY_.AllocTensor<T>();
    if constexpr (kIsFloat) Muls(y, acc, 1.0f, int32_t(len));  // exact copy into the queue's buffer
    else Cast(y, acc, RoundMode::CAST_RINT, int32_t(len));
    outY_.EnQue(y);
    y = outY_.DeQue<T>();
    DataCopyPad(outGm_[uint64_t(token) * t_.hidden + c0], y, DataCopyExtParams(1, len * uint32_t(sizeof(T)), 0, 0, 0));
    outY_.FreeTensor(y);
  }

  Tiling t_;
  uint32_t tokenStart_ = 0, tokenCount_ = 0;
  GlobalTensor<T> rowsGm_, skip1Gm_, skip2Gm_, biasGm_, outGm_;
  GlobalTensor<int32_t> dstGm_, expertGm_;
  GlobalTensor<float> scalesGm_;
  TQue<TPosition::VECIN, 2> inRow_, inBias_, inSkip_;
  TQue<TPosition::VECOUT, 2> outY_;
  TBuf<TPosition::VECCALC> acc_, conv_;
};

template <typename T>
__aicore__ inline void Run(GM_ADDR rows, GM_ADDR skip1, GM_ADDR skip2, GM_ADDR bias, GM_ADDR scales,
                           GM_ADDR srcToDst, GM_ADDR expertForRow, GM_ADDR out, const Tiling& tiling) {
  TPipe pipe;
  KernelMoeFinalize<T> op;
  op.Init(rows, skip1, skip2, bias, scales, srcToDst, expertForRow, out, tiling, &pipe);
  op.Process();
}

}  // namespace moe_finalize_kernel

// expanded_rows [R, H], skip1/skip2 [N, H] or null, bias [E, H] or null (all of the output's dtype: fp32/fp16/bf16),
// scales [N, k] fp32 or null, src_to_dst [N*k] int32, expert_for_row [N, k] int32 (with bias) -> out [N, H].
extern "C" __global__ __aicore__ void moe_finalize_routing_kernel(GM_ADDR expandedRows, GM_ADDR skip1, GM_ADDR skip2,
                                                                  GM_ADDR bias, GM_ADDR scales, GM_ADDR srcToDst,
                                                                  GM_ADDR expertForRow, GM_ADDR out,
                                                                  GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  const moe_finalize_kernel::Tiling t = *reinterpret_cast<__gm__ moe_finalize_kernel::Tiling*>(tiling);
  if (t.dtype == uint32_t(tot_ascendc::FinalizeDtype::kFloat16))
    moe_finalize_kernel::Run<half>(expandedRows, skip1, skip2, bias, scales, srcToDst, expertForRow, out, t);
  else if (t.dtype == uint32_t(tot_ascendc::FinalizeDtype::kBFloat16))
    moe_finalize_kernel::Run<bfloat16_t>(expandedRows, skip1, skip2, bias, scales, srcToDst, expertForRow, out, t);
  else
    moe_finalize_kernel::Run<float>(expandedRows, skip1, skip2, bias, scales, srcToDst, expertForRow, out, t);
}
