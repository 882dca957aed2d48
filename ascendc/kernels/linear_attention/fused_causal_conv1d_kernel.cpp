// The fused causal conv1d (torch_npu npu_fused_causal_conv1d / _v2: Qwen3-Next's short depthwise conv over q, k, v
// with a conv-state cache updated in place) as a vector-only Ascend C kernel (AIV_MODE).
//
// A unit (channel block, sequence; see the tiling header) works on n <= `channels` channels, every UB row of pitch
// `channels`:
//   window   the K-1 padded rows token 0's conv reads before its own row (cached rows of the line from `offset`, or
//            zeros without an initial state), in fp32 (rows 0 .. K-2 of the window buffer);
//   cache    the line keeps the last min(C, prefix + len) padded rows: the cached rows that survive are moved inside
//            the line first (through UB, in chunks ordered so that no row is overwritten before it is read), the
//            sequence's last min(C, len) rows of x are written from UB as their tiles pass;
//   tiles    `rows` rows of x at a time, in fp32 after the K-1 carried rows: out = sum_k w[k] * window[k .. k+r)
//            (one Mul per 64 lanes with the weight row broadcast over the rows: src1 repeat stride 0, then Add),
//            + bias (broadcast the same way), SiLU x / (1 + exp(-x)), zeros for the pangu reset rows, + x; rounded
//            once to the dtype and written to y; the last K-1 rows become the next tile's carried rows.
// A tile's rows of x are in UB before its rows of y are written, and nothing reads x behind the tile, so y may be x
// (the in-place _v2 op). Units own disjoint channels of disjoint lines: no synchronisation between cores.
//
// Arguments: x, y [tokens, dim]; weight [K, dim]; bias [dim] (only with has_bias, else any GM buffer, never read);
// seq_table int32 [seqs, kConvSeqFields]; conv_states [slots, C, dim] (read and written). No workspace.
#include "kernel_operator.h"

#include "common/vector_helpers.h"

#include "linear_attention/fused_causal_conv1d_tiling.h"
#include "linear_attention/fused_causal_conv1d_kernel.h"

using namespace AscendC;
using tot_ascendc::PipeSync;

namespace {

constexpr uint32_t kLanes = 64;  // fp32 elements per vector repeat
constexpr uint32_t kBlockFloats = 8;

template <typename T>
class CausalConv {
 public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR weight, GM_ADDR bias, GM_ADDR seq_table, GM_ADDR conv_states,
                              GM_ADDR y, const tot_ascendc::CausalConvTiling& t) {
    t_ = t;
    const uint64_t rowsX = uint64_t(t.tokens) * t.dim;
    if (rowsX > 0) {
      xGm_.SetGlobalBuffer((__gm__ T*)x, rowsX);
      yGm_.SetGlobalBuffer((__gm__ T*)y, rowsX);
    }
    wGm_.SetGlobalBuffer((__gm__ T*)weight, uint64_t(t.width) * t.dim);
    if (t.has_bias) biasGm_.SetGlobalBuffer((__gm__ T*)bias, t.dim);
    seqGm_.SetGlobalBuffer((__gm__ int32_t*)seq_table, uint64_t(t.seqs) * tot_ascendc::kConvSeqFields);
    if (t.state_len > 0) stGm_.SetGlobalBuffer((__gm__ T*)conv_states, t.slots * t.state_len * t.dim);
    InitBuffers();
  }

  __aicore__ inline void Process() {
    const uint32_t core = uint32_t(GetBlockIdx());
    const uint32_t end = tot_ascendc::ConvUnitBegin(t_, core + 1);
    for (uint32_t unit = tot_ascendc::ConvUnitBegin(t_, core); unit < end; ++unit) RunUnit(unit);
  }

