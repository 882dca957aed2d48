// FlashAttention-2 backward (FlashAttentionScoreGrad) as an Ascend C MIX kernel.
//
// Inputs BNSD-contiguous: query/dy/attention_in [B, N1, S1, D(v)], key/value [B, N2, S2, D(v)], softmax_max/sum
// [B, N1, S1, 8] fp32 as the forward wrote them (a row that saw no key has max -inf, sum 0), optional uint8 mask
// [Bm, Nm, S1, S2] (1 = masked out). Outputs dq/dk/dv in the input dtype.
//
// Phases (AIVs; the AIC of each group serves their matmuls):
//   1. rows split over AIVs: zero the fp32 dQ accumulator, Di = rowsum(dy * attention_in)     -> SyncAll
//   2. tasks (b, n2, key block) split over AIVs; per task, for the G query heads and every query block:
//        S = Q Kᵀ, dP = dy Vᵀ (cube) -> P = exp(scale S - max) / sum, dS = scale P (dP - Di) (vector)
//        dV += Pᵀ dy, dK += dSᵀ Q (cube, accumulated in the task's own fp32 workspace)
//        dQ part = dS K (cube) -> atomic add into the fp32 dQ accumulator (vector, SetAtomicAdd)
//      then dK/dV of the task's keys are cast to the output dtype                              -> SyncAll
//   3. rows split over AIVs: dQ accumulator -> dq in the output dtype.
// P and dS are rounded to the input dtype before their matmuls, as FlashAttention-2 does on the cube.
#include "kernel_operator.h"

#include "common/vector_helpers.h"
#include "attention/flash_attention_score_grad_tiling.h"
#include "attention/flash_attention_score_grad_kernel.h"

using namespace AscendC;
using tot_ascendc::PipeSync;
using tot_ascendc::FlashAttentionScoreGradTiling;

namespace {

constexpr float kNegInf = -__builtin_inff();

__aicore__ inline int64_t Clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }
__aicore__ inline uint32_t MinU(uint32_t a, uint32_t b) { return a < b ? a : b; }

template <typename T>
class FlashAttentionGrad {
  using GmT = MatmulType<TPosition::GM, CubeFormat::ND, T>;
  using GmTTrans = MatmulType<TPosition::GM, CubeFormat::ND, T, true>;
  using GmF32 = MatmulType<TPosition::GM, CubeFormat::ND, float>;

 public:
  Matmul<GmT, GmTTrans, GmF32> mmABt;  // A Bᵀ: S = Q Kᵀ, dP = dy Vᵀ
  Matmul<GmTTrans, GmT, GmF32> mmAtB;  // Aᵀ B: dV += Pᵀ dy, dK += dSᵀ Q
  Matmul<GmT, GmT, GmF32> mmAB;        // A B:  dQ part = dS K

