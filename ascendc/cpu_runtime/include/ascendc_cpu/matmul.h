// The cube through the Matmul high-level API (docs: 高阶API/矩阵计算/Matmul/*.md: MatmulType, Matmul, Init,
// SetOrgShape, SetSingleShape, SetTail, SetTensorA/B, SetBias, IterateAll, WaitIterateAll, End, REGIST_MATMUL_OBJ;
// TCubeTiling from 高阶API/矩阵计算/Matmul/Matmul Tiling/TCubeTiling结构体.md).
//
// In a MIX launch each group's AIC thread runs a server loop (REGIST_MATMUL_OBJ) and its two AIV threads are
// clients whose IterateAll calls become jobs for that AIC, executed concurrently with the AIVs — so a kernel that
// reads a result before WaitIterateAll sees stale data here too. Products accumulate in fp32 and are rounded once to
// the output type. Only ND row-major GM operands are in the subset.
#pragma once

#include <functional>

#include "data_copy.h"
#include "pipe.h"

namespace AscendC {

enum class CubeFormat { ND = 0, NZ, ZN, ZZ, NN, ND_ALIGN, SCALAR, VECTOR, ROW_MAJOR = ND, COLUMN_MAJOR = 8 };
enum class LayoutMode { NONE = 0, BSNGD, SBNGD, BNGS1S2, NORMAL };

template <TPosition POSITION, CubeFormat FORMAT, typename TYPE, bool ISTRANS = false,
          LayoutMode LAYOUT = LayoutMode::NONE, bool IBSHARE = false, TPosition SRCPOS = TPosition::GM>
struct MatmulType {
  static_assert(FORMAT == CubeFormat::ND, "MatmulType: only CubeFormat::ND is in this runtime's subset");
  static constexpr TPosition pos = POSITION;
  static constexpr bool isTrans = ISTRANS;
  using T = TYPE;
};

struct MatmulConfig {
  bool doNorm = true;
  bool doMultiDataLoad = false;
};
inline constexpr MatmulConfig CFG_NORM{true, false};
inline constexpr MatmulConfig CFG_MDL{false, true};

// The fields of TCubeTiling a host tiling function fills (names as in the docs; all int32).
struct TCubeTiling {
  int32_t usedCoreNum = 1, M = 0, N = 0, Ka = 0, Kb = 0, singleCoreM = 0, singleCoreN = 0, singleCoreK = 0;
  int32_t baseM = 128, baseN = 128, baseK = 64, depthA1 = 1, depthB1 = 1, stepM = 1, stepN = 1, isBias = 0;
  int32_t transLength = 0, iterateOrder = 0, shareL1Size = 0, shareL0CSize = 0, shareUbSize = 0;
  int32_t batchM = 1, batchN = 1, singleBatchM = 1, singleBatchN = 1, stepKa = 1, stepKb = 1;
  int32_t dbL0A = 2, dbL0B = 2, dbL0C = 1;
};

namespace cpu {

// One matmul as posted by a client: everything needed to run it on the cube core.
struct MatmulJob {
  std::function<void()> run;
  bool done = false;
};

struct MatmulMailbox {
  std::deque<MatmulJob*> jobs;
  int clients_left = 0;          // AIV threads of the group still running
  bool server_gone = false;      // the AIC thread returned
};

void PostMatmul(MatmulJob* job);     // client: enqueue for this group's AIC
void WaitMatmul(MatmulJob* job);     // client: block until the AIC finished it
void DropMatmul(MatmulJob* job) noexcept;  // client unwinding: unqueue the job, or wait until the AIC let go of it
bool ServeMatmuls();                 // AIC: run jobs until every client of the group has finished
bool MatmulInline();                 // true when this core runs the cube itself (AIC core, or AIC_MODE)

}  // namespace cpu

template <class A_TYPE, class B_TYPE, class C_TYPE, class BIAS_TYPE = C_TYPE, const auto& MM_CFG = CFG_NORM>
class Matmul {
  using SrcAT = typename A_TYPE::T;
  using SrcBT = typename B_TYPE::T;
  using DstT = typename C_TYPE::T;
  using BiasT = typename BIAS_TYPE::T;

 public:
  Matmul() = default;
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;
  // A client that fails (or returns) with an IterateAll<false> in flight must not free the job under the AIC.
  ~Matmul() {
    if (pending_ && !ran_inline_) cpu::DropMatmul(pending_);
  }

