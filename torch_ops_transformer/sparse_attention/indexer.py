"""The lightning indexer of DeepSeek-V3.2's sparse attention with torch_npu's Python signatures, on top of
`torch.ops.npu_fa`.

- `npu_lightning_indexer(query, key, weights, ...)` — per query token, the positions (and optionally the scores) of
  the top `sparse_count` cached keys by score = sum_h weights_h * ReLU(q_h . k); differentiable in query, key and
  weights through the returned scores;
- `npu_quant_lightning_indexer(...)` — the same selection on int8 query / key with their dequantisation scales;
- `npu_lightning_indexer_grad(...)` — the backward of the scores;
- `npu_sparse_lightning_indexer_grad_kl_loss(...)` — the indexer's training loss (KL divergence to the main
  attention's distribution over the selected keys) and its gradients.
Sequence lengths are accepted as lists of ints or integer tensors and reach the ops as tensors.
"""
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa
_I64_MAX = 2**63 - 1
IntList = Union[List[int], Tensor, None]


def _tensor(op: str, name: str, value, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, Tensor):
        raise TypeError(f"{op}: argument '{name}' must be a Tensor{' or None' if optional else ''}; "
                        f"got {type(value).__name__}")


def _str(op: str, name: str, value, default: str) -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise TypeError(f"{op}: argument '{name}' must be a str; got {value!r}")
    return value


@_args.torch_npu_api
def npu_lightning_indexer(query: Tensor, key: Tensor, weights: Tensor, *, actual_seq_lengths_query: IntList = None,
                          actual_seq_lengths_key: IntList = None, block_table: Optional[Tensor] = None,
                          layout_query: str = "BSND", layout_key: str = "BSND", sparse_count: int = 2048,
                          sparse_mode: int = 3, pre_tokens: int = _I64_MAX, next_tokens: int = _I64_MAX,
                          return_value: bool = False) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_lightning_indexer: (sparse_indices int32 [B, S1, N2, sparse_count] / [T1, N2, sparse_count],
    sparse_values in query's dtype of that shape when return_value, else an empty tensor). See
    docs/sparse_attention.md#lightning-indexer for layouts, lengths, the causal rule and the order of the indices."""
    op = "npu_lightning_indexer"
    for name, t in (("query", query), ("key", key), ("weights", weights)):
        _tensor(op, name, t)
    _tensor(op, "block_table", block_table, optional=True)
    dev = query.device
    asq = _args.host_int_tensor(op, "actual_seq_lengths_query", actual_seq_lengths_query, dev)
    ask = _args.host_int_tensor(op, "actual_seq_lengths_key", actual_seq_lengths_key, dev)
    return _OPS.lightning_indexer(query, key, weights, asq, ask, block_table, layout_query, layout_key,
                                  sparse_count, sparse_mode, pre_tokens, next_tokens, bool(return_value))


@_args.torch_npu_api
def npu_lightning_indexer_grad(query: Tensor, key: Tensor, dy: Tensor, sparse_indices: Tensor, weights: Tensor,
                               actual_seq_lengths_query: IntList = None, actual_seq_lengths_key: IntList = None,
                               layout: Optional[str] = "BSND", sparse_mode: Optional[int] = 3,
                               pre_tokens: Optional[int] = _I64_MAX,
                               next_tokens: Optional[int] = _I64_MAX) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_lightning_indexer_grad: (d_query, d_key, d_weights) of the indexer's selected scores, dy of
    sparse_indices' shape. layout None is "BSND"; sparse_mode None is 0 (as torch_npu passes it on)."""
    op = "npu_lightning_indexer_grad"
    for name, t in (("query", query), ("key", key), ("dy", dy), ("sparse_indices", sparse_indices),
                    ("weights", weights)):
        _tensor(op, name, t)
    dev = query.device
    asq = _args.host_int_tensor(op, "actual_seq_lengths_query", actual_seq_lengths_query, dev)
    ask = _args.host_int_tensor(op, "actual_seq_lengths_key", actual_seq_lengths_key, dev)
    return _OPS.lightning_indexer_grad(query, key, dy, sparse_indices, weights, asq, ask,
                                       _str(op, "layout", layout, "BSND"),
                                       _args.optional_int(op, "sparse_mode", sparse_mode, 0),
                                       _args.optional_int(op, "pre_tokens", pre_tokens, _I64_MAX),
                                       _args.optional_int(op, "next_tokens", next_tokens, _I64_MAX))


@_args.torch_npu_api
def npu_quant_lightning_indexer(query: Tensor, key: Tensor, weights: Tensor, query_dequant_scale: Tensor,
                                key_dequant_scale: Tensor, query_quant_mode: int, key_quant_mode: int, *,
                                actual_seq_lengths_query: IntList = None, actual_seq_lengths_key: IntList = None,
                                block_table: Optional[Tensor] = None, layout_query: str = "BSND",
                                layout_key: str = "BSND", sparse_count: int = 2048, sparse_mode: int = 3,
                                pre_tokens: int = _I64_MAX, next_tokens: int = _I64_MAX,
                                query_dtype: Optional[int] = None, key_dtype: Optional[int] = None) -> Tensor:
    """torch_npu.npu_quant_lightning_indexer: sparse_indices (int32) of the int8 indexer, scores dequantised per
    token and head (query_dequant_scale [.., N1]) and per key token (key_dequant_scale [.., N2]). query_dtype /
    key_dtype may name int8 (the dtype of the tensors); the 8-bit float formats are not implemented."""
    op = "npu_quant_lightning_indexer"
    for name, t in (("query", query), ("key", key), ("weights", weights),
                    ("query_dequant_scale", query_dequant_scale), ("key_dequant_scale", key_dequant_scale)):
        _tensor(op, name, t)
    _tensor(op, "block_table", block_table, optional=True)
    _args.same_dtype_or_none(op, "query_dtype", query_dtype, query.dtype, "an 8-bit float query")
    _args.same_dtype_or_none(op, "key_dtype", key_dtype, key.dtype, "an 8-bit float key")
    dev = query.device
    asq = _args.host_int_tensor(op, "actual_seq_lengths_query", actual_seq_lengths_query, dev)
    ask = _args.host_int_tensor(op, "actual_seq_lengths_key", actual_seq_lengths_key, dev)
    return _OPS.quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode,
                                        key_quant_mode, actual_seq_lengths_query=asq, actual_seq_lengths_key=ask,
                                        block_table=block_table, layout_query=layout_query, layout_key=layout_key,
                                        sparse_count=sparse_count, sparse_mode=sparse_mode, pre_tokens=pre_tokens,
                                        next_tokens=next_tokens)


