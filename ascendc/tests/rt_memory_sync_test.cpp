// The CPU runtime's data movement (DataCopy / DataCopyPad / atomic add), buffer lifecycles (TPipe / TQue / TBuf),
// synchronisation across cores (SyncAll, cross-core flags, pipe events), launch statistics and counters, and
// count-only mode, each against values computed here by hand.
#include "rt_test_util.h"

using namespace AscendC;
using rtt::Gm;

namespace {

constexpr KernelMode AIV = KernelMode::AIV_MODE;
constexpr KernelMode MIX = KernelMode::MIX_MODE;

bool IsPoison(float v) { return std::isnan(v); }

RT_TEST(datacopy_count_roundtrip_and_counters) {
  Gm<float> x(256), y(256);
  for (int i = 0; i < 256; ++i) x[i] = float(i);
  rtt::RunAiv([&] {
    TPipe pipe;
    TQue<TPosition::VECIN, 1> q;
    pipe.InitBuffer(q, 1, 256 * sizeof(float));
    GlobalTensor<float> xg, yg;
    xg.SetGlobalBuffer((__gm__ float*)x.p, 256);
    yg.SetGlobalBuffer((__gm__ float*)y.p, 256);
    auto t = q.AllocTensor<float>();
    DataCopy(t, xg[8], 240);  // 960 B: a multiple of 32
    q.EnQue(t);
    t = q.DeQue<float>();
    DataCopy(yg, t, 240);
    q.FreeTensor(t);
  });
  for (int i = 0; i < 240; ++i) EXPECT(y[i] == float(i + 8), "y[", i, "]=", y[i]);
  for (int i = 240; i < 256; ++i) EXPECT(IsPoison(y[i]), "DataCopy wrote beyond count at ", i);
  const auto k = cpu::LastLaunchStats().cores.at(0).counters;
  EXPECT(k.gm_read_bytes == 960 && k.gm_write_bytes == 960 && k.copies == 2, "read ", k.gm_read_bytes, " write ",
         k.gm_write_bytes, " copies ", k.copies);
}

RT_TEST(datacopy_params_strides_all_directions) {
  // 3 blocks of 2 DataBlocks (16 floats); GM gap 1 DataBlock, UB gap 2 DataBlocks.
  Gm<float> x(128), y(128);
  for (int i = 0; i < 128; ++i) x[i] = float(i);
  std::vector<float> ub(160), ub2(160);
  rtt::RunAiv([&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 2 * 160 * 4);
    auto a = buf.GetWithOffset<float>(160, 0), b = buf.GetWithOffset<float>(160, 640);
    GlobalTensor<float> xg, yg;
    xg.SetGlobalBuffer((__gm__ float*)x.p, 128);
    yg.SetGlobalBuffer((__gm__ float*)y.p, 128);
    DataCopy(a, xg, DataCopyParams(3, 2, 1, 2));
    DataCopy(b, a, DataCopyParams(3, 2, 2, 0));   // UB->UB: gather the blocks back together
    DataCopy(yg, a, DataCopyParams(3, 2, 2, 1));  // UB->GM: same gaps as the source had
    for (int i = 0; i < 160; ++i) ub[i] = a.GetValue(i), ub2[i] = b.GetValue(i);
  });
  for (int blk = 0; blk < 3; ++blk)
    for (int e = 0; e < 16; ++e) {
      EXPECT(ub[blk * 32 + e] == float(blk * 24 + e), "UB block ", blk, " elem ", e, " = ", ub[blk * 32 + e]);
      EXPECT(IsPoison(ub[blk * 32 + 16 + e]), "UB gap written at block ", blk);
      EXPECT(ub2[blk * 16 + e] == float(blk * 24 + e), "UB->UB block ", blk);
      EXPECT(y[blk * 24 + e] == float(blk * 24 + e), "GM block ", blk);
    }
  for (int blk = 0; blk < 2; ++blk)
    for (int e = 16; e < 24; ++e) EXPECT(IsPoison(y[blk * 24 + e]), "GM gap written at ", blk * 24 + e);
  const auto k = cpu::LastLaunchStats().cores.at(0).counters;
  EXPECT(k.gm_read_bytes == 3 * 64 && k.gm_write_bytes == 3 * 64 && k.copies == 3, "read ", k.gm_read_bytes);
}