  __aicore__ inline void Init(const TCubeTiling* cubeTiling, TPipe* tpipe = nullptr) {
    ASCENDC_CPU_CHECK(cubeTiling != nullptr, "Matmul::Init", "cubeTiling is null");
    t_ = *cubeTiling;
    SetOrgShape(t_.M, t_.N, t_.Ka, t_.Kb, 0);
    SetSingleShape(t_.singleCoreM, t_.singleCoreN, t_.singleCoreK);
    inited_ = true;
  }
  __aicore__ inline void SetOrgShape(int orgM, int orgN, int orgK) { SetOrgShape(orgM, orgN, orgK, orgK, 0); }
  __aicore__ inline void SetOrgShape(int orgM, int orgN, int orgKa, int orgKb, int orgKc = 0) {
    const int org[5] = {orgM, orgN, orgKa, orgKb, orgKc};
    std::copy(org, org + 5, org_);
  }
  __aicore__ inline void SetSingleShape(int singleM, int singleN, int singleK) { single_[0] = singleM; single_[1] = singleN; single_[2] = singleK; }
  __aicore__ inline void SetTail(int tailM = -1, int tailN = -1, int tailK = -1) {
    if (tailM > 0) single_[0] = tailM;
    if (tailN > 0) single_[1] = tailN;
    if (tailK > 0) single_[2] = tailK;
  }
  __aicore__ inline void SetTensorA(const GlobalTensor<SrcAT>& gm, bool isTransposeA = false) {
    ASCENDC_CPU_CHECK(!isTransposeA || A_TYPE::isTrans, "Matmul::SetTensorA",
                      "isTransposeA needs a MatmulType declared with ISTRANS = true");
    a_ = gm;
    trans_a_ = isTransposeA;
  }
  __aicore__ inline void SetTensorB(const GlobalTensor<SrcBT>& gm, bool isTransposeB = false) {
    ASCENDC_CPU_CHECK(!isTransposeB || B_TYPE::isTrans, "Matmul::SetTensorB",
                      "isTransposeB needs a MatmulType declared with ISTRANS = true");
    b_ = gm;
    trans_b_ = isTransposeB;
  }
  __aicore__ inline void SetBias(const GlobalTensor<BiasT>& biasGlobal) { bias_ = biasGlobal; has_bias_ = true; }
  __aicore__ inline void DisableBias() { has_bias_ = false; }

  template <bool sync = true>
  __aicore__ inline void IterateAll(const GlobalTensor<DstT>& gm, uint8_t enAtomic = 0, bool enSequentialWrite = false,
                                    bool waitIterateAll = false, bool fakeMsg = false) {
    Submit([=, self = Snapshot()] { self.Run(gm.Data(), gm.GetSize(), enAtomic != 0, true); }, sync);
  }
  template <bool sync = true>
  __aicore__ inline void IterateAll(const LocalTensor<DstT>& ubCmatrix, uint8_t enAtomic = 0) {
    ubCmatrix.CheckAligned("Matmul::IterateAll(UB)", "ubCmatrix");
    Submit([=, self = Snapshot()] { self.Run(ubCmatrix.Data(), ubCmatrix.GetSize(), enAtomic != 0, false); }, sync);
  }
  __aicore__ inline void WaitIterateAll() {
    ASCENDC_CPU_CHECK(pending_ != nullptr, "Matmul::WaitIterateAll", "no IterateAll<false> is outstanding");
    Finish();
  }
  __aicore__ inline void End() {
    ASCENDC_CPU_CHECK(pending_ == nullptr, "Matmul::End", "an IterateAll<false> was never waited for");
  }

 private:
  // The parameters of one product, copied at IterateAll so the cube core works on a stable description.
  struct Params {
    GlobalTensor<SrcAT> a;
    GlobalTensor<SrcBT> b;
    GlobalTensor<BiasT> bias;
    bool has_bias, trans_a, trans_b;
    int org[5], single[3];