  __aicore__ inline void Init(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR dy, GM_ADDR mask,
                              GM_ADDR softmax_max, GM_ADDR softmax_sum, GM_ADDR attention_in, GM_ADDR dq,
                              GM_ADDR dk, GM_ADDR dv, GM_ADDR workspace, const FlashAttentionScoreGradTiling& t) {
    t_ = t;
    const uint64_t q_elems = t.rows * t.d, o_elems = t.rows * t.dv;
    const uint64_t kv_rows = uint64_t(t.batch) * t.kv_heads * t.s2;
    q_.SetGlobalBuffer((__gm__ T*)query, q_elems);
    k_.SetGlobalBuffer((__gm__ T*)key, kv_rows * t.d);
    v_.SetGlobalBuffer((__gm__ T*)value, kv_rows * t.dv);
    dy_.SetGlobalBuffer((__gm__ T*)dy, o_elems);
    o_.SetGlobalBuffer((__gm__ T*)attention_in, o_elems);
    max_.SetGlobalBuffer((__gm__ float*)softmax_max, t.rows * 8);
    sum_.SetGlobalBuffer((__gm__ float*)softmax_sum, t.rows * 8);
    dq_.SetGlobalBuffer((__gm__ T*)dq, q_elems);
    dk_.SetGlobalBuffer((__gm__ T*)dk, kv_rows * t.d);
    dv_.SetGlobalBuffer((__gm__ T*)dv, kv_rows * t.dv);
    if (t.has_mask) {
      const uint64_t mb = t.mask_batch_stride ? t.batch : 1, mn = t.mask_head_stride ? t.q_heads : 1;
      mask_.SetGlobalBuffer((__gm__ uint8_t*)mask, mb * mn * t.s1 * t.s2);
    }
    GM_ADDR ws = GetUserWorkspace(workspace);
    dq_acc_.SetGlobalBuffer((__gm__ float*)(ws + t.ws_dq_offset), t.rows * t.d_pitch);
    di_.SetGlobalBuffer((__gm__ float*)(ws + t.ws_di_offset), t.rows * 8);
    GM_ADDR mine = ws + t.ws_aiv_offset + uint64_t(GetBlockIdx()) * t.ws_aiv_bytes;
    const uint64_t block = uint64_t(t.bq) * t.bkv_pitch;
    s_ws_.SetGlobalBuffer((__gm__ float*)(mine + t.ws_s_offset), block);
    dp_ws_.SetGlobalBuffer((__gm__ float*)(mine + t.ws_dp_offset), block);
    p_ws_.SetGlobalBuffer((__gm__ T*)(mine + t.ws_p_offset), block);
    ds_ws_.SetGlobalBuffer((__gm__ T*)(mine + t.ws_ds_offset), block);
    dqp_ws_.SetGlobalBuffer((__gm__ float*)(mine + t.ws_dqp_offset), uint64_t(t.bq) * t.d_pitch);
    dk_acc_.SetGlobalBuffer((__gm__ float*)(mine + t.ws_dk_offset), uint64_t(t.bkv) * t.d_pitch);
    dv_acc_.SetGlobalBuffer((__gm__ float*)(mine + t.ws_dv_offset), uint64_t(t.bkv) * t.dv_pitch);
    InitBuffers();
  }

  // The matmul objects' static tiling (shapes are set per call with SetOrgShape / SetSingleShape).
  __aicore__ inline void FillCubeTiling(TCubeTiling& c, int32_t m, int32_t n, int32_t k) {
    c.usedCoreNum = 1;
    c.M = c.singleCoreM = m;
    c.N = c.singleCoreN = n;
    c.Ka = c.Kb = c.singleCoreK = k;
    c.baseM = 128;
    c.baseN = 128;
    c.baseK = 64;
  }

  __aicore__ inline TPipe* Pipe() { return &pipe_; }

  __aicore__ inline void Process() {
    PrepareRows();
    SyncAll();
    for (uint32_t task = GetBlockIdx(); task < t_.task_num; task += t_.aiv_num) RunTask(task);
    mmABt.End();
    mmAtB.End();
    mmAB.End();
    SyncAll();
    WriteDq();
  }

 private:
  __aicore__ inline void InitBuffers() {
    const uint32_t chunk = t_.ub_chunk_elems;
    pipe_.InitBuffer(buf_a_, chunk * sizeof(float));
    pipe_.InitBuffer(buf_b_, chunk * sizeof(float));
    pipe_.InitBuffer(buf_c_, chunk * sizeof(T));
    pipe_.InitBuffer(buf_d_, chunk * sizeof(T));
    const uint32_t stats = t_.vec_rows * 8 * sizeof(float);
    pipe_.InitBuffer(max_buf_, stats);
    pipe_.InitBuffer(sum_buf_, stats);
    pipe_.InitBuffer(di_buf_, stats);
    pipe_.InitBuffer(mask_buf_, t_.vec_rows * t_.mask_pitch);
    const uint32_t cmp = tot_ascendc::FaGradComparePitch(t_.bkv_pitch);
    pipe_.InitBuffer(mask_half_buf_, cmp * sizeof(half));
    pipe_.InitBuffer(bits_buf_, cmp / 8);
    pipe_.InitBuffer(col_buf_, cmp * sizeof(float));
    pipe_.InitBuffer(tmp_buf_, 256);
    col_ = col_buf_.Get<float>();
    ArithProgression(col_, 0.0f, 1.0f, int32_t(cmp));  // key index inside a block, for the band
  }

  __aicore__ inline void RowRange(uint64_t& r0, uint64_t& r1) const {
    const uint64_t per = (t_.rows + t_.aiv_num - 1) / t_.aiv_num;
    r0 = per * GetBlockIdx();
    r1 = r0 + per < t_.rows ? r0 + per : t_.rows;
    if (r0 > r1) r0 = r1;
  }

