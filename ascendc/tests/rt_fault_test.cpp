// Seeded faults: each case is a tiny kernel with one bug; ICPU_RUN_KF must throw AscendC::cpu::KernelCheckError
// whose message names the check (and the core). Includes faults on one core while the others wait (SyncAll,
// a matmul, a cross-core flag): the launch must end with the error, not hang.
#include "rt_test_util.h"

using namespace AscendC;
using rtt::ExpectFault;
using rtt::Gm;
using rtt::LaunchError;

namespace {

constexpr KernelMode AIV = KernelMode::AIV_MODE;
constexpr KernelMode MIX = KernelMode::MIX_MODE;

std::string Aiv(std::function<void()> body) { return LaunchError(AIV, 1, std::move(body)); }

RT_TEST(fault_ub_overflow_at_init_buffer) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TQue<TPosition::VECIN, 2> q;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 100 * 1024);
                pipe.InitBuffer(q, 2, 48 * 1024);  // 196 KB > 192 KB
              }),
              {"TPipe::InitBuffer", "UB overflow", "AIV 0"});
}

RT_TEST(fault_datacopy_count_not_multiple_of_32_bytes) {
  Gm<half> x(256);
  ExpectFault(Aiv([&] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 512);
                GlobalTensor<half> xg;
                xg.SetGlobalBuffer((__gm__ half*)x.p, 256);
                DataCopy(b.Get<half>(), xg, 100);  // 200 B
              }),
              {"DataCopy(GM->UB)", "not a multiple of 32"});
}

RT_TEST(fault_misaligned_ub_operand_address) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 1024);
                auto t = b.Get<float>();
                Add(t[3], t[64], t[128], 16);  // t[3] starts 12 B into a DataBlock
              }),
              {"Add", "dst", "not 32-byte aligned"});
}

RT_TEST(fault_misaligned_datacopy_ub_address) {
  Gm<float> x(64);
  ExpectFault(Aiv([&] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 1024);
                GlobalTensor<float> xg;
                xg.SetGlobalBuffer((__gm__ float*)x.p, 64);
                DataCopy(b.Get<float>()[4], xg, 8);
              }),
              {"DataCopy(GM->UB)", "not 32-byte aligned"});
}

RT_TEST(fault_dequeue_on_empty_queue) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TQue<TPosition::VECIN, 1> q;
                pipe.InitBuffer(q, 1, 256);
                auto t = q.DeQue<float>();
                q.FreeTensor(t);
              }),
              {"TQue::DeQue", "empty"});
}

RT_TEST(fault_alloc_tensor_beyond_buffers) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TQue<TPosition::VECIN, 2> q;
                pipe.InitBuffer(q, 2, 256);
                auto a = q.AllocTensor<float>(), b = q.AllocTensor<float>(), c = q.AllocTensor<float>();
                q.FreeTensor(a), q.FreeTensor(b), q.FreeTensor(c);
              }),
              {"TQue::AllocTensor", "all 2 buffers"});
}

RT_TEST(fault_free_of_enqueued_tensor) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TQue<TPosition::VECIN, 1> q;
                pipe.InitBuffer(q, 1, 256);
                auto a = q.AllocTensor<float>();
                q.EnQue(a);
                q.FreeTensor(a);
              }),
              {"TQue::FreeTensor", "still enqueued"});
}

RT_TEST(fault_double_free) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TQue<TPosition::VECOUT, 1> q;
                pipe.InitBuffer(q, 1, 256);
                auto a = q.AllocTensor<float>();
                q.FreeTensor(a);
                q.FreeTensor(a);
              }),
              {"TQue::FreeTensor", "already freed"});
}

RT_TEST(fault_tensor_leaked_at_kernel_end) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TQue<TPosition::VECIN, 2> q;
                pipe.InitBuffer(q, 2, 256);
                auto a = q.AllocTensor<float>();
                q.EnQue(a);  // never DeQue'd nor freed
              }),
              {"never freed"});
}