 private:
  __aicore__ inline void InitBuffers() {
    const uint32_t d = t_.channels, r = t_.rows, k = t_.width;
    pipe_.InitBuffer(w_, k * d * sizeof(float));
    if (t_.has_bias) pipe_.InitBuffer(bias_, d * sizeof(float));
    pipe_.InitBuffer(win_, (k - 1 + r) * d * sizeof(float));
    pipe_.InitBuffer(out_, r * d * sizeof(float));
    pipe_.InitBuffer(tmp_, r * d * sizeof(float));
    pipe_.InitBuffer(stage_, t_.stage_rows * d * sizeof(T));
    if (!IsFloat()) pipe_.InitBuffer(yOut_, r * d * sizeof(T));
    // A copy writes a row's n channels padded to 32 bytes; the columns past that up to the pitch are never written
    // by a copy and must hold numbers once (they only ever meet their own column: never stored).
    Duplicate(stage_.Get<T>(), T(0.f), int32_t(t_.stage_rows * d));
  }

  __aicore__ inline bool IsFloat() const { return sizeof(T) == sizeof(float); }

  // ---- one unit: channels [c0, c0 + n) of one sequence ----

  __aicore__ inline void RunUnit(uint32_t unit) {
    const uint32_t block = unit / t_.seqs, seq = unit % t_.seqs;
    const uint32_t c0 = block * t_.channels;
    const uint32_t n = t_.dim - c0 < t_.channels ? t_.dim - c0 : t_.channels;
    if (block != loadedBlock_) LoadWeights(c0, n);
    loadedBlock_ = block;
    const uint64_t row = uint64_t(seq) * tot_ascendc::kConvSeqFields;
    const uint32_t start = uint32_t(seqGm_.GetValue(row + tot_ascendc::kConvStart));
    const uint32_t len = uint32_t(seqGm_.GetValue(row + tot_ascendc::kConvLen));
    const int32_t readLine = seqGm_.GetValue(row + tot_ascendc::kConvReadLine);
    const uint32_t offset = uint32_t(seqGm_.GetValue(row + tot_ascendc::kConvOffset));
    const uint32_t writeLine = uint32_t(seqGm_.GetValue(row + tot_ascendc::kConvWriteLine));
    const uint32_t reset = uint32_t(seqGm_.GetValue(row + tot_ascendc::kConvReset));
    const uint32_t prefix = (readLine < 0 ? 0 : offset) + t_.width - 1;
    if (!LoadLineOnce(readLine, offset, prefix, len, c0, n)) {
      LoadWindow(readLine, offset, c0, n);
      MoveCachedRows(readLine, writeLine, prefix, len, c0, n);
    }
    for (uint32_t t0 = 0; t0 < len; t0 += t_.rows) {
      const uint32_t r = len - t0 < t_.rows ? len - t0 : t_.rows;
      Tile(start, len, t0, r, writeLine, reset, c0, n);
    }
  }

  // GM offset of row `row` of cache line `line`, channel c0.
  __aicore__ inline uint64_t LineRow(uint32_t line, uint32_t row, uint32_t c0) const {
    return (uint64_t(line) * t_.state_len + row) * t_.dim + c0;
  }

  // `count` rows of n channels (GM pitch dim) into UB rows of pitch `channels`, padded with zeros to 32 bytes.
  __aicore__ inline void RowsIn(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t count, uint32_t n) {
    const uint32_t lane = 32 / sizeof(T), padded = (n + lane - 1) / lane * lane;
    const DataCopyExtParams params(uint16_t(count), uint32_t(n * sizeof(T)), uint32_t((t_.dim - n) * sizeof(T)),
                                   uint32_t((t_.channels - padded) / lane), 0);
    DataCopyPad(dst, src, params, DataCopyPadExtParams<T>(true, 0, uint8_t(padded - n), T(0.f)));
  }

  // `count` UB rows (pitch `channels`) to GM rows of n channels (pitch dim).
  __aicore__ inline void RowsOut(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t count, uint32_t n) {
    const uint32_t lane = 32 / sizeof(T), padded = (n + lane - 1) / lane * lane;
    DataCopyPad(dst, src, DataCopyExtParams(uint16_t(count), uint32_t(n * sizeof(T)),
                                            uint32_t((t_.channels - padded) / lane),
                                            uint32_t((t_.dim - n) * sizeof(T)), 0));
  }

