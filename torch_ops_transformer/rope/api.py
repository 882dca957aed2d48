"""Rotary position embedding with torch_npu's Python signatures, on top of `torch.ops.npu_fa`.

- `npu_rotary_mul(input, r1, r2, rotary_mode='half', rotate=None)` — torch_npu's fused RoPE (differentiable in x,
  r1, r2; modes 'half' and 'interleave', or a rotation matrix); `npu_rotary_mul_backward` — its gradients;
- `npu_rotary_position_embedding(x, cos, sin, mode=0)` — the same with CANN's integer modes;
- `npu_apply_rotary_pos_emb(query, key, cos, sin, layout='BSND', rotary_mode='half')` — in place on query and key,
  returns them (like torch_npu);
- `rope_with_sin_cos_cache(positions, query, key, cos_sin_cache, head_size, is_neox_style=True)` — vLLM-style;
- `npu_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode='half',
  cache_mode='default')` — torch_npu's cache RoPE and multimodal RoPE (Qwen2-VL to Qwen3-VL), on the same op;
- `npu_interleave_rope(x, cos, sin)` — DeepSeek's interleaved RoPE (MLA): pairs de-interleaved, then 'half'
  (differentiable in x, cos, sin).

Modes: 'half' (0, rotate_half, NeoX/LLaMA), 'interleave' (1, GPT-J), 'quarter' (2: cat(-x2, x1, -x4, x3) over the
four quarters of D), 'interleave-half' (3: x is reordered to cat(x[..., 0::2], x[..., 1::2]), then 'half').
cos/sin hold one value per element of D (for 'half': cat(freqs, freqs).cos(); for 'interleave':
freqs.repeat_interleave(2).cos()) and broadcast to x by the usual right-aligned rules.
"""
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa
ROTARY_MODES = {"half": 0, "interleave": 1, "quarter": 2, "interleave-half": 3, "interleave_half": 3}


_LAYOUT_CODES = {1: "BSND", 2: "SBND", 3: "BNSD", 4: "TND"}


def _mode(rotary_mode: Union[str, int]) -> int:
    if isinstance(rotary_mode, int):
        return rotary_mode  # the op validates the range
    if rotary_mode not in ROTARY_MODES:
        raise ValueError(f"unknown rotary_mode {rotary_mode!r}; expected one of {sorted(set(ROTARY_MODES))}")
    return ROTARY_MODES[rotary_mode]


# rotary_mode values torch_npu's npu_rotary_mul accepts ('quarter' and 'interleave-half' are reached through
# npu_rotary_position_embedding or npu_apply_rotary_pos_emb).
_ROTARY_MUL_MODES = ("half", "interleave")


def _rotary_mul_mode(op: str, rotary_mode) -> int:
    if rotary_mode not in _ROTARY_MUL_MODES:
        # torch_npu's wording, which code written for it may match
        raise ValueError(f"{op}: The rotary_mode of npu_rotary_mul should be half or interleave, but got "
                         f"{rotary_mode!r} (argument 'rotary_mode'; 'quarter' and 'interleave-half' are modes of "
                         f"npu_rotary_position_embedding)")
    return ROTARY_MODES[rotary_mode]