RT_TEST(datacopypad_gm_to_ub_padding_and_strides) {
  // 3 rows of 5 floats (20 B) separated by 8 B in GM -> UB rows of [pad, 5 values, pad, pad] + 1 DataBlock gap.
  Gm<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = float(i);
  std::vector<float> padded(48), raw(48);
  rtt::RunAiv([&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 2 * 48 * 4);
    auto a = buf.GetWithOffset<float>(48, 0), b = buf.GetWithOffset<float>(48, 192);
    GlobalTensor<float> xg;
    xg.SetGlobalBuffer((__gm__ float*)x.p, 64);
    DataCopyPad(a, xg, DataCopyExtParams(3, 20, 8, 1, 0), DataCopyPadExtParams<float>(true, 1, 2, 9.0f));
    DataCopyPad(b, xg, DataCopyExtParams(3, 20, 8, 0, 0), DataCopyPadExtParams<float>(false, 0, 0, 0.0f));
    for (int i = 0; i < 48; ++i) padded[i] = a.GetValue(i), raw[i] = b.GetValue(i);
  });
  for (int r = 0; r < 3; ++r) {
    const float* row = &padded[r * 16];
    EXPECT(row[0] == 9.0f && row[6] == 9.0f && row[7] == 9.0f, "padding of row ", r);
    for (int e = 0; e < 5; ++e) EXPECT(row[1 + e] == float(r * 7 + e), "row ", r, " elem ", e, " = ", row[1 + e]);
    for (int e = 8; e < 16; ++e) EXPECT(IsPoison(row[e]), "UB gap written, row ", r);
    for (int e = 0; e < 5; ++e) EXPECT(raw[r * 8 + e] == float(r * 7 + e), "unpadded row ", r);
    for (int e = 5; e < 8; ++e) EXPECT(IsPoison(raw[r * 8 + e]), "isPad=false must leave the tail poisoned");
  }
  EXPECT(cpu::LastLaunchStats().cores.at(0).counters.gm_read_bytes == 2 * 60, "gm read bytes");
}

RT_TEST(datacopypad_ub_to_gm_strides) {
  // 4 rows of 3 halves (6 B), UB rows 32 B apart + 1 DataBlock gap, GM rows 6 + 2 B apart.
  Gm<half> y(32);
  rtt::RunAiv([&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 256);
    auto a = buf.Get<half>();
    for (int i = 0; i < 128; ++i) a.SetValue(i, half(float(i)));
    GlobalTensor<half> yg;
    yg.SetGlobalBuffer((__gm__ half*)y.p, 32);
    DataCopyPad(yg, a, DataCopyExtParams(4, 6, 1, 2, 0));
  });
  for (int r = 0; r < 4; ++r) {
    for (int e = 0; e < 3; ++e) EXPECT(float(y[r * 4 + e]) == float(r * 32 + e), "GM row ", r, " elem ", e);
    EXPECT(IsPoison(float(y[r * 4 + 3])), "GM gap written in row ", r);
  }
  EXPECT(cpu::LastLaunchStats().cores.at(0).counters.gm_write_bytes == 24, "gm write bytes");
}

