"""`python -m torch_ops_transformer.bench quant`: quantised serving as vLLM-Ascend runs it, against the bf16 path.

- **int8 KV decode** (the "C8" cache): one query token per sequence (bf16, GQA) over a paged int8 cache in the NZ
  layout `(num_blocks, N2, D // 32, block_size, 32)` with per-channel antiquant scales, read in place by
  `npu_fused_infer_attention_score` (BNSD) — against the same call on a bf16 paged cache (head-major
  `(num_blocks, N2, block_size, D)`) and on the int8 ND head-major cache. Decode is memory-bound: the yardstick is the
  KV bytes read per call as GB/s and as a share of the memory-read speed measured in the same alternation (the
  faster of a sum over the cache's bytes viewed as fp32 words and a 1 GiB fp32 sum).
- **W8A8 GEMM**: `npu_quant_matmul` (int8 x1 [M, K] per-token scale, int8 x2 [K, N] per-channel scale, bf16 out;
  exact int32 products: oneDNN's int8 kernels (VNNI / AMX-INT8) on AVX-512 CPUs, an exact vpmaddwd kernel on AVX2 ones)
  against `torch.mm` in bf16 of the same shape (the peer a bf16 deployment runs) and in fp32.

All contenders of a row alternate in one process (median of `reps`); ratios are time(peer) / time(ours).
"""
import torch

from ..inference.api import npu_fused_infer_attention_score as fia
from ..kv_cache import to_nz
from ..quant.api import npu_quant_matmul
from .common import format_table, machine_line, time_alternating


def _paged_caches(B, N2, S, D, block, g):
    """int8 K/V [B, N2, S, D] scattered into shuffled blocks: the NZ cache, the ND head-major int8 cache, the bf16
    head-major cache of the dequantised values, and the block table."""
    k = torch.randint(-127, 128, (B, N2, S, D), generator=g, dtype=torch.int8)
    v = torch.randint(-127, 128, (B, N2, S, D), generator=g, dtype=torch.int8)
    nb = S // block
    perm = torch.randperm(B * nb, generator=g)
    table = perm.view(B, nb).to(torch.int32)

    def paged(x):  # [B, N2, S, D] -> (blocks, block, N2, D) in table order
        out = torch.empty(B * nb, block, N2, D, dtype=x.dtype)
        out[perm] = x.view(B, N2, nb, block, D).permute(0, 2, 3, 1, 4).reshape(B * nb, block, N2, D)
        return out

    kp, vp = paged(k), paged(v)
    return k, v, (to_nz(kp), to_nz(vp)), (kp.transpose(1, 2).contiguous(), vp.transpose(1, 2).contiguous()), table


