"""incre_flash_attention (decode) inputs from a compact case description, and an independent float64 reference.

Reference semantics (native_functions.yaml doc of incre_flash_attention, docs/inference.md):
  out[b, n] = softmax_j(scale * q[b,n]·k[b,n2,pos_j] + pse[b,n,pos_j], masked j -> -inf) · v[b,n2,pos_j]
with n2 = n // (N1/N2), pos_j = start_b + j for j < len_b, start_b = S - pad - len_b with kv_padding_size (else 0);
for a paged cache pos_j = j. Rows without a visible key are 0.
"""
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch
from torch import Tensor

from test.common.reference import DTYPES

OPS = torch.ops.npu_fa


@dataclass(frozen=True)
class Case:
    layout: str = "BSH"
    batch: int = 3
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    kv_len: int = 40                       # S of a contiguous cache; max_blocks * block_size for a paged one
    lens: Optional[Tuple[int, ...]] = None  # actual_seq_lengths (None = S, contiguous only)
    dtype: str = "fp32"
    mask: Optional[str] = None              # "BS", "B1S", "B11S"
    mask_dtype: str = "bool"
    pse: Optional[str] = None               # "BN1S", "1N1S"
    padding: Optional[int] = None           # kv_padding_size (contiguous only)
    block: Optional[int] = None             # paged cache with this block size
    paged_4d: bool = False                  # (num_blocks, N2, block, D) cache (BNSD only)
    scale: float = 0.25


@dataclass
class Inputs:
    q: Tensor        # [B, N1, D]
    k: Tensor        # [B, N2, S, D] contiguous logical cache
    v: Tensor
    mask: Optional[Tensor]   # [B, S] bool (for the reference)
    pse: Optional[Tensor]    # [B or 1, N1, 1, S]
    starts: Tuple[int, ...]
    lens: Tuple[int, ...]
    args: tuple              # positional arguments of torch.ops.npu_fa.incre_flash_attention


def q_layout(q: Tensor, layout: str) -> Tensor:
    b, n, d = q.shape
    return {"BSH": q.reshape(b, 1, n * d), "BSND": q.reshape(b, 1, n, d), "BNSD": q.reshape(b, n, 1, d)}[layout]


def kv_layout(k: Tensor, layout: str) -> Tensor:
    b, n, s, d = k.shape
    if layout == "BNSD":
        return k.contiguous()
    t = k.transpose(1, 2).contiguous()
    return t.reshape(b, s, n * d) if layout == "BSH" else t