RT_TEST(set_atomic_add_across_cores) {
  const int cores = 4, n = 64;
  Gm<float> out(n);
  Gm<half> out_h(n);
  for (int i = 0; i < n; ++i) out[i] = 1.0f, out_h[i] = half(0.5f);
  rtt::Launch(AIV, cores, [&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, n * 4 + n * 2);
    auto t = buf.GetWithOffset<float>(n, 0);
    auto h = buf.GetWithOffset<half>(n, n * 4);
    const float v = float(GetBlockIdx() + 1);
    Duplicate(t, v, n);
    Duplicate(h, half(v), n);
    GlobalTensor<float> og;
    GlobalTensor<half> oh;
    og.SetGlobalBuffer((__gm__ float*)out.p, n);
    oh.SetGlobalBuffer((__gm__ half*)out_h.p, n);
    SetAtomicAdd<float>();
    DataCopy(og, t, n);
    SetAtomicAdd<half>();
    DataCopy(oh, h, n);
    SetAtomicNone();
  });
  for (int i = 0; i < n; ++i) {
    EXPECT(out[i] == 11.0f, "float atomic sum ", out[i]);
    EXPECT(float(out_h[i]) == 10.5f, "half atomic sum ", float(out_h[i]));
  }
}

RT_TEST(integer_data_copies_to_gm) {
  Gm<int32_t> y(16);
  rtt::RunAiv([&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> buf;
    pipe.InitBuffer(buf, 64);
    auto t = buf.Get<int32_t>();
    for (int i = 0; i < 16; ++i) t.SetValue(i, i * 3);
    GlobalTensor<int32_t> yg;
    yg.SetGlobalBuffer((__gm__ int32_t*)y.p, 16);
    DataCopy(yg, t, 8);
    DataCopyPad(yg[8], t[8], DataCopyExtParams(1, 12, 0, 0, 0));
  });
  for (int i = 0; i < 11; ++i) EXPECT(y[i] == i * 3, "y[", i, "] = ", y[i]);
  EXPECT(y[11] == -1, "DataCopyPad wrote past blockLen");
}

RT_TEST(tque_double_buffer_depth2_fifo) {
  rtt::RunAiv([&] {
    TPipe pipe;
    TQue<TPosition::VECIN, 2> q;
    pipe.InitBuffer(q, 2, 100);  // rounded up to 128 B per buffer
    for (int round = 0; round < 3; ++round) {
      auto a = q.AllocTensor<float>(), b = q.AllocTensor<float>();
      EXPECT(a.GetSize() == 32 && b.GetSize() == 32, "buffer size ", a.GetSize());
      EXPECT(b.Data() - a.Data() == 32 || a.Data() - b.Data() == 32, "two distinct adjacent buffers");
      Duplicate(a, 1.0f, 32);
      Duplicate(b, 2.0f, 32);
      EXPECT(q.VacantInQue() && !q.HasTensorInQue(), "empty queue state");
      q.EnQue(a);
      q.EnQue(b);
      EXPECT(q.GetTensorCountInQue() == 2 && q.HasTensorInQue(), "count in queue ", q.GetTensorCountInQue());
      auto first = q.DeQue<float>(), second = q.DeQue<float>();
      EXPECT(first.GetValue(0) == 1.0f && second.GetValue(0) == 2.0f, "DeQue is FIFO");
      q.FreeTensor(first);
      q.FreeTensor(second);
    }
  });
}

RT_TEST(tpipe_reset_reuses_ub_and_tbuf_offsets) {
  rtt::RunAiv([&] {
    TPipe pipe;
    TBuf<TPosition::VECCALC> big;
    pipe.InitBuffer(big, 150 * 1024);
    big.Get<float>().SetValue(0, 1.0f);
    pipe.Reset();  // frees all UB: another 150 KB fits again
    TBuf<TPosition::VECCALC> big2;
    TQue<TPosition::VECOUT, 1> q;
    pipe.InitBuffer(big2, 150 * 1024);
    pipe.InitBuffer(q, 1, 32 * 1024);
    auto part = big2.GetWithOffset<half>(64, 1024);
    EXPECT(part.GetSize() == 64, "GetWithOffset size");
    EXPECT(big2.Get<half>(16).GetSize() == 16, "Get(len) size");
    auto t = q.AllocTensor<half>();
    q.FreeTensor(t);
  });
}

