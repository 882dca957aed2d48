"""Sparse flash attention with torch_npu's Python signatures, on top of `torch.ops.npu_fa` (docs/sparse_attention.md,
"Sparse flash attention").

- `npu_sparse_flash_attention(query, key, value, sparse_indices, scale_value, *, ...)` — each query token attends
  only to the KV tokens its row of `sparse_indices` selects (DeepSeek-V3.2's DSA, MLA absorbed: attention_mode=2);
  returns (attention_out, softmax_max, softmax_sum). Differentiable in query, key, value, query_rope, key_rope and
  sinks.
- `npu_sparse_flash_attention_grad(...)` — its backward, (d_query, d_key, d_value, d_query_rope, d_key_rope), and
  d_sinks after them when the `sinks` extension is given.
- `npu_kv_quant_sparse_flash_attention(query, key, value, sparse_indices, scale_value, key_quant_mode,
  value_quant_mode, *, ...)` — the same over an int8 MLA cache whose rows carry their rope part and per-tile scales.
"""
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa
_MAX_TOKENS = 9223372036854775807
Lengths = Union[Sequence[int], Tensor, None]


def _lengths(op, query, q_name, q_value, kv_name, kv_value):
    return (_args.host_int_tensor(op, q_name, q_value, query.device),
            _args.host_int_tensor(op, kv_name, kv_value, query.device))