  // dst = src in fp32 (`count` values). fp32 rows are multiplied by 1, which keeps every value (and -0) as it is.
  __aicore__ inline void ToFloat(const LocalTensor<float>& dst, const LocalTensor<T>& src, uint32_t count) {
    if constexpr (sizeof(T) == sizeof(float)) {
      Muls(dst, src.template ReinterpretCast<float>(), 1.f, int32_t(count));
    } else {
      Cast(dst, src, RoundMode::CAST_NONE, count);
    }
  }

  // The block's K weight rows (and bias) in fp32.
  __aicore__ inline void LoadWeights(uint32_t c0, uint32_t n) {
    const uint32_t d = t_.channels;
    LocalTensor<T> stage = stage_.Get<T>();
    PipeSync<HardEvent::V_MTE2>();   // the previous unit's vector work has read the staging rows
    PipeSync<HardEvent::MTE3_MTE2>();  // and its last store has too
    RowsIn(stage, wGm_[c0], t_.width, n);
    PipeSync<HardEvent::MTE2_V>();
    ToFloat(w_.Get<float>(), stage, t_.width * d);
    if (t_.has_bias) {
      PipeSync<HardEvent::V_MTE2>();
      RowsIn(stage, biasGm_[c0], 1, n);
      PipeSync<HardEvent::MTE2_V>();
      ToFloat(bias_.Get<float>(), stage, d);
    }
  }

  // The K-1 padded rows before token 0's own row, in fp32, to rows 0 .. K-2 of the window.
  __aicore__ inline void LoadWindow(int32_t readLine, uint32_t offset, uint32_t c0, uint32_t n) {
    const uint32_t carried = t_.width - 1;
    if (carried == 0) return;
    LocalTensor<float> win = win_.Get<float>();
    PipeSync<HardEvent::MTE3_V>();  // the previous unit's stores from the window are done
    if (readLine < 0) {
      Duplicate(win, 0.f, int32_t(carried * t_.channels));
      return;
    }
    LocalTensor<T> stage = stage_.Get<T>();
    PipeSync<HardEvent::V_MTE2>();
    PipeSync<HardEvent::MTE3_MTE2>();
    RowsIn(stage, stGm_[LineRow(uint32_t(readLine), offset, c0)], carried, n);
    PipeSync<HardEvent::MTE2_V>();
    ToFloat(win, stage, carried * t_.channels);
  }

  // The window and the cached rows that stay in the line (see MoveCachedRows) from one read of the line's rows
  // [min(offset, first kept), prefix), when they fit the staging rows (a decode step: K-1 rows); false otherwise.
  __aicore__ inline bool LoadLineOnce(int32_t readLine, uint32_t offset, uint32_t prefix, uint32_t len, uint32_t c0,
                                      uint32_t n) {
    if (readLine < 0) return false;
    const uint64_t total = uint64_t(prefix) + len;
    const uint64_t kept = total < t_.state_len ? total : t_.state_len;
    const uint32_t src0 = total - kept < prefix ? uint32_t(total - kept) : prefix;  // prefix: nothing stays
    const uint32_t lo = src0 < offset ? src0 : offset, count = prefix - lo;
    if (count > t_.stage_rows) return false;
    if (count == 0) return true;  // K = 1 and no cached row stays
    const uint32_t d = t_.channels, carried = t_.width - 1, line = uint32_t(readLine);
    LocalTensor<T> stage = stage_.Get<T>();
    PipeSync<HardEvent::MTE3_V>();  // the previous unit's stores from the window are done
    PipeSync<HardEvent::V_MTE2>();
    PipeSync<HardEvent::MTE3_MTE2>();
    RowsIn(stage, stGm_[LineRow(line, lo, c0)], count, n);
    PipeSync<HardEvent::MTE2_V>();
    if (carried > 0) ToFloat(win_.Get<float>(), stage[(offset - lo) * d], carried * d);
    const uint32_t dst0 = uint32_t(t_.state_len - kept);
    if (src0 < prefix && dst0 != src0) {  // every row is in UB: the store may overlap what was read
      PipeSync<HardEvent::MTE2_MTE3>();
      RowsOut(stGm_[LineRow(line, dst0, c0)], stage[(src0 - lo) * d], prefix - src0, n);
    }
    return true;
  }