RT_TEST(pipe_events_and_flags) {
  rtt::RunAiv([&] {
    TPipe pipe;
    TEventID a = pipe.AllocEventID<HardEvent::V_MTE3>(), b = pipe.AllocEventID<HardEvent::V_MTE3>();
    EXPECT(a != b, "two ids");
    pipe.ReleaseEventID<HardEvent::V_MTE3>(a);
    EXPECT(pipe.FetchEventID(HardEvent::V_MTE3) == a, "fetch returns the freed id");
    event_t e = static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::MTE2_V));
    SetFlag<HardEvent::MTE2_V>(e);
    WaitFlag<HardEvent::MTE2_V>(e);
    SetFlag<HardEvent::V_MTE3>(b);
    SetFlag<HardEvent::V_MTE3>(b);
    WaitFlag<HardEvent::V_MTE3>(b);
    WaitFlag<HardEvent::V_MTE3>(b);
    PipeBarrier<PIPE_V>();
    pipe.ReleaseEventID<HardEvent::V_MTE3>(b);
  });
}

RT_TEST(syncall_orders_gm_across_cores) {
  for (KernelMode mode : {AIV, MIX}) {
    const int blocks = 3, cores = mode == AIV ? 3 : 6;
    Gm<int32_t> slots(cores * 8), seen(cores * 8);
    rtt::Launch(mode, blocks, [&] {
      if (ASCEND_IS_AIC) return;
      const int me = int(GetBlockIdx()), n = int(GetBlockNum() * GetTaskRatio());
      for (int round = 1; round <= 3; ++round) {
        slots[me * 8] = me * 10 + round;
        SyncAll();
        seen[me * 8] = slots[((me + 1) % n) * 8];
        SyncAll();
        EXPECT(seen[me * 8] == ((me + 1) % n) * 10 + round, "core ", me, " saw ", seen[me * 8]);
      }
    });
  }
}

RT_TEST(cross_core_flags_aic_aiv) {
  const int blocks = 2;
  Gm<int32_t> box(blocks * 8), back(blocks * 16);
  for (int i = 0; i < blocks * 16; ++i) back[i] = 0;
  Gm<int32_t> result(blocks * 8);
  rtt::Launch(MIX, blocks, [&] {
    const int blk = ASCEND_IS_AIC ? int(GetBlockIdx()) : int(GetBlockIdx()) / 2;
    if (ASCEND_IS_AIC) {
      box[blk * 8] = 100 + blk;
      CrossCoreSetFlag<2, PIPE_FIX>(5);   // to both AIVs of the group
      CrossCoreWaitFlag(6);               // from both AIVs
      result[blk * 8] = back[blk * 16] + back[blk * 16 + 8];
    } else {
      CrossCoreWaitFlag(5);
      back[blk * 16 + GetSubBlockIdx() * 8] = box[blk * 8] + 1;
      CrossCoreSetFlag<2, PIPE_MTE3>(6);
    }
  });
  for (int b = 0; b < blocks; ++b) EXPECT(result[b * 8] == 2 * (101 + b), "block ", b, " got ", result[b * 8]);
}