  // Writes `count` (a multiple of 8) fp32 zeros to GM.
  __aicore__ inline void ZeroGm(const GlobalTensor<float>& gm, uint64_t count) {
    LocalTensor<float> zeros = buf_a_.Get<float>();
    Duplicate(zeros, 0.0f, int32_t(t_.ub_chunk_elems));
    PipeSync<HardEvent::V_MTE3>();
    for (uint64_t at = 0; at < count; at += t_.ub_chunk_elems) {
      const uint32_t n = uint32_t(count - at < t_.ub_chunk_elems ? count - at : t_.ub_chunk_elems);
      DataCopy(gm[at], zeros, n);
    }
    PipeSync<HardEvent::MTE3_V>();
  }

  // `rows` rows of `cols` T elements (GM row stride cols) into UB as fp32 rows of `pitch` elements.
  __aicore__ inline void LoadRowsF32(const LocalTensor<float>& dst, const LocalTensor<T>& stage,
                                     const GlobalTensor<T>& src, uint32_t rows, uint32_t cols, uint32_t pitch) {
    const uint32_t ub_row = (cols * sizeof(T) + 31) / 32 * 32;
    DataCopyExtParams p(uint16_t(rows), cols * uint32_t(sizeof(T)), 0, (pitch * uint32_t(sizeof(T)) - ub_row) / 32, 0);
    if constexpr (sizeof(T) == 4) {
      DataCopyPad(dst.template ReinterpretCast<T>(), src, p, DataCopyPadExtParams<T>());
      PipeSync<HardEvent::MTE2_V>();
    } else {
      DataCopyPad(stage, src, p, DataCopyPadExtParams<T>());
      PipeSync<HardEvent::MTE2_V>();
      // One instruction over the whole chunk: the pad columns of each row are converted too and never read.
      Cast(dst, stage, RoundMode::CAST_NONE, rows * pitch);
    }
  }

  // fp32 rows of `pitch` elements in UB -> `rows` rows of `cols` T elements in GM (row stride cols).
  __aicore__ inline void StoreRowsF32(const GlobalTensor<T>& dst, const LocalTensor<float>& src,
                                      const LocalTensor<T>& stage, uint32_t rows, uint32_t cols, uint32_t pitch) {
    const uint32_t ub_row = (cols * sizeof(T) + 31) / 32 * 32;
    DataCopyExtParams p(uint16_t(rows), cols * uint32_t(sizeof(T)), (pitch * uint32_t(sizeof(T)) - ub_row) / 32, 0, 0);
    if constexpr (sizeof(T) == 4) {
      PipeSync<HardEvent::V_MTE3>();
      DataCopyPad(dst, src.template ReinterpretCast<T>(), p);
    } else {
      Cast(stage, src, RoundMode::CAST_RINT, rows * pitch);  // one instruction; pad columns are not stored
      PipeSync<HardEvent::V_MTE3>();
      DataCopyPad(dst, stage, p);
    }
    PipeSync<HardEvent::MTE3_V>();
    PipeSync<HardEvent::MTE3_MTE2>();
  }

  // Phase 1: zero this AIV's rows of the dQ accumulator; Di = rowsum(dy * attention_in) for them.
  __aicore__ inline void PrepareRows() {
    uint64_t r0, r1;
    RowRange(r0, r1);
    if (r0 >= r1) return;
    ZeroGm(dq_acc_[r0 * t_.d_pitch], (r1 - r0) * t_.d_pitch);
    const uint32_t dv = t_.dv, pitch = t_.dv_pitch;
    const uint32_t rows_per = MinU(t_.vec_rows, t_.ub_chunk_elems / pitch);
    LocalTensor<float> a = buf_a_.Get<float>(), b = buf_b_.Get<float>(), di = di_buf_.Get<float>();
    LocalTensor<float> tmp = tmp_buf_.Get<float>();
    for (uint64_t row = r0; row < r1; row += rows_per) {
      const uint32_t n = uint32_t(r1 - row < rows_per ? r1 - row : rows_per);
      LoadRowsF32(a, buf_c_.Get<T>(), dy_[row * dv], n, dv, pitch);
      LoadRowsF32(b, buf_d_.Get<T>(), o_[row * dv], n, dv, pitch);
      for (uint32_t r = 0; r < n; ++r) {
        Mul(a[r * pitch], a[r * pitch], b[r * pitch], int32_t(dv));
        ReduceSum(tmp, a[r * pitch], tmp[32], int32_t(dv));
        PipeSync<HardEvent::V_S>();
        Duplicate(di[r * 8], tmp.GetValue(0), 8);
      }
      PipeSync<HardEvent::V_MTE3>();
      DataCopy(di_[row * 8], di, n * 8);
      PipeSync<HardEvent::MTE3_V>();
      PipeSync<HardEvent::MTE3_MTE2>();
    }
  }

