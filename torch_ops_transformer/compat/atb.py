"""`torch_npu.op_plugin.atb._atb_ops` of the shim: the ATB (Ascend Transformer Boost) functions vLLM-Ascend calls,
as thin wrappers on this package's kernels, with ATB's signatures (op-plugin's `op_plugin/ops/atb` schema lines)
and its write-into-`out` convention (each returns None).

- `_npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices)`: key/value [T, N_kv, D] into the ND
  paged caches [num_blocks, block_size, N_kv, D] at slot = block·block_size + offset (-1 skips the token):
  `npu_scatter_pa_kv_cache(..., cache_mode="Norm")`.
- `_npu_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
  context_lens, out, *, workspace=None)`: one query token per sequence, query/out [B, N, D], the sequence's
  `context_lens[b]` keys read through `block_table[b]`: `npu_fused_infer_attention_score` (BSH, paged).
  `_npu_paged_attention_get_workspace` returns an empty workspace (the kernels need none).
- `_npu_flash_attention(query, key, value, mask, seq_len, scale_value, num_heads, num_kv_heads, out)` and
  `_npu_flash_attention_unpad(query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out)`: prefill of
  packed sequences, query [T, N, D] (or [T, N·D]), key/value [T, N_kv, D], `seq_len` [B] the sequence lengths
  (summing to T): `npu_fusion_attention` per sequence. `_npu_flash_attention` applies `mask`, read as vLLM-Ascend
  builds it: [S_max, S_max] (or one per sequence, [B, S_max, S_max] / [B, 1, S_max, S_max]), a nonzero entry masks
  the position (vLLM-Ascend writes -inf for float16 and 1 for bfloat16 there); `_unpad` attends to every key of
  the sequence.

`_register_atb_extensions()` (torch_npu loads the ATB library there) makes these functions `torch_npu.<name>`.
"""
import sys

import torch
from torch import Tensor

from .._internal.args import ArgumentError

__all__ = ["_npu_reshape_and_cache", "_npu_paged_attention", "_npu_paged_attention_get_workspace",
           "_npu_flash_attention", "_npu_flash_attention_unpad", "_register_atb_extensions"]


def _tot():
    import torch_ops_transformer as tot  # lazy: the package imports compat

    return tot


def _fail(op: str, message: str):
    raise ArgumentError(f"torch_npu.{op}: {message}")


def _check_tensor(op: str, name: str, t) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"torch_npu.{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")


def _lengths(op: str, name: str, lengths) -> list:
    if isinstance(lengths, Tensor):
        if lengths.dim() != 1 or lengths.dtype not in (torch.int32, torch.int64):
            _fail(op, f"argument '{name}' must be a 1-D int32/int64 tensor; got {lengths.dtype} of shape "
                      f"{list(lengths.shape)}")
        lengths = lengths.tolist()
    lengths = [int(v) for v in lengths]
    if any(v < 0 for v in lengths):
        _fail(op, f"argument '{name}' must hold non-negative lengths; got {lengths}")
    return lengths


def _heads(op: str, num_heads: int, num_kv_heads: int) -> None:
    if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
        _fail(op, f"arguments 'num_heads' ({num_heads}) and 'num_kv_heads' ({num_kv_heads}) must be positive, "
                  f"num_heads a multiple of num_kv_heads")


def _tokens_heads_dim(op: str, name: str, t: Tensor, heads: int, head_name: str) -> Tensor:
    """[T, heads, D] view of a [T, heads, D] or [T, heads·D] tensor."""
    if t.dim() not in (2, 3) or (t.dim() == 3 and t.shape[1] != heads) or (t.dim() == 2 and t.shape[1] % heads):
        _fail(op, f"argument '{name}' must be [T, {head_name}, head_dim] or [T, {head_name}·head_dim] with "
                  f"{head_name}={heads}; got shape {list(t.shape)}")
    return t.reshape(t.shape[0], heads, -1)


def _write(op: str, out: Tensor, result: Tensor) -> None:
    _check_tensor(op, "out", out)
    if out.numel() != result.numel():
        _fail(op, f"argument 'out' must hold {list(result.shape)} ({result.numel()} elements); got shape "
                  f"{list(out.shape)}")
    out.copy_(result.reshape(out.shape))


def _npu_reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                           slot_indices: Tensor) -> None:
    """ATB reshape_and_cache: writes key/value [T, N_kv, D] into the ND paged caches, in place."""
    _tot().npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_indices, cache_mode="Norm")


