"""A roofline performance model of Ascend 910B kernels, fed by the CPU runtime's per-core counters.

The CPU runtime (ascendc/cpu_runtime) counts, per simulated core, the GM bytes read/written, cube multiply-adds,
vector elements and 256-byte vector repeats, and copy instructions. This module turns such counter records into a
*predicted* kernel time on an Ascend 910B. Nothing here is a measurement of an NPU; every number it produces is a
prediction of the model under the assumptions in `Ascend910B` (see docs/ascendc_npu_model.md for where it is crude).

Pure Python (no torch): the bench (`python -m torch_ops_transformer.bench npu-model`) and the unit tests use it.

Per core, the pipes (cube, vector, memory) are assumed to overlap — double-buffered queues let the MTE copy pipes
run while the cube/vector pipes compute — so a core is busy max(cube, vector, memory) unless its working set
cannot be double-buffered, in which case vector and memory serialise. Inside an AI Core group (1 AIC + 2 AIV in
MIX mode) AIC and AIVs exchange data through GM in `steps` hand-offs, each with a fixed cost: either as a software
pipeline (the group takes the slowest member plus one stage of the faster side per pipeline fill, `runs`) or
synchronously (each AIV waits for its own cube jobs while the shared AIC serves the other AIV). The kernel
takes its slowest group, never less than the chip-level bandwidth roofline (all GM bytes over the pooled L2 or HBM
bandwidth, compulsory bytes over HBM), plus a launch cost.
"""
from dataclasses import dataclass, replace
from typing import Dict, Iterable, List, Optional, Sequence

AIC, AIV = "AIC", "AIV"
VALUES_PER_CORE = 12  # layout of tot_ascendc_last_stats: type, block_idx, then the ten counters


@dataclass(frozen=True)
class Ascend910B:
    """Assumed Ascend 910B (910B1/B2) figures. Public or derived working values, not vendor specs (see the doc)."""

    aic_cores: int = 24
    aiv_cores: int = 48
    clock_hz: float = 1.8e9
    cube_macs_per_cycle: int = 4096        # fp16/bf16: a 16x16x16 cube per AIC -> 24*4096*2*1.8e9 ≈ 354 TFLOP/s
    vector_repeats_per_cycle: float = 1.0  # one 256-byte repeat per cycle per AIV (128 fp16 / 64 fp32 lanes)
    vector_issue_cycles: float = 16.0      # fixed cost per vector instruction (issue + pipeline head), a guess
    hbm_bytes_per_s: float = 1.6e12        # GM (HBM) bandwidth, shared by all cores
    l2_bytes_per_s: float = 7.0e12         # L2 read/write bandwidth (192 MB L2), shared by all cores
    l2_bytes: int = 192 * 1024 * 1024
    core_gm_bytes_per_cycle: float = 128.0  # one core's own GM port (MTE2+MTE3), a guess: ~230 GB/s at 1.8 GHz
    ub_bytes: int = 192 * 1024             # per AIV
    copy_latency_s: float = 0.05e-6        # fixed MTE cost per DataCopy instruction (~90 cycles), on the memory pipe
    scalar_ub_cycles: float = 2.0          # one scalar load/store of UB (GetValue/SetValue), a guess
    scalar_gm_cycles: float = 20.0         # one scalar GM access: data-cache hits plus a miss per 64-byte line, a guess
    sync_s: float = 0.2e-6                 # one AIC<->AIV hand-off through GM flags, on the critical path
    launch_s: float = 5e-6                 # kernel launch + first/last DMA latency, once per kernel

    @property
    def cube_flops_per_s(self) -> float:
        return 2.0 * self.cube_macs_per_cycle * self.clock_hz * self.aic_cores

    def describe(self) -> List[str]:
        return [
            f"{self.aic_cores} AIC (cube) + {self.aiv_cores} AIV (vector) at {self.clock_hz / 1e9:.1f} GHz",
            f"cube: {self.cube_macs_per_cycle} fp16 MAC/cycle/AIC = {self.cube_flops_per_s / 1e12:.0f} TFLOP/s fp16",
            f"vector: {self.vector_repeats_per_cycle:g} x 256-byte repeat/cycle/AIV "
            f"= {self.vector_repeats_per_cycle * 256 * self.clock_hz * self.aiv_cores / 1e12:.1f} TB/s of operands, "
            f"+ {self.vector_issue_cycles:g} cycles per vector instruction",
            f"HBM {self.hbm_bytes_per_s / 1e12:.1f} TB/s; L2 {self.l2_bytes // 2**20} MB at "
            f"{self.l2_bytes_per_s / 1e12:.0f} TB/s (re-read and workspace bytes assumed L2 hits)",
            f"scalar: {self.scalar_ub_cycles:g} cycles per UB access, {self.scalar_gm_cycles:g} per GM access "
            f"(added to the core's busy time)",
            f"per copy instruction {self.copy_latency_s * 1e6:.2f} us; per AIC<->AIV hand-off "
            f"{self.sync_s * 1e6:.2f} us; per launch {self.launch_s * 1e6:.0f} us",
        ]