  // Phase 3: dq = dQ accumulator in the output dtype, for this AIV's rows.
  __aicore__ inline void WriteDq() {
    uint64_t r0, r1;
    RowRange(r0, r1);
    const uint32_t pitch = t_.d_pitch, rows_per = t_.ub_chunk_elems / pitch;
    LocalTensor<float> a = buf_a_.Get<float>();
    for (uint64_t row = r0; row < r1; row += rows_per) {
      const uint32_t n = uint32_t(r1 - row < rows_per ? r1 - row : rows_per);
      DataCopy(a, dq_acc_[row * pitch], n * pitch);
      PipeSync<HardEvent::MTE2_V>();
      StoreRowsF32(dq_[row * t_.d], a, buf_c_.Get<T>(), n, t_.d, pitch);
    }
  }

  __aicore__ inline void RunTask(uint32_t task) {
    const uint32_t per_batch = t_.kv_heads * t_.s2_blocks;
    const uint32_t b = task / per_batch, n2 = task % per_batch / t_.s2_blocks, jb = task % t_.s2_blocks;
    const uint32_t j0 = jb * t_.bkv, nkv = jb + 1 == t_.s2_blocks ? t_.s2_tail : t_.bkv;
    ZeroGm(dk_acc_, uint64_t(nkv) * t_.d_pitch);
    ZeroGm(dv_acc_, uint64_t(nkv) * t_.dv_pitch);
    const uint64_t kv_row = (uint64_t(b) * t_.kv_heads + n2) * t_.s2 + j0;
    const GlobalTensor<T> k = k_[kv_row * t_.d], v = v_[kv_row * t_.dv];
    for (uint32_t g = 0; g < t_.group; ++g) {
      const uint32_t n = n2 * t_.group + g;
      for (uint32_t ib = 0; ib < t_.s1_blocks; ++ib) {
        const uint32_t i0 = ib * t_.bq, nq = ib + 1 == t_.s1_blocks ? t_.s1_tail : t_.bq;
        // Skip blocks the band hides entirely (causal).
        if (int64_t(j0) + nkv - 1 < int64_t(i0) + t_.band_lo || int64_t(j0) > int64_t(i0) + nq - 1 + t_.band_hi)
          continue;
        Block(b, n, i0, nq, j0, nkv, k, v);
      }
    }
    WaitDk();
    // dK, dV of this task's keys in the output dtype.
    const uint32_t rows_per = t_.ub_chunk_elems / (t_.d_pitch > t_.dv_pitch ? t_.d_pitch : t_.dv_pitch);
    LocalTensor<float> a = buf_a_.Get<float>();
    for (uint32_t r = 0; r < nkv; r += rows_per) {
      const uint32_t n = MinU(rows_per, nkv - r);
      DataCopy(a, dk_acc_[r * t_.d_pitch], n * t_.d_pitch);
      PipeSync<HardEvent::MTE2_V>();
      StoreRowsF32(dk_[(kv_row + r) * t_.d], a, buf_c_.Get<T>(), n, t_.d, t_.d_pitch);
      DataCopy(a, dv_acc_[r * t_.dv_pitch], n * t_.dv_pitch);
      PipeSync<HardEvent::MTE2_V>();
      StoreRowsF32(dv_[(kv_row + r) * t_.dv], a, buf_c_.Get<T>(), n, t_.dv, t_.dv_pitch);
    }
  }

