"""The CPU FlashAttention tile sizes (query rows, key rows): read, override, or override for a block.

The automatic choice and the per-machine tuning live in C++ (aten_ops/cpu/attention/tiles.cpp, tuning.cpp); `tuning`
measures and caches them."""
import contextlib
from typing import Optional, Tuple

import torch

_OPS = torch.ops.npu_fa


def attention_tiles(block_q: Optional[int] = None, block_kv: Optional[int] = None) -> Tuple[int, int]:
    """Reads, or overrides process-wide, the CPU FlashAttention tile sizes (query rows, key rows).

    None keeps a value, -1 restores the automatic choice (derived from the L2 cache, head dim and dtype).
    Returns the overrides in force; 0 means automatic.
    """
    q, kv = _OPS.attention_tile_config(block_q or 0, block_kv or 0)
    return int(q), int(kv)


@contextlib.contextmanager
def attention_tiles_override(block_q: Optional[int] = None, block_kv: Optional[int] = None):
    """Temporarily overrides the CPU tile sizes (block-size tuning); restores the previous
    overrides (or the automatic choice) on exit."""
    old_q, old_kv = attention_tiles()
    attention_tiles(block_q, block_kv)
    try:
        yield attention_tiles()
    finally:
        attention_tiles(old_q or -1, old_kv or -1)
