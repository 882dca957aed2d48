"""`python -m torch_ops_transformer.bench attention`: training attention vs PyTorch's CPU SDPA.

Every row times our op and `F.scaled_dot_product_attention` in the same process (alternating, median), forward
and forward+backward, and prints the speed-up (torch time / our time), our achieved GFLOP/s of *useful* work
and that as a share of the same-run GEMM speed. The varlen row compares our packed (TND) batch with SDPA on the
padded batch; the sliding-window row compares our band mode with SDPA given the explicit mask. The memory table
reports the peak resident-memory growth of one forward at a long sequence: ours vs the O(S²) math path.
"""
import dataclasses
import math
import multiprocessing
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from .common import format_table, gemm_gflops, peak_memory_growth, time_alternating

def _ops():
    # The kernels are registered: importing any bench module imports the package first, which loads them.
    return torch.ops.npu_fa


@dataclasses.dataclass
class Case:
    name: str
    batch: int
    q_heads: int
    kv_heads: int
    seq: int
    head_dim: int
    dtype: torch.dtype
    causal: bool = False
    lengths: Optional[Sequence[int]] = None   # varlen: packed (ours) vs padded + mask (torch)
    window: Optional[int] = None              # sliding window (left context) with causal

    def useful_flops(self) -> float:
        """Forward FLOPs of the unmasked work: 4·N·D per visible (query, key) pair."""
        per_pair = 4 * self.q_heads * self.head_dim
        if self.lengths is not None:
            pairs = sum(L * (L + 1) // 2 if self.causal else L * L for L in self.lengths)
        elif self.window is not None:
            pairs = self.batch * sum(min(i, self.window) + 1 for i in range(self.seq))
        else:
            s = self.seq
            pairs = self.batch * (s * (s + 1) // 2 if self.causal else s * s)
        return float(per_pair * pairs)


def default_cases(quick: bool) -> List[Case]:
    if quick:
        return [Case("dense", 1, 4, 4, 256, 64, torch.float32), Case("dense", 1, 4, 4, 256, 64, torch.bfloat16, True),
                Case("gqa", 1, 4, 2, 256, 64, torch.float32, True),
                Case("varlen", 3, 4, 4, 0, 64, torch.float32, True, lengths=(200, 64, 17)),
                Case("window", 1, 4, 4, 512, 64, torch.float32, True, window=64)]
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for causal in (False, True):
            cases.append(Case("dense", 1, 16, 16, 2048, 128, dtype, causal))
            cases.append(Case("dense", 4, 32, 32, 512, 128, dtype, causal))
    cases.append(Case("gqa", 1, 32, 8, 2048, 128, torch.bfloat16, True))
    cases.append(Case("varlen", 4, 16, 16, 0, 128, torch.bfloat16, True, lengths=(1536, 256, 768, 512)))
    cases.append(Case("window", 1, 16, 16, 4096, 128, torch.bfloat16, True, window=512))
    return cases


def _make(case: Case):
    """Inputs for both contenders: ours in BNSD (or TND for varlen), torch in BNSD (padded for varlen)."""
    g = torch.Generator().manual_seed(0)
    scale = 1.0 / math.sqrt(case.head_dim)
    ops = _ops()

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(case.dtype).requires_grad_()

    if case.lengths is not None:
        T, S = sum(case.lengths), max(case.lengths)
        q, k, v = rnd(T, case.q_heads, case.head_dim), rnd(T, case.kv_heads, case.head_dim), rnd(T, case.kv_heads, case.head_dim)
        cu = torch.tensor(case.lengths).cumsum(0)
        ours = lambda: ops.flash_attention_score(q, k, v, case.q_heads, "TND", actual_seq_qlen=cu, actual_seq_kvlen=cu,
                                                 scale=scale, sparse_mode=3 if case.causal else 0)[0]
        B = len(case.lengths)
        tq, tk, tv = (rnd(B, n, S, case.head_dim) for n in (case.q_heads, case.kv_heads, case.kv_heads))
        pos = torch.arange(S)
        valid = pos[None, :] < torch.tensor(case.lengths)[:, None]                  # [B, S] real tokens
        keep = valid[:, None, None, :] & (pos[None, :] <= pos[:, None] if case.causal else True)
        keep = keep | ~valid[:, None, :, None]  # padded query rows see everything (avoids NaN; discarded)
        theirs = lambda: F.scaled_dot_product_attention(tq, tk, tv, attn_mask=keep, scale=scale)
        return ours, theirs, (q, k, v), (tq, tk, tv)

    shape = lambda n: (case.batch, n, case.seq, case.head_dim)
    q, k, v = rnd(*shape(case.q_heads)), rnd(*shape(case.kv_heads)), rnd(*shape(case.kv_heads))
    gqa = case.kv_heads != case.q_heads
    if case.window is not None:
        ours = lambda: ops.flash_attention_score(q, k, v, case.q_heads, "BNSD", scale=scale, sparse_mode=4,
                                                 pre_tokens=case.window, next_tokens=0)[0]
        i = torch.arange(case.seq)
        keep = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - case.window)
        theirs = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale, enable_gqa=gqa)
    else:
        ours = lambda: ops.flash_attention_score(q, k, v, case.q_heads, "BNSD", scale=scale,
                                                 sparse_mode=3 if case.causal else 0)[0]
        theirs = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, scale=scale, enable_gqa=gqa)
    return ours, theirs, (q, k, v), (q, k, v)