    void Run(DstT* out, uint64_t out_size, bool atomic, bool to_gm) const {
      const int M = single[0], N = single[1], K = single[2];
      ASCENDC_CPU_CHECK(M > 0 && N > 0 && K > 0, "Matmul::IterateAll", "single shape (", M, ", ", N, ", ", K,
                        ") must be positive");
      const int64_t lda = trans_a ? org[0] : org[2], ldb = trans_b ? org[3] : org[1];
      const int64_t ldc = org[4] > 0 ? org[4] : org[1];
      const uint64_t a_last = trans_a ? uint64_t(K - 1) * lda + M : uint64_t(M - 1) * lda + K;
      const uint64_t b_last = trans_b ? uint64_t(N - 1) * ldb + K : uint64_t(K - 1) * ldb + N;
      a.CheckRange(0, a_last, "Matmul::IterateAll", "tensor A");
      b.CheckRange(0, b_last, "Matmul::IterateAll", "tensor B");
      if (has_bias) bias.CheckRange(0, N, "Matmul::IterateAll", "bias");
      ASCENDC_CPU_CHECK(uint64_t(M - 1) * ldc + N <= out_size, "Matmul::IterateAll", "the result [", M, " x ", N,
                        "] with row stride ", ldc, " exceeds the output tensor's ", out_size, " elements");
      auto& k = cpu::Core().counters;
      k.cube_macs += uint64_t(M) * N * K;
      ++k.cube_jobs;
      k.gm_read_bytes += (uint64_t(M) * K * sizeof(SrcAT) + uint64_t(K) * N * sizeof(SrcBT));
      if (to_gm) k.gm_write_bytes += uint64_t(M) * N * sizeof(DstT);
      if (cpu::CountOnly()) return;
      std::vector<float> acc(size_t(M) * N, 0.0f);
      for (int m = 0; m < M; ++m)
        for (int k = 0; k < K; ++k) {
          const float x = ToF(a.Data()[trans_a ? k * lda + m : m * lda + k]);
          if (x == 0.0f) continue;
          float* row = &acc[size_t(m) * N];
          for (int n = 0; n < N; ++n) row[n] += x * ToF(b.Data()[trans_b ? n * ldb + k : k * ldb + n]);
        }
      std::vector<DstT> row(N);
      for (int m = 0; m < M; ++m) {
        for (int n = 0; n < N; ++n)
          row[n] = cpu::FromFloat<DstT>(acc[size_t(m) * N + n] + (has_bias ? ToF(bias.Data()[n]) : 0.0f));
        DstT* o = out + int64_t(m) * ldc;
        // enAtomic adds the converted result into the output; in GM other groups may add to the same elements
        // concurrently, so that goes through the runtime's atomic add.
        bool added = false;
        if constexpr (kAtomicType) {
          if (atomic && to_gm) cpu::AtomicAddToGm(o, row.data(), size_t(N)), added = true;
        }
        if (added) continue;
        if (atomic) for (int n = 0; n < N; ++n) o[n] = cpu::FromFloat<DstT>(ToF(o[n]) + ToF(row[n]));
        else std::copy(row.begin(), row.end(), o);
      }
    }
    static constexpr bool kAtomicType = std::is_same_v<DstT, float> || std::is_same_v<DstT, half> ||
                                        std::is_same_v<DstT, bfloat16_t>;
    template <typename V>
    static float ToF(V v) { return cpu::ToFloat(v); }
  };

  Params Snapshot() const {
    ASCENDC_CPU_CHECK(inited_, "Matmul::IterateAll", "Init (or REGIST_MATMUL_OBJ) was not called");
    ASCENDC_CPU_CHECK(a_.Data() && b_.Data(), "Matmul::IterateAll", "SetTensorA and SetTensorB must come first");
    Params p{a_, b_, bias_, has_bias_, trans_a_, trans_b_, {org_[0], org_[1], org_[2], org_[3], org_[4]},
             {single_[0], single_[1], single_[2]}};
    return p;
  }
  void Submit(std::function<void()> run, bool sync) {
    ASCENDC_CPU_CHECK(pending_ == nullptr, "Matmul::IterateAll",
                      "the previous IterateAll<false> was not waited for (WaitIterateAll)");
    job_.done = false;
    pending_ = &job_;
    ran_inline_ = cpu::MatmulInline();
    if (ran_inline_) {
      run();  // this core is the cube: IterateAll<false> is complete at once, WaitIterateAll has nothing to wait for
    } else {
      job_.run = std::move(run);
      cpu::PostMatmul(pending_);
    }
    if (sync) Finish();
  }
  void Finish() {
    if (!ran_inline_) cpu::WaitMatmul(pending_);
    pending_ = nullptr;
  }

  TCubeTiling t_;
  bool inited_ = false;
  int org_[5] = {0, 0, 0, 0, 0};
  int single_[3] = {0, 0, 0};
  GlobalTensor<SrcAT> a_;
  GlobalTensor<SrcBT> b_;
  GlobalTensor<BiasT> bias_;
  bool has_bias_ = false, trans_a_ = false, trans_b_ = false;
  cpu::MatmulJob job_;
  cpu::MatmulJob* pending_ = nullptr;
  bool ran_inline_ = false;
};

namespace cpu {
inline void InitMatmuls(TPipe*) {}
template <typename MM, typename Tiling, typename... Rest>
void InitMatmuls(TPipe* pipe, MM& mm, Tiling tiling, Rest&&... rest) {
  if (tiling != nullptr) mm.Init(tiling, pipe);
  InitMatmuls(pipe, std::forward<Rest>(rest)...);
}
// AIV: initialise the client objects and continue; AIC in a MIX launch: serve, then tell the kernel to return.
template <typename... Objs>
bool RegisterMatmuls(TPipe* pipe, GM_ADDR workspace, Objs&&... objs) {
  if (Core().type == CoreType::AIC && Core().mode != KernelMode::AIC_MODE) return ServeMatmuls();
  InitMatmuls(pipe, std::forward<Objs>(objs)...);
  return false;
}
}  // namespace cpu

}  // namespace AscendC

// REGIST_MATMUL_OBJ(tpipe, workspace, mm1, &tiling1, mm2, &tiling2, ...): the AIC of a MIX kernel serves its AIVs'
// matmuls and returns from the kernel; every other core initialises the objects and carries on.
#define REGIST_MATMUL_OBJ(tpipe, workspace, ...) \
  if (::AscendC::cpu::RegisterMatmuls(tpipe, workspace, __VA_ARGS__)) return
#define REGIST_CUBE_OBJ REGIST_MATMUL_OBJ
namespace matmul = AscendC;