@_args.torch_npu_api
def npu_rotary_mul(input: Tensor, r1: Tensor, r2: Tensor, rotary_mode: str = "half",
                   rotate: Optional[Tensor] = None) -> Tensor:
    """torch_npu.npu_rotary_mul: input * r1 + rotate(input) * r2 (r1 = cos, r2 = sin); rotary_mode 'half'
    (rotate_half) or 'interleave' (GPT-J pairs).

    rotate: a [D, D] matrix with rotate(input) = input @ rotate, in place of the rotary_mode's rotation (e.g. a
    block-diagonal matrix rotating several sub-vectors of D in one call). Computed in fp32 (fp64 for fp64) like the
    op, returned in input's dtype; differentiable through PyTorch's own ops (torch_npu has no backward here)."""
    op = "npu_rotary_mul"
    mode = _rotary_mul_mode(op, rotary_mode)
    if rotate is None:
        return _OPS.rotary_position_embedding(input, r1, r2, mode)
    d = input.shape[-1] if input.dim() else 0
    if rotate.dim() != 2 or tuple(rotate.shape) != (d, d):
        raise ValueError(f"{op}: argument 'rotate' of shape {tuple(rotate.shape)} must be [D, D] with D = "
                         f"input.size(-1) = {d}")
    for name, t in (("input", input), ("r1", r1), ("r2", r2), ("rotate", rotate)):
        if not t.is_floating_point():
            raise TypeError(f"{op}: argument '{name}' must be a floating-point tensor; got {t.dtype}")
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    x = input.to(acc)
    out = x * r1.to(acc) + torch.matmul(x, rotate.to(acc)) * r2.to(acc)
    if out.shape != input.shape:
        raise ValueError(f"{op}: arguments 'r1' {tuple(r1.shape)} and 'r2' {tuple(r2.shape)} must broadcast to "
                         f"input's shape {tuple(input.shape)}")
    return out.to(input.dtype)


@_args.torch_npu_api
def npu_rotary_mul_backward(grad: Tensor, input: Tensor, r1: Tensor, r2: Tensor, rotary_mode: str = "half"
                            ) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_rotary_mul_backward: the gradients (d input, d r1, d r2) of npu_rotary_mul(input, r1, r2,
    rotary_mode) for the output gradient `grad`; d r1 / d r2 are reduced to r1's / r2's shapes."""
    mode = _rotary_mul_mode("npu_rotary_mul_backward", rotary_mode)
    return _OPS.rotary_position_embedding_grad(grad, r1, r2, input, mode)


@_args.torch_npu_api
def npu_rotary_position_embedding(x: Tensor, cos: Tensor, sin: Tensor, mode: int = 0) -> Tensor:
    """CANN's RotaryPositionEmbedding with an integer mode (0 half, 1 interleave, 2 quarter, 3 interleave-half)."""
    return _OPS.rotary_position_embedding(x, cos, sin, _mode(mode))


# rotary_mode values of torch_npu's npu_apply_rotary_pos_emb.
_APPLY_MODES = ("half", "interleave", "quarter")