@dataclass(frozen=True)
class CoreCounts:
    """One core's counters from one launch (AscendC::cpu::Counters)."""

    core_type: str  # AIC or AIV
    block_idx: int  # GetBlockIdx() of that core
    gm_read_bytes: int = 0
    gm_write_bytes: int = 0
    cube_macs: int = 0
    vector_elements: int = 0
    vector_repeats: int = 0
    copies: int = 0
    vector_instrs: int = 0
    cube_jobs: int = 0  # Matmul jobs served (AIC): hand-offs with its AIVs
    scalar_gm: int = 0  # scalar GetValue/SetValue on GM
    scalar_ub: int = 0  # scalar GetValue/SetValue on UB

    @property
    def gm_bytes(self) -> int:
        return self.gm_read_bytes + self.gm_write_bytes


def records_from_flat(values: Sequence[int], cores: int) -> List[CoreCounts]:
    """Parse the VALUES_PER_CORE array of tot_ascendc_last_stats (type 0=AIC/1=AIV, block_idx, the counters)."""
    if len(values) < cores * VALUES_PER_CORE:
        raise ValueError(f"records_from_flat: need {cores * VALUES_PER_CORE} values for {cores} cores, "
                         f"got {len(values)}")
    out = []
    for c in range(cores):
        v = [int(x) for x in values[c * VALUES_PER_CORE:(c + 1) * VALUES_PER_CORE]]
        if v[0] not in (0, 1):
            raise ValueError(f"records_from_flat: core {c} has type {v[0]}, expected 0 (AIC) or 1 (AIV)")
        out.append(CoreCounts(AIC if v[0] == 0 else AIV, *v[1:]))
    return out


