// The recurrent gated delta rule (CANN RecurrentGatedDeltaRule, Gated DeltaNet / Kimi Delta Attention decode) as a
// vector-only Ascend C kernel (AIV_MODE).
//
// A unit (sequence b, value head h, block of state rows; see the tiling header) loads its rows of the sequence's
// first slot into UB in fp32 and keeps them there through the sequence's tokens. Per token, on the unit's n rows of
// Dk (pitch dk_pad, zero columns past Dk):
//   decay    S *= a diag(ak): the row exp(g) (* exp(gk)) multiplied into every state row (one Mul per 64 lanes
//            with the decay row broadcast over the rows: src1 repeat stride 0);
//   S k      x = S k, the RowDots GEMV of common/vector_helpers.h;
//   update   y = beta (v - x), broadcast to one DataBlock per row (Brcb), S += y kᵀ: one Mul per 64 lanes with k
//            broadcast over the rows and y over the lanes (src1 block stride 0), then one Add;
//   output   o = scale S q (RowDots, Muls), in the inputs' dtype to out[t, h, rows];
//   state    the rows, in the state's dtype, to the token's slot.
// The state is carried in fp32 between tokens (not re-rounded to a 16-bit cache's dtype), as the CPU op does.
//
// Arguments: query, key [T, Nk, Dk]; value [T, Nv, Dv]; beta, g fp32 [T, Nv] and gk fp32 [T, Nv, Dk] (each only
// when the tiling's has_* flag is set, else any GM buffer, never read); seq_table int32 [B + 1, 2] = (first token,
// first slot) per sequence, the last row (T, 0); slot_table int32 [T]; state [slots, Nv, Dv, Dk] (read and written);
// out [T, Nv, Dv]. No workspace.
#include "kernel_operator.h"

#include "common/vector_helpers.h"

#include "linear_attention/recurrent_gated_delta_rule_tiling.h"
#include "linear_attention/recurrent_gated_delta_rule_kernel.h"

using namespace AscendC;
using tot_ascendc::PipeSync;

namespace {

constexpr uint32_t kLanes = 64;  // fp32 elements per vector repeat
constexpr uint32_t kBlockFloats = 8;

// T: query / key / value / out; S: the state cache (T or float).
template <typename T, typename S>
class RecurrentGdr {
 public:
  __aicore__ inline void Init(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR beta, GM_ADDR g, GM_ADDR gk,
                              GM_ADDR seq_table, GM_ADDR slot_table, GM_ADDR state, GM_ADDR out,
                              const tot_ascendc::RecurrentGdrTiling& t) {
    t_ = t;
    const uint64_t T_ = t.tokens;
    qGm_.SetGlobalBuffer((__gm__ T*)query, T_ * t.k_heads * t.dk);
    kGm_.SetGlobalBuffer((__gm__ T*)key, T_ * t.k_heads * t.dk);
    vGm_.SetGlobalBuffer((__gm__ T*)value, T_ * t.v_heads * t.dv);
    outGm_.SetGlobalBuffer((__gm__ T*)out, T_ * t.v_heads * t.dv);
    if (t.has_beta) betaGm_.SetGlobalBuffer((__gm__ float*)beta, T_ * t.v_heads);
    if (t.has_g) gGm_.SetGlobalBuffer((__gm__ float*)g, T_ * t.v_heads);
    if (t.has_gk) gkGm_.SetGlobalBuffer((__gm__ float*)gk, T_ * t.v_heads * t.dk);
    seqGm_.SetGlobalBuffer((__gm__ int32_t*)seq_table, (uint64_t(t.batch) + 1) * 2);
    slotGm_.SetGlobalBuffer((__gm__ int32_t*)slot_table, T_);
    stateGm_.SetGlobalBuffer((__gm__ S*)state, t.slots * t.v_heads * t.dv * t.dk);
    InitBuffers();
  }