def _fwd_bwd(fn, leaves):
    def run():
        for t in leaves:
            t.grad = None
        out = fn()
        out.backward(torch.ones_like(out))
    return run


def run_case(case: Case, reps: int):
    ours, theirs, our_leaves, their_leaves = _make(case)
    with torch.no_grad():
        fwd = time_alternating({"ours": ours, "torch": theirs}, reps=reps)
    both = time_alternating({"ours": _fwd_bwd(ours, our_leaves), "torch": _fwd_bwd(theirs, their_leaves)}, reps=reps)
    return fwd, both


def _memory_contender(name: str, seq: int, heads: int, head_dim: int) -> int:
    """Peak RSS growth of one fp32 causal forward; runs in a fresh process so earlier frees cannot hide growth."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, seq, head_dim) for _ in range(3))
    scale = 1.0 / math.sqrt(head_dim)
    if name == "ours":
        ops = _ops()
        fn = lambda: ops.flash_attention_score(q, k, v, heads, "BNSD", scale=scale, sparse_mode=3)[0]
    elif name == "torch SDPA":
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        fn = lambda: torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(causal, float("-inf")), -1) @ v
    with torch.no_grad():
        fn()  # warm-up: one-time allocations (packing buffers, thread pools) are not per-call memory
        return peak_memory_growth(fn)


MEMORY_CONTENDERS = ("ours", "torch SDPA", "math (softmax(QKᵀ)V)")


def memory_growth_fresh_process(name: str, seq: int, heads: int = 8, head_dim: int = 128) -> int:
    """Bytes of peak RSS growth of one fp32 causal forward of contender `name`, measured in a new process."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_memory_contender, (name, seq, heads, head_dim))


def memory_table(seq: int, heads: int = 8, head_dim: int = 128):
    """Peak RSS growth of one fp32 forward at sequence `seq`: ours, torch SDPA (flash) and the math path."""
    out_mib = heads * seq * head_dim * 4 / 2**20
    rows = []
    for name in MEMORY_CONTENDERS:
        grown = memory_growth_fresh_process(name, seq, heads, head_dim) / 2**20
        rows.append([name, f"{grown:.0f}", f"{max(0.0, grown - out_mib):.0f}"])
    return format_table([f"forward, B=1 N={heads} S={seq} D={head_dim} fp32 causal", "peak RSS growth MiB",
                         f"beyond the {out_mib:.0f} MiB output"], rows)


def main(quick: bool = False, reps: int = 5, memory_seq: int = 8192) -> None:
    threads = torch.get_num_threads()
    dt_name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    gemm = {dt: gemm_gflops(dt, 512 if quick else 2048) for dt in (torch.float32, torch.bfloat16)}
    print(f"# attention: ours vs F.scaled_dot_product_attention (CPU), {threads} threads, median of {reps}, "
          f"same-run GEMM fp32 {gemm[torch.float32]:.0f} GFLOP/s, bf16 {gemm[torch.bfloat16]:.0f} GFLOP/s")
    rows = []
    for case in default_cases(quick):
        fwd, both = run_case(case, reps)
        flops = case.useful_flops()
        shape = (f"B={case.batch} N={case.q_heads}/{case.kv_heads} S={case.seq} D={case.head_dim}"
                 if case.lengths is None else f"lengths={list(case.lengths)} N={case.q_heads} D={case.head_dim}")
        mask = "causal" if case.causal else "full"
        if case.window is not None:
            mask = f"window {case.window}"
        gf = flops / fwd["ours"] / 1e9
        rows.append([case.name, shape, dt_name[case.dtype], mask,
                     f"{fwd['ours'] * 1e3:.1f}", f"{fwd['torch'] * 1e3:.1f}", f"{fwd['torch'] / fwd['ours']:.2f}x",
                     f"{both['ours'] * 1e3:.1f}", f"{both['torch'] * 1e3:.1f}", f"{both['torch'] / both['ours']:.2f}x",
                     f"{gf:.0f}", f"{100 * gf / gemm[case.dtype]:.0f}%"])
        print(f"  done: {case.name} {shape} {dt_name[case.dtype]} {mask}", flush=True)
    print(format_table(["case", "shape", "dtype", "mask", "fwd ours ms", "fwd torch ms", "fwd speed-up",
                        "fwd+bwd ours ms", "fwd+bwd torch ms", "fwd+bwd speed-up", "ours fwd GFLOP/s",
                        "of GEMM"], rows))
    print()
    print(memory_table(512 if quick else memory_seq))