def parse_counter_lines(text: str) -> List[CoreCounts]:
    """Records from lines `core <AIC|AIV> <block_idx> <read> <write> <macs> <elements> <repeats> <copies>
    <vector_instrs> <cube_jobs> <scalar_gm> <scalar_ub>` (what the C++ test programs print)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == VALUES_PER_CORE + 1 and parts[0] == "core":
            out.append(CoreCounts(parts[1], *map(int, parts[2:])))
    return out


@dataclass(frozen=True)
class Pipeline:
    """How the AIC and AIVs of a MIX group hand work to each other.

    steps: hand-offs on a group's critical path (e.g. two per S2 block of FlashAttention); each costs `sync_s`, and
    in a software pipeline the pipes overlap across them. runs: how often the pipeline fills and drains (e.g. once per S1 block). steps == runs == 1 means no
    overlap between AIC and AIV (they serialise). double_buffered: False when an AIV step's working set does not fit
    twice in UB, so its copies cannot overlap its vector work. synchronous: every AIV waits for its own cube jobs
    (IterateAll<true>), so its critical path holds its share of the AIC's time; the AIC shared by the group's AIVs
    overlaps one AIV's cube job with the other's vector work. waited_share: the part of an AIV's cube work it waits
    for; the rest is issued ahead (IterateAll<false>) and runs under its vector work."""

    steps: float = 1.0
    runs: float = 1.0
    double_buffered: bool = True
    synchronous: bool = False
    waited_share: float = 1.0


@dataclass
class CoreTime:
    counts: CoreCounts
    cube_s: float
    vector_s: float
    memory_s: float
    busy_s: float
    scalar_s: float = 0.0

    @property
    def bottleneck(self) -> str:
        pipes = {"cube": self.cube_s, "vector": self.vector_s, "memory": self.memory_s, "scalar": self.scalar_s}
        return max(pipes, key=pipes.get)


@dataclass
class GroupTime:
    block: int
    cores: List[CoreTime]
    bubble_s: float
    sync_s: float
    time_s: float


@dataclass
class Prediction:
    """Predicted kernel time (seconds, of the model — not a measurement) and its breakdown."""

    time_s: float
    groups: List[GroupTime]
    bandwidth_floor_s: float  # the chip-level bandwidth roofline: max(compulsory bytes / HBM, all GM bytes / pooled bw)
    slowest: GroupTime
    launch_s: float
    totals: CoreCounts
    scale: float = 1.0  # > 1 when scaled up from a simulated subset: per-core times and totals are the subset's

    @property
    def bottleneck(self) -> str:
        if self.bandwidth_floor_s >= self.slowest.time_s * self.scale:
            return "bandwidth (chip)"
        core = max(self.slowest.cores, key=lambda c: c.busy_s)
        parts = {core.bottleneck: max(core.cube_s, core.vector_s, core.memory_s, core.scalar_s),
                 "sync": self.slowest.sync_s, "pipeline fill": self.slowest.bubble_s}
        return max(parts, key=parts.get)

    def scaled(self, factor: float) -> "Prediction":
        """The same kernel repeated `factor` times back to back (waves of work not simulated): launch paid once."""
        body = (self.time_s - self.launch_s) * factor
        return replace(self, time_s=body + self.launch_s, bandwidth_floor_s=self.bandwidth_floor_s * factor,
                       scale=self.scale * factor)


def total_counts(records: Iterable[CoreCounts]) -> CoreCounts:
    t = CoreCounts("all", -1)
    for r in records:
        t = CoreCounts("all", -1, t.gm_read_bytes + r.gm_read_bytes, t.gm_write_bytes + r.gm_write_bytes,
                       t.cube_macs + r.cube_macs, t.vector_elements + r.vector_elements,
                       t.vector_repeats + r.vector_repeats, t.copies + r.copies, t.vector_instrs + r.vector_instrs,
                       t.cube_jobs + r.cube_jobs, t.scalar_gm + r.scalar_gm, t.scalar_ub + r.scalar_ub)
    return t


def core_time(r: CoreCounts, hw: Ascend910B, bytes_per_s: float, double_buffered: bool = True) -> CoreTime:
    """One core's busy time: its pipes overlap (max) when double-buffered, else vector and memory serialise; the
    scalar unit's own accesses are added (it issues every instruction and waits on their flags: no overlap assumed).
    bytes_per_s: the core's own GM port bandwidth; each copy instruction adds a fixed cost."""
    cube = r.cube_macs / (hw.cube_macs_per_cycle * hw.clock_hz)
    vector = (r.vector_repeats / hw.vector_repeats_per_cycle + r.vector_instrs * hw.vector_issue_cycles) / hw.clock_hz
    memory = r.gm_bytes / bytes_per_s + r.copies * hw.copy_latency_s
    scalar = (r.scalar_ub * hw.scalar_ub_cycles + r.scalar_gm * hw.scalar_gm_cycles) / hw.clock_hz
    busy = max(cube, vector, memory) if double_buffered or r.core_type == AIC else max(cube, vector + memory)
    return CoreTime(r, cube, vector, memory, busy + scalar, scalar)