@_args.torch_npu_api
def npu_sparse_lightning_indexer_grad_kl_loss(
        query: Tensor, key: Tensor, query_index: Tensor, key_index: Tensor, weights: Tensor, sparse_indices: Tensor,
        softmax_max: Tensor, softmax_sum: Tensor, scale_value: float, *, query_rope: Optional[Tensor] = None,
        key_rope: Optional[Tensor] = None, actual_seq_qlen: IntList = None, actual_seq_klen: IntList = None,
        layout: Optional[str] = "BSND", sparse_mode: Optional[int] = 3, pre_tokens: Optional[int] = _I64_MAX,
        next_tokens: Optional[int] = _I64_MAX, sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_sparse_lightning_indexer_grad_kl_loss: (d_query_index, d_key_index, d_weights, loss) of the
    indexer's KL loss against the main attention over the selected keys (docs/sparse_attention.md)."""
    op = "npu_sparse_lightning_indexer_grad_kl_loss"
    for name, t in (("query", query), ("key", key), ("query_index", query_index), ("key_index", key_index),
                    ("weights", weights), ("sparse_indices", sparse_indices), ("softmax_max", softmax_max),
                    ("softmax_sum", softmax_sum)):
        _tensor(op, name, t)
    for name, t in (("query_rope", query_rope), ("key_rope", key_rope), ("sinks", sinks)):
        _tensor(op, name, t, optional=True)
    if isinstance(scale_value, bool) or not isinstance(scale_value, (int, float)):
        raise TypeError(f"{op}: argument 'scale_value' must be a float; got {scale_value!r}")
    dev = query.device
    asq = _args.host_int_tensor(op, "actual_seq_qlen", actual_seq_qlen, dev)
    ask = _args.host_int_tensor(op, "actual_seq_klen", actual_seq_klen, dev)
    return _OPS.sparse_lightning_indexer_grad_kl_loss(
        query, key, query_index, key_index, weights, sparse_indices, softmax_max, softmax_sum, float(scale_value),
        query_rope=query_rope, key_rope=key_rope, actual_seq_qlen=asq, actual_seq_klen=ask,
        layout=_str(op, "layout", layout, "BSND"), sparse_mode=_args.optional_int(op, "sparse_mode", sparse_mode, 3),
        pre_tokens=_args.optional_int(op, "pre_tokens", pre_tokens, _I64_MAX),
        next_tokens=_args.optional_int(op, "next_tokens", next_tokens, _I64_MAX), sinks=sinks)