RT_TEST(launch_stats_core_lists_and_ids) {
  struct Id { int32_t type, idx, num, sub, subnum, pad[3]; };
  {
    Gm<int32_t> ids(5 * 8);
    rtt::Launch(AIV, 5, [&] { ids[GetBlockIdx() * 8] = int32_t(GetBlockNum()); });
    const auto st = cpu::LastLaunchStats();
    EXPECT(st.mode == AIV && st.num_blocks == 5 && st.cores.size() == 5 && st.kernel == "rt_kernel", "AIV stats");
    for (int i = 0; i < 5; ++i) {
      EXPECT(st.cores[i].type == cpu::CoreType::AIV && st.cores[i].block_idx == i, "core ", i);
      EXPECT(ids[i * 8] == 5, "GetBlockNum");
    }
  }
  {
    const int blocks = 3;
    Gm<int32_t> aiv(blocks * 2 * 8), aic(blocks * 8);
    for (int i = 0; i < blocks * 16; ++i) aiv[i] = -1;
    rtt::Launch(MIX, blocks, [&] {
      const int idx = int(GetBlockIdx());
      if (ASCEND_IS_AIV) aiv[idx * 8] = int32_t(GetSubBlockIdx()), aiv[idx * 8 + 1] = int32_t(GetTaskRatio());
      else aic[idx * 8] = int32_t(GetBlockNum());
    });
    const auto st = cpu::LastLaunchStats();
    EXPECT(st.mode == MIX && st.cores.size() == 9, "MIX: 1 AIC + 2 AIV per block, got ", st.cores.size());
    int n_aic = 0, n_aiv = 0;
    for (auto& c : st.cores) (c.type == cpu::CoreType::AIC ? n_aic : n_aiv)++;
    EXPECT(n_aic == 3 && n_aiv == 6, "AIC ", n_aic, " AIV ", n_aiv);
    for (int b = 0; b < blocks; ++b) {
      EXPECT(aic[b * 8] == blocks, "AIC GetBlockNum");
      for (int s = 0; s < 2; ++s)
        EXPECT(aiv[(b * 2 + s) * 8] == s && aiv[(b * 2 + s) * 8 + 1] == 2,
               "AIV GetBlockIdx = block*2+sub: slot ", b * 2 + s, " has sub ", aiv[(b * 2 + s) * 8]);
    }
  }
}

// A small add kernel: per core 2 tiles of 128 halves in, 1 out; exact counters, and count-only mode agrees.
void AddTiles(half* x, half* z) {
  TPipe pipe;
  TQue<TPosition::VECIN, 2> qx;
  TQue<TPosition::VECOUT, 2> qz;
  pipe.InitBuffer(qx, 2, 256);
  pipe.InitBuffer(qz, 2, 256);
  GlobalTensor<half> xg, zg;
  xg.SetGlobalBuffer((__gm__ half*)x + GetBlockIdx() * 256, 256);
  zg.SetGlobalBuffer((__gm__ half*)z + GetBlockIdx() * 128, 128);
  auto a = qx.AllocTensor<half>(), b = qx.AllocTensor<half>();
  DataCopy(a, xg, 128);
  DataCopy(b, xg[128], 128);
  qx.EnQue(a);
  qx.EnQue(b);
  a = qx.DeQue<half>();
  b = qx.DeQue<half>();
  auto c = qz.AllocTensor<half>();
  Add(c, a, b, 128);
  Muls(c, c, half(0.5f), 128);
  qz.EnQue(c);
  qx.FreeTensor(a);
  qx.FreeTensor(b);
  c = qz.DeQue<half>();
  DataCopy(zg, c, 128);
  qz.FreeTensor(c);
}

RT_TEST(counters_exact_and_count_only_mode) {
  const int cores = 3;
  Gm<half> x(cores * 256), z(cores * 128);
  for (int i = 0; i < cores * 256; ++i) x[i] = half(float(i % 11));
  rtt::Launch(AIV, cores, [&] { AddTiles(x.p, z.p); });
  const auto full = cpu::LastLaunchStats();
  for (int c = 0; c < cores; ++c)
    for (int i = 0; i < 128; ++i)
      EXPECT(float(z[c * 128 + i]) == float(half((float(x[c * 256 + i]) + float(x[c * 256 + 128 + i])) * 0.5f)),
             "z at ", c, ",", i);
  for (auto& c : full.cores) {
    const auto& k = c.counters;
    EXPECT(k.gm_read_bytes == 512 && k.gm_write_bytes == 256 && k.copies == 3, "core ", c.block_idx, " gm ",
           k.gm_read_bytes, "/", k.gm_write_bytes, " copies ", k.copies);
    EXPECT(k.vector_repeats == 2 && k.vector_elements == 256 && k.cube_macs == 0, "vector ", k.vector_repeats);
  }
  for (int i = 0; i < cores * 128; ++i) z[i] = half(-3.0f);
  cpu::SetCountOnly(true);
  try {
    rtt::Launch(AIV, cores, [&] { AddTiles(x.p, z.p); });
  } catch (...) {
    cpu::SetCountOnly(false);
    throw;
  }
  cpu::SetCountOnly(false);
  const auto counted = cpu::LastLaunchStats();
  for (int i = 0; i < cores * 128; ++i) EXPECT(float(z[i]) == -3.0f, "count-only mode wrote GM at ", i);
  EXPECT(counted.cores.size() == full.cores.size(), "core count");
  for (size_t c = 0; c < full.cores.size(); ++c) {
    const auto &a = full.cores[c].counters, &b = counted.cores[c].counters;
    EXPECT(a.gm_read_bytes == b.gm_read_bytes && a.gm_write_bytes == b.gm_write_bytes && a.copies == b.copies &&
           a.vector_repeats == b.vector_repeats && a.vector_elements == b.vector_elements,
           "count-only counters differ on core ", c);
  }
}