  __aicore__ inline void Process() {
    const uint32_t core = uint32_t(GetBlockIdx());
    const uint32_t end = tot_ascendc::GdrUnitBegin(t_, core + 1);
    for (uint32_t unit = tot_ascendc::GdrUnitBegin(t_, core); unit < end; ++unit) RunUnit(unit);
  }

 private:
  __aicore__ inline void InitBuffers() {
    const uint32_t r = t_.rows, d = t_.dk_pad;
    pipe_.InitBuffer(sF_, r * d * sizeof(float));
    pipe_.InitBuffer(prod_, r * d * sizeof(float));
    if (!StateIsFloat()) pipe_.InitBuffer(sIn_, r * d * sizeof(S));
    pipe_.InitBuffer(qF_, d * sizeof(float));
    pipe_.InitBuffer(kF_, d * sizeof(float));
    if (!InputIsFloat()) {
      pipe_.InitBuffer(qIn_, d * sizeof(T));
      pipe_.InitBuffer(kIn_, d * sizeof(T));
    }
    pipe_.InitBuffer(decay_, d * sizeof(float));
    if (t_.has_gk) pipe_.InitBuffer(gkIn_, d * sizeof(float));
    pipe_.InitBuffer(vF_, r * sizeof(float));
    pipe_.InitBuffer(x_, r * sizeof(float));
    pipe_.InitBuffer(o_, r * sizeof(float));
    pipe_.InitBuffer(yb_, r * kBlockFloats * sizeof(float));
    if (!InputIsFloat()) {
      pipe_.InitBuffer(vIn_, (r * sizeof(T) + 31) / 32 * 32);
      pipe_.InitBuffer(oOut_, (r * sizeof(T) + 31) / 32 * 32);
    }
    // fp32 rows are loaded straight into these (DataCopyPad pads to 8 values, the pitch is 16): the columns in
    // between are never written by a copy and must be zero once (they stay zero: every product with them is 0).
    Duplicate(qF_.Get<float>(), 0.f, int32_t(d));
    Duplicate(kF_.Get<float>(), 0.f, int32_t(d));
    if (t_.has_gk) Duplicate(gkIn_.Get<float>(), 0.f, int32_t(d));
  }

  __aicore__ inline bool InputIsFloat() const { return sizeof(T) == sizeof(float); }
  __aicore__ inline bool StateIsFloat() const { return sizeof(S) == sizeof(float); }

  // ---- one unit: rows [row0, row0 + n) of (sequence b, value head h) through the sequence's tokens ----

  __aicore__ inline void RunUnit(uint32_t unit) {
    const uint32_t item = unit / t_.row_blocks, block = unit % t_.row_blocks;
    const uint32_t b = item / t_.v_heads, h = item % t_.v_heads;
    const uint32_t row0 = block * t_.rows;
    const uint32_t n = t_.dv - row0 < t_.rows ? t_.dv - row0 : t_.rows;
    const int32_t first = seqGm_.GetValue(uint64_t(b) * 2), last = seqGm_.GetValue(uint64_t(b) * 2 + 2);
    LoadState(uint32_t(seqGm_.GetValue(uint64_t(b) * 2 + 1)), h, row0, n);
    for (int32_t tok = first; tok < last; ++tok) {
      const uint32_t t = uint32_t(tok);
      LoadToken(t, h, row0, n);
      Decay(t, h, n);
      Update(t, h, n);
      Output(t, h, row0, n);
      StoreState(uint32_t(slotGm_.GetValue(t)), h, row0, n);
    }
  }

  // GM offset of row `row` of (slot, head h) in the state cache.
  __aicore__ inline uint64_t StateRow(uint32_t slot, uint32_t h, uint32_t row) const {
    return ((uint64_t(slot) * t_.v_heads + h) * t_.dv + row) * t_.dk;
  }

