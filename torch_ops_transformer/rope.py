"""Rotary position embedding with torch_npu's Python signatures, on top of `torch.ops.npu_fa`.

- `npu_rotary_mul(input, r1, r2, rotary_mode='half')` — torch_npu's fused RoPE (differentiable in x, r1, r2);
- `npu_rotary_position_embedding(x, cos, sin, mode=0)` — the same with CANN's integer modes;
- `npu_apply_rotary_pos_emb(query, key, cos, sin, layout='BSND', rotary_mode='half')` — in place on query and key,
  returns them (like torch_npu);
- `rope_with_sin_cos_cache(positions, query, key, cos_sin_cache, head_size, is_neox_style=True)` — vLLM-style.

Modes: 'half' (0, rotate_half, NeoX/LLaMA), 'interleave' (1, GPT-J), 'quarter' (2: cat(-x2, x1, -x4, x3) over the
four quarters of D), 'interleave-half' (3: x is reordered to cat(x[..., 0::2], x[..., 1::2]), then 'half').
cos/sin hold one value per element of D (for 'half': cat(freqs, freqs).cos(); for 'interleave':
freqs.repeat_interleave(2).cos()) and broadcast to x by the usual right-aligned rules.
"""
from typing import Tuple, Union

import torch
from torch import Tensor

from . import _args

_OPS = torch.ops.npu_fa
ROTARY_MODES = {"half": 0, "interleave": 1, "quarter": 2, "interleave-half": 3, "interleave_half": 3}


_LAYOUT_CODES = {1: "BSND", 2: "SBND", 3: "BNSD", 4: "TND"}


def _mode(rotary_mode: Union[str, int]) -> int:
    if isinstance(rotary_mode, int):
        return rotary_mode  # the op validates the range
    if rotary_mode not in ROTARY_MODES:
        raise ValueError(f"unknown rotary_mode {rotary_mode!r}; expected one of {sorted(set(ROTARY_MODES))}")
    return ROTARY_MODES[rotary_mode]


@_args.torch_npu_api
def npu_rotary_mul(input: Tensor, r1: Tensor, r2: Tensor, rotary_mode: str = "half") -> Tensor:
    """torch_npu.npu_rotary_mul: input * r1 + rotate(input) * r2 (r1 = cos, r2 = sin)."""
    return _OPS.rotary_position_embedding(input, r1, r2, _mode(rotary_mode))


@_args.torch_npu_api
def npu_rotary_position_embedding(x: Tensor, cos: Tensor, sin: Tensor, mode: int = 0) -> Tensor:
    """CANN's RotaryPositionEmbedding with an integer mode (0 half, 1 interleave, 2 quarter, 3 interleave-half)."""
    return _OPS.rotary_position_embedding(x, cos, sin, _mode(mode))


@_args.torch_npu_api
def npu_apply_rotary_pos_emb(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, layout: str = "BSND",
                             rotary_mode: str = "half") -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_apply_rotary_pos_emb: rotates query and key **in place** and returns them.

    layout is BSND (alias BSH), BNSD, SBND (4-D query/key) or TND (3-D), or torch_npu's integer codes 1 (BSND),
    2 (SBND), 3 (BNSD), 4 (TND); a 2-D [S, D] cos/sin is placed on the layout's
    sequence axis, otherwise cos/sin broadcast to query and key (e.g. [B, S, 1, D] for BSND)."""
    if isinstance(layout, int):  # torch_npu's integer layout codes
        if layout not in _LAYOUT_CODES:
            raise ValueError(f"unknown layout code {layout}; expected one of {_LAYOUT_CODES}")
        layout = _LAYOUT_CODES[layout]
    _OPS.apply_rotary_pos_emb(query, key, cos, sin, layout, rotary_mode)
    return query, key


def rope_with_sin_cos_cache(positions: Tensor, query: Tensor, key: Tensor, cos_sin_cache: Tensor, head_size: int,
                            is_neox_style: bool = True) -> Tuple[Tensor, Tensor]:
    """vLLM-style RoPE: cos_sin_cache [max_position, rot_dim] = cat(cos, sin) per position, looked up by `positions`
    (int64 [T]); query/key [T, N*head_size] or [T, N, head_size]; only the first rot_dim values of each head rotate.
    Returns new tensors (the inputs are not modified)."""
    return _OPS.rope_with_sin_cos_cache(positions, query, key, cos_sin_cache, head_size, is_neox_style)