@_args.torch_npu_api
def npu_apply_rotary_pos_emb(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, layout: str = "BSND",
                             rotary_mode: str = "half") -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_apply_rotary_pos_emb: rotates query and key **in place** and returns them.

    layout is BSND (alias BSH), BNSD, SBND (4-D query/key) or TND (3-D), or torch_npu's integer codes 1 (BSND),
    2 (SBND), 3 (BNSD), 4 (TND); rotary_mode 'half', 'interleave' or 'quarter'. query, key, cos and sin have one
    dtype. A 2-D [S, D] cos/sin is placed on the layout's sequence axis, otherwise cos/sin broadcast to query and
    key (e.g. [B, S, 1, D] for BSND)."""
    op = "npu_apply_rotary_pos_emb"
    if isinstance(layout, int):  # torch_npu's integer layout codes
        if layout not in _LAYOUT_CODES:
            raise ValueError(f"{op}: unknown layout code {layout}; expected one of {_LAYOUT_CODES}")
        layout = _LAYOUT_CODES[layout]
    if rotary_mode not in _APPLY_MODES:
        raise ValueError(f"{op}: argument 'rotary_mode' must be one of {_APPLY_MODES}; got {rotary_mode!r}")
    for name, t in (("key", key), ("cos", cos), ("sin", sin)):
        if t.dtype != query.dtype:
            raise TypeError(f"{op}: argument '{name}' ({t.dtype}) must have the dtype of 'query' ({query.dtype})")
    _OPS.apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode)
    return query, key


@_args.torch_npu_api
def npu_interleave_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """torch_npu.npu_interleave_rope: q = cat(x[..., 0::2], x[..., 1::2]) (the pairs of the last dim D
    de-interleaved), returns q * cos + rotate_half(q) * sin — DeepSeek-V3's rope of q_pe / k_pe.

    Upstream takes x [B, N, S, 64] and cos/sin [B, 1, S, 64] or [B, 1, 1, 64] in x's dtype (bf16/fp16). Here D is
    any even size, x any rank, cos/sin (one shape, x's dtype) broadcast to x right-aligned, and fp32/fp64 work too;
    computed in fp32 (fp64 for fp64). Differentiable in x, cos and sin (torch.ops.npu_fa.interleave_rope_grad)."""
    op = "npu_interleave_rope"
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype != x.dtype:
            raise TypeError(f"{op}: argument '{name}' ({t.dtype}) must have the dtype of 'x' ({x.dtype})")
    return _OPS.interleave_rope(x, cos, sin)


def rope_with_sin_cos_cache(positions: Tensor, query: Tensor, key: Tensor, cos_sin_cache: Tensor, head_size: int,
                            is_neox_style: bool = True) -> Tuple[Tensor, Tensor]:
    """vLLM-style RoPE: cos_sin_cache [max_position, rot_dim] = cat(cos, sin) per position, looked up by `positions`
    (int64 [T]); query/key [T, N*head_size] or [T, N, head_size]; only the first rot_dim values of each head rotate.
    Returns new tensors (the inputs are not modified)."""
    return _OPS.rope_with_sin_cos_cache(positions, query, key, cos_sin_cache, head_size, is_neox_style)


@_args.torch_npu_api
def npu_mrope(positions: Tensor, query: Tensor, key: Tensor, cos_sin_cache: Tensor, head_size: int, *,
              mrope_section: Optional[Sequence[int]] = None, rotary_mode: Optional[str] = "half",
              cache_mode: Optional[str] = "default") -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_mrope: RoPE from a cos/sin cache (rope_with_sin_cos_cache). positions [T] (RoPE) or [m, T]
    (multimodal RoPE, m = len(mrope_section) = 3 or 4, e.g. Qwen2-VL's t/h/w rows); query/key [T, N*head_size];
    cos_sin_cache [max_position, rot_dim] = cat(cos, sin), rot_dim <= head_size (partial rotary: the rest of each
    head passes through). mrope_section: lengths of the sections of the rotary half (sum rot_dim/2) whose cos/sin
    come from position rows 0, 1, ... (None or all zeros: RoPE). rotary_mode 'half' (NeoX) or 'interleave' (GPT-J
    pairs); cache_mode 'default' (consecutive sections) or 'interleave' (Qwen3-VL: columns j % 3 == 1, 2 below
    3*mrope_section[1] from rows 1, 2; ignored for RoPE). Returns new tensors of query's and key's shapes."""
    op = "npu_mrope"
    for name, t in (("positions", positions), ("query", query), ("key", key), ("cos_sin_cache", cos_sin_cache)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    rotary_mode = "half" if rotary_mode is None else rotary_mode
    cache_mode = "default" if cache_mode is None else cache_mode
    if rotary_mode not in ("half", "interleave"):  # torch_npu's wording first
        raise ValueError(f"{op}: rotary_mode only support half or interleave (argument 'rotary_mode'); got "
                         f"{rotary_mode!r}")
    if cache_mode not in ("default", "interleave"):
        raise ValueError(f"{op}: cache_mode only support default or interleave (argument 'cache_mode'); got "
                         f"{cache_mode!r}")
    for name, t in (("query", query), ("key", key)):
        if t.dtype != cos_sin_cache.dtype:
            raise TypeError(f"{op}: argument '{name}' ({t.dtype}) must have the dtype of 'cos_sin_cache' "
                            f"({cos_sin_cache.dtype})")
    section = None if mrope_section is None else [int(v) for v in mrope_section]
    return _OPS.rope_with_sin_cos_cache(positions, query, key, cos_sin_cache, head_size, rotary_mode == "half",
                                        section, cache_mode)