  // `count` rows of Dk values (GM pitch `pitch` elements) into UB rows of pitch dk_pad: the 16-bit rows padded to
  // dk_pad, the fp32 rows to a multiple of 8 (then a one-DataBlock gap when Dk rounds to 8 mod 16).
  template <typename U>
  __aicore__ inline void CopyRowsIn(const LocalTensor<U>& dst, const GlobalTensor<U>& src, uint32_t count,
                                    uint64_t pitch) {
    const uint32_t lane = 32 / sizeof(U), padded = (t_.dk + lane - 1) / lane * lane;
    const DataCopyExtParams params(uint16_t(count), uint32_t(t_.dk * sizeof(U)), uint32_t((pitch - t_.dk) * sizeof(U)),
                                   uint32_t((t_.dk_pad - padded) / lane), 0);
    const DataCopyPadExtParams<U> pad(true, 0, uint8_t(padded - t_.dk), U(0.f));
    DataCopyPad(dst, src, params, pad);
  }

  // The unit's rows of the first slot, in fp32 (the padding columns zero).
  __aicore__ inline void LoadState(uint32_t slot, uint32_t h, uint32_t row0, uint32_t n) {
    LocalTensor<float> s = sF_.Get<float>();
    const uint64_t at = StateRow(slot, h, row0);
    if constexpr (sizeof(S) == sizeof(float)) {
      Duplicate(s, 0.f, int32_t(n * t_.dk_pad));  // the gap columns a copy does not write
      PipeSync<HardEvent::V_MTE2>();
      CopyRowsIn(s.template ReinterpretCast<S>(), stateGm_[at], n, t_.dk);
      PipeSync<HardEvent::MTE2_V>();
    } else {
      LocalTensor<S> in = sIn_.Get<S>();
      PipeSync<HardEvent::MTE3_MTE2>();  // the previous unit's last store has read the staging rows
      CopyRowsIn(in, stateGm_[at], n, t_.dk);
      PipeSync<HardEvent::MTE2_V>();
      Cast(s, in, RoundMode::CAST_NONE, n * t_.dk_pad);
    }
  }

  // The token's q and k rows (key head h / group), its v values of the unit's rows and, with gk, its gk row.
  __aicore__ inline void LoadToken(uint32_t t, uint32_t h, uint32_t row0, uint32_t n) {
    const uint64_t qk = (uint64_t(t) * t_.k_heads + h / t_.group) * t_.dk;
    const uint64_t v = (uint64_t(t) * t_.v_heads + h) * t_.dv + row0;
    PipeSync<HardEvent::V_MTE2>();  // the previous token's vector work on these buffers is done
    if constexpr (sizeof(T) == sizeof(float)) {
      CopyRowsIn(qF_.Get<float>().template ReinterpretCast<T>(), qGm_[qk], 1, t_.dk);
      CopyRowsIn(kF_.Get<float>().template ReinterpretCast<T>(), kGm_[qk], 1, t_.dk);
      DataCopyPad(vF_.Get<float>().template ReinterpretCast<T>(), vGm_[v],
                  DataCopyExtParams(1, n * sizeof(T), 0, 0, 0), DataCopyPadExtParams<T>(false, 0, 0, T(0.f)));
    } else {
      CopyRowsIn(qIn_.Get<T>(), qGm_[qk], 1, t_.dk);
      CopyRowsIn(kIn_.Get<T>(), kGm_[qk], 1, t_.dk);
      DataCopyPad(vIn_.Get<T>(), vGm_[v], DataCopyExtParams(1, n * sizeof(T), 0, 0, 0),
                  DataCopyPadExtParams<T>(false, 0, 0, T(0.f)));
    }
    if (t_.has_gk) CopyRowsIn(gkIn_.Get<float>(), gkGm_[(uint64_t(t) * t_.v_heads + h) * t_.dk], 1, t_.dk);
    PipeSync<HardEvent::MTE2_V>();
    if constexpr (sizeof(T) != sizeof(float)) {
      Cast(qF_.Get<float>(), qIn_.Get<T>(), RoundMode::CAST_NONE, t_.dk_pad);
      Cast(kF_.Get<float>(), kIn_.Get<T>(), RoundMode::CAST_NONE, t_.dk_pad);
      Cast(vF_.Get<float>(), vIn_.Get<T>(), RoundMode::CAST_NONE, n);
    }
  }