RT_TEST(fault_enque_of_freed_tensor) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TQue<TPosition::VECIN, 1> q;
                pipe.InitBuffer(q, 1, 256);
                auto a = q.AllocTensor<float>();
                q.FreeTensor(a);
                q.EnQue(a);
              }),
              {"TQue::EnQue", "freed"});
}

RT_TEST(fault_use_of_freed_tensor) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TQue<TPosition::VECIN, 1> q;
                pipe.InitBuffer(q, 1, 256);
                auto a = q.AllocTensor<float>();
                q.FreeTensor(a);
                Duplicate(a, 1.0f, 8);
              }),
              {"Duplicate", "freed"});
}

RT_TEST(fault_set_global_buffer_outside_gm) {
  Gm<float> x(64);
  ExpectFault(Aiv([&] {
                GlobalTensor<float> g;
                g.SetGlobalBuffer((__gm__ float*)x.p + 32, 64);  // runs 128 B past the allocation
              }),
              {"GlobalTensor::SetGlobalBuffer", "not inside one GM allocation"});
  static float host[64];
  ExpectFault(Aiv([&] {
                GlobalTensor<float> g;
                g.SetGlobalBuffer((__gm__ float*)host, 64);  // host memory, not GmAlloc
              }),
              {"GlobalTensor::SetGlobalBuffer", "not inside one GM allocation"});
}

RT_TEST(fault_datacopy_beyond_global_tensor) {
  Gm<float> x(256);
  ExpectFault(Aiv([&] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 1024);
                GlobalTensor<float> xg;
                xg.SetGlobalBuffer((__gm__ float*)x.p, 64);  // the tensor is 64 elements of the 256
                DataCopy(b.Get<float>(), xg[32], 64);
              }),
              {"DataCopy(GM->UB)", "out of bounds of the GlobalTensor"});
  ExpectFault(Aiv([&] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 1024);
                GlobalTensor<float> xg;
                xg.SetGlobalBuffer((__gm__ float*)x.p, 64);
                DataCopyPad(xg, b.Get<float>(), DataCopyExtParams(4, 80, 0, 8, 0));  // rows 88 B apart
              }),
              {"DataCopyPad(UB->GM)", "out of bounds of the GlobalTensor"});
}

RT_TEST(fault_atomic_add_on_integer_copy) {
  Gm<int32_t> y(8);
  ExpectFault(Aiv([&] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 32);
                GlobalTensor<int32_t> yg;
                yg.SetGlobalBuffer((__gm__ int32_t*)y.p, 8);
                SetAtomicAdd<float>();
                DataCopy(yg, b.Get<int32_t>(), 8);
              }),
              {"DataCopy(UB->GM)", "SetAtomicAdd is active"});
}

RT_TEST(fault_global_get_value_beyond) {
  Gm<int32_t> x(16);
  ExpectFault(Aiv([&] {
                GlobalTensor<int32_t> g;
                g.SetGlobalBuffer((__gm__ int32_t*)x.p, 16);
                (void)g.GetValue(16);
              }),
              {"GlobalTensor::GetValue", "out of bounds"});
}

RT_TEST(fault_local_tensor_out_of_bounds) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TQue<TPosition::VECCALC, 1> q;
                pipe.InitBuffer(q, 1, 256);
                auto a = q.AllocTensor<float>();
                Add(a, a, a, 65);  // 64 elements in the buffer
                q.FreeTensor(a);
              }),
              {"Add", "out of bounds of the LocalTensor"});
  ExpectFault(Aiv([] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 256);
                b.Get<half>().SetValue(128, half(1.0f));
              }),
              {"LocalTensor::SetValue", "out of bounds"});
  ExpectFault(Aiv([] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 1024);
                auto t = b.Get<float>();  // 256 floats; 4 repeats of 8 blocks 16 blocks apart reach 1792 B
                Exp(t, t, 64, 4, UnaryRepeatParams(1, 1, 16, 16));
              }),
              {"Exp", "out of bounds of the LocalTensor"});
}

