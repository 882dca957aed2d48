"""A paged KV cache for decoding, written through `torch.ops.npu_fa.scatter_pa_kv_cache`, and torch_npu's form of
that write, `npu_scatter_pa_kv_cache`, and MLA's fused latent-cache write `npu_kv_rmsnorm_rope_cache` (+ `_v2`,
`_v2_functional`) (at the end of this module).

The cache is `num_blocks` blocks of `block_size` token rows, shared by all sequences; each sequence owns a list of
blocks taken from a free list as it grows and returned by `free()`. Layout "BSND" (default) stores
`key_cache`/`value_cache` as (num_blocks, block_size, N2, D); layout "BSH" as (num_blocks, block_size, N2*D).

`block_table(seq_ids)` is int32 [B, max_blocks]: row b lists sequence b's physical blocks in logical order and is
**padded with 0** past its last block (a valid block index, so a kernel that reads the whole row never goes out
of bounds; entries past ceil(seq_lens[b] / block_size) carry no meaning). `seq_lens(seq_ids)` is int64 [B].

Decode loop (npu_incre_flash_attention is the paged-attention op of torch_ops_transformer)::

    cache = PagedKVCache(num_blocks=256, block_size=128, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    ids = [cache.add_sequence() for _ in range(batch)]
    for step in range(steps):                              # k, v: [B, N2, D], q: [B, 1, N1, D] (BSND)
        cache.append(ids, k, v)
        out = torch_ops_transformer.npu_incre_flash_attention(
            q, cache.key_cache, cache.value_cache, block_table=cache.block_table(ids),
            actual_seq_lengths=cache.seq_lens(ids), block_size=cache.block_size, input_layout="BSND",
            num_heads=N1, num_key_value_heads=N2, scale_value=D ** -0.5)
    # or: out = cache.attention(q, ids, num_heads=N1, scale_value=D ** -0.5)

int8 cache ("C8", `dtype=torch.int8`): rows are quantised on append, symmetric per channel,
x_int8 = clamp(round(x / scale), -127, 127) with one fp32 scale per (KV head, channel) for keys and one for values,
and `attention()` passes the scales to the fused decode, which dequantises x_int8 * scale in registers. The scales are
given at construction (`key_scale` / `value_scale`: a number, [N2, D] or [N2*D]) or, when omitted, calibrated from
the first append: max |x| over its tokens per channel / 127 (a channel that is 0 there gets scale 1/127). Values of
later tokens beyond the calibrated range saturate at ±127 * scale. `antiquant_scale` is the stacked [2, N2, D]
factor for torch_npu-style calls.
"""
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor

from .._internal import args as _args
from ..inference.api import npu_incre_flash_attention

_OPS = torch.ops.npu_fa


