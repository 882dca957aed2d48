"""`python -m torch_ops_transformer.bench decode`: decode attention (incre_flash_attention) vs PyTorch's CPU SDPA.

One query token per sequence against a KV cache (GQA). Each row times our op on a contiguous cache and on a paged
cache (same data scattered into shuffled blocks), fused_infer_attention_score on the contiguous cache (its one-token
calls take the same decode kernel) and `F.scaled_dot_product_attention(q, k, v, enable_gqa=True)` on
the contiguous cache, all in one process (alternating, median). Decode is memory-bound, so the yardstick is the
KV bytes read per call: achieved GB/s and that as a share of the memory-read speed measured in the same alternation
: the faster of `k.sum() + v.sum()` over the cache's bytes viewed as fp32 words (exactly the bytes the op must read) and
the sum of a 1 GiB fp32 tensor, so machine noise hits both alike.

The int8 row is an int8 KV cache (KV antiquant, "C8") with a bf16 query and per-channel key/value scales: the kernel
reads the int8 bytes and dequantises in registers, so it streams half the bytes of the bf16 row; "torch" there runs
SDPA on the cache dequantised to bf16 beforehand (the dequantisation is not timed). The line under the table gives
the bf16 / int8 decode time ratio of the same shape, timed in the int8 row's alternation.
"""
import dataclasses
from typing import List

import torch
import torch.nn.functional as F

from .common import format_table, time_alternating


@dataclasses.dataclass
class Case:
    batch: int
    q_heads: int
    kv_heads: int
    kv_len: int
    head_dim: int
    dtype: torch.dtype
    block: int = 128


def default_cases(quick: bool) -> List[Case]:
    if quick:
        return [Case(2, 4, 2, 512, 64, torch.float32, 64), Case(2, 4, 2, 512, 64, torch.bfloat16, 64),
                Case(2, 4, 2, 512, 64, torch.int8, 64)]
    return [Case(4, 32, 8, 8192, 128, torch.float32), Case(4, 32, 8, 8192, 128, torch.bfloat16),
            Case(4, 32, 8, 8192, 128, torch.int8)]


def make_inputs(c: Case):
    g = torch.Generator().manual_seed(0)
    B, N1, N2, S, D = c.batch, c.q_heads, c.kv_heads, c.kv_len, c.head_dim
    if c.dtype == torch.int8:  # int8 cache, bf16 query
        q = torch.randn(B, N1, 1, D, generator=g).to(torch.bfloat16)
        k = torch.randint(-127, 128, (B, N2, S, D), generator=g, dtype=torch.int8)
        v = torch.randint(-127, 128, (B, N2, S, D), generator=g, dtype=torch.int8)
    else:
        q = torch.randn(B, N1, 1, D, generator=g).to(c.dtype)
        k = torch.randn(B, N2, S, D, generator=g).to(c.dtype)
        v = torch.randn(B, N2, S, D, generator=g).to(c.dtype)
    # Paged cache (num_blocks, block, N2*D) with a shuffled block table.
    nb = S // c.block
    perm = torch.randperm(B * nb, generator=g)
    table = perm.view(B, nb).to(torch.int32)
    kc = torch.empty(B * nb, c.block, N2 * D, dtype=c.dtype)
    vc = torch.empty_like(kc)
    kc[perm] = k.permute(0, 2, 1, 3).reshape(B * nb, c.block, N2 * D)
    vc[perm] = v.permute(0, 2, 1, 3).reshape(B * nb, c.block, N2 * D)
    q_bsh = q.reshape(B, 1, N1 * D)
    return q, k, v, q_bsh, kc, vc, table