  // S *= exp(g) diag(exp(gk)): the decay row (exp(g) everywhere, times exp(gk) per column) times every row.
  __aicore__ inline void Decay(uint32_t t, uint32_t h, uint32_t n) {
    if (!t_.has_g && !t_.has_gk) return;
    const uint32_t d = t_.dk_pad;
    LocalTensor<float> dec = decay_.Get<float>(), s = sF_.Get<float>();
    if (t_.has_g) {
      Duplicate(dec, gGm_.GetValue(uint64_t(t) * t_.v_heads + h), int32_t(d));
      Exp(dec, dec, int32_t(d));
      if (t_.has_gk) {
        LocalTensor<float> ek = prod_.Get<float>();  // scratch: the products are not live here
        Exp(ek, gkIn_.Get<float>(), int32_t(d));
        Mul(dec, dec, ek, int32_t(d));
      }
    } else {
      Exp(dec, gkIn_.Get<float>(), int32_t(d));
    }
    const uint8_t rowBlocks = uint8_t(d / kBlockFloats);
    for (uint32_t c = 0; c < d; c += kLanes) {
      const uint64_t lanes = d - c < kLanes ? d - c : kLanes;
      Mul(s[c], s[c], dec[c], lanes, uint8_t(n), BinaryRepeatParams(1, 1, 1, rowBlocks, rowBlocks, 0));
    }
  }

  // x = S k; y = beta (v - x); S += y kᵀ.
  __aicore__ inline void Update(uint32_t t, uint32_t h, uint32_t n) {
    const uint32_t d = t_.dk_pad;
    LocalTensor<float> s = sF_.Get<float>(), prod = prod_.Get<float>(), k = kF_.Get<float>();
    LocalTensor<float> x = x_.Get<float>(), yb = yb_.Get<float>();
    tot_ascendc::RowDots(x, s, k, prod, d, n);
    Sub(x, vF_.Get<float>(), x, int32_t(n));
    if (t_.has_beta) Muls(x, x, betaGm_.GetValue(uint64_t(t) * t_.v_heads + h), int32_t(n));
    const uint32_t groups = (n + kBlockFloats - 1) / kBlockFloats;  // y[n .. 8 * groups) fills unused rows of yb
    Brcb(yb, x, uint8_t(groups), BrcbRepeatParams(1, 8));
    const uint8_t rowBlocks = uint8_t(d / kBlockFloats);
    for (uint32_t c = 0; c < d; c += kLanes) {  // prod[r, j] = k[j] * y[r]
      const uint64_t lanes = d - c < kLanes ? d - c : kLanes;
      Mul(prod[c], k[c], yb, lanes, uint8_t(n), BinaryRepeatParams(1, 1, 0, rowBlocks, 0, 1));
    }
    Add(s, s, prod, int32_t(n * d));
  }

  // o = scale S q to out[t, h, row0 .. row0 + n) in the inputs' dtype.
  __aicore__ inline void Output(uint32_t t, uint32_t h, uint32_t row0, uint32_t n) {
    LocalTensor<float> o = o_.Get<float>();
    tot_ascendc::RowDots(o, sF_.Get<float>(), qF_.Get<float>(), prod_.Get<float>(), t_.dk_pad, n);
    Muls(o, o, t_.scale, int32_t(n));
    const uint64_t at = (uint64_t(t) * t_.v_heads + h) * t_.dv + row0;
    const DataCopyExtParams one(1, n * sizeof(T), 0, 0, 0);
    if constexpr (sizeof(T) == sizeof(float)) {
      PipeSync<HardEvent::V_MTE3>();
      DataCopyPad(outGm_[at], o.template ReinterpretCast<T>(), one);
    } else {
      LocalTensor<T> staged = oOut_.Get<T>();
      Cast(staged, o, RoundMode::CAST_RINT, n);
      PipeSync<HardEvent::V_MTE3>();
      DataCopyPad(outGm_[at], staged, one);
    }
  }