  // One (query block, key block) step.
  __aicore__ inline void Block(uint32_t b, uint32_t n, uint32_t i0, uint32_t nq, uint32_t j0, uint32_t nkv,
                               const GlobalTensor<T>& k, const GlobalTensor<T>& v) {
    const uint64_t row0 = (uint64_t(b) * t_.q_heads + n) * t_.s1 + i0;
    const GlobalTensor<T> q = q_[row0 * t_.d], dy = dy_[row0 * t_.dv];
    const int32_t d = int32_t(t_.d), dv = int32_t(t_.dv), kp = int32_t(t_.bkv_pitch);
    // S = Q Kᵀ and dP = dy Vᵀ, fp32 [nq, bkv_pitch].
    mmABt.SetTensorA(q);
    mmABt.SetTensorB(k, true);
    mmABt.SetOrgShape(int(nq), int(nkv), d, d, kp);
    mmABt.SetSingleShape(int(nq), int(nkv), d);
    mmABt.IterateAll(s_ws_);
    mmABt.SetTensorA(dy);
    mmABt.SetTensorB(v, true);
    mmABt.SetOrgShape(int(nq), int(nkv), dv, dv, kp);
    mmABt.SetSingleShape(int(nq), int(nkv), dv);
    mmABt.IterateAll(dp_ws_);
    WaitDk();  // the previous block's dK product has read dS before SoftmaxGrad rewrites it
    SoftmaxGrad(b, n, i0, nq, j0, nkv, row0);
    // dQ part = dS K first (synchronous), so that its atomic add into the shared dQ accumulator (other AIVs own
    // other key blocks) runs on this AIV while the cube computes dV += Pᵀ dy; dK += dSᵀ Q is then left in flight
    // until the next block's SoftmaxGrad or the task's end (atomic accumulation into this task's fp32 accumulators).
    mmAB.SetTensorA(ds_ws_);
    mmAB.SetTensorB(k);
    mmAB.SetOrgShape(int(nq), d, kp, int(nkv), int(t_.d_pitch));
    mmAB.SetSingleShape(int(nq), d, int(nkv));
    mmAB.IterateAll(dqp_ws_);
    mmAtB.SetTensorA(p_ws_, true);
    mmAtB.SetTensorB(dy);
    mmAtB.SetOrgShape(kp, dv, int(nq), int(nq), int(t_.dv_pitch));
    mmAtB.SetSingleShape(int(nkv), dv, int(nq));
    mmAtB.template IterateAll<false>(dv_acc_, 1);
    AddDqPart(row0, nq);
    mmAtB.WaitIterateAll();
    mmAtB.SetTensorA(ds_ws_, true);
    mmAtB.SetTensorB(q);
    mmAtB.SetOrgShape(kp, d, int(nq), int(nq), int(t_.d_pitch));
    mmAtB.SetSingleShape(int(nkv), d, int(nq));
    mmAtB.template IterateAll<false>(dk_acc_, 1);
    dk_pending_ = true;
  }

  __aicore__ inline void WaitDk() {
    if (!dk_pending_) return;
    mmAtB.WaitIterateAll();
    dk_pending_ = false;
  }

  // dq_acc rows [row0, row0 + nq) += the fp32 dQ part in the workspace (atomic add: AIVs share dQ rows).
  __aicore__ inline void AddDqPart(uint64_t row0, uint32_t nq) {
    const uint32_t pitch = t_.d_pitch, rows_per = t_.ub_chunk_elems / pitch;
    LocalTensor<float> a = buf_a_.Get<float>();
    for (uint32_t r = 0; r < nq; r += rows_per) {
      const uint32_t cnt = MinU(rows_per, nq - r);
      DataCopy(a, dqp_ws_[r * pitch], cnt * pitch);
      PipeSync<HardEvent::MTE2_MTE3>();
      SetAtomicAdd<float>();
      DataCopy(dq_acc_[(row0 + r) * pitch], a, cnt * pitch);
      SetAtomicNone();
      PipeSync<HardEvent::MTE3_MTE2>();
    }
  }