// Count-only mode must not touch data for any instruction: run one of each on poisoned UB and check nothing moved.
RT_TEST(count_only_touches_no_data) {
  Gm<float> x(64), y(64);
  for (int i = 0; i < 64; ++i) x[i] = 1.0f, y[i] = 5.0f;
  std::vector<uint32_t> bits;
  cpu::SetCountOnly(true);
  try {
    rtt::RunAiv([&] {
      TPipe pipe;
      TBuf<TPosition::VECCALC> buf;
      pipe.InitBuffer(buf, 4096);
      auto a = buf.GetWithOffset<float>(64, 0), b = buf.GetWithOffset<float>(64, 256), d = buf.GetWithOffset<float>(256, 512);
      auto h = buf.GetWithOffset<half>(64, 1536);
      auto m = buf.GetWithOffset<uint8_t>(64, 1664);
      auto o = buf.GetWithOffset<uint32_t>(64, 1792);
      GlobalTensor<float> xg, yg;
      xg.SetGlobalBuffer((__gm__ float*)x.p, 64);
      yg.SetGlobalBuffer((__gm__ float*)y.p, 64);
      DataCopy(a, xg, 64);
      DataCopyPad(b, xg, DataCopyExtParams(1, 12, 0, 0, 0), DataCopyPadExtParams<float>(true, 0, 0, 0.0f));
      Add(d, a, b, 64);
      Exp(d, a, 64);
      Adds(d, a, 1.0f, 64);
      Duplicate(d, 2.0f, 64);
      Brcb(d, a, 2, BrcbRepeatParams(1, 8));
      Cast(h, a, RoundMode::CAST_ROUND, 64);
      Compare(m, a, b, CMPMODE::LT, 64);
      Select(d, m, a, b, SELMODE::VSEL_TENSOR_TENSOR_MODE, 64);
      ReduceMax(d, a, b, 64, true);
      ReduceSum(d, a, b, 64);
      WholeReduceMax(d, a, 64, 1, 1, 1, 8);
      WholeReduceSum(d, a, 64, 1, 1, 1, 8);
      ArithProgression(d, 0.0f, 1.0f, 64);
      Gather(d, a, o, 0u, 64);
      Axpy(d, a, 2.0f, 64);
      DataCopy(yg, d, 64);
      DataCopyPad(yg, d, DataCopyExtParams(1, 12, 0, 0, 0));
      for (int i = 0; i < 1024; ++i) bits.push_back(buf.Get<uint32_t>().GetValue(i));
    });
  } catch (...) {
    cpu::SetCountOnly(false);
    throw;
  }
  cpu::SetCountOnly(false);
  for (size_t i = 0; i < bits.size(); ++i) EXPECT(bits[i] == 0xffffffffu, "UB word ", i, " changed in count-only mode");
  for (int i = 0; i < 64; ++i) EXPECT(y[i] == 5.0f, "GM changed in count-only mode");
  EXPECT(cpu::LastLaunchStats().cores.at(0).counters.vector_repeats > 0, "count-only mode counted nothing");
}

}  // namespace

RT_MAIN
