"""Inputs and float64 references of int8 KV caches (KV antiquant) for incre_flash_attention and
fused_infer_attention_score: int8 key/value, fp16/bf16 query, dequantisation factors in every mode and in both the
separate (key_/value_antiquant_*) and the stacked (antiquant_scale/offset, [2, ...]) forms.

The reference dequantises the cache in float64, x = (x_int8 + offset) * scale, and runs plain attention on it; the
same-dtype reference rounds the dequantised cache to the query's dtype and computes in that dtype.
"""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from test.inference import decode_cases

OPS = torch.ops.npu_fa
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Case:
    layout: str = "BSH"              # BSH, BSND, BNSD
    dtype: str = "bf16"
    batch: int = 3
    q_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    kv_len: int = 80                 # contiguous: the cache's S; paged: blocks per sequence * block
    lens: Tuple[int, ...] = (80, 33, 0)
    k_mode: int = 0
    v_mode: int = 0
    offset: bool = True
    form: str = "separate"           # separate | stacked (antiquant_scale [2, ...], k_mode == v_mode in 0/1)
    per_tensor: bool = False         # mode 0 with one value
    block: int = 0                   # paged when > 0
    paged_4d: bool = False           # paged BNSD cache (num_blocks, N2, block, D)
    nz: bool = False                 # with paged_4d: the NZ cache (num_blocks, N2, D // 32, block, 32)
    padding: Optional[int] = None    # kv_padding_size (contiguous)
    mask: bool = False               # a (B, S) mask

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5


@dataclass
class Inputs:
    q: Tensor           # [B, N1, D] in the query dtype
    kd: Tensor          # dequantised key, float64 [B, N2, S, D] (logical positions)
    vd: Tensor
    starts: list
    lens: list
    mask: Optional[Tensor]
    args: tuple         # positional arguments of incre_flash_attention (up to inner_precise)
    kwargs: dict        # the antiquant arguments


def _factor(mode: int, B: int, N2: int, S: int, D: int, g, per_tensor: bool, lo: float, hi: float):
    """A factor tensor in its canonical shape for `mode`, and its [B, N2, S, D] broadcast in float64."""
    if mode == 0:
        t = torch.rand((1,) if per_tensor else (N2, D), generator=g) * (hi - lo) + lo
        full = t.double().reshape(1, 1, 1, 1) if per_tensor else t.double().reshape(1, N2, 1, D)
    elif mode == 1:
        t = torch.rand(B, S, generator=g) * (hi - lo) + lo
        full = t.double().reshape(B, 1, S, 1)
    elif mode == 2:
        t = torch.rand(N2, generator=g) * (hi - lo) + lo
        full = t.double().reshape(1, N2, 1, 1)
    else:
        t = torch.rand(B, N2, S, generator=g) * (hi - lo) + lo
        full = t.double().reshape(B, N2, S, 1)
    return t, full


def _shape_for(t: Tensor, mode: int, layout: str, N2: int, D: int, per_tensor: bool) -> Tensor:
    """The separate form's documented shape for the layout: per-channel [1, N2, 1, D] (BNSD), [1, N2, D] (BSND),
    [1, H] (BSH); per-token [1, B, S]."""
    if mode == 0 and not per_tensor:
        return {"BNSD": t.reshape(1, N2, 1, D), "BSND": t.reshape(1, N2, D), "BSH": t.reshape(1, N2 * D)}[layout]
    if mode == 1:
        return t.unsqueeze(0)
    return t


def _stacked(tk: Tensor, tv: Tensor, mode: int, layout: str, N2: int, D: int, per_tensor: bool) -> Tensor:
    """antiquant_scale's form: [2, N2, 1, D] (BNSD), [2, N2, D] (BSND), [2, H] (BSH), [2] per-tensor, [2, B, S]."""
    s = torch.stack([tk, tv])
    if mode == 0 and not per_tensor:
        return {"BNSD": s.reshape(2, N2, 1, D), "BSND": s.reshape(2, N2, D), "BSH": s.reshape(2, N2 * D)}[layout]
    if mode == 0:
        return s.reshape(2)
    return s


