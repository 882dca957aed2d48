"""`python -m torch_ops_transformer.bench dsa`: DeepSeek-V3.2's sparse attention (DSA) decode against dense absorbed
MLA over the same paged latent cache, at growing context.

One query token per sequence, DeepSeek-V3.2's sizes: latent 512 + rope 64 per cached token (one KV head), the
indexer's 64 heads of dim 128 over its own paged key cache, top 2048 tokens per query, block 128. Contenders,
alternating in one process (median):
- dense: `npu_fused_infer_attention_score(q_absorbed, c_kv, c_kv, query_rope=q_pe, key_rope=k_pe, block_table=...)`,
  the absorbed MLA decode of `bench mla` over the whole context;
- indexer: `npu_lightning_indexer(q_index, k_index, weights, block_table=..., layout_key="PA_BSND",
  sparse_count=2048)`: scores every cached token, keeps the top 2048;
- sparse attention: `npu_sparse_flash_attention(q_absorbed, c_kv, c_kv, sparse_indices, query_rope=q_pe,
  key_rope=k_pe, layout_kv="PA_BSND", attention_mode=2)` over those tokens only.
DSA's cost per step is indexer + sparse attention; the table prints it, the indexer's share of it, and dense / DSA.
The sparse attention's cost stays flat once the context exceeds the top-k; the indexer's grows linearly, at a
fraction of dense attention's per-token work ((64·128) multiply-adds per cached token against N·(576 + 512)), so the
ratio grows with the context and with the head count N.

Checks (a failure ends the command after the table): the indices are a top 2048 of a plain-PyTorch float32
recomputation of the indexer scores (the scores at our indices equal the reference's sorted top scores, so ties
may pick either token), and the sparse output equals float32 attention over the gathered selected tokens.
"""
import dataclasses
from typing import List, Optional

import torch

from ..inference.api import npu_fused_infer_attention_score
from ..sparse_attention import npu_lightning_indexer, npu_sparse_flash_attention
from .common import format_table, machine_line, time_alternating

KV_LORA, ROPE, NOPE = 512, 64, 128
INDEX_HEADS, INDEX_DIM = 64, 128
TOPK = 2048
GOALS = {32768: 5.0, 131072: 15.0}  # dense / DSA at these contexts
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@dataclasses.dataclass
class Case:
    batch: int
    heads: int
    ctx: int
    dtype: torch.dtype = torch.bfloat16
    topk: int = TOPK
    block: int = 128


def default_cases(quick: bool) -> List[Case]:
    if quick:
        return [Case(2, 4, 512, torch.float32, topk=64, block=64), Case(1, 4, 256, torch.bfloat16, topk=64, block=64)]
    # N = 128: one device holding all of DeepSeek-V3.2's heads; N = 16: a tensor-parallel shard of 8.
    return [Case(1, n, ctx) for n in (128, 16) for ctx in (8192, 32768, 131072)]


@dataclasses.dataclass
class Inputs:
    q_abs: torch.Tensor    # [B, 1, N, 512]
    q_pe: torch.Tensor     # [B, 1, N, 64]
    q_idx: torch.Tensor    # [B, 1, 64, 128]
    weights: torch.Tensor  # [B, 1, 64]
    latent: torch.Tensor   # [blocks, block, 1, 512]
    rope: torch.Tensor     # [blocks, block, 1, 64]
    k_idx: torch.Tensor    # [blocks, block, 1, 128]
    table: torch.Tensor    # int32 [B, ctx / block], shuffled blocks
    scale: float


def make_inputs(c: Case) -> Inputs:
    g = torch.Generator().manual_seed(0)
    B, N, dt = c.batch, c.heads, c.dtype
    blocks = B * c.ctx // c.block

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=g) * std).to(dt)

    return Inputs(q_abs=randn(B, 1, N, KV_LORA), q_pe=randn(B, 1, N, ROPE), q_idx=randn(B, 1, INDEX_HEADS, INDEX_DIM),
                  weights=randn(B, 1, INDEX_HEADS, std=INDEX_HEADS ** -0.5), latent=randn(blocks, c.block, 1, KV_LORA,
                                                                                          std=0.5),
                  rope=randn(blocks, c.block, 1, ROPE), k_idx=randn(blocks, c.block, 1, INDEX_DIM),
                  table=torch.randperm(blocks, generator=g).view(B, -1).to(torch.int32),
                  scale=(NOPE + ROPE) ** -0.5)