def main(quick: bool = False, reps: int = 5) -> None:
    ops = torch.ops.npu_fa  # registered by the package's import, which ran before this module's
    threads = torch.get_num_threads()
    print(f"# decode: ours vs F.scaled_dot_product_attention(enable_gqa=True) (CPU), {threads} threads, median of "
          f"{reps}, memory read = the faster of k.sum() + v.sum() (bytes as fp32 words) and a 1 GiB fp32 sum, in the same alternation")
    big = torch.ones((1 << 22) if quick else (1 << 28), dtype=torch.float32)  # 1 GiB: a second read yardstick
    rows = []
    dt_name = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int8: "int8 (bf16 q)"}
    ratio = None
    for c in default_cases(quick):
        q, k, v, q_bsh, kc, vc, table = make_inputs(c)
        B, N1, N2, S, D = c.batch, c.q_heads, c.kv_heads, c.kv_len, c.head_dim
        lens = torch.full((B,), S, dtype=torch.int64)
        scale = D ** -0.5
        aq, tk, tv = {}, k, v
        if c.dtype == torch.int8:  # per-channel scales; torch runs on the cache dequantised to bf16 beforehand
            gs = torch.Generator().manual_seed(1)
            ks, vs = (torch.rand(1, N2, 1, D, generator=gs) * 0.02 + 0.005 for _ in range(2))
            aq = dict(key_antiquant_scale=ks, value_antiquant_scale=vs)
            tk, tv = (k.float() * ks).to(torch.bfloat16), (v.float() * vs).to(torch.bfloat16)
        # The read yardstick sums the cache's bytes as fp32 words: a bf16 sum would be bound by its conversions.
        k_words, v_words = (t.reshape(-1).view(torch.float32) for t in (k, v))
        fns = {
            "contiguous": lambda: ops.incre_flash_attention(q, k, v, None, None, lens, None, None, N1, scale, "BNSD",
                                                            N2, **aq),
            "paged": lambda: ops.incre_flash_attention(q_bsh, kc, vc, None, None, lens, table, None, N1, scale, "BSH",
                                                       N2, c.block, **aq),
            # fused_infer_attention_score on the contiguous cache: its one-token calls take the decode route.
            "fia": lambda: ops.fused_infer_attention_score(q, k, v, num_heads=N1, scale=scale, input_layout="BNSD",
                                                           num_key_value_heads=N2, **aq)[0],
            "torch": lambda: F.scaled_dot_product_attention(q, tk, tv, scale=scale, enable_gqa=True),
            "read": lambda: k_words.sum() + v_words.sum(),
            "read_big": lambda: big.sum(),
        }
        ref = fns["torch"]().float()
        err = max((fns["contiguous"]().float() - ref).abs().max().item(),
                  (fns["paged"]().float().view_as(ref) - ref).abs().max().item(),
                  (fns["fia"]().float() - ref).abs().max().item())
        if c.dtype == torch.int8:  # the same shape with the bf16 cache, in the same alternation
            fns["bf16"] = lambda: ops.incre_flash_attention(q, tk, tv, None, None, lens, None, None, N1, scale,
                                                            "BNSD", N2)
        t = time_alternating(fns, reps=reps, min_time=0.2)
        if c.dtype == torch.int8:
            ratio = t["bf16"] / t["contiguous"]
        kv_bytes = 2 * B * N2 * S * D * k.element_size()
        gbs = {name: kv_bytes / t[name] / 1e9 for name in ("contiguous", "paged", "read")}
        gbs["read"] = max(gbs["read"], big.numel() * 4 / t["read_big"] / 1e9)  # the faster yardstick (conservative)
        rows.append([f"B={B} N={N1}/{N2} S={S} D={D}", dt_name[c.dtype], f"{t['contiguous'] * 1e3:.2f}",
                     f"{t['fia'] * 1e3:.2f}", f"{t['paged'] * 1e3:.2f}", f"{t['torch'] * 1e3:.2f}",
                     f"{t['torch'] / t['contiguous']:.2f}x", f"{gbs['contiguous']:.1f}",
                     f"{gbs['read']:.1f}", f"{100 * gbs['contiguous'] / gbs['read']:.0f}%", f"{gbs['paged']:.1f}",
                     f"{t['paged'] / t['contiguous']:.2f}", f"{err:.1e}"])
        print(f"  done: {rows[-1][0]} {dt_name[c.dtype]}", flush=True)
    print(format_table(["shape", "dtype", "ours contig ms", "FIA contig ms",
                        f"ours paged (block {default_cases(quick)[0].block}) ms",
                        "torch ms", "speed-up (contig)", "contig KV GB/s", "read GB/s (best sum)", "of read", "paged KV GB/s",
                        "paged/contig time", "max |diff| vs torch"], rows))
    if ratio is not None:
        print(f"int8 cache vs bf16 cache of the same shape, contiguous decode (timed in one alternation): "
              f"{ratio:.2f}x faster")