  // The cached rows that stay in the line: padded rows [total - kept, prefix) to line rows [C - kept, C - len)
  // (total = prefix + len, kept = min(C, total)); zeros without an initial state. The window was read before.
  __aicore__ inline void MoveCachedRows(int32_t readLine, uint32_t line, uint32_t prefix, uint32_t len, uint32_t c0,
                                        uint32_t n) {
    const uint64_t total = uint64_t(prefix) + len;
    const uint64_t kept = total < t_.state_len ? total : t_.state_len;
    const uint64_t src0 = total - kept;
    if (src0 >= prefix) return;  // the sequence's own rows fill the line
    const uint32_t count = uint32_t(prefix - src0), dst0 = uint32_t(t_.state_len - kept);
    LocalTensor<T> stage = stage_.Get<T>();
    PipeSync<HardEvent::V_MTE2>();
    PipeSync<HardEvent::MTE3_MTE2>();
    if (readLine < 0) {  // the K-1 zero rows (count <= K-1 <= stage_rows)
      PipeSync<HardEvent::MTE3_V>();
      Duplicate(stage, T(0.f), int32_t(count * t_.channels));
      PipeSync<HardEvent::V_MTE3>();
      RowsOut(stGm_[LineRow(line, dst0, c0)], stage, count, n);
      return;
    }
    if (dst0 == src0) return;  // same line, same rows
    // Chunks in the direction of the move, each read whole before it is written: a chunk's rows land where no
    // later chunk reads.
    const uint32_t chunk = t_.stage_rows, chunks = (count + chunk - 1) / chunk;
    for (uint32_t i = 0; i < chunks; ++i) {
      const uint32_t c = dst0 < src0 ? i : chunks - 1 - i;
      const uint32_t first = c * chunk, m = count - first < chunk ? count - first : chunk;
      PipeSync<HardEvent::MTE3_MTE2>();
      RowsIn(stage, stGm_[LineRow(line, uint32_t(src0) + first, c0)], m, n);
      PipeSync<HardEvent::MTE2_MTE3>();
      RowsOut(stGm_[LineRow(line, dst0 + first, c0)], stage, m, n);
    }
  }

  // Rows [t0, t0 + r) of the sequence: loads x, stores the rows the line keeps, computes and stores y.
  __aicore__ inline void Tile(uint32_t start, uint32_t len, uint32_t t0, uint32_t r, uint32_t line, uint32_t reset,
                              uint32_t c0, uint32_t n) {
    const uint32_t d = t_.channels, carried = t_.width - 1;
    LocalTensor<T> stage = stage_.Get<T>();
    LocalTensor<float> win = win_.Get<float>(), out = out_.Get<float>(), tmp = tmp_.Get<float>();
    const uint64_t at = (uint64_t(start) + t0) * t_.dim + c0;
    PipeSync<HardEvent::V_MTE2>();
    PipeSync<HardEvent::MTE3_MTE2>();
    RowsIn(stage, xGm_[at], r, n);
    PipeSync<HardEvent::MTE2_V>();
    PipeSync<HardEvent::MTE3_V>();  // the previous tile's outputs are stored
    ToFloat(win[carried * d], stage, r * d);
    // the sequence's last min(C, len) rows of x go to the line's last rows
    const uint32_t fromX = len < t_.state_len ? len : t_.state_len;
    const uint32_t lo = t0 > len - fromX ? t0 : len - fromX;
    if (lo < t0 + r) RowsOut(stGm_[LineRow(line, t_.state_len - len + lo, c0)], stage[(lo - t0) * d], t0 + r - lo, n);

    Conv(win, out, tmp, r);
    Epilogue(win, out, tmp, t0, r, reset);
    if constexpr (sizeof(T) == sizeof(float)) {
      PipeSync<HardEvent::V_MTE3>();
      RowsOut(yGm_[at], out.template ReinterpretCast<T>(), r, n);
    } else {
      LocalTensor<T> staged = yOut_.Get<T>();
      Cast(staged, out, RoundMode::CAST_RINT, r * d);
      PipeSync<HardEvent::V_MTE3>();
      RowsOut(yGm_[at], staged, r, n);
    }
    if (t0 + r < len) {
      // the last K-1 rows of the window are the next tile's carried rows (row by row, upwards: a row is read
      // before it is overwritten even when the tile is shorter than K-1)
      for (uint32_t j = 0; j < carried; ++j) Muls(win[j * d], win[(r + j) * d], 1.f, int32_t(d));
    }
  }