  // The unit's rows, in the state's dtype, to the token's slot.
  __aicore__ inline void StoreState(uint32_t slot, uint32_t h, uint32_t row0, uint32_t n) {
    const uint32_t lane = 32 / sizeof(S), padded = (t_.dk + lane - 1) / lane * lane;
    const DataCopyExtParams rows(uint16_t(n), uint32_t(t_.dk * sizeof(S)), uint32_t((t_.dk_pad - padded) / lane), 0,
                                 0);
    const uint64_t at = StateRow(slot, h, row0);
    if constexpr (sizeof(S) == sizeof(float)) {
      PipeSync<HardEvent::V_MTE3>();
      DataCopyPad(stateGm_[at], sF_.Get<float>().template ReinterpretCast<S>(), rows);
    } else {
      LocalTensor<S> staged = sIn_.Get<S>();
      Cast(staged, sF_.Get<float>(), RoundMode::CAST_RINT, n * t_.dk_pad);
      PipeSync<HardEvent::V_MTE3>();
      DataCopyPad(stateGm_[at], staged, rows);
    }
    PipeSync<HardEvent::MTE3_V>();  // the next token updates the rows (and reuses the staging) after the copy
  }

  tot_ascendc::RecurrentGdrTiling t_;
  TPipe pipe_;
  TBuf<TPosition::VECCALC> sF_, prod_, sIn_, qF_, kF_, qIn_, kIn_, decay_, gkIn_, vF_, x_, o_, yb_, vIn_, oOut_;
  GlobalTensor<T> qGm_, kGm_, vGm_, outGm_;
  GlobalTensor<S> stateGm_;
  GlobalTensor<float> betaGm_, gGm_, gkGm_;
  GlobalTensor<int32_t> seqGm_, slotGm_;
};

template <typename T, typename S>
__aicore__ inline void RunGdr(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR beta, GM_ADDR g, GM_ADDR gk,
                              GM_ADDR seq_table, GM_ADDR slot_table, GM_ADDR state, GM_ADDR out,
                              const tot_ascendc::RecurrentGdrTiling& t) {
  RecurrentGdr<T, S> op;
  op.Init(query, key, value, beta, g, gk, seq_table, slot_table, state, out, t);
  op.Process();
}

}  // namespace

extern "C" __global__ __aicore__ void recurrent_gated_delta_rule(GM_ADDR query, GM_ADDR key, GM_ADDR value,
                                                                 GM_ADDR beta, GM_ADDR g, GM_ADDR gk,
                                                                 GM_ADDR seq_table, GM_ADDR slot_table,
                                                                 GM_ADDR state, GM_ADDR out, GM_ADDR workspace,
                                                                 GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  using tot_ascendc::GdrDtype;
  const tot_ascendc::RecurrentGdrTiling t = *reinterpret_cast<__gm__ tot_ascendc::RecurrentGdrTiling*>(tiling);
  const bool fp32State = t.state_dtype == uint32_t(GdrDtype::FP32);
  if (t.dtype == uint32_t(GdrDtype::FP16)) {
    if (fp32State) RunGdr<half, float>(query, key, value, beta, g, gk, seq_table, slot_table, state, out, t);
    else RunGdr<half, half>(query, key, value, beta, g, gk, seq_table, slot_table, state, out, t);
  } else if (t.dtype == uint32_t(GdrDtype::BF16)) {
    if (fp32State) RunGdr<bfloat16_t, float>(query, key, value, beta, g, gk, seq_table, slot_table, state, out, t);
    else RunGdr<bfloat16_t, bfloat16_t>(query, key, value, beta, g, gk, seq_table, slot_table, state, out, t);
  } else {
    RunGdr<float, float>(query, key, value, beta, g, gk, seq_table, slot_table, state, out, t);
  }
}
