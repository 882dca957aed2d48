// The Matmul high-level API on the CPU runtime: MIX mode (each group's AIC serves its two AIVs; sync and async
// IterateAll), AIC_MODE (the cube core runs it inline), transposes, SetOrgShape / SetSingleShape / SetTail on a
// sub-block, bias, enAtomic, fp16 / bf16 / fp32 inputs with fp32 accumulation, and the cube MAC counter.
#include "rt_test_util.h"

using namespace AscendC;
using rtt::Gm;

namespace {

template <typename T>
float F(T v) { return static_cast<float>(v); }

// C[m][n] = sum_k A(m,k) B(k,n) (+ bias[n]) in double, A/B read through their leading dimensions.
template <typename TA, typename TB>
double Dot(const TA* a, const TB* b, int m, int n, int K, bool ta, bool tb, int lda, int ldb) {
  double s = 0;
  for (int k = 0; k < K; ++k)
    s += double(F(ta ? a[k * lda + m] : a[m * lda + k])) * double(F(tb ? b[n * ldb + k] : b[k * ldb + n]));
  return s;
}

template <typename In, typename Out, bool TA, bool TB, bool Sync>
void MixProduct(bool bias, bool atomic) {
  const int blocks = 2, aivs = 4, M = 16, N = 24, K = 40;
  Gm<In> A(aivs * M * K), B(K * N);
  Gm<Out> C(aivs * M * N), Bias(N);
  rtt::Rng rng(43);
  for (int i = 0; i < aivs * M * K; ++i) A[i] = In(rng.Uniform(-1, 1));
  for (int i = 0; i < K * N; ++i) B[i] = In(rng.Uniform(-1, 1));
  for (int i = 0; i < N; ++i) Bias[i] = Out(rng.Uniform(-1, 1));
  for (int i = 0; i < aivs * M * N; ++i) C[i] = Out(atomic ? 0.5f : -9.0f);
  rtt::Launch(KernelMode::MIX_MODE, blocks, [&] {
    TPipe pipe;
    TCubeTiling t;
    t.M = M, t.N = N, t.Ka = K, t.Kb = K, t.singleCoreM = M, t.singleCoreN = N, t.singleCoreK = K;
    t.isBias = bias;
    Matmul<MatmulType<TPosition::GM, CubeFormat::ND, In, TA>, MatmulType<TPosition::GM, CubeFormat::ND, In, TB>,
           MatmulType<TPosition::GM, CubeFormat::ND, Out>, MatmulType<TPosition::GM, CubeFormat::ND, Out>>
        mm;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
    const int v = int(GetBlockIdx());
    GlobalTensor<In> ag, bg;
    GlobalTensor<Out> cg, biasg;
    ag.SetGlobalBuffer((__gm__ In*)A.p + v * M * K, M * K);
    bg.SetGlobalBuffer((__gm__ In*)B.p, K * N);
    cg.SetGlobalBuffer((__gm__ Out*)C.p + v * M * N, M * N);
    biasg.SetGlobalBuffer((__gm__ Out*)Bias.p, N);
    mm.SetTensorA(ag, TA);
    mm.SetTensorB(bg, TB);
    if (bias) mm.SetBias(biasg);
    mm.template IterateAll<Sync>(cg, atomic ? 1 : 0);
    if (!Sync) mm.WaitIterateAll();
    mm.End();
  });
  // A stored [K, M] when transposed (lda = M), B stored [N, K] when transposed (ldb = K).
  for (int v = 0; v < aivs; ++v)
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double want = Dot(A.p + v * M * K, B.p, m, n, K, TA, TB, TA ? M : K, TB ? K : N) + (bias ? F(Bias[n]) : 0.0);
        float got = F(C[v * M * N + m * N + n]);
        if (atomic) got -= 0.5f;
        const double tol = std::is_same_v<Out, float> ? 1e-5 : std::is_same_v<Out, half> ? 2e-3 : 1.6e-2;
        EXPECT(std::fabs(got - want) <= tol * (1 + std::fabs(want)), "C[", v, "][", m, "][", n, "] = ", got,
               " want ", want);
      }
  uint64_t macs = 0;
  for (auto& c : cpu::LastLaunchStats().cores) {
    if (c.type == cpu::CoreType::AIV) EXPECT(c.counters.cube_macs == 0, "AIV counted MACs");
    macs += c.counters.cube_macs;
  }
  EXPECT(macs == uint64_t(aivs) * M * N * K, "cube MACs ", macs);
}