  // out[i] = sum_k w[k] * window[i + k], i < r.
  __aicore__ inline void Conv(const LocalTensor<float>& win, const LocalTensor<float>& out,
                              const LocalTensor<float>& tmp, uint32_t r) {
    const uint32_t d = t_.channels;
    const uint8_t pitch = uint8_t(d / kBlockFloats);
    LocalTensor<float> w = w_.Get<float>();
    for (uint32_t k = 0; k < t_.width; ++k) {
      const LocalTensor<float>& dst = k == 0 ? out : tmp;
      for (uint32_t c = 0; c < d; c += kLanes) {
        const uint64_t lanes = d - c < kLanes ? d - c : kLanes;
        Mul(dst[c], win[k * d + c], w[k * d + c], lanes, uint8_t(r), BinaryRepeatParams(1, 1, 1, pitch, pitch, 0));
      }
      if (k > 0) Add(out, out, tmp, int32_t(r * d));
    }
  }

  // + bias, SiLU, the pangu reset rows to 0, + x.
  __aicore__ inline void Epilogue(const LocalTensor<float>& win, const LocalTensor<float>& out,
                                  const LocalTensor<float>& tmp, uint32_t t0, uint32_t r, uint32_t reset) {
    const uint32_t d = t_.channels;
    const int32_t count = int32_t(r * d);
    if (t_.has_bias) {
      const uint8_t pitch = uint8_t(d / kBlockFloats);
      LocalTensor<float> bias = bias_.Get<float>();
      for (uint32_t c = 0; c < d; c += kLanes) {
        const uint64_t lanes = d - c < kLanes ? d - c : kLanes;
        Add(out[c], out[c], bias[c], lanes, uint8_t(r), BinaryRepeatParams(1, 1, 1, pitch, pitch, 0));
      }
    }
    if (t_.silu) {
      Muls(tmp, out, -1.f, count);
      Exp(tmp, tmp, count);
      Adds(tmp, tmp, 1.f, count);
      Div(out, out, tmp, count);
    }
    if (t0 < reset) {
      const uint32_t zero = reset - t0 < r ? reset - t0 : r;
      Duplicate(out, 0.f, int32_t(zero * d));
    }
    if (t_.residual) Add(out, out, win[(t_.width - 1) * d], count);
  }

  tot_ascendc::CausalConvTiling t_;
  uint32_t loadedBlock_ = 0xffffffffu;
  TPipe pipe_;
  TBuf<TPosition::VECCALC> w_, bias_, win_, out_, tmp_, stage_, yOut_;
  GlobalTensor<T> xGm_, yGm_, wGm_, biasGm_, stGm_;
  GlobalTensor<int32_t> seqGm_;
};

template <typename T>
__aicore__ inline void RunConv(GM_ADDR x, GM_ADDR weight, GM_ADDR bias, GM_ADDR seq_table, GM_ADDR conv_states,
                               GM_ADDR y, const tot_ascendc::CausalConvTiling& t) {
  CausalConv<T> op;
  op.Init(x, weight, bias, seq_table, conv_states, y, t);
  op.Process();
}

}  // namespace

extern "C" __global__ __aicore__ void fused_causal_conv1d(GM_ADDR x, GM_ADDR weight, GM_ADDR bias,
                                                          GM_ADDR seq_table, GM_ADDR conv_states, GM_ADDR y,
                                                          GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  using tot_ascendc::ConvDtype;
  const tot_ascendc::CausalConvTiling t = *reinterpret_cast<__gm__ tot_ascendc::CausalConvTiling*>(tiling);
  if (t.dtype == uint32_t(ConvDtype::FP16)) {
    RunConv<half>(x, weight, bias, seq_table, conv_states, y, t);
  } else if (t.dtype == uint32_t(ConvDtype::BF16)) {
    RunConv<bfloat16_t>(x, weight, bias, seq_table, conv_states, y, t);
  } else {
    RunConv<float>(x, weight, bias, seq_table, conv_states, y, t);
  }
}