  // P = exp(scale S - max) / sum (0 where masked or for rows that saw no key) and scale * dS = scale P (dP - Di),
  // both rounded to T into the workspace for the cube.
  __aicore__ inline void SoftmaxGrad(uint32_t b, uint32_t n, uint32_t i0, uint32_t nq, uint32_t j0, uint32_t nkv,
                                     uint64_t row0) {
    const uint32_t kp = t_.bkv_pitch;
    LocalTensor<float> s = buf_a_.Get<float>(), dp = buf_b_.Get<float>();
    LocalTensor<T> p_out = buf_c_.Get<T>(), ds_out = buf_d_.Get<T>();
    LocalTensor<float> mx = max_buf_.Get<float>(), sm = sum_buf_.Get<float>(), di = di_buf_.Get<float>();
    LocalTensor<uint8_t> mask = mask_buf_.Get<uint8_t>(), bits = bits_buf_.Get<uint8_t>();
    LocalTensor<half> mask_h = mask_half_buf_.Get<half>();
    for (uint32_t r0 = 0; r0 < nq; r0 += t_.vec_rows) {
      const uint32_t cnt = MinU(t_.vec_rows, nq - r0);
      DataCopy(s, s_ws_[r0 * kp], cnt * kp);
      DataCopy(dp, dp_ws_[r0 * kp], cnt * kp);
      DataCopy(mx, max_[(row0 + r0) * 8], cnt * 8);
      DataCopy(sm, sum_[(row0 + r0) * 8], cnt * 8);
      DataCopy(di, di_[(row0 + r0) * 8], cnt * 8);
      if (t_.has_mask) {
        const uint64_t at = uint64_t(b) * t_.mask_batch_stride + uint64_t(n) * t_.mask_head_stride +
                            uint64_t(i0 + r0) * t_.s2 + j0;
        DataCopyExtParams mp(uint16_t(cnt), nkv, t_.s2 - nkv, (t_.mask_pitch - (nkv + 31) / 32 * 32) / 32, 0);
        DataCopyPad(mask, mask_[at], mp, DataCopyPadExtParams<uint8_t>());
      }
      PipeSync<HardEvent::MTE2_S>();
      PipeSync<HardEvent::MTE2_V>();
      for (uint32_t r = 0; r < cnt; ++r) {
        const int64_t i = int64_t(i0) + r0 + r;
        LocalTensor<float> srow = s[r * kp], dprow = dp[r * kp];
        const float m = mx.GetValue(r * 8), total = sm.GetValue(r * 8), dsum = di.GetValue(r * 8);
        const int64_t lo = Clamp(i + t_.band_lo - j0, 0, nkv), hi = Clamp(i + t_.band_hi + 1 - j0, lo, nkv);
        // A NaN forward row (NaN statistics) is not a row without keys: it gets NaN gradients below.
        const bool nan_row = m != m || total != total;
        if (hi <= lo || (!nan_row && (!(total > 0.0f) || m == kNegInf))) {  // nothing visible: P = dS = 0
          Duplicate(srow, 0.0f, int32_t(nkv));
          Duplicate(dprow, 0.0f, int32_t(nkv));
          continue;
        }
        Muls(srow, srow, t_.scale, int32_t(nkv));
        Adds(srow, srow, nan_row ? __builtin_nanf("") : -m, int32_t(nkv));  // a NaN row: NaN for every key
        if (lo > 0) {
          CompareScalar(bits, col_, float(lo), CMPMODE::GE, tot_ascendc::FaGradComparePitch(nkv));
          Select(srow, bits, srow, kNegInf, SELMODE::VSEL_TENSOR_SCALAR_MODE, nkv);
        }
        if (hi < int64_t(nkv)) {
          CompareScalar(bits, col_, float(hi), CMPMODE::LT, tot_ascendc::FaGradComparePitch(nkv));
          Select(srow, bits, srow, kNegInf, SELMODE::VSEL_TENSOR_SCALAR_MODE, nkv);
        }
        if (t_.has_mask) {
          Cast(mask_h, mask[r * t_.mask_pitch], RoundMode::CAST_NONE, nkv);
          CompareScalar(bits, mask_h, half(0.5f), CMPMODE::LT, tot_ascendc::FaGradComparePitch(nkv));  // 1 = visible
          Select(srow, bits, srow, kNegInf, SELMODE::VSEL_TENSOR_SCALAR_MODE, nkv);
        }
        Exp(srow, srow, int32_t(nkv));
        if (nan_row) {  // exp(NaN) where the row sees the key, exp(-inf) = 0 where it does not: P = dS = that
          Adds(dprow, srow, 0.0f, int32_t(nkv));
          continue;
        }
        Muls(srow, srow, 1.0f / total, int32_t(nkv));
        Adds(dprow, dprow, -dsum, int32_t(nkv));
        Mul(dprow, dprow, srow, int32_t(nkv));
        Muls(dprow, dprow, t_.scale, int32_t(nkv));
      }
      if constexpr (sizeof(T) == 4) {
        PipeSync<HardEvent::V_MTE3>();
        DataCopy(p_ws_[r0 * kp], s.template ReinterpretCast<T>(), cnt * kp);
        DataCopy(ds_ws_[r0 * kp], dp.template ReinterpretCast<T>(), cnt * kp);
      } else {
        // One instruction each over the chunk (pad columns included: the cube reads nkv columns per row).
        Cast(p_out, s, RoundMode::CAST_RINT, cnt * kp);
        Cast(ds_out, dp, RoundMode::CAST_RINT, cnt * kp);
        PipeSync<HardEvent::V_MTE3>();
        DataCopy(p_ws_[r0 * kp], p_out, cnt * kp);
        DataCopy(ds_ws_[r0 * kp], ds_out, cnt * kp);
      }
      PipeSync<HardEvent::MTE3_MTE2>();
      PipeSync<HardEvent::MTE3_V>();
    }
  }