class BlockAllocator:
    """The block bookkeeping of a paged cache, without the tensors: a free list of `num_blocks` block ids, each
    sequence's blocks in logical order and its length. `PagedKVCache` and the MLA latent cache
    (`torch_ops_transformer.mla.MLALatentCache`, one allocator for the caches of every layer) use it.
    `owner` prefixes the error messages."""

    def __init__(self, num_blocks: int, block_size: int, owner: str = "BlockAllocator"):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(f"{owner}: num_blocks and block_size must be positive; got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size, self.owner = num_blocks, block_size, owner
        self._free: List[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out low block ids first
        self._blocks: Dict[int, List[int]] = {}
        self._lens: Dict[int, int] = {}
        self._next_id = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def add_sequence(self) -> int:
        """Registers an empty sequence and returns its id."""
        sid = self._next_id
        self._next_id += 1
        self._blocks[sid], self._lens[sid] = [], 0
        return sid

    def free(self, seq_id: int) -> None:
        """Returns the sequence's blocks to the free list; the id becomes invalid."""
        self.check_ids([seq_id])
        self._free.extend(reversed(self._blocks.pop(seq_id)))
        del self._lens[seq_id]

    def blocks(self, seq_id: int) -> List[int]:
        self.check_ids([seq_id])
        return list(self._blocks[seq_id])

    def length(self, seq_id: int) -> int:
        self.check_ids([seq_id])
        return self._lens[seq_id]

    def check_ids(self, seq_ids: Sequence[int]) -> None:
        for s in seq_ids:
            if s not in self._blocks:
                raise KeyError(f"{self.owner}: unknown (or freed) sequence id {s}")

    def reserve(self, owners: Sequence[int]) -> List[int]:
        """Appends one token to sequence owners[t] for each t, in order, and returns the slots (block * block_size
        + offset) they take. Atomic: when the free list cannot hold them, RuntimeError and nothing changes."""
        self.check_ids(owners)
        lens = {sid: self._lens[sid] for sid in set(owners)}
        need = 0
        for sid in owners:
            if lens[sid] % self.block_size == 0 and lens[sid] // self.block_size >= len(self._blocks[sid]):
                need += 1
            lens[sid] += 1
        if need > len(self._free):
            raise RuntimeError(f"{self.owner}: out of blocks: the new tokens need {need} more blocks, "
                               f"{len(self._free)} of {self.num_blocks} are free")
        slots = []
        for sid in owners:
            pos = self._lens[sid]
            blocks = self._blocks[sid]
            if pos // self.block_size >= len(blocks):
                blocks.append(self._free.pop())
            slots.append(blocks[pos // self.block_size] * self.block_size + pos % self.block_size)
            self._lens[sid] = pos + 1
        return slots

    def seq_lens(self, seq_ids: Sequence[int]) -> Tensor:
        """int64 [B]: the number of tokens of each sequence."""
        self.check_ids(seq_ids)
        return torch.tensor([self._lens[s] for s in seq_ids], dtype=torch.int64)

    def block_table(self, seq_ids: Sequence[int], max_blocks: Optional[int] = None) -> Tensor:
        """int32 [B, max_blocks] (default: the longest row, at least 1), padded with 0."""
        self.check_ids(seq_ids)
        rows = [self._blocks[s] for s in seq_ids]
        width = max([len(r) for r in rows] + [1]) if max_blocks is None else max_blocks
        if any(len(r) > width for r in rows):
            raise ValueError(f"{self.owner}.block_table: max_blocks={width} is below a sequence's block count")
        table = torch.zeros((len(rows), width), dtype=torch.int32)
        for b, r in enumerate(rows):
            if r:
                table[b, :len(r)] = torch.tensor(r, dtype=torch.int32)
        return table


class PagedKVCache:
    """Block-allocated K/V cache (see the module docstring for the layout and the decode loop)."""

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, v_head_dim: Optional[int] = None, layout: str = "BSND",
                 device: Optional[torch.device] = None, key_scale=None, value_scale=None):
        if num_blocks <= 0 or block_size <= 0 or num_kv_heads <= 0 or head_dim <= 0:
            raise ValueError("PagedKVCache: num_blocks, block_size, num_kv_heads and head_dim must be positive")
        if layout not in ("BSND", "BSH"):
            raise ValueError(f"PagedKVCache: layout must be 'BSND' or 'BSH'; got {layout!r}")
        vd = v_head_dim or head_dim
        self.int8 = dtype == torch.int8
        if self.int8:
            if vd != head_dim:
                raise ValueError(f"PagedKVCache: an int8 cache needs v_head_dim == head_dim ({head_dim}); got {vd}")
            if block_size % 32:
                raise ValueError(f"PagedKVCache: an int8 cache needs block_size % 32 == 0 (as torch_npu's decode); "
                                 f"got {block_size}")
        elif key_scale is not None or value_scale is not None:
            raise ValueError("PagedKVCache: key_scale/value_scale quantise an int8 cache; dtype is "
                             f"{dtype}")
        if layout == "BSND":
            kshape, vshape = (num_kv_heads, head_dim), (num_kv_heads, vd)
        else:
            kshape, vshape = (num_kv_heads * head_dim,), (num_kv_heads * vd,)
        self.num_blocks, self.block_size, self.layout = num_blocks, block_size, layout
        self.num_kv_heads, self.head_dim, self.v_head_dim = num_kv_heads, head_dim, vd
        self.key_cache = torch.zeros((num_blocks, block_size, *kshape), dtype=dtype, device=device)
        self.value_cache = torch.zeros((num_blocks, block_size, *vshape), dtype=dtype, device=device)
        self._alloc = BlockAllocator(num_blocks, block_size, "PagedKVCache")
        # int8: per-(head, channel) fp32 dequantisation scales [N2, D], None until given or calibrated.
        self.key_scale = self._scale_arg("key_scale", key_scale, device)
        self.value_scale = self._scale_arg("value_scale", value_scale, device)

    def _scale_arg(self, name: str, value, device) -> Optional[Tensor]:
        if value is None:
            return None
        n2, d = self.num_kv_heads, self.head_dim
        t = torch.as_tensor(value, dtype=torch.float32, device=device)
        if t.numel() == 1:
            t = t.reshape(1, 1).expand(n2, d)
        elif t.numel() == n2 * d:
            t = t.reshape(n2, d)
        else:
            raise ValueError(f"PagedKVCache: {name} must be a number, [N2, D] or [N2*D] = [{n2 * d}]; got shape "
                             f"{list(t.shape)}")
        if not bool(torch.isfinite(t).all()) or bool((t <= 0).any()):
            raise ValueError(f"PagedKVCache: {name} must be finite and positive")
        return t.contiguous()

    @property
    def antiquant_scale(self) -> Optional[Tensor]:
        """int8 caches: key's and value's scales stacked, [2, N2, D] fp32 (torch_npu's `antiquant_scale` for BSND);
        None before the first append when they are calibrated."""
        if not self.int8 or self.key_scale is None:
            return None
        return torch.stack([self.key_scale, self.value_scale])

    def _quantise(self, x: Tensor, scale: Tensor) -> Tensor:
        """Symmetric int8 of token rows x [T, N2*D] (or [T, N2, D]) with per-channel scale [N2, D]."""
        x = x.reshape(x.shape[0], *scale.shape).float()
        return torch.clamp(torch.round(x / scale), -127, 127).to(torch.int8)

    @staticmethod
    def _calibrate(x: Tensor, n2: int, d: int) -> Tensor:
        amax = x.reshape(-1, n2, d).float().abs().amax(dim=0)
        return torch.where(amax > 0, amax / 127, torch.full_like(amax, 1 / 127)).contiguous()

    # --- bookkeeping (BlockAllocator) ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self._alloc.num_free_blocks

    @property
    def _free(self) -> List[int]:  # the allocator's free list (tests inspect it)
        return self._alloc._free

    def add_sequence(self) -> int:
        """Registers an empty sequence and returns its id."""
        return self._alloc.add_sequence()

    def free(self, seq_id: int) -> None:
        """Returns the sequence's blocks to the free list; the id becomes invalid."""
        self._alloc.free(seq_id)

    def blocks(self, seq_id: int) -> List[int]:
        return self._alloc.blocks(seq_id)

    def _check_ids(self, seq_ids: Sequence[int]) -> None:
        self._alloc.check_ids(seq_ids)

    # --- writing -----------------------------------------------------------------------------------------------
    def append(self, seq_ids: Sequence[int], key: Tensor, value: Tensor) -> Tensor:
        """Appends new tokens and returns the slot mapping used (int64 [T]).

        key/value are [B, N2, D] (one token per sequence of `seq_ids`; ids may repeat, tokens are appended in
        order) or [B, S, N2, D] (S tokens per sequence). With layout "BSH" the trailing (N2, D) may be N2*D.
        The call is atomic: every check (ids, shapes, dtypes, devices, free blocks) runs before any state changes,
        so a call that raises leaves the sequence lengths, the block tables and the free list as they were.
        Raises KeyError for an unknown id, TypeError for a non-tensor or a non-floating key/value (unless it has
        the cache's dtype), ValueError for a bad shape or device, and RuntimeError when the free list cannot hold
        the new tokens."""
        seq_ids = [int(s) for s in (seq_ids.tolist() if isinstance(seq_ids, Tensor) else seq_ids)]
        self._check_ids(seq_ids)
        for name, t, cache in (("key", key, self.key_cache), ("value", value, self.value_cache)):
            if not isinstance(t, Tensor):
                raise TypeError(f"PagedKVCache.append: {name} must be a Tensor; got {type(t).__name__}")
            if self.int8 and t.dtype == torch.int8:
                raise TypeError(f"PagedKVCache.append: an int8 cache quantises on append; pass {name} in floating "
                                f"point (not int8)")
            if t.dtype != cache.dtype and not t.dtype.is_floating_point:
                raise TypeError(f"PagedKVCache.append: {name} must be a floating-point tensor or have the cache's "
                                f"dtype {cache.dtype}; got {t.dtype}")
            if t.device != cache.device:
                raise ValueError(f"PagedKVCache.append: {name} is on {t.device} but the cache is on {cache.device}")
        row = self.num_kv_heads * self.head_dim  # values of one token row
        vrow = self.num_kv_heads * self.v_head_dim
        if key.dim() >= 3 and key.shape[0] > 0 and key[0].numel() != row:  # [B, S, ...]
            if key.shape[0] != len(seq_ids):
                raise ValueError(f"PagedKVCache.append: key has batch {key.shape[0]} but {len(seq_ids)} seq_ids")
            if value.dim() < 3 or value.shape[:2] != key.shape[:2]:
                raise ValueError(f"PagedKVCache.append: value of shape {list(value.shape)} does not match key of "
                                 f"shape {list(key.shape)} in its leading (B, S) dimensions")
            s = key.shape[1]
            owners = [sid for sid in seq_ids for _ in range(s)]
            key, value = key.reshape(-1, *key.shape[2:]), value.reshape(-1, *value.shape[2:])
        else:
            owners = seq_ids
        if key.dim() < 2 or value.dim() < 2:
            raise ValueError(f"PagedKVCache.append: key/value need a token dimension and a row; got shapes "
                             f"{list(key.shape)}/{list(value.shape)}")
        if key.shape[0] != len(owners) or value.shape[0] != len(owners):
            raise ValueError(f"PagedKVCache.append: {len(owners)} tokens expected, key/value have "
                             f"{key.shape[0]}/{value.shape[0]}")
        for name, t, n in (("key", key, row), ("value", value, vrow)):
            if len(owners) and t[0].numel() != n:
                raise ValueError(f"PagedKVCache.append: {name} has {t[0].numel()} values per token (shape "
                                 f"{list(t.shape[1:])}) but the cache holds {n} (num_kv_heads * head_dim)")
        slots = self._alloc.reserve(owners)  # atomic: out of blocks leaves the cache untouched
        slot_mapping = torch.tensor(slots, dtype=torch.int64, device=self.key_cache.device)
        if self.int8:
            if self.key_scale is None and len(owners):
                self.key_scale = self._calibrate(key, self.num_kv_heads, self.head_dim)
                self.value_scale = self._calibrate(value, self.num_kv_heads, self.head_dim)
            if self.key_scale is None:
                return slot_mapping
            key, value = self._quantise(key, self.key_scale), self._quantise(value, self.value_scale)
            key = key.reshape(key.shape[0], *self.key_cache.shape[2:])
            value = value.reshape(value.shape[0], *self.value_cache.shape[2:])
        _OPS.scatter_pa_kv_cache(key.to(self.key_cache.dtype), value.to(self.value_cache.dtype),
                                 self.key_cache, self.value_cache, slot_mapping)
        return slot_mapping

    # --- reading -----------------------------------------------------------------------------------------------
    def seq_lens(self, seq_ids: Sequence[int]) -> Tensor:
        """int64 [B]: the number of tokens of each sequence."""
        return self._alloc.seq_lens(seq_ids)

    def block_table(self, seq_ids: Sequence[int], max_blocks: Optional[int] = None) -> Tensor:
        """int32 [B, max_blocks] (default: the longest row, at least 1), padded with 0."""
        return self._alloc.block_table(seq_ids, max_blocks)

    def attention(self, query: Tensor, seq_ids: Sequence[int], *, num_heads: int, scale_value: float,
                  input_layout: str = "BSND") -> Tensor:
        """Decode attention of one query token per sequence of `seq_ids` against this cache
        (`npu_incre_flash_attention`); query is BSND [B, 1, N1, D] or BSH [B, 1, N1*D]. An int8 cache passes its
        scales (`antiquant_scale`), so the fused decode dequantises in registers."""
        if input_layout not in ("BSND", "BSH"):
            raise ValueError(f"PagedKVCache.attention: input_layout must be 'BSND' or 'BSH'; got {input_layout!r}")
        if self.int8 and self.key_scale is None:
            raise RuntimeError("PagedKVCache.attention: the int8 cache has no scales yet (append tokens first or "
                               "pass key_scale/value_scale)")
        scale = self.antiquant_scale
        if scale is not None and input_layout == "BSH":
            scale = scale.reshape(2, -1)
        return npu_incre_flash_attention(
            query, self.key_cache, self.value_cache, block_table=self.block_table(seq_ids).to(query.device),
            actual_seq_lengths=self.seq_lens(seq_ids), block_size=self.block_size, input_layout=input_layout,
            num_heads=num_heads, num_key_value_heads=self.num_kv_heads, scale_value=scale_value,
            antiquant_scale=scale)

    def gather(self, seq_ids: Sequence[int]):
        """Contiguous (key, value) of the sequences, packed: [sum(seq_lens), N2, D] (gather_pa_kv_cache)."""
        return _OPS.gather_pa_kv_cache(self.key_cache, self.value_cache, self.block_table(seq_ids),
                                       self.seq_lens(seq_ids))


# ================================================================================================================
# The NZ layout of paged caches (docs/kv_cache.md "NZ layout")
# ================================================================================================================

NZ_BYTES = 32  # bytes per piece of the head dim in an NZ cache


def nz_c0(dtype: torch.dtype) -> int:
    """Values per piece of an NZ cache of `dtype`: 32 bytes (32 int8, 16 fp16/bf16, 8 fp32)."""
    return NZ_BYTES // torch.empty((), dtype=dtype).element_size()


def to_nz(cache: Tensor) -> Tensor:
    """A paged ND cache [num_blocks, block_size, N, D] (vLLM's, `PagedKVCache`'s) as the NZ cache
    [num_blocks, N, D // c0, block_size, c0] (c0 = `nz_c0(dtype)`) that decode, FIA and npu_scatter_pa_kv_cache
    read and write in place: value d of the row in slot (block, offset), head n, moves to
    [block, n, d // c0, offset, d % c0]. A copy; exact (`from_nz` inverts it)."""
    if cache.dim() != 4:
        raise ValueError(f"to_nz: argument 'cache' must be [num_blocks, block_size, N, D]; got {list(cache.shape)}")
    blocks, bs, n, d = cache.shape
    c0 = nz_c0(cache.dtype)
    if d % c0:
        raise ValueError(f"to_nz: the head dim D = {d} of a {cache.dtype} cache must be a multiple of {c0} (32 "
                         f"bytes per NZ piece)")
    return cache.reshape(blocks, bs, n, d // c0, c0).permute(0, 2, 3, 1, 4).contiguous()


def from_nz(cache: Tensor) -> Tensor:
    """The ND cache [num_blocks, block_size, N, D] of an NZ cache [num_blocks, N, D // c0, block_size, c0]."""
    if cache.dim() != 5:
        raise ValueError(f"from_nz: argument 'cache' must be [num_blocks, N, D // c0, block_size, c0]; got "
                         f"{list(cache.shape)}")
    blocks, n, pieces, bs, c0 = cache.shape
    return cache.permute(0, 3, 1, 2, 4).reshape(blocks, bs, n, pieces * c0)


def nz_write_view(op: str, name: str, cache, cache_mode) -> Optional[Tensor]:
    """For the MLA cache writers (npu_kv_rmsnorm_rope_cache, npu_mla_prolog*) in an NZ cache_mode: a 5-D NZ cache
    (num_blocks, 1, D // c0, block_size, c0) as the 4-D (num_blocks, block_size, 1, D) tensor of the same memory
    that those ops write in NZ order (None for other caches)."""
    if not isinstance(cache, Tensor) or cache.dim() != 5 or cache_mode not in ("PA_NZ", "PA_BLK_NZ"):
        return None
    blocks, n, pieces, bs, c0 = cache.shape
    if n != 1 or c0 != nz_c0(cache.dtype):
        raise ValueError(f"{op}: argument '{name}' (5-D NZ) must be [num_blocks, 1, D // {nz_c0(cache.dtype)}, "
                         f"block_size, {nz_c0(cache.dtype)}] for {cache.dtype} (one head, 32-byte pieces); got "
                         f"{list(cache.shape)}")
    if not cache.is_contiguous():
        raise ValueError(f"{op}: argument '{name}' is written in place and must be contiguous")
    return cache.view(blocks, bs, 1, pieces * c0)


# ================================================================================================================
# torch_npu.npu_scatter_pa_kv_cache
# ================================================================================================================

def _cache_shape_error(op: str, mode: str, name: str, cache: Tensor, want: str) -> ValueError:
    hint = (" For an ND cache [num_blocks, block_size, num_heads, head_dim] pass cache_mode='Norm'."
            if mode == "PA_NZ" else "")
    return ValueError(f"{op}: with cache_mode='{mode}', argument '{name}' must have shape {want}; got "
                      f"{list(cache.shape)}.{hint}")


def _nz_as_4d(op: str, name: str, cache: Tensor, rows: Tensor) -> Tensor:
    """A 5-D NZ cache (num_blocks, N, D // c0, block_size, c0) as the 4-D (num_blocks, N·D // c0, block_size, c0)
    whose memory it is (docs/kv_cache.md "NZ layout"); other ranks unchanged."""
    if cache.dim() != 5:
        return cache
    n, d = rows.shape[1], rows.shape[2]
    c0 = cache.shape[4]
    if c0 == 0 or d % c0 or tuple(cache.shape[1:3]) != (n, d // c0):
        raise ValueError(f"{op}: argument '{name}' (5-D NZ) must be [num_blocks, {n}, {d} // c0, block_size, c0] for "
                         f"{n} heads of {d} values (c0 dividing {d}); got {list(cache.shape)}")
    if not cache.is_contiguous():
        raise ValueError(f"{op}: argument '{name}' is written in place and must be contiguous")
    return cache.view(cache.shape[0], n * (d // c0), cache.shape[3], c0)


def _scatter(op: str, key, value, key_cache, value_cache, slot_mapping, cache_layout: str) -> None:
    try:
        _OPS.scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, cache_layout)
    except RuntimeError as e:
        # The op's own argument checks (slot range, repeated slots, slot_mapping's dtype and length) raise a plain
        # RuntimeError; here they are bad values of a torch_npu-compatible call.
        if isinstance(e, ValueError) or not str(e).startswith("scatter_pa_kv_cache:"):
            raise
        raise _args.ArgumentError(f"{op}: {str(e).split(': ', 1)[1]}") from None


@_args.torch_npu_api
def npu_scatter_pa_kv_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor,
                            *, compress_lens: Optional[Tensor] = None, compress_seq_offsets: Optional[Tensor] = None,
                            seq_lens: Optional[Tensor] = None, cache_mode: Optional[str] = "PA_NZ") -> None:
    """torch_npu.npu_scatter_pa_kv_cache: writes T new tokens into a paged K/V cache, in place (returns None).

    key [T, N, Dk], value [T, N, Dv] (same dtype as their caches); slot_mapping int32/int64 [T] on the caches'
    device: token t goes to slot s = block·block_size + offset, s = -1 skips the token (padding); slots must be
    distinct. cache_mode gives the caches' layout:

    - 'Norm' (or None): ND caches [num_blocks, block_size, N, D] — vLLM's layout;
    - 'PA_NZ' (the default, as upstream): the NZ-tiled caches [num_blocks, N·D // last, block_size, last] — the
      token row of N·D values is cut into chunks of `last` values (the cache's last dim; 32 bytes on the NPU, 16 for
      fp16/bf16), chunk c of the token in slot s stored at cache[block, c, offset, :]. A plain index remapping, so
      it is exact here; only torch_npu's storage-format tag (npu_format_cast) has no counterpart. The same memory
      viewed 5-D, [num_blocks, N, D // last, block_size, last] (vLLM-Ascend's int8 caches), is accepted too; that
      form is what decode / FIA read in place (docs/kv_cache.md "NZ layout").

    The compression form of torch_npu (key/value [B, S, N, D] with compress_lens, seq_lens, compress_seq_offsets)
    is not implemented: those arguments raise NotImplementedError naming them, and a 4-D key a ValueError.
    Implemented by `torch.ops.npu_fa.scatter_pa_kv_cache` (PA_NZ is its head-major "BNSD" layout with N·D // last
    "heads" of `last` values).
    """
    op = "npu_scatter_pa_kv_cache"
    _args.not_implemented(op, "the KV compression form", compress_lens=compress_lens,
                          compress_seq_offsets=compress_seq_offsets, seq_lens=seq_lens)
    mode = "Norm" if cache_mode is None else cache_mode
    if mode not in ("Norm", "PA_NZ"):
        raise ValueError(f"{op}: argument 'cache_mode' must be 'PA_NZ', 'Norm' or None; got {cache_mode!r}")
    for name, t in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache),
                    ("slot_mapping", slot_mapping)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3:
            raise ValueError(f"{op}: argument '{name}' must be [T, num_heads, head_dim]; got shape {list(t.shape)}"
                             + (" (the 4-D [B, S, N, D] form is torch_npu's KV compression, which needs "
                                "compress_lens and seq_lens and is not implemented)" if t.dim() == 4 else ""))
    if key.shape[:2] != value.shape[:2]:
        raise ValueError(f"{op}: arguments 'key' {list(key.shape)} and 'value' {list(value.shape)} must agree in "
                         f"[T, num_heads]")
    for name, t, cache in (("key", key, key_cache), ("value", value, value_cache)):
        if t.dtype != cache.dtype:
            raise TypeError(f"{op}: argument '{name}' ({t.dtype}) must have the dtype of '{name}_cache' "
                            f"({cache.dtype})")
    n = key.shape[1]
    if mode == "PA_NZ":  # the 5-D NZ view of vLLM-Ascend: the 4-D cache's memory, heads split out
        key_cache = _nz_as_4d(op, "key_cache", key_cache, key)
        value_cache = _nz_as_4d(op, "value_cache", value_cache, value)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dim() != 4:
            raise ValueError(f"{op}: argument '{name}' must be a 4-D cache"
                             f"{' (or the 5-D NZ form with cache_mode=PA_NZ)' if mode == 'Norm' else ''}; got shape "
                             f"{list(cache.shape)}")
        if not cache.is_contiguous():
            raise ValueError(f"{op}: argument '{name}' is written in place and must be contiguous")
    if mode == "Norm":
        for name, t, cache in (("key_cache", key, key_cache), ("value_cache", value, value_cache)):
            if cache.shape[2:] != t.shape[1:]:
                raise _cache_shape_error(op, mode, name, cache, f"[num_blocks, block_size, {n}, {t.shape[2]}]")
        if key_cache.shape[:2] != value_cache.shape[:2]:
            raise ValueError(f"{op}: 'key_cache' {list(key_cache.shape)} and 'value_cache' "
                             f"{list(value_cache.shape)} must share [num_blocks, block_size]")
        _scatter(op, key, value, key_cache, value_cache, slot_mapping, "BSND")
        return None
    rows = []
    for name, t, cache in (("key_cache", key, key_cache), ("value_cache", value, value_cache)):
        row = n * t.shape[2]
        if cache.shape[1] * cache.shape[3] != row:
            raise _cache_shape_error(op, mode, name, cache, f"[num_blocks, {row} // last, block_size, last] "
                                                            f"({n} heads x {t.shape[2]} values per token)")
        rows.append(t.reshape(t.shape[0], cache.shape[1], cache.shape[3]))
    if (key_cache.shape[0], key_cache.shape[2]) != (value_cache.shape[0], value_cache.shape[2]):
        raise ValueError(f"{op}: 'key_cache' {list(key_cache.shape)} and 'value_cache' {list(value_cache.shape)} "
                         f"must share num_blocks (dim 0) and block_size (dim 2) in cache_mode='PA_NZ'")
    _scatter(op, rows[0], rows[1], key_cache, value_cache, slot_mapping, "BNSD")
    return None


# ---- MLA: RMSNorm + interleaved rope + cache write (torch.ops.npu_fa.kv_rms_norm_rope_cache) ----

def _kv_rmsnorm_rope_cache(op, kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale,
                           k_rope_offset, c_kv_offset, v, epsilon, cache_mode, is_output_kv):
    for name, t in (("kv", kv), ("gamma", gamma), ("cos", cos), ("sin", sin), ("index", index),
                    ("k_cache", k_cache), ("ckv_cache", ckv_cache)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    if not isinstance(cache_mode, str):
        raise TypeError(f"{op}: argument 'cache_mode' must be a str; got {type(cache_mode).__name__}")
    # 5-D NZ caches: written through their 4-D view (same memory, NZ order), as FIA then reads them.
    k_view, ckv_view = (nz_write_view(op, n, c, cache_mode) for n, c in (("k_cache", k_cache), ("ckv_cache", ckv_cache)))
    try:
        return _OPS.kv_rms_norm_rope_cache(
            kv, gamma, cos, sin, index, k_cache if k_view is None else k_view,
            ckv_cache if ckv_view is None else ckv_view, k_rope_scale=k_rope_scale, c_kv_scale=c_kv_scale,
            k_rope_offset=k_rope_offset, c_kv_offset=c_kv_offset, v=v, epsilon=float(epsilon), cache_mode=cache_mode,
            is_output_kv=bool(is_output_kv))
    except (ValueError, TypeError, NotImplementedError) as e:
        msg = str(e)
        if not msg.startswith("kv_rms_norm_rope_cache:"):
            raise
        raise type(e)(f"{op}: {msg.split(': ', 1)[1]}") from None


def _cache_dtype_args(op, k_cache_dtype, ckv_cache_dtype):
    _args.not_implemented(op, "a cache dtype other than the cache tensor's own (HiFloat8/FP8 caches)",
                          k_cache_dtype=k_cache_dtype, ckv_cache_dtype=ckv_cache_dtype)


@_args.torch_npu_api
def npu_kv_rmsnorm_rope_cache(kv: Tensor, gamma: Tensor, cos: Tensor, sin: Tensor, index: Tensor, k_cache: Tensor,
                              ckv_cache: Tensor, *, k_rope_scale: Optional[Tensor] = None,
                              c_kv_scale: Optional[Tensor] = None, k_rope_offset: Optional[Tensor] = None,
                              c_kv_offset: Optional[Tensor] = None, v: Optional[Tensor] = None,
                              epsilon: float = 1e-5, cache_mode: str = "Norm", is_output_kv: bool = False):
    """torch_npu.npu_kv_rmsnorm_rope_cache: MLA's K path fused — RMSNorm of the latent part of kv, interleaved RoPE
    (npu_interleave_rope) of its rope part, both written **in place** into ckv_cache / k_cache. Returns
    (k_cache, ckv_cache, k_rope, c_kv): the updated caches (the same tensors) and the un-quantised rows in kv's
    dtype (filled whatever is_output_kv).

    kv [B, N, S, Dn + Dr] (DeepSeek: N = 1, 512 + 64), gamma [Dn], cos/sin [B, N|1, S|1, Dr]; with v
    [B, N, S, Dv] (K and V separate): RMSNorm over all of kv (gamma [D]), rope of its first Dr values, k_cache gets
    that, ckv_cache gets v. cache_mode / index:

    - 'Norm': caches [B, N, Sc, *], index [B, S] positions;
    - 'PA' / 'PA_BNSD': caches [blocks, block_size, N, *], index [B*S] slots (block * block_size + offset);
    - 'PA_BLK_BNSD': index [B*ceil(S/block_size)], the start slot of each block of a sequence;
    - 'PA_NZ' / 'PA_BLK_NZ': as 'PA' / 'PA_BLK_BNSD' with the caches' memory in FRACTAL_NZ order
      [blocks, D/d0, block_size, d0] (d0 = 16 for fp16/bf16, 32 for int8, 8 for fp32), N = 1.

    A negative index skips its tokens; an index writing one row twice is an error. int8 caches (quantised):
    k_rope_scale / c_kv_scale (fp32 [D], [1, D], [N, D] or [1]) are required, q = clamp(round(x * scale + offset),
    -128, 127) with optional k_rope_offset / c_kv_offset. Other caches have kv's dtype. Implemented by
    `torch.ops.npu_fa.kv_rms_norm_rope_cache` (docs/kv_cache.md)."""
    k_rope, c_kv = _kv_rmsnorm_rope_cache("npu_kv_rmsnorm_rope_cache", kv, gamma, cos, sin, index, k_cache,
                                          ckv_cache, k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset, v,
                                          epsilon, cache_mode, is_output_kv)
    return k_cache, ckv_cache, k_rope, c_kv


@_args.torch_npu_api
def npu_kv_rmsnorm_rope_cache_v2(kv: Tensor, gamma: Tensor, cos: Tensor, sin: Tensor, index: Tensor,
                                 k_cache: Tensor, ckv_cache: Tensor, *, k_rope_scale: Optional[Tensor] = None,
                                 c_kv_scale: Optional[Tensor] = None, k_rope_offset: Optional[Tensor] = None,
                                 c_kv_offset: Optional[Tensor] = None, v: Optional[Tensor] = None,
                                 epsilon: float = 1e-5, cache_mode: str = "Norm", is_output_kv: bool = False,
                                 k_cache_dtype: Optional[int] = None, ckv_cache_dtype: Optional[int] = None):
    """torch_npu.npu_kv_rmsnorm_rope_cache_v2: npu_kv_rmsnorm_rope_cache writing k_cache / ckv_cache in place and
    returning only (k_rope, c_kv). k_cache_dtype / ckv_cache_dtype (HiFloat8/FP8 caches held in int8 tensors) are
    not implemented: they must be None."""
    op = "npu_kv_rmsnorm_rope_cache_v2"
    _cache_dtype_args(op, k_cache_dtype, ckv_cache_dtype)
    return _kv_rmsnorm_rope_cache(op, kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale,
                                  k_rope_offset, c_kv_offset, v, epsilon, cache_mode, is_output_kv)


@_args.torch_npu_api
def npu_kv_rmsnorm_rope_cache_v2_functional(kv: Tensor, gamma: Tensor, cos: Tensor, sin: Tensor, index: Tensor,
                                            k_cache: Tensor, ckv_cache: Tensor, *,
                                            k_rope_scale: Optional[Tensor] = None,
                                            c_kv_scale: Optional[Tensor] = None,
                                            k_rope_offset: Optional[Tensor] = None,
                                            c_kv_offset: Optional[Tensor] = None, v: Optional[Tensor] = None,
                                            epsilon: float = 1e-5, cache_mode: str = "Norm",
                                            is_output_kv: bool = False, k_cache_dtype: Optional[int] = None,
                                            ckv_cache_dtype: Optional[int] = None):
    """torch_npu.npu_kv_rmsnorm_rope_cache_v2_functional: the out-of-place form — k_cache / ckv_cache are left
    unchanged and updated copies are returned: (k_rope, c_kv, k_cache_out, ckv_cache_out)."""
    op = "npu_kv_rmsnorm_rope_cache_v2_functional"
    _cache_dtype_args(op, k_cache_dtype, ckv_cache_dtype)
    for name, t in (("k_cache", k_cache), ("ckv_cache", ckv_cache)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    k_out = k_cache.clone(memory_format=torch.contiguous_format)
    ckv_out = ckv_cache.clone(memory_format=torch.contiguous_format)
    k_rope, c_kv = _kv_rmsnorm_rope_cache(op, kv, gamma, cos, sin, index, k_out, ckv_out, k_rope_scale, c_kv_scale,
                                          k_rope_offset, c_kv_offset, v, epsilon, cache_mode, is_output_kv)
    return k_rope, c_kv, k_out, ckv_out


# ================================================================================================================
# torch_npu.npu_gather_pa_kv_cache (+ _functional), npu_scatter_nd_update(_)
# ================================================================================================================

def _tensor_args(op: str, **tensors) -> None:
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")


@_args.torch_npu_api
def npu_gather_pa_kv_cache(key_cache: Tensor, value_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
                           key: Tensor, value: Tensor, *, seq_offset: Optional[Tensor] = None,
                           is_seq_lens_cumsum: bool = False) -> None:
    """torch_npu.npu_gather_pa_kv_cache: copies the tokens of each sequence of a paged ND cache ([num_blocks,
    block_size, N, Dk] / [.., Dv]: K and V may have different widths, as MLA's latent and rope caches do) into the
    caller's key [num_tokens, N, Dk] and value [num_tokens, N, Dv], sequence after sequence, in place (returns None).
    seq_lens: [B] lengths, or [B+1] cumulative counts with is_seq_lens_cumsum=True. seq_offset [B]: where each
    sequence starts in its block_tables row, in tokens (whole blocks: seq_offset // block_size; vLLM-Ascend passes
    chunk starts, multiples of the block size). Block ids outside the cache or past the table give rows of zeros."""
    op = "npu_gather_pa_kv_cache"
    _tensor_args(op, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables, seq_lens=seq_lens,
                 key=key, value=value)
    _OPS.gather_pa_kv_cache_into(key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset,
                                 bool(is_seq_lens_cumsum))
    return None


@_args.torch_npu_api
def npu_gather_pa_kv_cache_functional(key_cache: Tensor, value_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
                                      key: Tensor, value: Tensor, *, seq_offset: Optional[Tensor] = None,
                                      is_seq_lens_cumsum: bool = False):
    """torch_npu.npu_gather_pa_kv_cache_functional: the out-of-place form — key / value are left unchanged and the
    gathered copies are returned: (key_out, value_out)."""
    op = "npu_gather_pa_kv_cache_functional"
    _tensor_args(op, key=key, value=value)
    key_out = key.clone(memory_format=torch.contiguous_format)
    value_out = value.clone(memory_format=torch.contiguous_format)
    npu_gather_pa_kv_cache.__wrapped__(key_cache, value_cache, block_tables, seq_lens, key_out, value_out,
                                       seq_offset=seq_offset, is_seq_lens_cumsum=is_seq_lens_cumsum)
    return key_out, value_out


@_args.torch_npu_api
def npu_scatter_nd_update_(input: Tensor, indices: Tensor, updates: Tensor) -> Tensor:  # noqa: A002 (upstream's name)
    """torch_npu.npu_scatter_nd_update_: input[indices[r]] = updates[r] in place, returns input. indices int32/int64
    [..., K] (K <= input.dim()) address slices of input.shape[K:]; updates has shape indices.shape[:-1] +
    input.shape[K:] and input's dtype. Out-of-range indices are an error; for a repeated index the last update
    wins. The KV-cache write of serving loops: input = cache [slots, N, D], indices [T, 1], updates [T, N, D]."""
    op = "npu_scatter_nd_update_"
    _tensor_args(op, input=input, indices=indices, updates=updates)
    _OPS.scatter_nd_update(input, indices, updates)
    return input


@_args.torch_npu_api
def npu_scatter_nd_update(input: Tensor, indices: Tensor, updates: Tensor) -> Tensor:  # noqa: A002 (upstream's name)
    """torch_npu.npu_scatter_nd_update: npu_scatter_nd_update_ on a copy of input (input is left unchanged)."""
    op = "npu_scatter_nd_update"
    _tensor_args(op, input=input)
    out = input.clone(memory_format=torch.contiguous_format)
    _OPS.scatter_nd_update(out, indices, updates)
    return out
