// Grouped matmul (CANN GroupedMatmul, rows of x split into groups, one weight matrix per group) as an Ascend C MIX
// kernel: the cube computes each item's product with the Matmul API, the group list is walked on the scalar unit,
// and bias + activation run in the vector epilogue. Work split and buffers: grouped_matmul_tiling.h.
#include "moe/grouped_matmul_kernel.h"

#include "moe/grouped_matmul_tiling.h"

using namespace AscendC;

namespace {

using tot_ascendc::GmmAct;
using tot_ascendc::GroupedMatmulTiling;

template <typename A, typename B>
struct IsSame { static constexpr bool value = false; };
template <typename A>
struct IsSame<A, A> { static constexpr bool value = true; };

constexpr uint32_t kFp32PerBlock = 8, kFp32PerRepeat = 64;

template <HardEvent E>
__aicore__ inline void WaitPipe() {
  const event_t id = static_cast<event_t>(GetTPipePtr()->FetchEventID(E));
  SetFlag<E>(id);
  WaitFlag<E>(id);
}

__aicore__ inline uint32_t MinU(uint32_t a, uint32_t b) { return a < b ? a : b; }

// One work item: rows [row0, row0 + rows) of x (all in group e) times columns [n0, n0 + cols) of weight[e].
struct Item {
  uint32_t e = 0, row0 = 0, rows = 0, n0 = 0, cols = 0;
};

template <typename T>
class GroupedMatmulKernel {
 public:
  using InType = MatmulType<TPosition::GM, CubeFormat::ND, T>;
  using OutType = MatmulType<TPosition::GM, CubeFormat::ND, float>;
  Matmul<InType, InType, OutType> mm0, mm1;  // one per workspace slice: the next item's product is in flight

  __aicore__ inline void Init(GM_ADDR x, GM_ADDR w, GM_ADDR bias, GM_ADDR groupList, GM_ADDR out, GM_ADDR actInput,
                              GM_ADDR workspace, const GroupedMatmulTiling& t, TPipe* pipe) {
    t_ = t;
    aiv_ = uint32_t(GetBlockIdx());
    xGm_.SetGlobalBuffer((__gm__ T*)x, uint64_t(t.m) * t.k);
    wGm_.SetGlobalBuffer((__gm__ T*)w, uint64_t(t.groups) * t.k * t.n);
    outGm_.SetGlobalBuffer((__gm__ T*)out, uint64_t(t.m) * t.n);
    if (t.act != uint32_t(GmmAct::kNone)) actGm_.SetGlobalBuffer((__gm__ T*)actInput, uint64_t(t.m) * t.n);
    if (t.has_bias) biasGm_.SetGlobalBuffer((__gm__ float*)bias, uint64_t(t.groups) * t.n);
    groupGm_.SetGlobalBuffer((__gm__ int64_t*)groupList, t.groups);
    wsGm_.SetGlobalBuffer((__gm__ float*)(GetUserWorkspace(workspace) + t.ws_per_aiv * aiv_), 2 * t.ws_slice);
    const uint32_t f32 = t.chunk_rows * t.bn * sizeof(float);
    pipe->InitBuffer(acc_, f32);
    if (t.act != uint32_t(GmmAct::kNone)) pipe->InitBuffer(tmp_, f32);
    pipe->InitBuffer(stage_, t.chunk_rows * t.bn * sizeof(T));
    pipe->InitBuffer(bias_, t.bn * sizeof(float));
  }

  // Items are numbered group by group (row blocks, then column blocks) and dealt round-robin to the AIVs. Each
  // item's product is issued before the previous item's epilogue runs, alternating the two workspace slices.
  __aicore__ inline void Process() {
    if (aiv_ >= t_.aiv_num) return;
    Item prev;
    bool hasPrev = false;
    uint32_t slice = 0, idx = 0;
    uint64_t start = 0;
    for (uint32_t e = 0; e < t_.groups; ++e) {
      const int64_t v = groupGm_.GetValue(e);
      const uint64_t end = t_.counts ? start + uint64_t(v) : uint64_t(v);  // the glue checked the list
      const uint32_t rows = uint32_t(end - start);
      for (uint32_t r0 = 0; r0 < rows; r0 += t_.bm) {
        for (uint32_t cb = 0; cb < t_.n_blocks; ++cb, ++idx) {
          if (idx % t_.aiv_num != aiv_) continue;
          Item it;
          it.e = e;
          it.row0 = uint32_t(start) + r0;
          it.rows = MinU(t_.bm, rows - r0);
          it.n0 = cb * t_.bn;
          it.cols = MinU(t_.bn, t_.n - it.n0);
          Issue(it, slice);
          if (hasPrev) Finish(prev, slice ^ 1u);
          prev = it;
          hasPrev = true;
          slice ^= 1u;
        }
      }
      start = end;
    }
    if (hasPrev) Finish(prev, slice ^ 1u);
    mm0.End();
    mm1.End();
  }