  FlashAttentionScoreGradTiling t_;
  bool dk_pending_ = false;  // a dK += dSᵀ Q product is in flight on the cube
  TPipe pipe_;
  TBuf<TPosition::VECCALC> buf_a_, buf_b_, buf_c_, buf_d_, max_buf_, sum_buf_, di_buf_, mask_buf_, mask_half_buf_,
      bits_buf_, col_buf_, tmp_buf_;
  LocalTensor<float> col_;
  GlobalTensor<T> q_, k_, v_, dy_, o_, dq_, dk_, dv_;
  GlobalTensor<float> max_, sum_, di_, dq_acc_, s_ws_, dp_ws_, dqp_ws_, dk_acc_, dv_acc_;
  GlobalTensor<T> p_ws_, ds_ws_;
  GlobalTensor<uint8_t> mask_;
};

template <typename T>
__aicore__ inline void Run(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR dy, GM_ADDR mask, GM_ADDR softmax_max,
                           GM_ADDR softmax_sum, GM_ADDR attention_in, GM_ADDR dq, GM_ADDR dk, GM_ADDR dv,
                           GM_ADDR workspace, const FlashAttentionScoreGradTiling& t) {
  FlashAttentionGrad<T> op;
  TCubeTiling c1, c2, c3;
  op.FillCubeTiling(c1, int32_t(t.bq), int32_t(t.bkv), int32_t(t.d));
  op.FillCubeTiling(c2, int32_t(t.bkv), int32_t(t.d), int32_t(t.bq));
  op.FillCubeTiling(c3, int32_t(t.bq), int32_t(t.d), int32_t(t.bkv));
  REGIST_MATMUL_OBJ(op.Pipe(), GetSysWorkSpacePtr(), op.mmABt, &c1, op.mmAtB, &c2, op.mmAB, &c3);
  op.Init(query, key, value, dy, mask, softmax_max, softmax_sum, attention_in, dq, dk, dv, workspace, t);
  op.Process();
}

}  // namespace

extern "C" __global__ __aicore__ void flash_attention_score_grad(GM_ADDR query, GM_ADDR key, GM_ADDR value, GM_ADDR dy,
                                                                 GM_ADDR atten_mask, GM_ADDR softmax_max,
                                                                 GM_ADDR softmax_sum, GM_ADDR attention_in,
                                                                 GM_ADDR dq, GM_ADDR dk, GM_ADDR dv,
                                                                 GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  const FlashAttentionScoreGradTiling t = *reinterpret_cast<__gm__ FlashAttentionScoreGradTiling*>(tiling);
  switch (t.dtype) {
    case uint32_t(tot_ascendc::FagDtype::FP32):
      return Run<float>(query, key, value, dy, atten_mask, softmax_max, softmax_sum, attention_in, dq, dk, dv,
                        workspace, t);
    case uint32_t(tot_ascendc::FagDtype::FP16):
      return Run<half>(query, key, value, dy, atten_mask, softmax_max, softmax_sum, attention_in, dq, dk, dv,
                       workspace, t);
    default:
      return Run<bfloat16_t>(query, key, value, dy, atten_mask, softmax_max, softmax_sum, attention_in, dq, dk, dv,
                             workspace, t);
  }
}