def group_of(r: CoreCounts, mix: bool) -> int:
    """MIX mode: AIC b and AIVs 2b, 2b+1 form AI Core group b. Vector-only launches: every AIV is its own group."""
    return r.block_idx // 2 if mix and r.core_type == AIV else r.block_idx


def predict(records: Sequence[CoreCounts], hw: Ascend910B = Ascend910B(), pipeline: Pipeline = Pipeline(),
            hbm_unique_bytes: Optional[int] = None) -> Prediction:
    """Predicted 910B time of one launch from its per-core counters.

    Each core moves its bytes through its own port; the cores share the pooled bandwidth, so the kernel is never
    faster than all GM bytes over the pooled bandwidth (the chip-level roofline).
    hbm_unique_bytes: compulsory HBM traffic (inputs read once + outputs written once). When given, all counted GM
    traffic is served at L2 bandwidth (re-reads and workspace round trips assumed L2 hits) and the kernel is never
    faster than hbm_unique_bytes / HBM bandwidth either. When None, every counted byte is charged at HBM bandwidth."""
    if not records:
        raise ValueError("predict: no core records (was the launch run with counters?)")
    mix = any(r.core_type == AIC for r in records)
    bandwidth = hw.l2_bytes_per_s if hbm_unique_bytes is not None else hw.hbm_bytes_per_s
    share = hw.core_gm_bytes_per_cycle * hw.clock_hz  # a core's own port; the pooled bandwidth is the floor below
    by_group: Dict[int, List[CoreTime]] = {}
    for r in records:
        by_group.setdefault(group_of(r, mix), []).append(core_time(r, hw, share, pipeline.double_buffered))
    groups = [_group_time(b, cores, hw, pipeline) for b, cores in sorted(by_group.items())]
    slowest = max(groups, key=lambda g: g.time_s)
    totals = total_counts(records)
    floor = max((hbm_unique_bytes or 0) / hw.hbm_bytes_per_s, totals.gm_bytes / bandwidth)
    return Prediction(max(slowest.time_s, floor) + hw.launch_s, groups, floor, slowest, hw.launch_s, totals)


def _group_time(block: int, cores: List[CoreTime], hw: Ascend910B, p: Pipeline) -> GroupTime:
    """Slowest member + pipeline fill/drain + hand-offs. Fill/drain: each run exposes one stage (1/steps of the
    total) of the faster side (AIC vs the slower AIV); with steps == runs this is full serialisation. Synchronous
    AIVs instead add their share of the AIC's time (AIC / number of AIVs) to their own."""
    aic = max((c.busy_s for c in cores if c.counts.core_type == AIC), default=0.0)
    aivs = [c.busy_s for c in cores if c.counts.core_type == AIV]
    aiv = max(aivs, default=0.0)
    has_both = aic > 0 and aiv > 0
    if has_both and p.synchronous:
        bubble = max(aic, aiv + aic * p.waited_share / len(aivs)) - max(aic, aiv)
    else:
        bubble = min(aic, aiv) * min(1.0, p.runs / p.steps) if has_both else 0.0
    sync = p.steps * hw.sync_s if has_both else 0.0
    return GroupTime(block, cores, bubble, sync, max(aic, aiv) + bubble + sync)


def pipeline_from_counts(records: Sequence[CoreCounts], waited_share: float = 1.0,
                         double_buffered: bool = True) -> Pipeline:
    """The pipeline of a launch whose AIVs wait for their cube jobs (all our MIX kernels), from its counters: each
    AIC serves two AIVs, so an AIV's critical path holds half the jobs of its group's busiest AIC, each a hand-off.
    waited_share: the part of an AIV's cube work it waits for (the rest is issued ahead with IterateAll<false>).
    Vector-only launches have no hand-offs."""
    jobs = max((r.cube_jobs for r in records if r.core_type == AIC), default=0)
    if not jobs:
        return Pipeline(double_buffered=double_buffered)
    steps = jobs / 2
    return Pipeline(steps=steps, runs=steps, double_buffered=double_buffered, synchronous=True,
                    waited_share=waited_share)