def decode_rows(quick: bool, reps: int):
    B, N1, N2, S, D, block = (2, 4, 2, 512, 128, 64) if quick else (4, 32, 8, 8192, 128, 128)
    g = torch.Generator().manual_seed(0)
    k, v, (nz_k, nz_v), (hm_k, hm_v), table = _paged_caches(B, N2, S, D, block, g)
    ks, vs = (torch.rand(1, N2, 1, D, generator=g) * 0.02 + 0.005 for _ in range(2))
    bf_k, bf_v = (hm_k.float() * ks.view(1, N2, 1, D)).bfloat16(), (hm_v.float() * vs.view(1, N2, 1, D)).bfloat16()
    q = torch.randn(B, N1, 1, D, generator=g).bfloat16()
    kw = dict(block_table=table, actual_seq_lengths_kv=[S] * B, num_heads=N1, scale=D ** -0.5, input_layout="BNSD",
              num_key_value_heads=N2, block_size=block)
    aq = dict(key_antiquant_scale=ks, value_antiquant_scale=vs, inner_precise=1)
    big = torch.ones((1 << 22) if quick else (1 << 28), dtype=torch.float32)
    words = [t.reshape(-1).view(torch.float32) for t in (k, v)]
    fns = {
        "int8 NZ": lambda: fia(q, nz_k, nz_v, **kw, **aq),
        "int8 ND": lambda: fia(q, hm_k, hm_v, **kw, **aq),
        "bf16": lambda: fia(q, bf_k, bf_v, **kw),
        "read": lambda: words[0].sum() + words[1].sum(),
        "read_big": lambda: big.sum(),
    }
    if not torch.equal(fns["int8 NZ"]()[0], fns["int8 ND"]()[0]):
        raise RuntimeError("quant benchmark: decode over the NZ cache differs from the same call over the ND cache")
    err = (fns["int8 NZ"]()[0].float() - fns["bf16"]()[0].float()).abs().max().item()
    t = time_alternating(fns, reps=reps, min_time=0.2)
    int8_bytes = 2 * B * N2 * S * D
    read = max(int8_bytes / t["read"], big.numel() * 4 / t["read_big"]) / 1e9
    rows = []
    for name, nbytes in (("int8 NZ", int8_bytes), ("int8 ND", int8_bytes), ("bf16", 2 * int8_bytes)):
        gbs = nbytes / t[name] / 1e9
        rows.append([f"B={B} N={N1}/{N2} S={S} D={D} block {block}", name, f"{t[name] * 1e3:.2f}", f"{gbs:.1f}",
                     f"{read:.1f}", f"{100 * gbs / read:.0f}%", f"{t['bf16'] / t[name]:.2f}x"])
    print(format_table(["decode (bf16 query)", "cache", "ms", "KV GB/s", "read GB/s", "of read", "bf16 time / this"],
                       rows))
    print(f"max |int8 - bf16 cache| of the outputs: {err:.1e} (the bf16 cache holds the dequantised values rounded)")


def gemm_rows(quick: bool, reps: int):
    # (CPUs without native bf16 / int8 products run ATen's bf16 mm at ~0.2 GFLOP/s: larger M would take minutes.)
    shapes = [(64, 256, 256)] if quick else [(16, 4096, 4096), (256, 4096, 4096)]
    g = torch.Generator().manual_seed(1)
    rows = []
    for M, K, N in shapes:
        x1 = torch.randint(-127, 128, (M, K), generator=g, dtype=torch.int8)
        x2 = torch.randint(-127, 128, (K, N), generator=g, dtype=torch.int8)
        scale = torch.rand(N, generator=g) * 1e-3
        pertoken = torch.rand(M, generator=g) * 1e-2
        a, b = (x1.float() * pertoken[:, None]).bfloat16(), (x2.float() * scale).bfloat16()
        a32, b32 = a.float(), b.float()
        fns = {
            "w8a8": lambda: npu_quant_matmul(x1, x2, scale, pertoken_scale=pertoken, output_dtype=torch.bfloat16),
            "bf16": lambda: torch.mm(a, b),
            "fp32": lambda: torch.mm(a32, b32),
        }
        want = fns["fp32"]()
        got = fns["w8a8"]().float()
        if (got - want).abs().max().item() > 1e-2 * want.abs().max().item():  # bf16 output: 2^-9 relative
            raise RuntimeError(f"quant benchmark: W8A8 M={M} K={K} N={N} is off the fp32 product of its dequantised "
                               f"operands")
        t = time_alternating(fns, reps=reps, min_time=0.2)
        flop = 2 * M * K * N
        rows.append([f"M={M} K={K} N={N}", f"{t['w8a8'] * 1e3:.2f}", f"{flop / t['w8a8'] / 1e9:.1f}",
                     f"{t['bf16'] * 1e3:.2f}", f"{flop / t['bf16'] / 1e9:.1f}", f"{t['bf16'] / t['w8a8']:.2f}x",
                     f"{t['fp32'] * 1e3:.2f}", f"{t['fp32'] / t['w8a8']:.2f}x"])
    print(format_table(["W8A8 GEMM", "int8 ms", "int8 GOP/s", "bf16 mm ms", "bf16 GFLOP/s", "bf16 time / int8",
                        "fp32 mm ms", "fp32 time / int8"], rows))


def main(quick: bool = False, reps: int = 5) -> None:
    threads = torch.get_num_threads()
    print(f"# quant: {machine_line(threads)}; median of {reps}, contenders alternating in one process")
    decode_rows(quick, reps)
    gemm_rows(quick, reps)