def contenders(c: Case, x: Inputs):
    lens = [c.ctx] * c.batch
    ones = [1] * c.batch

    def dense():
        return npu_fused_infer_attention_score(
            x.q_abs, x.latent, x.latent, query_rope=x.q_pe, key_rope=x.rope, num_heads=c.heads, num_key_value_heads=1,
            scale=x.scale, input_layout="BSND", block_table=x.table, block_size=c.block, actual_seq_lengths_kv=lens)[0]

    def indexer():
        return npu_lightning_indexer(x.q_idx, x.k_idx, x.weights, actual_seq_lengths_query=ones,
                                     actual_seq_lengths_key=lens, block_table=x.table, layout_key="PA_BSND",
                                     sparse_count=c.topk, sparse_mode=3)[0]

    def sparse(indices):
        return npu_sparse_flash_attention(x.q_abs, x.latent, x.latent, indices, x.scale, block_table=x.table,
                                          actual_seq_lengths_query=ones, actual_seq_lengths_kv=lens,
                                          query_rope=x.q_pe, key_rope=x.rope, layout_kv="PA_BSND", sparse_mode=3,
                                          attention_mode=2)[0]

    return dense, indexer, sparse


def _sequence(cache: torch.Tensor, table: torch.Tensor, b: int) -> torch.Tensor:
    """Sequence b's rows of a paged cache [blocks, block, 1, D] in token order, float32 [ctx, D]."""
    return cache[table[b].long()].flatten(0, 2).float()


def check(c: Case, x: Inputs, indices: torch.Tensor, out: torch.Tensor) -> List[str]:
    """The problems found (empty: none), against plain-PyTorch float32 recomputations."""
    bad = []
    for b in range(c.batch):
        sel = indices[b, 0, 0].long()
        k_idx = _sequence(x.k_idx, x.table, b)
        scores = (torch.relu(x.q_idx[b, 0].float() @ k_idx.t()) * x.weights[b, 0].float()[:, None]).sum(0)
        top = scores.topk(min(c.topk, c.ctx)).values
        picked = scores[sel[sel >= 0]].sort(descending=True).values
        gap = (picked - top).abs().max().item() if picked.numel() == top.numel() else float("inf")
        if not gap <= 1e-3 * max(1.0, top.abs().max().item()):
            bad.append(f"B={c.batch} N={c.heads} S={c.ctx}: sequence {b}'s indices are not a top-{c.topk} "
                       f"(score gap {gap:.3g})")
        lat, rope = _sequence(x.latent, x.table, b)[sel], _sequence(x.rope, x.table, b)[sel]
        s = (x.q_abs[b, 0].float() @ lat.t() + x.q_pe[b, 0].float() @ rope.t()) * x.scale
        ref = torch.softmax(s, -1) @ lat
        diff = (out[b, 0].float() - ref).abs().max().item()
        if not diff <= TOL[c.dtype]:
            bad.append(f"B={c.batch} N={c.heads} S={c.ctx}: sparse attention max|diff| {diff:.3g} > {TOL[c.dtype]}")
    return bad


def run(quick: bool = False, reps: int = 5, cases: Optional[List[Case]] = None):
    """Measures, prints the header and table, returns the rows; raises RuntimeError (after printing) when a check
    fails."""
    rows, bad = [], []
    for c in cases or default_cases(quick):
        x = make_inputs(c)
        dense, indexer, sparse = contenders(c, x)
        indices = indexer()
        times = time_alternating({"dense": dense, "indexer": indexer, "sparse": lambda: sparse(indices)}, reps=reps)
        out = sparse(indices)
        bad += check(c, x, indices, out)
        dsa = times["indexer"] + times["sparse"]
        ratio = times["dense"] / dsa
        goal = GOALS.get(c.ctx)
        rows.append([f"B={c.batch} N={c.heads} S={c.ctx}", "bf16" if c.dtype == torch.bfloat16 else "fp32",
                     f"{times['dense'] * 1e3:.2f}", f"{times['indexer'] * 1e3:.2f}", f"{times['sparse'] * 1e3:.2f}",
                     f"{dsa * 1e3:.2f}", f"{100 * times['indexer'] / dsa:.0f}%", f"{ratio:.2f}x",
                     f">= {goal:.0f}x" if goal else "-"])
    print(f"# dsa: DeepSeek-V3.2 sparse attention decode (indexer {INDEX_HEADS}x{INDEX_DIM} + sparse attention over "
          f"the top {TOPK if not quick else 'k'}) vs dense absorbed MLA (latent {KV_LORA} + rope {ROPE}), paged caches, "
          f"one process, contenders alternating, median of {reps}")
    print(f"# {machine_line(torch.get_num_threads())}")
    print(format_table(["case", "dtype", "dense ms", "indexer ms", "sparse attn ms", "DSA ms", "indexer share",
                        "dense/DSA", "goal"], rows))
    if bad:
        raise RuntimeError("dsa benchmark: " + "; ".join(bad))
    return rows


def main(quick: bool = False, reps: int = 5) -> None:
    run(quick, reps)
