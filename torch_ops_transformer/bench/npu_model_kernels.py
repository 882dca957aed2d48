"""The per-kernel table of `bench npu-model`: every Ascend C kernel of the npu backend, counted on a serving or
training shape and predicted on an Ascend 910B, with the share of the cube, vector and bandwidth peaks the model
predicts it uses — the numbers the next step of kernel work is chosen from.

Each kernel runs once on the simulated npu device in count-only mode (bench/npu_counters.py `counted_launch`; the
kernels whose control flow reads vector results — gating, routing, the indexer's top-k — run for real: the
counters are those of the real walk); its
counters go through the model (npu_perf_model.predict) with the pipeline read from the counters
(`pipeline_from_counts`: cube jobs per AIV = hand-offs) and the part of its cube work an AIV waits for, which is a
property of the kernel's code (column "waits for"). Compulsory bytes (inputs read once, outputs written once) are
those of the launch's tensors. Shapes are smaller than production ones where the count-only walk would take
minutes on a small machine; the table says which.
"""
import time
from dataclasses import dataclass
from typing import Callable, List, Sequence

import torch

from .. import npu_sim
from . import npu_perf_model as pm
from .common import format_table
from .npu_counters import counted_launch


@dataclass
class KernelCase:
    name: str
    shape: str
    build: Callable[[], tuple]  # -> (launch: () -> outputs, inputs: list of tensors)
    waited_share: float         # part of its cube work an AIV waits for (1 when every IterateAll waits)
    waits_for: str              # what that share is, in the kernel's terms
    count_only: bool = True     # False: the kernel's control flow reads vector results (run it for real)


def _npu(*tensors):
    return [t.to("npu") for t in tensors]


def _fa_forward(b=1, n=8, s=2048, d=128):
    def build():
        q, k, v = _npu(*(torch.zeros(b, n, s, d, dtype=torch.float16) for _ in range(3)))
        return (lambda: torch.ops.npu_fa.flash_attention_score(q, k, v, n, "BNSD", scale=d ** -0.5)), [q, k, v]
    return KernelCase("flash_attention_score", f"B{b} N{n} S{s} D{d} fp16 BNSD", build, 0.5,
                      "P·V (Q·Kᵀ of the next block issued ahead)")


def _fa_backward(b=1, n=8, s=1024, d=128):
    def build():
        q, k, v, dy, out = _npu(*(torch.zeros(b, n, s, d, dtype=torch.float16) for _ in range(5)))
        smax, ssum = _npu(torch.zeros(b, n, s, 8), torch.ones(b, n, s, 8))
        return (lambda: torch.ops.npu_fa.flash_attention_score_grad(
            q, k, v, dy, n, "BNSD", softmax_max=smax, softmax_sum=ssum, attention_in=out, scale=d ** -0.5)), \
            [q, k, v, dy, out, smax, ssum]
    return KernelCase("flash_attention_score_grad", f"B{b} N{n} S{s} D{d} fp16 BNSD", build, 0.6,
                      "S, dP and dQ (dV overlaps the dQ add, dK the next block)")


def _decode(b=8, n=32, kvn=8, s=4096, d=128):
    def build():
        q = _npu(torch.zeros(b, n, 1, d, dtype=torch.float16))[0]
        k, v = _npu(*(torch.zeros(b, kvn, s, d, dtype=torch.float16) for _ in range(2)))
        return (lambda: torch.ops.npu_fa.incre_flash_attention(
            q, k, v, num_heads=n, scale_value=d ** -0.5, input_layout="BNSD", num_key_value_heads=kvn)), [q, k, v]
    return KernelCase("incre_flash_attention", f"B{b} N{n} KV heads {kvn} KV {s} D{d} fp16", build, 1.0, "-")


def _rope(s=2048, n=32, d=128):
    def build():
        x = _npu(torch.zeros(1, s, n, d, dtype=torch.float16))[0]
        cos, sin = _npu(*(torch.zeros(1, s, 1, d, dtype=torch.float16) for _ in range(2)))
        return (lambda: torch.ops.npu_fa.rotary_position_embedding(x, cos, sin, 0)), [x, cos, sin]
    return KernelCase("rotary_position_embedding", f"[1, {s}, {n}, {d}] fp16 half mode", build, 1.0, "-")