 private:
  // The fp32 product of the item into workspace slice `slice` (row pitch bn), asynchronously.
  __aicore__ inline void Issue(const Item& it, uint32_t slice) {
    Matmul<InType, InType, OutType>& mm = slice ? mm1 : mm0;
    mm.SetTensorA(xGm_[uint64_t(it.row0) * t_.k]);
    mm.SetTensorB(wGm_[uint64_t(it.e) * t_.k * t_.n + it.n0]);
    mm.SetOrgShape(int(it.rows), int(t_.n), int(t_.k), int(t_.k), int(t_.bn));
    mm.SetSingleShape(int(it.rows), int(it.cols), int(t_.k));
    mm.template IterateAll<false>(wsGm_[uint64_t(slice) * t_.ws_slice]);
  }

  __aicore__ inline void Finish(const Item& it, uint32_t slice) {
    (slice ? mm1 : mm0).WaitIterateAll();
    const uint32_t colsPad = (it.cols + 15) / 16 * 16;
    if (t_.has_bias) {
      WaitPipe<HardEvent::V_MTE2>();  // the previous item's bias row is no longer read
      DataCopyPad(bias_.Get<float>(), biasGm_[uint64_t(it.e) * t_.n + it.n0],
                  DataCopyExtParams(1, it.cols * sizeof(float), 0, 0, 0), DataCopyPadExtParams<float>(true, 0, 0, 0.f));
    }
    for (uint32_t r = 0; r < it.rows; r += t_.chunk_rows) {
      Epilogue(it, slice, r, MinU(t_.chunk_rows, it.rows - r), colsPad);
    }
  }

  // Rows [r, r + cr) of the item: + bias, act_input, activation, cast, out.
  __aicore__ inline void Epilogue(const Item& it, uint32_t slice, uint32_t r, uint32_t cr, uint32_t colsPad) {
    const uint32_t n = cr * colsPad;
    LocalTensor<float> acc = acc_.Get<float>();
    WaitPipe<HardEvent::V_MTE2>();  // the previous chunk's vector work on acc is done
    const GlobalTensor<float> src = wsGm_[uint64_t(slice) * t_.ws_slice + uint64_t(r) * t_.bn];
    DataCopy(acc, src, DataCopyParams(uint16_t(cr), uint16_t(colsPad / kFp32PerBlock),
                                      uint16_t((t_.bn - colsPad) / kFp32PerBlock), 0));
    WaitPipe<HardEvent::MTE2_V>();
    if (t_.has_bias) {
      const uint8_t pitch = uint8_t(colsPad / kFp32PerBlock);
      LocalTensor<float> b = bias_.Get<float>();
      for (uint32_t c = 0; c < colsPad; c += kFp32PerRepeat) {
        Add(acc[c], acc[c], b[c], MinU(kFp32PerRepeat, colsPad - c), uint8_t(cr),
            BinaryRepeatParams(1, 1, 1, pitch, pitch, 0));
      }
    }
    const uint64_t row = uint64_t(it.row0) + r;
    if (t_.act != uint32_t(GmmAct::kNone)) {
      Store(actGm_, acc, row, it, cr, colsPad);
      Activate(acc, n);
    }
    Store(outGm_, acc, row, it, cr, colsPad);
  }