RT_TEST(fault_mask_out_of_range) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 1024);
                auto t = b.Get<float>();
                Add(t, t, t, 65, 1, BinaryRepeatParams());  // 64 lanes for 32-bit data
              }),
              {"Add", "mask 65 must be in [1, 64]"});
  ExpectFault(Aiv([] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 1024);
                auto t = b.Get<float>();
                uint64_t mask[2] = {~0ull, 1};
                Mul(t, t, t, mask, 1, BinaryRepeatParams());
              }),
              {"Mul", "mask[1] must be 0"});
}

RT_TEST(fault_compare_count_not_whole_repeats) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 2048);
                auto x = b.GetWithOffset<float>(256, 0);
                auto bits = b.GetWithOffset<uint8_t>(64, 1024);
                CompareScalar(bits, x, 0.0f, CMPMODE::LT, 100);  // 400 B
              }),
              {"CompareScalar", "not a multiple of 256"});
}

RT_TEST(fault_repeat_out_of_range) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                TBuf<TPosition::VECCALC> b;
                pipe.InitBuffer(b, 64 * 1024);
                auto t = b.Get<float>();
                WholeReduceSum(t, t, 64, 256, 1, 1, 8);
              }),
              {"WholeReduceSum", "repeatTime 256"});
}

RT_TEST(fault_wait_flag_without_set_flag) {
  ExpectFault(Aiv([] {
                TPipe pipe;
                event_t e = static_cast<event_t>(pipe.FetchEventID(HardEvent::V_MTE3));
                WaitFlag<HardEvent::V_MTE3>(e);
              }),
              {"WaitFlag", "never set"});
}

using MM = Matmul<MatmulType<TPosition::GM, CubeFormat::ND, half>, MatmulType<TPosition::GM, CubeFormat::ND, half>,
                  MatmulType<TPosition::GM, CubeFormat::ND, float>>;

// One AIV's [16 x 32] x [32 x 16] product; a/b/c sized by the caller.
void MatmulBody(half* a, uint64_t a_elems, half* b, float* c) {
  TPipe pipe;
  TCubeTiling t;
  t.M = 16, t.N = 16, t.Ka = 32, t.Kb = 32, t.singleCoreM = 16, t.singleCoreN = 16, t.singleCoreK = 32;
  MM mm;
  REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
  GlobalTensor<half> ag, bg;
  GlobalTensor<float> cg;
  ag.SetGlobalBuffer((__gm__ half*)a, a_elems);
  bg.SetGlobalBuffer((__gm__ half*)b, 512);
  cg.SetGlobalBuffer((__gm__ float*)c + GetBlockIdx() * 256, 256);
  mm.SetTensorA(ag);
  mm.SetTensorB(bg);
  mm.IterateAll(cg);
  mm.End();
}

RT_TEST(fault_matmul_in_aiv_mode) {
  Gm<half> a(512), b(512);
  Gm<float> c(256);
  ExpectFault(LaunchError(AIV, 1, [&] { MatmulBody(a.p, 512, b.p, c.p); }), {"Matmul", "MIX_MODE"});
}

RT_TEST(fault_matmul_async_never_waited) {
  Gm<half> a(512), b(512);
  Gm<float> c(512);
  ExpectFault(LaunchError(MIX, 1, [&] {
                TPipe pipe;
                TCubeTiling t;
                t.M = 16, t.N = 16, t.Ka = 32, t.Kb = 32, t.singleCoreM = 16, t.singleCoreN = 16, t.singleCoreK = 32;
                MM mm;
                REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &t);
                GlobalTensor<half> ag, bg;
                GlobalTensor<float> cg;
                ag.SetGlobalBuffer((__gm__ half*)a.p, 512);
                bg.SetGlobalBuffer((__gm__ half*)b.p, 512);
                cg.SetGlobalBuffer((__gm__ float*)c.p + GetBlockIdx() * 256, 256);
                mm.SetTensorA(ag);
                mm.SetTensorB(bg);
                mm.IterateAll<false>(cg);
                mm.End();
              }),
              {"Matmul::End", "never waited"});
}

extern "C" __global__ __aicore__ void pointer_kernel(GM_ADDR x, GM_ADDR y) {}

