// Counter source for the performance model's tests (test/npu/test_perf_model.py): a MIX GEMM kernel (each AIV asks
// its group's cube for a [rows x N] = [rows x K] x [K x N] slice) and a vector add kernel, launched through the CPU
// runtime. Prints one line per core: `core <AIC|AIV> <block_idx> <gm_read> <gm_write> <cube_macs> <vector_elements>
// <vector_repeats> <copies> <vector_instrs> <cube_jobs>`, after a `launch <name>` line. Usage: npu_model_counts [count-only (0/1)]
#include <cstdio>
#include <cstdlib>

#include "tikicpulib.h"

using namespace AscendC;

namespace {
constexpr int kRowsPerAiv = 64, kN = 128, kK = 256, kGroups = 4;  // GEMM: M = 8 AIVs x 64 rows
constexpr uint32_t kAddTile = 1024, kAddTilesPerCore = 4, kAddCores = 8;
}  // namespace

// MIX GEMM: AIV i computes rows [64 i, 64 i + 64) of C = A B through the Matmul API (the cube runs on its AIC).
extern "C" __global__ __aicore__ void gemm_slices(GM_ADDR a, GM_ADDR b, GM_ADDR c, GM_ADDR workspace) {
  TPipe pipe;
  TCubeTiling t;
  t.M = kRowsPerAiv * 2 * kGroups; t.N = kN; t.Ka = kK; t.Kb = kK;
  t.singleCoreM = kRowsPerAiv; t.singleCoreN = kN; t.singleCoreK = kK;
  Matmul<MatmulType<TPosition::GM, CubeFormat::ND, half>, MatmulType<TPosition::GM, CubeFormat::ND, half>,
         MatmulType<TPosition::GM, CubeFormat::ND, float>> mm;
  REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
  const int idx = GetBlockIdx();
  GlobalTensor<half> ag, bg;
  GlobalTensor<float> cg;
  ag.SetGlobalBuffer((__gm__ half*)a + idx * kRowsPerAiv * kK, kRowsPerAiv * kK);
  bg.SetGlobalBuffer((__gm__ half*)b, kK * kN);
  cg.SetGlobalBuffer((__gm__ float*)c + idx * kRowsPerAiv * kN, kRowsPerAiv * kN);
  mm.SetTensorA(ag);
  mm.SetTensorB(bg);
  mm.template IterateAll<false>(cg);
  mm.WaitIterateAll();
  mm.End();
}

// AIV: z = x + y over kAddTilesPerCore tiles of kAddTile fp16 per core, double-buffered queues.
extern "C" __global__ __aicore__ void add_tiles(GM_ADDR x, GM_ADDR y, GM_ADDR z) {
  const uint32_t per = kAddTile * kAddTilesPerCore;
  GlobalTensor<half> xg, yg, zg;
  xg.SetGlobalBuffer((__gm__ half*)x + per * GetBlockIdx(), per);
  yg.SetGlobalBuffer((__gm__ half*)y + per * GetBlockIdx(), per);
  zg.SetGlobalBuffer((__gm__ half*)z + per * GetBlockIdx(), per);
  TPipe pipe;
  TQue<TPosition::VECIN, 2> qx, qy;
  TQue<TPosition::VECOUT, 2> qz;
  pipe.InitBuffer(qx, 2, kAddTile * sizeof(half));
  pipe.InitBuffer(qy, 2, kAddTile * sizeof(half));
  pipe.InitBuffer(qz, 2, kAddTile * sizeof(half));
  for (uint32_t i = 0; i < kAddTilesPerCore; ++i) {
    LocalTensor<half> xa = qx.AllocTensor<half>(), ya = qy.AllocTensor<half>();
    DataCopy(xa, xg[i * kAddTile], kAddTile);
    DataCopy(ya, yg[i * kAddTile], kAddTile);
    qx.EnQue(xa);
    qy.EnQue(ya);
    xa = qx.DeQue<half>();
    ya = qy.DeQue<half>();
    LocalTensor<half> za = qz.AllocTensor<half>();
    Add(za, xa, ya, kAddTile);
    qz.EnQue(za);
    qx.FreeTensor(xa);
    qy.FreeTensor(ya);
    za = qz.DeQue<half>();
    DataCopy(zg[i * kAddTile], za, kAddTile);
    qz.FreeTensor(za);
  }
}

static void PrintStats() {
  const cpu::LaunchStats st = cpu::LastLaunchStats();
  std::printf("launch %s\n", st.kernel.c_str());
  for (const cpu::CoreStats& c : st.cores) {
    const cpu::Counters& k = c.counters;
    std::printf("core %s %d %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu\n", c.type == cpu::CoreType::AIC ? "AIC" : "AIV",
                c.block_idx, (unsigned long long)k.gm_read_bytes, (unsigned long long)k.gm_write_bytes,
                (unsigned long long)k.cube_macs, (unsigned long long)k.vector_elements,
                (unsigned long long)k.vector_repeats, (unsigned long long)k.copies,
                (unsigned long long)k.vector_instrs, (unsigned long long)k.cube_jobs,
                (unsigned long long)k.scalar_gm, (unsigned long long)k.scalar_ub);
  }
}

int main(int argc, char** argv) {
  cpu::SetCountOnly(argc > 1 && std::atoi(argv[1]) != 0);
  const int m = kRowsPerAiv * 2 * kGroups;
  half* a = (half*)GmAlloc(size_t(m) * kK * sizeof(half));
  half* b = (half*)GmAlloc(size_t(kK) * kN * sizeof(half));
  float* c = (float*)GmAlloc(size_t(m) * kN * sizeof(float));
  uint8_t* ws = (uint8_t*)GmAlloc(1024);
  for (int i = 0; i < m * kK; ++i) a[i] = half(float(i % 5) * 0.25f);
  for (int i = 0; i < kK * kN; ++i) b[i] = half(float(i % 3) - 1.0f);
  SetKernelMode(KernelMode::MIX_MODE);
  ICPU_RUN_KF(gemm_slices, kGroups, (uint8_t*)a, (uint8_t*)b, (uint8_t*)c, ws);
  PrintStats();

  const uint32_t n = kAddTile * kAddTilesPerCore * kAddCores;
  half* x = (half*)GmAlloc(n * sizeof(half));
  half* y = (half*)GmAlloc(n * sizeof(half));
  half* z = (half*)GmAlloc(n * sizeof(half));
  for (uint32_t i = 0; i < n; ++i) { x[i] = half(float(i % 7)); y[i] = half(0.5f); }
  SetKernelMode(KernelMode::AIV_MODE);
  ICPU_RUN_KF(add_tiles, kAddCores, (uint8_t*)x, (uint8_t*)y, (uint8_t*)z);
  PrintStats();
  GmFree(a); GmFree(b); GmFree(c); GmFree(ws); GmFree(x); GmFree(y); GmFree(z);
  return 0;
}