  __aicore__ inline void Activate(const LocalTensor<float>& acc, uint32_t n) {
    if (t_.act == uint32_t(GmmAct::kRelu)) {
      Relu(acc, acc, int32_t(n));
      return;
    }
    // silu: x * sigmoid(x); fast_gelu: x * sigmoid(1.702 x). As x / (1 + exp(-beta x)).
    const float beta = t_.act == uint32_t(GmmAct::kSilu) ? 1.0f : 1.702f;
    LocalTensor<float> tmp = tmp_.Get<float>();
    Muls(tmp, acc, -beta, int32_t(n));
    Exp(tmp, tmp, int32_t(n));
    Adds(tmp, tmp, 1.0f, int32_t(n));
    Div(acc, acc, tmp, int32_t(n));
  }

  // [cr, cols] of acc (row pitch colsPad) in T to gm rows starting at `row`, columns [n0, n0 + cols).
  __aicore__ inline void Store(const GlobalTensor<T>& gm, const LocalTensor<float>& acc, uint64_t row, const Item& it,
                               uint32_t cr, uint32_t colsPad) {
    const uint32_t bytes = it.cols * sizeof(T);
    const uint32_t ubGap = (colsPad * sizeof(T) - (bytes + 31) / 32 * 32) / 32;
    const DataCopyExtParams cp(uint16_t(cr), bytes, ubGap, (t_.n - it.cols) * sizeof(T), 0);
    if constexpr (IsSame<T, float>::value) {
      WaitPipe<HardEvent::V_MTE3>();
      DataCopyPad(gm[row * t_.n + it.n0], acc, cp);
      WaitPipe<HardEvent::MTE3_V>();
    } else {
      LocalTensor<T> stage = stage_.Get<T>();
      Cast(stage, acc, RoundMode::CAST_RINT, int32_t(cr * colsPad));
      WaitPipe<HardEvent::V_MTE3>();
      DataCopyPad(gm[row * t_.n + it.n0], stage, cp);
      WaitPipe<HardEvent::MTE3_V>();
    }
  }

  GroupedMatmulTiling t_;
  uint32_t aiv_ = 0;
  GlobalTensor<T> xGm_, wGm_, outGm_, actGm_;
  GlobalTensor<float> biasGm_, wsGm_;
  GlobalTensor<int64_t> groupGm_;
  TBuf<TPosition::VECCALC> acc_, tmp_, stage_, bias_;
};

__aicore__ inline void FillCubeTiling(const GroupedMatmulTiling& t, TCubeTiling& c) {
  c.M = int32_t(t.bm); c.N = int32_t(t.bn); c.Ka = c.Kb = int32_t(t.k);
  c.singleCoreM = c.M; c.singleCoreN = c.N; c.singleCoreK = c.Ka;
  c.baseM = int32_t(MinU(t.bm, 128)); c.baseN = int32_t(MinU(t.bn, 128)); c.baseK = 64;
}

template <typename T>
__aicore__ inline void Run(GM_ADDR x, GM_ADDR w, GM_ADDR bias, GM_ADDR groupList, GM_ADDR out, GM_ADDR actInput,
                           GM_ADDR workspace, const GroupedMatmulTiling& t) {
  TPipe pipe;
  GroupedMatmulKernel<T> op;
  TCubeTiling c;
  FillCubeTiling(t, c);
  REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), op.mm0, &c, op.mm1, &c);
  op.Init(x, w, bias, groupList, out, actInput, workspace, t, &pipe);
  op.Process();
}

}  // namespace

extern "C" __global__ __aicore__ void grouped_matmul_kernel(GM_ADDR x, GM_ADDR weight, GM_ADDR bias,
                                                            GM_ADDR groupList, GM_ADDR out, GM_ADDR actInput,
                                                            GM_ADDR workspace, GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
  const GroupedMatmulTiling t = *reinterpret_cast<__gm__ GroupedMatmulTiling*>(tiling);
  if (t.dtype == uint32_t(tot_ascendc::GmmDtype::kFloat16)) {
    Run<half>(x, weight, bias, groupList, out, actInput, workspace, t);
  } else if (t.dtype == uint32_t(tot_ascendc::GmmDtype::kBFloat16)) {
    Run<bfloat16_t>(x, weight, bias, groupList, out, actInput, workspace, t);
  } else {
    Run<float>(x, weight, bias, groupList, out, actInput, workspace, t);
  }
}