RT_TEST(fault_non_gm_pointer_argument) {
  Gm<uint8_t> x(64);
  static uint8_t host[64];
  SetKernelMode(AIV);
  std::string error;
  try {
    ICPU_RUN_KF(pointer_kernel, 1, x.addr(), (GM_ADDR)host);
  } catch (const cpu::KernelCheckError& e) {
    error = e.what();
  }
  ExpectFault(error, {"ICPU_RUN_KF(pointer_kernel)", "pointer argument 1 is not GM"});
}

RT_TEST(fault_num_blocks_over_limit) {
  ExpectFault(LaunchError(AIV, 51, [] {}), {"ICPU_RUN_KF", "numBlocks 51 must be in [1, 50]"});
  ExpectFault(LaunchError(MIX, 26, [] {}), {"ICPU_RUN_KF", "numBlocks 26 must be in [1, 25]"});
  ExpectFault(LaunchError(AIV, 0, [] {}), {"ICPU_RUN_KF", "numBlocks 0"});
}

// ---- one core fails while the others wait: the launch ends with that core's error ----

RT_TEST(fault_stops_cores_waiting_in_syncall) {
  Gm<half> x(64);
  ExpectFault(LaunchError(AIV, 6, [&] {
                if (GetBlockIdx() == 4) {
                  TPipe pipe;
                  TBuf<TPosition::VECCALC> b;
                  pipe.InitBuffer(b, 256);
                  GlobalTensor<half> xg;
                  xg.SetGlobalBuffer((__gm__ half*)x.p, 64);
                  DataCopy(b.Get<half>(), xg, 24);  // 48 B
                }
                SyncAll();
                SyncAll();
              }),
              {"AIV 4", "DataCopy(GM->UB)", "not a multiple of 32"});
}

RT_TEST(fault_stops_aiv_waiting_on_matmul) {
  // AIV 1's A tensor is too small: the AIC's check fails while AIV 1 waits for the product and AIV 0 waits in
  // SyncAll for AIV 1.
  Gm<half> a(512), b(512);
  Gm<float> c(512);
  ExpectFault(LaunchError(MIX, 1, [&] {
                MatmulBody(a.p, GetBlockIdx() == 1 ? 100 : 512, b.p, c.p);
                if (ASCEND_IS_AIV) SyncAll();
              }),
              {"AIC 0", "Matmul::IterateAll", "tensor A", "out of bounds"});
}

RT_TEST(fault_stops_aic_serving_and_aivs_in_syncall) {
  // AIV 3 fails before its matmul; the AIVs of both groups wait in SyncAll, AIC 1 serves AIV 2 only.
  Gm<half> a(512), b(512);
  Gm<float> c(1024);
  ExpectFault(LaunchError(MIX, 2, [&] {
                if (ASCEND_IS_AIV && GetBlockIdx() == 3) {
                  TPipe pipe;
                  TQue<TPosition::VECIN, 1> q;
                  pipe.InitBuffer(q, 1, 64);
                  (void)q.DeQue<float>();
                }
                MatmulBody(a.p, 512, b.p, c.p);
                if (ASCEND_IS_AIV) SyncAll();
              }),
              {"AIV 3", "TQue::DeQue"});
}

RT_TEST(fault_core_returns_without_syncall) {
  ExpectFault(LaunchError(AIV, 3, [] {
                if (GetBlockIdx() == 0) return;
                SyncAll();
              }),
              {"SyncAll", "without reaching this SyncAll"});
}

RT_TEST(fault_cross_core_wait_never_set) {
  ExpectFault(LaunchError(MIX, 1, [] {
                if (ASCEND_IS_AIV) CrossCoreWaitFlag(7);
              }),
              {"CrossCoreWaitFlag", "never set"});
  ExpectFault(LaunchError(AIV, 1, [] { CrossCoreSetFlag<2, PIPE_MTE3>(1); }),
              {"CrossCoreSetFlag", "needs a MIX launch"});
}

}  // namespace

RT_MAIN