@dataclass
class PeakShares:
    """What a predicted launch makes of the chip: each fraction is work / (peak rate x predicted time)."""

    cube: float       # cube MACs over all AICs' peak
    vector: float     # vector repeats over all AIVs' peak (issue costs excluded: they are not useful work)
    bandwidth: float  # the chip-level bandwidth floor over the predicted time
    issue: float      # on the busiest AIV, the part of its vector time spent on per-instruction issue costs


def peak_shares(pred: Prediction, hw: Ascend910B = Ascend910B()) -> PeakShares:
    t = pred.totals
    cube_peak = hw.cube_macs_per_cycle * hw.clock_hz * hw.aic_cores
    vector_peak = hw.vector_repeats_per_cycle * hw.clock_hz * hw.aiv_cores
    body = pred.time_s / pred.scale  # totals are those of the simulated part
    aivs = [c for g in pred.groups for c in g.cores if c.counts.core_type == AIV]
    busiest = max(aivs, key=lambda c: c.vector_s, default=None)
    issue = 0.0
    if busiest is not None and busiest.vector_s > 0:
        issue = busiest.counts.vector_instrs * hw.vector_issue_cycles / hw.clock_hz / busiest.vector_s
    return PeakShares(t.cube_macs / (cube_peak * body), t.vector_repeats / (vector_peak * body),
                      pred.bandwidth_floor_s / pred.time_s, issue)


# ---- FlashAttention forward: analytic counters (fallback without the kernel's count hooks; cross-check) -------
@dataclass(frozen=True)
class AttentionShape:
    batch: int = 4
    heads: int = 32
    seq: int = 4096
    head_dim: int = 128
    dtype_bytes: int = 2  # fp16

    @property
    def qkvo_bytes(self) -> int:
        return 4 * self.batch * self.heads * self.seq * self.head_dim * self.dtype_bytes