def _npu_paged_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, num_kv_heads: int, num_heads: int,
                         scale_value: float, block_table: Tensor, context_lens: Tensor, out: Tensor, *,
                         workspace=None) -> None:
    """ATB paged attention (decode): out[b] = attention of query[b] over the sequence's cached keys/values."""
    op = "_npu_paged_attention"
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache),
                    ("block_table", block_table)):
        _check_tensor(op, name, t)
    _heads(op, num_heads, num_kv_heads)
    q = _tokens_heads_dim(op, "query", query, num_heads, "num_heads")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dim() != 4 or cache.shape[2] != num_kv_heads:
            _fail(op, f"argument '{name}' must be [num_blocks, block_size, num_kv_heads={num_kv_heads}, head_dim] "
                      f"(the ND layout); got shape {list(cache.shape)}")
    lens = _lengths(op, "context_lens", context_lens)
    if len(lens) != q.shape[0] or block_table.dim() != 2 or block_table.shape[0] != q.shape[0]:
        _fail(op, f"one query token per sequence: 'query' has {q.shape[0]} tokens, 'context_lens' {len(lens)} "
                  f"lengths, 'block_table' shape {list(block_table.shape)} (expected [{q.shape[0]}, max_blocks])")
    b, block_size = q.shape[0], key_cache.shape[1]
    result, _ = _tot().npu_fused_infer_attention_score(
        q.reshape(b, 1, -1), key_cache.reshape(key_cache.shape[0], block_size, -1),
        value_cache.reshape(value_cache.shape[0], block_size, -1), block_table=block_table,
        actual_seq_lengths_kv=lens, num_heads=num_heads, num_key_value_heads=num_kv_heads, scale=scale_value,
        input_layout="BSH", block_size=block_size)
    _write(op, out, result)


def _npu_paged_attention_get_workspace(query: Tensor, key_cache: Tensor, value_cache: Tensor, num_kv_heads: int,
                                       num_heads: int, scale_value: float, block_table: Tensor, context_lens: Tensor,
                                       out: Tensor) -> Tensor:
    """The workspace _npu_paged_attention takes for graph capture: none is needed here (an empty uint8 tensor)."""
    return torch.empty(0, dtype=torch.uint8, device=query.device)


def _prefill(op: str, query, key, value, mask, seq_len, scale_value, num_heads, num_kv_heads, out) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(op, name, t)
    _heads(op, num_heads, num_kv_heads)
    q = _tokens_heads_dim(op, "query", query, num_heads, "num_heads")
    k = _tokens_heads_dim(op, "key", key, num_kv_heads, "num_kv_heads")
    v = _tokens_heads_dim(op, "value", value, num_kv_heads, "num_kv_heads")
    lens = _lengths(op, "seq_len", seq_len)
    if sum(lens) != q.shape[0] or k.shape[0] != q.shape[0] or v.shape[0] != q.shape[0]:
        _fail(op, f"argument 'seq_len' {lens} must sum to the token count of 'query', 'key' and 'value' "
                  f"({q.shape[0]}, {k.shape[0]}, {v.shape[0]})")
    if mask is not None:
        _check_tensor(op, "mask", mask)
        s_max = max(lens, default=0)
        per_seq = mask.dim() > 2
        if mask.dim() not in (2, 3, 4) or (per_seq and mask.shape[0] != len(lens)) or \
                mask.shape[-1] < s_max or mask.shape[-2] < s_max:
            _fail(op, f"argument 'mask' must be [S, S], [B, S, S] or [B, 1, S, S] with S >= the longest sequence "
                      f"({s_max}) and B = {len(lens)}; got shape {list(mask.shape)}")
    fa = _tot().npu_fusion_attention
    results, start = [], 0
    for i, s in enumerate(lens):
        if s == 0:
            continue
        qi, ki, vi = (t[start:start + s].unsqueeze(0) for t in (q, k, v))
        atten_mask = None
        if mask is not None:
            m = mask[i] if mask.dim() > 2 else mask
            atten_mask = (m.reshape(m.shape[-2], m.shape[-1])[:s, :s] != 0)
        results.append(fa(qi, ki, vi, num_heads, "BSND", atten_mask=atten_mask, scale=scale_value)[0][0])
        start += s
    result = torch.cat(results) if results else q.new_empty((0,) + tuple(q.shape[1:2]) + (v.shape[-1],))
    _write(op, out, result)


def _npu_flash_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, seq_len: Tensor,
                         scale_value: float, num_heads: int, num_kv_heads: int, out: Tensor) -> None:
    """ATB self attention (prefill, masked), packed sequences [T, N, D]; writes `out`."""
    _check_tensor("_npu_flash_attention", "mask", mask)
    _prefill("_npu_flash_attention", query, key, value, mask, seq_len, scale_value, num_heads, num_kv_heads, out)


def _npu_flash_attention_unpad(query: Tensor, key: Tensor, value: Tensor, seq_len: Tensor, scale_value: float,
                               num_heads: int, num_kv_heads: int, out: Tensor) -> None:
    """ATB self attention without a mask (every key of the sequence), packed sequences [T, N, D]; writes `out`."""
    _prefill("_npu_flash_attention_unpad", query, key, value, None, seq_len, scale_value, num_heads, num_kv_heads,
             out)


FUNCTIONS = {name: globals()[name] for name in __all__ if name != "_register_atb_extensions"}


def _register_atb_extensions() -> None:
    """torch_npu loads the ATB library here and puts its functions on torch_npu; the shim's are set on the shim."""
    torch_npu = sys.modules.get("torch_npu")
    if torch_npu is not None:
        for name, fn in FUNCTIONS.items():
            setattr(torch_npu, name, fn)