RT_TEST(matmul_mix_sync_fp16_to_fp32) { MixProduct<half, float, false, false, true>(false, false); }
RT_TEST(matmul_mix_async_fp16_to_fp32) { MixProduct<half, float, false, false, false>(false, false); }
RT_TEST(matmul_mix_transpose_a_and_b) {
  MixProduct<half, float, true, false, true>(false, false);
  MixProduct<half, float, false, true, false>(false, false);
  MixProduct<half, float, true, true, true>(false, false);
}
RT_TEST(matmul_mix_bias_and_atomic) {
  MixProduct<half, float, false, true, true>(true, false);
  MixProduct<half, float, false, false, false>(false, true);
  MixProduct<float, float, false, false, true>(true, true);
}
RT_TEST(matmul_mix_bf16_and_fp32_inputs) {
  MixProduct<bfloat16_t, float, false, true, true>(false, false);
  MixProduct<float, float, true, false, false>(false, false);
}
RT_TEST(matmul_fp16_output_rounds_fp32_accumulator_once) {
  MixProduct<half, half, false, false, true>(false, false);
  // 64 products of 1 + 2^-10 sum exactly to 64 + 2^-4 in fp32, an fp16 value; rounding the running sum to fp16
  // after each step would lose the 2^-10 parts once the sum passes 2 (fp16 ulp there is 2^-9 and more).
  const int M = 16, N = 16, K = 64;
  Gm<half> A(M * K), B(K * N), C(M * N);
  for (int i = 0; i < M * K; ++i) A[i] = half(1.0f);
  for (int i = 0; i < K * N; ++i) B[i] = half(1.0f + 1.0f / 1024);
  rtt::Launch(KernelMode::MIX_MODE, 1, [&] {
    TPipe pipe;
    TCubeTiling t;
    t.M = M, t.N = N, t.Ka = K, t.Kb = K, t.singleCoreM = M, t.singleCoreN = N, t.singleCoreK = K;
    Matmul<MatmulType<TPosition::GM, CubeFormat::ND, half>, MatmulType<TPosition::GM, CubeFormat::ND, half>,
           MatmulType<TPosition::GM, CubeFormat::ND, half>> mm;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
    if (GetSubBlockIdx() != 0) { mm.End(); return; }
    GlobalTensor<half> ag, bg, cg;
    ag.SetGlobalBuffer((__gm__ half*)A.p, M * K);
    bg.SetGlobalBuffer((__gm__ half*)B.p, K * N);
    cg.SetGlobalBuffer((__gm__ half*)C.p, M * N);
    mm.SetTensorA(ag);
    mm.SetTensorB(bg);
    mm.IterateAll(cg);
    mm.End();
  });
  for (int i = 0; i < M * N; ++i) EXPECT(F(C[i]) == F(half(64.0f + 64.0f / 1024)), "C[", i, "] = ", F(C[i]));
}