def build(c: Case, seed: int = 0, scale_dtype=torch.float32) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    B, N1, N2, D, S = c.batch, c.q_heads, c.kv_heads, c.head_dim, c.kv_len
    dt = DTYPES[c.dtype]
    q = torch.randn(B, N1, D, generator=g).to(dt)
    k8 = torch.randint(-127, 128, (B, N2, S, D), generator=g, dtype=torch.int8)
    v8 = torch.randint(-127, 128, (B, N2, S, D), generator=g, dtype=torch.int8)
    # Scales around 1/64 keep q·k in a softmax-friendly range; offsets a few int8 steps.
    ks, ks_full = _factor(c.k_mode, B, N2, S, D, g, c.per_tensor, 0.004, 0.03)
    vs, vs_full = _factor(c.v_mode, B, N2, S, D, g, c.per_tensor, 0.004, 0.03)
    ko = vo = None
    ko_full = vo_full = torch.zeros((), dtype=torch.float64)
    if c.offset:
        ko, ko_full = _factor(c.k_mode, B, N2, S, D, g, c.per_tensor, -4.0, 4.0)
        vo, vo_full = _factor(c.v_mode, B, N2, S, D, g, c.per_tensor, -4.0, 4.0)
    kd = (k8.double() + ko_full) * ks_full
    vd = (v8.double() + vo_full) * vs_full

    if c.form == "stacked":
        assert c.k_mode == c.v_mode and c.k_mode in (0, 1)
        kwargs = dict(antiquant_scale=_stacked(ks, vs, c.k_mode, c.layout, N2, D, c.per_tensor).to(scale_dtype),
                      antiquant_mode=c.k_mode)
        if c.offset:
            kwargs["antiquant_offset"] = _stacked(ko, vo, c.k_mode, c.layout, N2, D, c.per_tensor).to(scale_dtype)
    else:
        kwargs = dict(key_antiquant_scale=_shape_for(ks, c.k_mode, c.layout, N2, D, c.per_tensor).to(scale_dtype),
                      value_antiquant_scale=_shape_for(vs, c.v_mode, c.layout, N2, D, c.per_tensor).to(scale_dtype),
                      key_antiquant_mode=c.k_mode, value_antiquant_mode=c.v_mode)
        if c.offset:
            kwargs["key_antiquant_offset"] = _shape_for(ko, c.k_mode, c.layout, N2, D, c.per_tensor).to(scale_dtype)
            kwargs["value_antiquant_offset"] = _shape_for(vo, c.v_mode, c.layout, N2, D,
                                                          c.per_tensor).to(scale_dtype)

    lens = list(c.lens)
    pad = c.padding
    starts = [S - (pad or 0) - L if pad is not None else 0 for L in lens]
    lens_t = torch.tensor(lens, dtype=torch.int64)
    mask = None
    if c.mask:
        mask = torch.rand(B, S, generator=g) < 0.2
    q_arg = {"BSH": q.reshape(B, 1, N1 * D), "BSND": q.reshape(B, 1, N1, D), "BNSD": q.reshape(B, N1, 1, D)}[c.layout]
    if c.block:
        nb = S // c.block
        num_blocks = B * nb + 3
        perm = torch.randperm(num_blocks, generator=g)[:B * nb].view(B, nb).to(torch.int32)
        if c.paged_4d:
            key = torch.zeros(num_blocks, N2, c.block, D, dtype=torch.int8)
            value = torch.zeros_like(key)
        else:
            key = torch.zeros(num_blocks, c.block, N2 * D, dtype=torch.int8)
            value = torch.zeros_like(key)
        for b in range(B):
            for i in range(nb):
                blk = int(perm[b, i])
                for src, dst in ((k8, key), (v8, value)):
                    rows = src[b, :, i * c.block:(i + 1) * c.block]  # [N2, block, D]
                    dst[blk] = rows if c.paged_4d else rows.transpose(0, 1).reshape(c.block, N2 * D)
        if c.nz:  # (num_blocks, N2, block, D) -> (num_blocks, N2, D // 32, block, 32): the same rows in NZ order
            key, value = (t.view(num_blocks, N2, c.block, D // 32, 32).transpose(2, 3).contiguous()
                          for t in (key, value))
        args = (q_arg, key, value, mask, None, lens_t, perm, None, N1, c.scale, c.layout, N2, c.block, 1)
    else:
        key = {"BSH": k8.transpose(1, 2).reshape(B, S, N2 * D), "BSND": k8.transpose(1, 2).contiguous(),
               "BNSD": k8}[c.layout]
        value = {"BSH": v8.transpose(1, 2).reshape(B, S, N2 * D), "BSND": v8.transpose(1, 2).contiguous(),
                 "BNSD": v8}[c.layout]
        pad_t = None if pad is None else torch.tensor([pad], dtype=torch.int64)
        args = (q_arg, key, value, mask, None, lens_t, None, pad_t, N1, c.scale, c.layout, N2, 0, 1)
    return Inputs(q, kd, vd, starts, lens, mask, args, kwargs)


def reference(inp: Inputs, c: Case, dtype=torch.float64) -> Tensor:
    """[B, N1, D] decode attention on the dequantised cache (float64: ref64; the query dtype: plain PyTorch in that
    precision, the dequantised cache rounded to it): the decode suite's reference on kd/vd."""
    plain = decode_cases.Inputs(q=inp.q, k=inp.kd, v=inp.vd, mask=inp.mask, pse=None, starts=inp.starts,
                                lens=inp.lens, args=())
    return decode_cases.reference(plain, c, dtype)


def run(inp: Inputs) -> Tensor:
    return OPS.incre_flash_attention(*inp.args, **inp.kwargs)


_SMALL = dict(batch=2, q_heads=4, kv_heads=2, head_dim=16, kv_len=64, lens=(40, 17))


def _sample(c: Case):
    inp = build(c)
    return inp.args, inp.kwargs


def _fia_sample(c: Case):
    inp = build(c)
    a = inp.args
    kw = dict(block_table=a[6], num_heads=a[8], scale=a[9], input_layout=a[10], num_key_value_heads=a[11],
              block_size=a[12], actual_seq_lengths_kv=a[5], **inp.kwargs)
    return (a[0], a[1], a[2]), kw


OPCHECK_CASES = {
    "incre_flash_attention": {
        "int8_per_channel_offset_separate": lambda: _sample(Case(**_SMALL)),
        "int8_per_token_stacked_paged": lambda: _sample(Case(layout="BSND", k_mode=1, v_mode=1, form="stacked",
                                                             block=32, **_SMALL)),
    },
    "fused_infer_attention_score": {
        "int8_paged_decode_route": lambda: _fia_sample(Case(layout="BNSD", block=32, paged_4d=True, **_SMALL)),
        "int8_nz_paged_decode_route": lambda: _fia_sample(Case(layout="BNSD", block=32, paged_4d=True, nz=True,
                                                               **dict(_SMALL, head_dim=32))),
    },
}