@_args.torch_npu_api
def npu_sparse_flash_attention(query: Tensor, key: Tensor, value: Tensor, sparse_indices: Tensor,
                               scale_value: float, *, block_table: Optional[Tensor] = None,
                               actual_seq_lengths_query: Lengths = None, actual_seq_lengths_kv: Lengths = None,
                               query_rope: Optional[Tensor] = None, key_rope: Optional[Tensor] = None,
                               sparse_block_size: int = 1, layout_query: str = "BSND", layout_kv: str = "BSND",
                               sparse_mode: int = 3, pre_tokens: int = _MAX_TOKENS, next_tokens: int = _MAX_TOKENS,
                               attention_mode: int = 0, return_softmax_lse: bool = False,
                               sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_sparse_flash_attention: softmax(scale_value * q K̃ᵀ) Ṽ over the tokens each query's row of
    sparse_indices selects (entry b: tokens [b * sparse_block_size, (b + 1) * sparse_block_size), -1 unused).
    attention_mode 2 adds query_rope · key_rope to the scores (MLA absorb, value = the latent key); sparse_mode 3 adds
    the right-down causal limit. Lengths may be lists of ints or integer tensors (cumulative for TND).
    Returns (attention_out, softmax_max, softmax_sum); the statistics are empty [0] unless return_softmax_lse."""
    op = "npu_sparse_flash_attention"
    lq, lkv = _lengths(op, query, "actual_seq_lengths_query", actual_seq_lengths_query, "actual_seq_lengths_kv",
                       actual_seq_lengths_kv)
    return _OPS.sparse_flash_attention(query, key, value, sparse_indices, scale_value, block_table, lq, lkv,
                                       query_rope, key_rope, sparse_block_size, layout_query, layout_kv, sparse_mode,
                                       pre_tokens, next_tokens, attention_mode, return_softmax_lse, sinks)


@_args.torch_npu_api
def npu_sparse_flash_attention_grad(query: Tensor, key: Tensor, value: Tensor, sparse_indices: Tensor, d_out: Tensor,
                                    out: Tensor, softmax_max: Tensor, softmax_sum: Tensor, scale_value: float,
                                    sparse_block_size: int, query_rope: Optional[Tensor] = None,
                                    key_rope: Optional[Tensor] = None, actual_seq_qlen: Lengths = None,
                                    actual_seq_kvlen: Lengths = None, layout: Optional[str] = "BSND",
                                    sparse_mode: Optional[int] = 3, pre_tokens: Optional[int] = _MAX_TOKENS,
                                    next_tokens: Optional[int] = _MAX_TOKENS, attention_mode: Optional[int] = 0, *,
                                    block_table: Optional[Tensor] = None, layout_kv: Optional[str] = None,
                                    sinks: Optional[Tensor] = None) -> Tuple[Tensor, ...]:
    """torch_npu.npu_sparse_flash_attention_grad: the gradients (d_query, d_key, d_value, d_query_rope, d_key_rope)
    of npu_sparse_flash_attention from its out, softmax_max and softmax_sum (empty statistics are recomputed).
    Extensions (keyword-only): block_table and layout_kv for a paged cache, sinks as in the forward; with sinks the
    tuple has a sixth entry, d_sinks (without them it keeps torch_npu's five)."""
    op = "npu_sparse_flash_attention_grad"
    lq, lkv = _lengths(op, query, "actual_seq_qlen", actual_seq_qlen, "actual_seq_kvlen", actual_seq_kvlen)
    if layout is not None and not isinstance(layout, str):
        raise TypeError(f"{op}: argument 'layout' must be a str or None; got {layout!r}")
    if layout_kv is not None and not isinstance(layout_kv, str):
        raise TypeError(f"{op}: argument 'layout_kv' must be a str or None; got {layout_kv!r}")
    grads = _OPS.sparse_flash_attention_grad(
        query, key, value, sparse_indices, d_out, out, softmax_max, softmax_sum, scale_value, sparse_block_size,
        query_rope, key_rope, lq, lkv, "BSND" if layout is None else layout,
        _args.optional_int(op, "sparse_mode", sparse_mode, 3),
        _args.optional_int(op, "pre_tokens", pre_tokens, _MAX_TOKENS),
        _args.optional_int(op, "next_tokens", next_tokens, _MAX_TOKENS),
        _args.optional_int(op, "attention_mode", attention_mode, 0), block_table, layout_kv or "", sinks)
    return grads if sinks is not None else grads[:5]


@_args.torch_npu_api
def npu_kv_quant_sparse_flash_attention(query: Tensor, key: Tensor, value: Tensor, sparse_indices: Tensor,
                                        scale_value: float, key_quant_mode: int, value_quant_mode: int, *,
                                        key_dequant_scale: Optional[Tensor] = None,
                                        value_dequant_scale: Optional[Tensor] = None,
                                        block_table: Optional[Tensor] = None, actual_seq_lengths_query: Lengths = None,
                                        actual_seq_lengths_kv: Lengths = None, sparse_block_size: int = 1,
                                        layout_query: str = "BSND", layout_kv: str = "BSND", sparse_mode: int = 3,
                                        pre_tokens: int = _MAX_TOKENS, next_tokens: int = _MAX_TOKENS,
                                        attention_mode: int = 0, quant_scale_repo_mode: int = 1, tile_size: int = 128,
                                        rope_head_dim: int = 64, key_dtype=None, value_dtype=None,
                                        sinks: Optional[Tensor] = None) -> Tensor:
    """torch_npu.npu_kv_quant_sparse_flash_attention: npu_sparse_flash_attention (attention_mode 2) over an int8
    (or float8_e4m3fn) MLA cache. query is [q_nope, q_rope] on its last axis; each key row holds the quantised
    latent, the rope part (query's dtype, as bytes) and one float32 scale per tile_size latent values (as bytes).
    Returns the attention output [.., N1, Dn] in query's dtype. key_dtype / value_dtype other than the cache's own
    dtype (hifloat8) are not implemented."""
    op = "npu_kv_quant_sparse_flash_attention"
    _args.reserved(op, key_dequant_scale=key_dequant_scale, value_dequant_scale=value_dequant_scale)
    _args.same_dtype_or_none(op, "key_dtype", key_dtype, key.dtype, "a key cache format other than its dtype")
    _args.same_dtype_or_none(op, "value_dtype", value_dtype, value.dtype, "a value cache format other than its dtype")
    lq, lkv = _lengths(op, query, "actual_seq_lengths_query", actual_seq_lengths_query, "actual_seq_lengths_kv",
                       actual_seq_lengths_kv)
    return _OPS.kv_quant_sparse_flash_attention(
        query, key, value, sparse_indices, scale_value, key_quant_mode, value_quant_mode, block_table=block_table,
        actual_seq_lengths_query=lq, actual_seq_lengths_kv=lkv, sparse_block_size=sparse_block_size,
        layout_query=layout_query, layout_kv=layout_kv, sparse_mode=sparse_mode, pre_tokens=pre_tokens,
        next_tokens=next_tokens, attention_mode=attention_mode, quant_scale_repo_mode=quant_scale_repo_mode,
        tile_size=tile_size, rope_head_dim=rope_head_dim, sinks=sinks)