// A [40 x 48] x [48 x 56] problem split into 16 x 24 tiles with tails: SetOrgShape gives the leading dimensions,
// SetSingleShape the tile, SetTail the last tile's extent; each AIV computes the tiles of its index.
RT_TEST(matmul_org_single_shape_and_tail) {
  const int Mo = 40, No = 56, Ko = 48, tm = 16, tn = 24;
  Gm<half> A(Mo * Ko), B(Ko * No);
  Gm<float> C(Mo * No);
  rtt::Rng rng(47);
  for (int i = 0; i < Mo * Ko; ++i) A[i] = half(rng.Uniform(-1, 1));
  for (int i = 0; i < Ko * No; ++i) B[i] = half(rng.Uniform(-1, 1));
  for (int i = 0; i < Mo * No; ++i) C[i] = -9.0f;
  const int tiles_m = (Mo + tm - 1) / tm, tiles_n = (No + tn - 1) / tn;
  rtt::Launch(KernelMode::MIX_MODE, 2, [&] {
    TPipe pipe;
    TCubeTiling t;
    t.M = Mo, t.N = No, t.Ka = Ko, t.Kb = Ko, t.singleCoreM = tm, t.singleCoreN = tn, t.singleCoreK = Ko;
    Matmul<MatmulType<TPosition::GM, CubeFormat::ND, half>, MatmulType<TPosition::GM, CubeFormat::ND, half>,
           MatmulType<TPosition::GM, CubeFormat::ND, float>> mm;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
    GlobalTensor<half> ag, bg;
    GlobalTensor<float> cg;
    ag.SetGlobalBuffer((__gm__ half*)A.p, Mo * Ko);
    bg.SetGlobalBuffer((__gm__ half*)B.p, Ko * No);
    cg.SetGlobalBuffer((__gm__ float*)C.p, Mo * No);
    mm.SetOrgShape(Mo, No, Ko);
    for (int tile = int(GetBlockIdx()); tile < tiles_m * tiles_n; tile += int(GetBlockNum() * GetTaskRatio())) {
      const int i = tile / tiles_n, j = tile % tiles_n;
      mm.SetSingleShape(tm, tn, Ko);
      const int rm = Mo - i * tm, rn = No - j * tn;
      if (rm < tm || rn < tn) mm.SetTail(rm < tm ? rm : -1, rn < tn ? rn : -1);
      mm.SetTensorA(ag[i * tm * Ko]);
      mm.SetTensorB(bg[j * tn]);
      mm.IterateAll(cg[i * tm * No + j * tn]);
    }
    mm.End();
  });
  for (int m = 0; m < Mo; ++m)
    for (int n = 0; n < No; ++n) {
      const double want = Dot(A.p, B.p, m, n, Ko, false, false, Ko, No);
      EXPECT(std::fabs(C[m * No + n] - want) <= 1e-5 * (1 + std::fabs(want)), "C[", m, "][", n, "] = ",
             C[m * No + n], " want ", want);
    }
}

RT_TEST(matmul_aic_mode_inline) {
  const int blocks = 2, M = 16, N = 16, K = 32;
  Gm<half> A(blocks * M * K), B(K * N);
  Gm<float> C(blocks * M * N);
  rtt::Rng rng(53);
  for (int i = 0; i < blocks * M * K; ++i) A[i] = half(rng.Uniform(-1, 1));
  for (int i = 0; i < K * N; ++i) B[i] = half(rng.Uniform(-1, 1));
  rtt::Launch(KernelMode::AIC_MODE, blocks, [&] {
    EXPECT(ASCEND_IS_AIC, "AIC_MODE runs cube cores only");
    TPipe pipe;
    TCubeTiling t;
    t.M = M, t.N = N, t.Ka = K, t.Kb = K, t.singleCoreM = M, t.singleCoreN = N, t.singleCoreK = K;
    Matmul<MatmulType<TPosition::GM, CubeFormat::ND, half>, MatmulType<TPosition::GM, CubeFormat::ND, half>,
           MatmulType<TPosition::GM, CubeFormat::ND, float>> mm;
    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
    GlobalTensor<half> ag, bg;
    GlobalTensor<float> cg;
    ag.SetGlobalBuffer((__gm__ half*)A.p + GetBlockIdx() * M * K, M * K);
    bg.SetGlobalBuffer((__gm__ half*)B.p, K * N);
    cg.SetGlobalBuffer((__gm__ float*)C.p + GetBlockIdx() * M * N, M * N);
    mm.SetTensorA(ag);
    mm.SetTensorB(bg);
    mm.template IterateAll<false>(cg);
    mm.WaitIterateAll();
    mm.End();
  });
  const auto st = cpu::LastLaunchStats();
  EXPECT(st.cores.size() == size_t(blocks), "AIC_MODE cores ", st.cores.size());
  for (auto& c : st.cores) EXPECT(c.type == cpu::CoreType::AIC && c.counters.cube_macs == uint64_t(M) * N * K, "AIC");
  for (int b = 0; b < blocks; ++b)
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        const double want = Dot(A.p + b * M * K, B.p, m, n, K, false, false, K, N);
        EXPECT(std::fabs(C[b * M * N + m * N + n] - want) <= 1e-5 * (1 + std::fabs(want)), "AIC_MODE C");
      }
}

}  // namespace

RT_MAIN