def _gating(tokens=4096, experts=64, k=8):
    def build():
        x = _npu(torch.zeros(tokens, experts, dtype=torch.float16))[0]
        return (lambda: torch.ops.npu_fa.moe_gating_top_k_softmax(x, None, k)), [x]
    # Top-k reads the index ReduceMax computed: count-only mode (nothing computed) would read garbage.
    return KernelCase("moe_gating_top_k_softmax", f"{tokens} tokens x {experts} experts, k={k}, fp16", build, 1.0,
                      "-", count_only=False)


def _grouped_matmul(m=4096, k=1024, n=2048, experts=8):
    def build():
        x = _npu(torch.zeros(m, k, dtype=torch.float16))[0]
        w = _npu(torch.zeros(experts, k, n, dtype=torch.float16))[0]
        ends = torch.arange(1, experts + 1, dtype=torch.int64) * (m // experts)
        return (lambda: torch.ops.npu_fa.grouped_matmul([x], [w], [], ends, 0, 0, 0)), [x, w]
    return KernelCase("grouped_matmul", f"x [{m}, {k}] over {experts} experts [{k}, {n}] fp16", build, 0.0,
                      "none (the next item's product runs under this one's epilogue)")


def _finalize(tokens=2048, k=8, hidden=2048):
    def build():
        rows = _npu(torch.zeros(tokens * k, hidden, dtype=torch.bfloat16))[0]
        skip = _npu(torch.zeros(tokens, hidden, dtype=torch.bfloat16))[0]
        scales = _npu(torch.ones(tokens, k))[0]
        dst = _npu(torch.arange(tokens * k, dtype=torch.int32))[0]
        experts = _npu(torch.zeros(tokens, k, dtype=torch.int32))[0]
        return (lambda: torch.ops.npu_fa.moe_finalize_routing(rows, skip, None, None, scales, dst, experts, 2)), \
            [rows, skip, scales, dst]
    return KernelCase("moe_finalize_routing", f"{tokens} tokens x k={k}, H={hidden} bf16, skip1 + scales", build,
                      1.0, "-")


def _init_routing(tokens=2048, k=8, hidden=2048, experts=64):
    def build():
        g = torch.Generator().manual_seed(0)
        x = _npu(torch.zeros(tokens, hidden, dtype=torch.bfloat16))[0]
        idx = _npu(torch.randint(0, experts, (tokens, k), generator=g, dtype=torch.int32))[0]
        return (lambda: torch.ops.npu_fa.moe_init_routing_v2(
            x, idx, active_num=tokens * k, expert_num=experts, expert_tokens_num_type=1,
            expert_tokens_num_flag=True, active_expert_range=[0, experts])), [x, idx]
    # The sort's control flow reads the counters (run for real; the counts are those of a count-only walk).
    return KernelCase("moe_init_routing_v2", f"{tokens} tokens x k={k} over {experts} experts, H={hidden} bf16",
                      build, 0.0, "-", count_only=False)


def _indexer(b=4, n=64, d=128, keys=4096, k=2048, block=128):
    def build():
        # random inputs: the running top-k's scalar work depends on the scores (zeros would tie and skip every tile)
        g = torch.Generator().manual_seed(0)
        per = keys // block
        q = _npu(torch.randn(b, 1, n, d, generator=g).to(torch.bfloat16))[0]
        key = _npu(torch.randn(b * per, block, 1, d, generator=g).to(torch.bfloat16))[0]
        w = _npu((torch.randn(b, 1, n, generator=g) / n).to(torch.bfloat16))[0]
        table = _npu(torch.arange(b * per, dtype=torch.int32).view(b, per))[0]
        lens = torch.full((b,), keys, dtype=torch.int32)
        return (lambda: torch.ops.npu_fa.lightning_indexer(
            q, key, w, actual_seq_lengths_key=lens, block_table=table, layout_key="PA_BSND", sparse_count=k)), \
            [q, key, w, table]
    # The top-k's control flow reads the scores (run for real; the counters are those of the real walk).
    return KernelCase("lightning_indexer", f"decode B{b} N{n} D{d}, {keys} paged keys, top-{k}, bf16", build, 1.0,
                      "-", count_only=False)


def _gated_delta_rule(b=16, nk=16, nv=32, d=128):
    def build():
        # Qwen3-Next's decode step: one token per sequence, bf16 activations, a float32 state cache of one slot per
        # sequence (written back in place)
        q, k = _npu(*(torch.zeros(b, nk, d, dtype=torch.bfloat16) for _ in range(2)))
        v = _npu(torch.zeros(b, nv, d, dtype=torch.bfloat16))[0]
        state = _npu(torch.zeros(b, nv, d, d))[0]
        beta, g = _npu(torch.ones(b, nv), torch.zeros(b, nv))
        idx = torch.arange(b, dtype=torch.int32)
        # the state is listed twice: read once and written once in place (the op's compulsory bytes)
        return (lambda: torch.ops.npu_fa.recurrent_gated_delta_rule(
            q, k, v, state, beta=beta, g=g, ssm_state_indices=idx)), [q, k, v, state, beta, g, state]
    return KernelCase("recurrent_gated_delta_rule", f"decode B{b} Nk{nk} Nv{nv} {d}x{d} state, bf16, fp32 cache",
                      build, 1.0, "-")


def _causal_conv1d(b=16, dim=8192, k=4):
    def build():
        # Qwen3-Next's conv in a decode step: one token per sequence over the 2*16*128 + 32*128 channels of q, k and
        # v, bf16, a K-1-row cache line per sequence (shifted in place), SiLU
        x = _npu(torch.zeros(b, dim, dtype=torch.bfloat16))[0]
        w = _npu(torch.zeros(k, dim, dtype=torch.bfloat16))[0]
        states = _npu(torch.zeros(b, k - 1, dim, dtype=torch.bfloat16))[0]
        qsl, lines = _npu(torch.arange(b + 1, dtype=torch.int32), torch.arange(b, dtype=torch.int32))
        # the cache is listed twice: read once and written once in place (the op's compulsory bytes)
        return (lambda: torch.ops.npu_fa.fused_causal_conv1d(
            x, w, states, query_start_loc=qsl, cache_indices=lines, activation="silu")), [x, w, states, states]
    return KernelCase("fused_causal_conv1d", f"decode B{b}, {dim} channels, K={k}, bf16, SiLU", build, 1.0, "-")


def kernel_cases(quick: bool = False) -> List[KernelCase]:
    if quick:
        return [_fa_forward(1, 2, 256, 64), _fa_backward(1, 2, 128, 64), _decode(2, 8, 2, 512, 64),
                _rope(128, 8, 64), _gating(256, 16, 4), _init_routing(64, 2, 256, 8), _grouped_matmul(256, 128, 256, 4),
                _finalize(64, 2, 256), _indexer(2, 8, 64, 512, 64, 64), _gated_delta_rule(2, 2, 4, 64),
                _causal_conv1d(2, 256, 4)]
    return [_fa_forward(), _fa_backward(), _decode(), _rope(), _gating(), _init_routing(), _grouped_matmul(),
            _finalize(), _indexer(), _gated_delta_rule(), _causal_conv1d()]


def _nbytes(values) -> int:
    if isinstance(values, torch.Tensor):
        return values.numel() * values.element_size()
    if isinstance(values, (list, tuple)):
        return sum(_nbytes(v) for v in values)
    return 0


@dataclass
class KernelRow:
    case: KernelCase
    pred: pm.Prediction
    shares: pm.PeakShares
    seconds: float  # host time of the count-only walk


def predict_kernels(lib, cases: Sequence[KernelCase], hw: pm.Ascend910B) -> List[KernelRow]:
    npu_sim.enable()
    rows = []
    for case in cases:
        launch, inputs = case.build()
        outputs = []
        start = time.perf_counter()
        records = counted_launch(lib, lambda: outputs.append(launch()), case.count_only)
        seconds = time.perf_counter() - start
        pipe = pm.pipeline_from_counts(records, case.waited_share)
        pred = pm.predict(records, hw, pipe, hbm_unique_bytes=_nbytes(inputs) + _nbytes(outputs))
        rows.append(KernelRow(case, pred, pm.peak_shares(pred, hw), seconds))
    return rows


def kernel_table(rows: Sequence[KernelRow]) -> str:
    out = []
    for r in rows:
        p, s = r.pred, r.shares
        g = p.slowest
        out.append([r.case.name, r.case.shape, "MIX" if any(c.counts.core_type == pm.AIC for c in g.cores) else "AIV",
                    f"{p.time_s * 1e6:.1f}", f"{100 * s.cube:.0f}%", f"{100 * s.vector:.0f}%",
                    f"{100 * s.bandwidth:.0f}%", f"{100 * s.issue:.0f}%",
                    f"{(g.sync_s + g.bubble_s) * 1e6:.1f}", p.bottleneck, r.case.waits_for])
    headers = ["kernel", "shape", "mode", "predicted us", "cube peak", "vector peak", "bandwidth", "vector issue",
               "wait+sync us", "bottleneck", "an AIV waits for"]
    return format_table(headers, out)