LLAMA7B_B4_S4096 = AttentionShape()


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def fa_ub_bytes(s1_block: int, s2_block: int, vec_rows: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """UB one AIV of our FlashAttention forward uses (no mask): the buffers of its UB plan
    (ascendc/kernels/attention/flash_attention_score_tiling.h, FaPlanUb), each rounded to 32 bytes."""
    r = lambda n: _ceil_div(n, 32) * 32  # noqa: E731
    d = _ceil_div(head_dim, 16) * 16
    low = 0 if dtype_bytes == 4 else dtype_bytes
    per_chunk = (2 * r(vec_rows * s2_block * 4) + r(vec_rows * s2_block * low) + r(vec_rows * s2_block // 8)
                 + r(vec_rows * 64 * 4) + r(vec_rows * 4) + 2 * r(vec_rows * 32) + 2 * r(vec_rows * d * 4)
                 + r(vec_rows * d * low))
    return per_chunk + r(s2_block * 4) + 3 * r(s1_block * 32) + r(s1_block * d * 4)


def fa_vec_rows(s1_block: int, s2_block: int, head_dim: int, dtype_bytes: int = 2,
                hw: Ascend910B = Ascend910B()) -> int:
    """Rows the vector stage handles at a time: the largest multiple of 8 dividing s1_block, at most 128, whose
    UB plan fits (192 KB minus the 256 bytes reserved in mixed kernels); 0 when none fits."""
    for rows in range(min(s1_block, 128) // 8 * 8, 0, -8):
        if s1_block % rows == 0 and fa_ub_bytes(s1_block, s2_block, rows, head_dim, dtype_bytes) <= hw.ub_bytes - 256:
            return rows
    return 0


def _fa_tasks(shape: AttentionShape, s1_block: int, hw: Ascend910B) -> List[Dict[int, int]]:
    """Per AIV, {S1 block rows: how many tasks}: tasks (batch, head, S1 block) numbered head-major, split into
    contiguous ranges of equal cost over 2 x min(24, tasks / 2) AIVs, as our kernel's tiling does without a mask
    (AIV a starts at task ceil(tasks * a / AIVs))."""
    blocks = _block_sizes(shape.seq, s1_block)
    total = shape.batch * shape.heads * len(blocks)
    aivs = 2 * min(hw.aic_cores, _ceil_div(total, 2))
    out = []
    for a in range(aivs):
        rows: Dict[int, int] = {}
        for t in range(_ceil_div(total * a, aivs), _ceil_div(total * (a + 1), aivs)):
            rows[blocks[t % len(blocks)]] = rows.get(blocks[t % len(blocks)], 0) + 1
        out.append(rows)
    return out


def fa_tasks_per_aiv(shape: AttentionShape, s1_block: int, hw: Ascend910B = Ascend910B()) -> int:
    """Tasks of the busiest AIV: the number of waves of the kernel's work split."""
    return max(sum(t.values()) for t in _fa_tasks(shape, s1_block, hw))


def fa_pipeline(shape: AttentionShape, s1_block: int, s2_block: int, hw: Ascend910B = Ascend910B()) -> Pipeline:
    """How our FA forward's AIVs use the cube: each AIV runs its tasks one S2 block at a time with two Matmul calls
    — 2 hand-offs per step on its critical path; the two AIVs of a group share the AIC. S = Q K^T of the next block
    is issued ahead (IterateAll<false>) and runs under the softmax, so an AIV waits for its P V products only: their
    share of the cube work is v_dim / (head_dim + v_dim), one half here. Vector work double-buffers its row chunks
    whenever the UB plan fits."""
    steps = 2 * fa_tasks_per_aiv(shape, s1_block, hw) * _ceil_div(shape.seq, s2_block)
    fits = fa_vec_rows(s1_block, s2_block, shape.head_dim, shape.dtype_bytes, hw) > 0
    return Pipeline(steps=steps, runs=steps, double_buffered=fits, synchronous=True, waited_share=0.5)


def fa_forward_counts(shape: AttentionShape, s1_block: int, s2_block: int,
                      hw: Ascend910B = Ascend910B()) -> List[CoreCounts]:
    """Per-core counters our MIX FlashAttention forward should produce (analytic, no simulation): the stand-in for
    the simulated kernel's counts, and their cross-check.

    Per task (one S1 block of one head) and S2 block, an AIV asks its AIC for S = Q K^T (the Matmul API reads the
    Q and K blocks, writes fp32 S to the GM workspace); then per chunk of vec_rows rows it reads S, makes six fp32
    passes (scale, fold for the row max, subtract, exp, fold for the row sum, cast), reduces the folded rows and
    updates the [rows, 8] statistics, writes P; asks for P V (reads P and V, writes the fp32 product); reads it per
    chunk and rescales/accumulates O in UB (two passes). Per task it finally normalises and casts O and writes it
    with the two statistics (softmax_max as max + 0·sum, so a NaN row's max is NaN too). Checked against the kernel's simulated counters (docs/ascendc_npu_model.md)."""
    b, d = shape.dtype_bytes, shape.head_dim
    vec_rows = fa_vec_rows(s1_block, s2_block, d, b, hw) or 8
    out: List[CoreCounts] = []
    aic = dict(r=0, w=0, macs=0)
    for a, tasks in enumerate(_fa_tasks(shape, s1_block, hw)):
        v = dict(r=0, w=0, el=0, rep=0, cp=0, ins=0)
        for s1, n_tasks in tasks.items():
            chunks = _counted(_block_sizes(s1, vec_rows))
            for s2, n_steps in _counted(_block_sizes(shape.seq, s2_block)).items():
                t = n_tasks * n_steps
                aic["macs"] += t * 2 * s1 * s2 * d
                aic["r"] += t * (s1 * d + s2 * d + s1 * s2 + s2 * d) * b
                aic["w"] += t * (s1 * s2 + s1 * d) * 4
                for cr, n_chunks in chunks.items():
                    tc = t * n_chunks
                    v["r"] += tc * (cr * s2 + cr * d) * 4
                    v["w"] += tc * cr * s2 * b
                    v["cp"] += tc * 4  # S in, P out, P.V in, the new row max (UB -> UB)
                    _vector(v, 6 * cr * s2, 4, tc, 6)  # scale, 2 row folds, subtract, exp, cast
                    _vector(v, (2 * cr * 64 if s2 > 64 else 0) + 8 * cr * 8, 4, tc, 10)  # row reduces, [rows, 8] ops
                    _vector(v, 2 * cr * d, 4, tc, 2)  # acc * alpha + P.V
            _vector(v, s1 * (2 * 8 + d), 4, n_tasks, 3)  # zero the statistics and the accumulator
            for cr, n_chunks in chunks.items():
                tc = n_tasks * n_chunks
                v["w"] += tc * (cr * d * b + 2 * cr * 8 * 4)
                v["cp"] += tc * 3
                _vector(v, 2 * cr * d + 3 * cr * 8, 4, tc, 5)  # softmax_max + 0·sum (NaN rows), acc / sum, cast
        out.append(CoreCounts(AIV, a, v["r"], v["w"], 0, v["el"], v["rep"], v["cp"], v["ins"]))
        if a % 2 == 1:  # the group's AIC served both of its AIVs
            out.append(CoreCounts(AIC, a // 2, aic["r"], aic["w"], aic["macs"], 0, 0, 0))
            aic = dict(r=0, w=0, macs=0)
    return out


def _vector(acc: dict, elements: int, elem_bytes: int, times: int = 1, instrs: int = 1) -> None:
    """`times` rounds of `instrs` vector instructions over `elements` elements in all."""
    acc["ins"] += times * instrs
    acc["el"] += times * elements
    acc["rep"] += times * _ceil_div(elements * elem_bytes, 256)


def _counted(items: Iterable[int]) -> Dict[int, int]:
    out: Dict[int, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _block_sizes(length: int, block: int) -> List[int]:
    return [min(block, length - i) for i in range(0, length, block)]


# ---- attention memory: standard (materialised S x S) vs flash (tiles) --------------------------------------------
@dataclass(frozen=True)
class MemoryRow:
    item: str
    standard_bytes: int
    flash_bytes: int


def attention_memory(shape: AttentionShape, score_bytes: int = 4, s1_block: int = 128, s2_block: int = 128,
                     hw: Ascend910B = Ascend910B()) -> List[MemoryRow]:
    """Analytic device memory of one attention layer's forward (bytes).

    Standard attention materialises the scores and the softmax probabilities, S x S per head (score_bytes each:
    4, as in the published ≈ 8 GB figure), kept for the backward. Flash keeps no S x S tensor: each AIV of our kernel has a
    GM workspace slice for one Bm x Bn fp32 score tile, its probabilities and the fp32 Bm x D P.V partial, plus
    the softmax max/sum statistics in the [B, N, S, 8] fp32 layout. Both hold Q, K, V and the output."""
    s = shape
    bnss = s.batch * s.heads * s.seq * s.seq
    stats = 2 * s.batch * s.heads * s.seq * 8 * 4
    workspace = hw.aiv_cores * (s1_block * s2_block * (4 + s.dtype_bytes) + s1_block * s.head_dim * 4)
    return [
        MemoryRow("Q, K, V, O", s.qkvo_bytes, s.qkvo_bytes),
        MemoryRow(f"scores S x S ({score_bytes} B)", bnss * score_bytes, 0),
        MemoryRow(f"probabilities S x S ({score_bytes} B)", bnss * score_bytes, 0),
        MemoryRow("softmax max/sum [B,N,S,8] fp32", 0, stats),
        MemoryRow(f"GM workspace: S, P, PV tiles ({s1_block}x{s2_block}) x {hw.aiv_cores} AIV", 0, workspace),
    ]
