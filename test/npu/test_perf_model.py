"""The 910B performance model (torch_ops_transformer/bench/npu_perf_model.py): roofline arithmetic on hand-made and
runtime-produced counters, the analytic FlashAttention counts, the attention memory table and the block-size
ranking. Every time here is a model prediction; nothing is timed."""
import math
import os

import pytest

from test.npu import ascendc_programs
from test.npu import perf_model_worker as WORKER
from test.npu.runner import case_names
from torch_ops_transformer.bench import npu_perf_model as m

HW = m.Ascend910B()
GHZ = HW.clock_hz


# ---- assumptions --------------------------------------------------------------------------------------------------
def test_assumed_peaks_match_the_public_figures():
    assert (HW.aic_cores, HW.aiv_cores) == (24, 48)
    assert HW.cube_flops_per_s == pytest.approx(354e12, rel=0.01)  # "~350 TFLOP/s fp16"
    assert HW.hbm_bytes_per_s == 1.6e12
    assert any("354 TFLOP/s" in line for line in HW.describe())


# ---- per-core roofline --------------------------------------------------------------------------------------------
def test_core_pipes_overlap_to_the_slowest():
    r = m.CoreCounts(m.AIV, 0, gm_read_bytes=0, vector_repeats=int(3 * GHZ) // 1000)  # 3 ms of vector work
    hw = m.Ascend910B(launch_s=0.0)
    t = m.core_time(r, hw, bytes_per_s=1e11)
    assert t.vector_s == pytest.approx(3e-3)
    assert t.busy_s == t.vector_s and t.bottleneck == "vector"
    r2 = m.CoreCounts(m.AIV, 0, gm_read_bytes=10**9, vector_repeats=int(3 * GHZ) // 1000, copies=1000)
    t2 = m.core_time(r2, hw, bytes_per_s=1e11)
    assert t2.memory_s == pytest.approx(1e9 / 1e11 + 1000 * hw.copy_latency_s)
    assert t2.busy_s == pytest.approx(max(t2.vector_s, t2.memory_s)) and t2.bottleneck == "memory"
    serial = m.core_time(r2, hw, bytes_per_s=1e11, double_buffered=False)
    assert serial.busy_s == pytest.approx(t2.vector_s + t2.memory_s)


def test_kernel_time_is_the_slowest_group_plus_launch():
    fast = m.CoreCounts(m.AIV, 0, vector_repeats=1800)   # 1 us
    slow = m.CoreCounts(m.AIV, 1, vector_repeats=18000)  # 10 us
    p = m.predict([fast, slow], HW)
    assert p.time_s == pytest.approx(10e-6 + HW.launch_s)
    assert p.slowest.block == 1 and p.bottleneck == "vector"


def test_chip_bandwidth_floor_and_port():
    port = HW.core_gm_bytes_per_cycle * GHZ
    few = [m.CoreCounts(m.AIV, i, gm_read_bytes=10**8) for i in range(2)]  # two cores: their ports limit
    assert m.predict(few, HW).slowest.time_s == pytest.approx(1e8 / port)
    assert m.predict(few, HW).bottleneck == "memory"
    many = [m.CoreCounts(m.AIV, i, gm_read_bytes=10**8) for i in range(48)]  # 48 cores: HBM is the roofline
    p = m.predict(many, HW)
    assert p.bandwidth_floor_s == pytest.approx(48e8 / HW.hbm_bytes_per_s) and p.bandwidth_floor_s > 1e8 / port
    assert p.time_s == pytest.approx(p.bandwidth_floor_s + HW.launch_s) and p.bottleneck == "bandwidth (chip)"
    # with the compulsory bytes known, re-reads are L2 hits: the floor is max(unique / HBM, all / L2)
    l2 = m.predict(many, HW, hbm_unique_bytes=10**9)
    assert l2.bandwidth_floor_s == pytest.approx(max(1e9 / HW.hbm_bytes_per_s, 48e8 / HW.l2_bytes_per_s))


def test_mix_group_serialises_without_pipeline_and_overlaps_with_one():
    aic = m.CoreCounts(m.AIC, 0, cube_macs=int(4096 * GHZ * 2e-3))  # 2 ms of cube
    aivs = [m.CoreCounts(m.AIV, v, vector_repeats=int(GHZ * 1e-3)) for v in (0, 1)]  # 1 ms of vector each
    hw = m.Ascend910B(launch_s=0.0)
    serial = m.predict([aic, *aivs], hw)
    assert serial.time_s == pytest.approx(3e-3 + hw.sync_s)
    piped = m.predict([aic, *aivs], hw, m.Pipeline(steps=100, runs=1))
    assert piped.time_s == pytest.approx(2e-3 + 1e-3 / 100 + 100 * hw.sync_s)
    assert len(piped.groups) == 1  # AIC 0 with AIVs 0 and 1
    # synchronous Matmul calls: each AIV waits for its half of the shared cube
    sync = m.predict([aic, *aivs], hw, m.Pipeline(steps=10, runs=10, synchronous=True))
    assert sync.time_s == pytest.approx(max(2e-3, 1e-3 + 2e-3 / 2) + 10 * hw.sync_s)
    light = m.CoreCounts(m.AIC, 0, cube_macs=int(4096 * GHZ * 0.5e-3))
    sync2 = m.predict([light, *aivs], hw, m.Pipeline(steps=10, runs=10, synchronous=True))
    assert sync2.time_s == pytest.approx(1e-3 + 0.5e-3 / 2 + 10 * hw.sync_s)


def test_scaling_pays_the_launch_once():
    p = m.predict([m.CoreCounts(m.AIV, 0, vector_repeats=18000)], HW)
    s = p.scaled(4)
    assert s.time_s == pytest.approx(4 * 10e-6 + HW.launch_s)
    assert s.scale == 4 and s.bandwidth_floor_s == pytest.approx(4 * p.bandwidth_floor_s)
    assert s.bottleneck == p.bottleneck == "vector"
    # 48 cores, 10 us of vector each, 6 us of chip bandwidth: still vector-bound after scaling
    cores = [m.CoreCounts(m.AIV, i, gm_read_bytes=200_000, vector_repeats=18000) for i in range(48)]
    p48 = m.predict(cores, HW)
    assert p48.bandwidth_floor_s == pytest.approx(6e-6) and p48.scaled(43).bottleneck == "vector"


def test_scalar_accesses_add_to_the_core_time():
    """The scalar unit's GM and UB accesses are added to the busy time of the pipes (no overlap assumed)."""
    base = m.CoreCounts(m.AIV, 0, gm_read_bytes=10**6)
    scalar = m.CoreCounts(m.AIV, 0, gm_read_bytes=10**6, scalar_gm=1000, scalar_ub=5000)
    t0 = m.core_time(base, HW, 1e11)
    t1 = m.core_time(scalar, HW, 1e11)
    want = (1000 * HW.scalar_gm_cycles + 5000 * HW.scalar_ub_cycles) / HW.clock_hz
    assert t1.scalar_s == pytest.approx(want) and t1.busy_s == pytest.approx(t0.busy_s + want)


def test_records_from_flat_and_errors():
    flat = [0, 0, 10, 20, 30, 0, 0, 0, 0, 2, 7, 8, 1, 1, 1, 2, 0, 5, 1, 3, 4, 0, 9, 6]
    recs = m.records_from_flat(flat, 2)
    assert recs[0] == m.CoreCounts(m.AIC, 0, 10, 20, 30, 0, 0, 0, 0, 2, 7, 8)
    assert recs[1] == m.CoreCounts(m.AIV, 1, 1, 2, 0, 5, 1, 3, 4, 0, 9, 6)
    with pytest.raises(ValueError, match="need 24 values for 2 cores, got 12"):
        m.records_from_flat(flat[:12], 2)
    with pytest.raises(ValueError, match="type 7"):
        m.records_from_flat([7] + flat[1:12], 1)
    with pytest.raises(ValueError, match="no core records"):
        m.predict([], HW)


# ---- counters from the CPU runtime (torch-free C++ program) -------------------------------------------------------
@pytest.fixture(scope="module")
def runtime_launches():
    exe = ascendc_programs.build("npu_model_counts", ["ascendc/tests/npu_model_counts.cpp"])
    out = {}
    for count_only in (0, 1):
        res = ascendc_programs.run(exe, count_only, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        launches = {}
        for block in res.stdout.split("launch ")[1:]:
            name, _, rest = block.partition("\n")
            launches[name] = m.parse_counter_lines(rest)
        out[count_only] = launches
    return out


def test_count_only_mode_counts_the_same(runtime_launches):
    assert runtime_launches[0] == runtime_launches[1]


def test_gemm_cube_time_matches_macs_over_peak(runtime_launches):
    recs = runtime_launches[1]["gemm_slices"]
    m_rows, n, k, groups = 512, 128, 256, 4
    assert sum(r.cube_macs for r in recs) == m_rows * n * k
    assert sum(r.cube_jobs for r in recs if r.core_type == m.AIC) == 8  # one job per AIV request
    hw = m.Ascend910B(launch_s=0.0)
    p = m.predict(recs, hw)
    aic_times = [c for g in p.groups for c in g.cores if c.counts.core_type == m.AIC]
    assert len(aic_times) == groups
    per_aic_macs = m_rows * n * k / groups
    assert all(c.cube_s == pytest.approx(per_aic_macs / (4096 * GHZ)) for c in aic_times)
    # GM traffic the Matmul API moves: A slice + B per AIV request, fp32 C out
    assert sum(r.gm_read_bytes for r in recs) == (m_rows * k + 8 * k * n) * 2
    assert sum(r.gm_write_bytes for r in recs) == m_rows * n * 4
    port = hw.core_gm_bytes_per_cycle * GHZ
    per_aic_bytes = (m_rows * k + 8 * k * n) * 2 / groups + m_rows * n * 4 / groups
    assert all(c.memory_s == pytest.approx(per_aic_bytes / port) for c in aic_times)
    # a small GEMM: 4 cores, each memory-bound on its port; the kernel is its slowest core
    assert p.time_s == pytest.approx(max(per_aic_bytes / port, per_aic_macs / (4096 * GHZ)))
    assert p.time_s >= 2 * m_rows * n * k / (hw.cube_flops_per_s * groups / hw.aic_cores)
    # a large GEMM's counters (synthetic, same shape of records): cube-bound at the analytic MACs / peak
    big = [m.CoreCounts(m.AIC, g, 10**6, 10**6, 4096**3 // 24) for g in range(24)]
    assert m.predict(big, hw).time_s == pytest.approx(2 * 4096**3 / hw.cube_flops_per_s, rel=1e-6)


def test_vector_kernel_time_matches_repeats_and_bytes(runtime_launches):
    recs = runtime_launches[1]["add_tiles"]
    n_per_core, cores = 4096, 8
    assert len(recs) == cores and all(r.core_type == m.AIV for r in recs)
    assert all(r.vector_repeats == n_per_core * 2 // 256 and r.vector_elements == n_per_core for r in recs)
    assert all(r.gm_read_bytes == 2 * n_per_core * 2 and r.gm_write_bytes == n_per_core * 2 for r in recs)
    assert all(r.copies == 3 * 4 and r.vector_instrs == 4 for r in recs)  # 4 tiles: one Add each
    hw = m.Ascend910B(launch_s=0.0)
    p = m.predict(recs, hw)
    port_s = 3 * n_per_core * 2 / (hw.core_gm_bytes_per_cycle * GHZ)
    assert p.time_s == pytest.approx(port_s + 12 * hw.copy_latency_s)
    assert p.bottleneck == "memory"
    assert p.slowest.cores[0].vector_s == pytest.approx((32 + 4 * hw.vector_issue_cycles) / GHZ)


def test_vector_issue_cost_favours_fewer_longer_instructions():
    """The same repeats in 128 instructions or in 12: the model charges each instruction's issue cost, so the
    batched form (decode's P·V: 528 repeats in 12 instructions vs 256 in 128 Axpy) predicts faster."""
    hw = m.Ascend910B(launch_s=0.0)
    axpy = m.core_time(m.CoreCounts(m.AIV, 0, vector_repeats=256, vector_instrs=128), hw, 1e11)
    batched = m.core_time(m.CoreCounts(m.AIV, 0, vector_repeats=528, vector_instrs=12), hw, 1e11)
    assert batched.vector_s < axpy.vector_s
    assert axpy.vector_s == pytest.approx((256 + 128 * hw.vector_issue_cycles) / GHZ)


def test_pipeline_and_peak_shares_from_counts():
    hw = m.Ascend910B(launch_s=0.0, sync_s=0.0)
    aic = m.CoreCounts(m.AIC, 0, cube_macs=int(4096 * GHZ * 1e-3), cube_jobs=40)  # 1 ms of cube work
    aivs = [m.CoreCounts(m.AIV, i, vector_repeats=int(GHZ * 0.5e-3)) for i in (0, 1)]  # 0.5 ms each
    pipe = m.pipeline_from_counts([aic] + aivs, waited_share=0.5)
    assert (pipe.steps, pipe.synchronous, pipe.waited_share) == (20, True, 0.5)
    assert m.pipeline_from_counts(aivs) == m.Pipeline()  # vector-only: no hand-offs
    p = m.predict([aic] + aivs, hw, pipe)
    shares = m.peak_shares(p, hw)
    # one AIC of 24 busy for the whole kernel: 1/24 of the cube peak; two AIVs of 48 busy half the time
    assert p.time_s == pytest.approx(1e-3)
    assert shares.cube == pytest.approx(1 / 24) and shares.vector == pytest.approx(2 * 0.5 / 48)
    assert shares.issue == 0.0


# ---- analytic FlashAttention counters and the tables --------------------------------------------------------------
SMALL = m.AttentionShape(batch=1, heads=5, seq=300, head_dim=64)


@pytest.mark.parametrize("s1,s2", [(64, 64), (128, 64), (256, 128)])
def test_fa_counts_conserve_the_work(s1, s2):
    recs = m.fa_forward_counts(SMALL, s1, s2)
    groups = min(24, math.ceil(SMALL.batch * SMALL.heads * math.ceil(SMALL.seq / s1) / 2))  # 2 AIVs, >= 1 task each
    assert [r.core_type for r in recs[:3]] == [m.AIV, m.AIV, m.AIC] and len(recs) == 3 * groups
    tot = m.total_counts(recs)
    bnh, s, d = SMALL.batch * SMALL.heads, SMALL.seq, SMALL.head_dim
    assert tot.cube_macs == 2 * bnh * s * s * d
    # every AIV writes P once per score, O once per row and the two [rows, 8] statistics
    aiv_written = sum(r.gm_write_bytes for r in recs if r.core_type == m.AIV)
    assert aiv_written == bnh * (s * s * 2 + s * d * 2 + s * 8 * 4 * 2)
    # the cube reads Q once per S2 block, K and V once per S1 block, and P once
    s1_blocks, s2_blocks = math.ceil(s / s1), math.ceil(s / s2)
    aic_reads = sum(r.gm_read_bytes for r in recs if r.core_type == m.AIC)
    assert aic_reads == bnh * 2 * (s * d * s2_blocks + 2 * s * d * s1_blocks + s * s)


FA_SOURCES = ["ascendc/tests/npu_model_fa_counts.cpp",
              "ascendc/kernels/attention/flash_attention_score_kernel.cpp",
              "ascendc/kernels/attention/flash_attention_score_tiling.cpp"]


@pytest.mark.parametrize("b,n,s,d,block", [(1, 3, 512, 64, 64), (1, 2, 512, 128, 128), (1, 1, 1024, 128, 256)])
def test_fa_analytic_counts_equal_the_kernels(b, n, s, d, block):
    """The analytic counters are the FlashAttention kernel's, core by core (count-only launch of the kernel)."""
    if not os.path.exists(os.path.join(ascendc_programs.ROOT, FA_SOURCES[1])):
        pytest.skip("the FlashAttention Ascend C kernel is not in this checkout yet")
    res = ascendc_programs.run(ascendc_programs.build("npu_model_fa_counts", FA_SOURCES), b, n, s, d, block)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    tiling = [int(x) for x in res.stdout.split("tiling ")[1].split()[:5]]
    shape = m.AttentionShape(b, n, s, d)
    assert tiling[:3] == [block, block, m.fa_vec_rows(block, block, d)]
    key = lambda r: (r.core_type, r.block_idx)  # noqa: E731
    sim = sorted(m.parse_counter_lines(res.stdout), key=key)
    ana = sorted(m.fa_forward_counts(shape, block, block), key=key)
    assert [key(r) for r in sim] == [key(r) for r in ana]
    for x, y in zip(sim, ana):
        assert (x.gm_read_bytes, x.gm_write_bytes, x.cube_macs, x.copies) == \
            (y.gm_read_bytes, y.gm_write_bytes, y.cube_macs, y.copies), key(x)
        assert y.vector_repeats == pytest.approx(x.vector_repeats, rel=2e-3), key(x)


def test_fa_ub_plan_and_pipeline():
    assert m.fa_vec_rows(128, 128, 128) == 32 and m.fa_vec_rows(64, 64, 128) == 64
    assert m.fa_vec_rows(256, 256, 128) == 8  # the 256-row fp32 accumulator leaves room for 8-row chunks only
    assert m.fa_ub_bytes(256, 256, 8, 128) <= HW.ub_bytes - 256 < m.fa_ub_bytes(256, 256, 16, 128)
    assert m.fa_vec_rows(256, 512, 128) == 0
    assert not m.fa_pipeline(m.LLAMA7B_B4_S4096, 256, 512).double_buffered
    p = m.fa_pipeline(m.LLAMA7B_B4_S4096, 128, 128)
    tasks = 4 * 32 * 32
    assert p.synchronous and p.double_buffered
    assert p.steps == 2 * math.ceil(tasks / 48) * 32  # two Matmul hand-offs per S2 block on an AIV's path


def _times(hw):
    shape = m.LLAMA7B_B4_S4096
    return {b: m.predict(m.fa_forward_counts(shape, b, b, hw), hw, m.fa_pipeline(shape, b, b, hw),
                         hbm_unique_bytes=shape.qkvo_bytes).time_s for b in (64, 128, 256)}


def test_block_ranking_small_blocks_lose_on_overheads():
    times = _times(HW)
    assert max(times, key=times.get) == 64  # 4x the hand-offs and copies, 2x the K/V re-reads of 128
    assert times[64] > 1.5 * times[128]
    # without per-instruction and hand-off costs the gap shrinks: those costs are what sink small blocks
    free = _times(m.Ascend910B(copy_latency_s=0.0, sync_s=0.0))
    assert free[64] / free[128] < times[64] / times[128]


def test_block_ranking_256_hinges_on_the_copy_cost():
    default = _times(HW)
    assert abs(default[256] / default[128] - 1) < 0.2  # close at the default constants
    # 8-row chunks: 4x the copy instructions of 128 x 128; dear copies make 256 lose, free ones make it win
    dear = _times(m.Ascend910B(copy_latency_s=0.2e-6))
    assert min(dear, key=dear.get) == 128 and dear[256] > dear[128]
    cheap = _times(m.Ascend910B(copy_latency_s=0.0))
    assert min(cheap, key=cheap.get) == 256


def test_memory_table_llama7b():
    rows = {r.item.split(" (")[0]: r for r in m.attention_memory(m.LLAMA7B_B4_S4096)}
    scores = rows["scores S x S"]
    assert scores.standard_bytes == 4 * 32 * 4096 * 4096 * 4 == 8 * 2**30  # the published "≈ 8 GB"
    assert scores.flash_bytes == 0
    assert rows["Q, K, V, O"].standard_bytes == 4 * 4 * 32 * 4096 * 128 * 2
    assert rows["softmax max/sum [B,N,S,8] fp32"].flash_bytes == 2 * 4 * 32 * 4096 * 8 * 4
    std = sum(r.standard_bytes for r in rows.values())
    flash = sum(r.flash_bytes for r in rows.values())
    assert std == pytest.approx(16.5 * 2**30, rel=0.01)
    assert flash < 0.6 * 2**30 and std / flash > 25


# ---- the bench table ----------------------------------------------------------------------------------------------
def test_bench_detects_missing_hooks(monkeypatch):
    from torch_ops_transformer.bench import npu_counters

    monkeypatch.setattr(npu_counters, "HOOKS", npu_counters.HOOKS + ("tot_ascendc_no_such_hook",))
    lib, why = npu_counters.runtime_hooks()
    assert lib is None and "tot_ascendc_no_such_hook" in why


def test_bench_quick_prints_predictions_beside_the_published(monkeypatch, capsys):
    from torch_ops_transformer.bench import npu_model

    monkeypatch.setattr(npu_model, "runtime_hooks", lambda: (None, "test: no hooks"))
    npu_model.main(quick=True)
    out = capsys.readouterr().out
    assert "PREDICTED BY THE MODEL" in out and "NOTE: counts are ANALYTIC" in out and "test: no hooks" in out
    for claim in ("85 (#3)", "52 (#1)", "68 (#2)", "16.2 GB vs 3.8 GB", "4.3x"):
        assert claim in out
    assert "predicted winner:" in out and "354 TFLOP/s" in out


@pytest.mark.parametrize("case", case_names(WORKER))
def test_bench_path_on_the_simulated_npu(results, case):
    assert results.get(case) == "ok", results.get(case, "did not run")