def paged(k: Tensor, block: int, table: Tensor, num_blocks: int, four_d: bool) -> Tensor:
    """Scatter a logical [B, N2, S, D] cache into physical blocks following table (entries < 0 unused)."""
    b, n, s, d = k.shape
    shape = (num_blocks, n, block, d) if four_d else (num_blocks, block, n * d)
    cache = torch.full(shape, float("nan"), dtype=k.dtype)  # unused blocks are NaN: reading one would show
    for bi in range(b):
        for i in range(s // block):
            phys = int(table[bi, i])
            if phys < 0:
                continue
            part = k[bi, :, i * block:(i + 1) * block]  # [N2, block, D]
            cache[phys] = part if four_d else part.transpose(0, 1).reshape(block, n * d)
    return cache


def build(c: Case, seed: int = 0) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[c.dtype]
    B, N1, N2, D, S = c.batch, c.q_heads, c.kv_heads, c.head_dim, c.kv_len
    q = torch.randn(B, N1, D, generator=g).to(dt)
    k = torch.randn(B, N2, S, D, generator=g).to(dt)
    v = torch.randn(B, N2, S, D, generator=g).to(dt)
    lens = tuple(c.lens) if c.lens is not None else (S,) * B
    pad = c.padding or 0
    starts = tuple(S - pad - L for L in lens) if c.padding is not None else (0,) * B
    mask = pse = mask_arg = None
    if c.mask:
        mask = torch.rand(B, S, generator=g) < 0.3
        shape = {"BS": (B, S), "B1S": (B, 1, S), "B11S": (B, 1, 1, S)}[c.mask]
        mask_arg = mask.reshape(shape)
        if c.mask_dtype == "uint8":
            mask_arg = mask_arg.to(torch.uint8)
    if c.pse:
        pse = torch.randn(B if c.pse == "BN1S" else 1, N1, 1, S, generator=g).to(dt)
    lens_t = torch.tensor(lens, dtype=torch.int64) if (c.lens is not None or c.block) else None
    pad_t = torch.tensor(c.padding, dtype=torch.int64) if c.padding is not None else None
    if c.block:
        nb = S // c.block
        num_blocks = B * nb + 2
        perm = torch.randperm(num_blocks, generator=g)[:B * nb].view(B, nb).to(torch.int32)
        used = torch.tensor([(L + c.block - 1) // c.block for L in lens])
        table = torch.where(torch.arange(nb)[None, :] < used[:, None], perm, torch.full_like(perm, -1))
        key, value = (paged(t, c.block, table, num_blocks, c.paged_4d) for t in (k, v))
        args = (q_layout(q, c.layout), key, value, mask_arg, pse, lens_t, table, None, N1, c.scale, c.layout, N2,
                c.block, 1)
    else:
        args = (q_layout(q, c.layout), kv_layout(k, c.layout), kv_layout(v, c.layout), mask_arg, pse, lens_t, None,
                pad_t, N1, c.scale, c.layout, N2, 0, 1)
    return Inputs(q, k, v, mask, pse, starts, lens, args)


def reference(inp: Inputs, c: Case, dtype=torch.float64) -> Tensor:
    """[B, N1, D] in `dtype` (float64: ref64; the inputs' dtype: what plain PyTorch gets in that precision)."""
    B, N1, N2 = c.batch, c.q_heads, c.kv_heads
    G = N1 // N2
    out = torch.zeros(B, N1, c.head_dim, dtype=dtype)
    for b in range(B):
        lo, hi = inp.starts[b], inp.starts[b] + inp.lens[b]
        if hi <= lo:
            continue
        k = inp.k[b, :, lo:hi].to(dtype).repeat_interleave(G, 0)  # [N1, L, D]
        v = inp.v[b, :, lo:hi].to(dtype).repeat_interleave(G, 0)
        s = torch.einsum("nd,nld->nl", inp.q[b].to(dtype), k) * c.scale
        if inp.pse is not None:
            s = s + inp.pse[b if inp.pse.shape[0] > 1 else 0, :, 0, lo:hi].to(dtype)
        if inp.mask is not None:
            s = s.masked_fill(inp.mask[b, lo:hi][None, :], float("-inf"))
        visible = torch.isfinite(s).any(-1, keepdim=True)
        p = torch.softmax(s.masked_fill(~visible, 0.0), -1) * visible
        out[b] = torch.einsum("nl,nld->nd", p, v)
    return out


def run(inp: Inputs) -> Tensor:
    out = OPS.incre_flash_attention(*inp.args)
    return out


SMALL = dict(batch=2, q_heads=4, kv_heads=2, head_dim=8, kv_len=32)

OPCHECK_CASES = {
    "incre_flash_attention": {
        "contiguous_BSH_lens": lambda: (build(Case(lens=(5, 0), **SMALL)).args, {}),
        "BNSD_mask_pse_padding": lambda: (build(Case(layout="BNSD", lens=(7, 3), padding=4, mask="B11S", pse="BN1S",
                                                     **SMALL)).args, {}),
        "paged_BSND": lambda: (build(Case(layout="BSND", lens=(17, 30), block=16, **SMALL)).args, {}),
        "paged_BSND_learnable_sink": lambda: (build(Case(layout="BSND", lens=(17, 0), block=16, **SMALL)).args,
                                              {"learnable_sink": torch.linspace(-1.0, 2.0, SMALL["q_heads"])}),
    },
}
