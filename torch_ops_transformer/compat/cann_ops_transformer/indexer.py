"""cann_ops_transformer's lightning indexer functions (lightning_indexer, quant_lightning_indexer,
sparse_lightning_indexer_kl_loss_grad) with upstream's Python signatures, on this package's DSA ops
(torch_ops_transformer.sparse_attention): docs/sparse_attention.md, "cann_ops_transformer stand-in"."""
from typing import Callable, Tuple

import torch
from torch import Tensor

from ...sparse_attention import (npu_lightning_indexer, npu_lightning_indexer_grad, npu_quant_lightning_indexer)
from . import _common as c

_LAYOUTS_K = ("BSND", "TND", "PA_BBND")
# The largest count our indexer ranks; upstream's topk set is [1, 2048] and 3072, 4096, ..., 8192.
_MAX_RANKED = 8192


def _key_lengths(op: str, k: Tensor, layout_k: str, rows: c.Rows, cu_seqlens_k, seqused_k) -> list:
    """Keys per sequence: BSND S2 or seqused_k, TND from cu_seqlens_k, a paged cache from seqused_k (required)."""
    b = rows.batch_size
    if layout_k == "TND":
        if seqused_k is not None:
            raise c.not_supported(op, "seqused_k", "a tensor", "with layout_k 'TND' the key lengths come from "
                                  "cu_seqlens_k")
        ends = c.cumulative(op, "cu_seqlens_k", cu_seqlens_k, "for layout_k 'TND'")
        if len(ends) != b:
            raise ValueError(f"{op}: argument 'cu_seqlens_k' must describe {b} sequences (as the query); got "
                             f"{len(ends)}")
        return c.lengths_from(ends)
    used = c.host_ints(op, "seqused_k", seqused_k, b)
    if layout_k == "PA_BBND" and used is None:
        raise ValueError(f"{op}: argument 'seqused_k' is required for layout_k 'PA_BBND'")
    return used if used is not None else [k.shape[1]] * b


def _our_lengths(op: str, layout_q: str, layout_k: str, rows: c.Rows, seqused_q, k_lens: list):
    """(actual_seq_lengths_query, actual_seq_lengths_key) in our ops' convention (cumulative for TND)."""
    asq = rows.ends if layout_q == "TND" else c.host_ints(op, "seqused_q", seqused_q, rows.batch_size)
    if layout_k == "TND":
        ask, total = [], 0
        for n in k_lens:
            total += n
            ask.append(total)
        return asq, ask
    return asq, k_lens


def _ranked_count(op: str, k_lens: list, cmp_ratio: int) -> int:
    """The smallest count our indexer accepts that ranks every key of the longest sequence."""
    n = max(max(k_lens, default=1), 1)
    if n <= 2048:
        return n
    if n <= _MAX_RANKED:
        return -(-n // 1024) * 1024
    raise c.not_supported(op, "cmp_ratio", cmp_ratio, f"a causal mask over a compressed key is applied by ranking "
                          f"every key, at most {_MAX_RANKED} per sequence; got {n}")


def _keep_visible(idx: Tensor, values: Tensor, visible: Tensor, topk: int):
    """The first `topk` entries of each ranked row that are keys the row's token sees (-1 / -inf after them):
    filtering a full ranking keeps the order (scores, then position) of the visible keys."""
    shape = idx.shape
    flat = idx.reshape(visible.shape[0], -1, shape[-1])
    keep = (flat >= 0) & (flat < visible.view(-1, 1, 1).to(flat.device))
    order = torch.sort((~keep).to(torch.int8), dim=-1, stable=True).indices[..., :topk]
    kept = torch.gather(keep, -1, order)
    out_idx = torch.where(kept, torch.gather(flat, -1, order), -1)
    pad = topk - out_idx.shape[-1]
    out_idx = torch.nn.functional.pad(out_idx, (0, pad), value=-1) if pad > 0 else out_idx
    out_idx = out_idx.reshape(*shape[:-1], topk).to(torch.int32)
    if values.numel() == 0:  # values not asked for: our op's empty [0] tensor
        return out_idx, values
    vflat = values.reshape(flat.shape)
    out_v = torch.where(kept, torch.gather(vflat, -1, order), float("-inf"))
    out_v = torch.nn.functional.pad(out_v, (0, pad), value=float("-inf")) if pad > 0 else out_v
    return out_idx, out_v.reshape(*shape[:-1], topk)


def _post(op: str, idx: Tensor, values: Tensor, rows: c.Rows, output_idx_offset) -> Tuple[Tensor, Tensor]:
    """Padding rows (TND seqused_q) to -1 / -inf, then upstream's output_idx_offset added to the real entries."""
    flat = idx.reshape(rows.batch.shape[0], -1)
    dead = ~rows.valid.view(-1, 1).to(flat.device)
    flat = flat.masked_fill(dead, -1)
    if values.numel():
        values = values.reshape(flat.shape).masked_fill(dead, float("-inf")).reshape(idx.shape)
    offsets = c.host_ints(op, "output_idx_offset", output_idx_offset, rows.batch_size)
    if offsets is not None:
        if any(v < 0 for v in offsets):
            raise ValueError(f"{op}: argument 'output_idx_offset' entries must be >= 0; got {offsets}")
        add = torch.tensor(offsets, dtype=torch.int64)[rows.batch].view(-1, 1).to(flat.device)
        shifted = flat.to(torch.int64) + add
        if shifted.numel() and shifted.max() > 2**31 - 1:
            raise ValueError(f"{op}: argument 'output_idx_offset' moves an index past the int32 range")
        flat = torch.where(flat >= 0, shifted, -1).to(torch.int32)
    return flat.reshape(idx.shape), values


def _select(op: str, rank: Callable, q: Tensor, k: Tensor, topk: int, rows: c.Rows, k_lens: list, layout_k: str,
            mask_mode: int, cmp_ratio: int, cmp_residual_k) -> Tuple[Tensor, Tensor]:
    """Our indexer's selection under upstream's masks. `rank(count, sparse_mode)` runs our op. A causal mask over
    an uncompressed key is our sparse_mode 3; over a compressed key (cmp_ratio > 1) every key is ranked without a
    mask and each row keeps its first `topk` visible keys."""
    if mask_mode == 0 or cmp_ratio == 1:
        if cmp_residual_k is not None and cmp_ratio == 1:
            c.residuals(op, "cmp_residual_k", cmp_residual_k, rows.batch_size, 1)  # all zero (< cmp_ratio 1)
        return rank(topk, mask_mode)
    c.int_in(op, "topk", topk, 1, _MAX_RANKED)
    res = c.residuals(op, "cmp_residual_k", cmp_residual_k, rows.batch_size, cmp_ratio)
    idx, values = rank(_ranked_count(op, k_lens, cmp_ratio), 0)
    k_len = torch.tensor(k_lens, dtype=torch.long)[rows.batch]
    visible = c.compressed_visible(k_len, rows, cmp_ratio, res[rows.batch])
    return _keep_visible(idx, values, visible, topk)


def _common_checks(op: str, layout_q: str, layout_k: str, mask_mode: int, cmp_ratio: int, return_value) -> bool:
    c.choice(op, "layout_q", layout_q, c.LAYOUTS_Q)
    c.choice(op, "layout_k", layout_k, _LAYOUTS_K)
    c.choice(op, "mask_mode", mask_mode, (0, 3))
    c.int_in(op, "cmp_ratio", cmp_ratio, 1, 128)
    if isinstance(return_value, bool):
        return return_value
    c.choice(op, "return_value", return_value, (0, 1))
    return bool(return_value)


def lightning_indexer(q, k, w, topk, *, cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
                      cmp_residual_k=None, block_table=None, output_idx_offset=None, metadata=None, max_seqlen_q=-1,
                      layout_q="BSND", layout_k="BSND", mask_mode=0, cmp_ratio=1, return_value=0):
    """cann_ops_transformer.lightning_indexer: (sparse_indices int32 [B, S1, N2, topk] / [T1, N2, topk],
    sparse_values float32 of that shape when return_value, else an empty [0] tensor), on npu_lightning_indexer.
    `metadata` and `max_seqlen_q` are tiling hints on the NPU and are not needed here."""
    op = "cann_ops_transformer.lightning_indexer"
    for name, t in (("q", q), ("k", k), ("w", w)):
        c.tensor(op, name, t)
    want = _common_checks(op, layout_q, layout_k, mask_mode, cmp_ratio, return_value)
    rows = c.query_rows(op, q, layout_q, cu_seqlens_q, seqused_q)
    k_lens = _key_lengths(op, k, layout_k, rows, cu_seqlens_k, seqused_k)
    asq, ask = _our_lengths(op, layout_q, layout_k, rows, seqused_q, k_lens)
    our_layout_k = "PA_BSND" if layout_k == "PA_BBND" else layout_k

    def rank(count, sparse_mode):
        return npu_lightning_indexer(q, k, w, actual_seq_lengths_query=asq, actual_seq_lengths_key=ask,
                                     block_table=block_table, layout_query=layout_q, layout_key=our_layout_k,
                                     sparse_count=count, sparse_mode=sparse_mode, return_value=want)

    idx, values = _select(op, rank, q, k, topk, rows, k_lens, layout_k, mask_mode, cmp_ratio, cmp_residual_k)
    idx, values = _post(op, idx, values, rows, output_idx_offset)
    # upstream's values are float32; ours come in q's dtype (the fp32 scores rounded to it), widened here
    return idx, values.to(torch.float64 if values.dtype == torch.float64 else torch.float32)


def quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale, topk, quant_mode, *,
                            cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None,
                            cmp_residual_k=None, block_table=None, output_idx_offset=None, metadata=None,
                            max_seqlen_q=-1, layout_q="BSND", layout_k="BSND", mask_mode=0, cmp_ratio=1,
                            return_value=0):
    """cann_ops_transformer.quant_lightning_indexer: (sparse_indices, an empty [0] tensor) of the int8 indexer
    (quant_mode 2: int8 query / key with per-token-head scales), on npu_quant_lightning_indexer."""
    op = "cann_ops_transformer.quant_lightning_indexer"
    for name, t in (("query", query), ("key", key), ("weights", weights),
                    ("query_dequant_scale", query_dequant_scale), ("key_dequant_scale", key_dequant_scale)):
        c.tensor(op, name, t)
    if quant_mode in (1, 4):
        raise c.not_supported(op, "quant_mode", quant_mode, "8-bit float query / key (fp8 e4m3, hifloat8)")
    c.choice(op, "quant_mode", quant_mode, (1, 2, 4))
    if _common_checks(op, layout_q, layout_k, mask_mode, cmp_ratio, return_value):
        raise c.not_supported(op, "return_value", return_value, "the quantised indexer returns the indices only")
    rows = c.query_rows(op, query, layout_q, cu_seqlens_q, seqused_q, q_name="query")
    k_lens = _key_lengths(op, key, layout_k, rows, cu_seqlens_k, seqused_k)
    asq, ask = _our_lengths(op, layout_q, layout_k, rows, seqused_q, k_lens)
    our_layout_k = "PA_BSND" if layout_k == "PA_BBND" else layout_k

    def rank(count, sparse_mode):
        # quant_mode 2 is our per-token-head int8 mode (0); its fp16 scales are exact in fp32
        idx = npu_quant_lightning_indexer(query, key, weights, query_dequant_scale.float(),
                                          key_dequant_scale.float(), 0, 0, actual_seq_lengths_query=asq,
                                          actual_seq_lengths_key=ask, block_table=block_table,
                                          layout_query=layout_q, layout_key=our_layout_k, sparse_count=count,
                                          sparse_mode=sparse_mode)
        return idx, idx.new_empty((0,), dtype=torch.float32)

    idx, values = _select(op, rank, query, key, topk, rows, k_lens, layout_k, mask_mode, cmp_ratio, cmp_residual_k)
    return _post(op, idx, values, rows, output_idx_offset)


def _indexer_scores(q: Tensor, k_rows: Tensor, w: Tensor) -> Tensor:
    """I[r, n2, j] = sum over the G query heads h of key head n2 of w[r, h] * ReLU(q[r, h] . k_rows[r, n2, j]),
    accumulated in fp32 (fp64 for fp64 inputs): the indexer's score of each selected key."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    r, n1, d = q.shape
    n2 = k_rows.shape[1]
    s = torch.einsum("rngd,rnjd->rngj", q.to(acc).view(r, n2, n1 // n2, d), k_rows.to(acc))
    return (w.to(acc).view(r, n2, n1 // n2, 1) * s.relu()).sum(2)


def sparse_lightning_indexer_kl_loss_grad(q, k, w, sparse_indices, attn_softmax_l1_norm, *, cu_seqlens_q=None,
                                          cu_seqlens_k=None, seqused_q=None, seqused_k=None, cmp_residual_k=None,
                                          metadata=None, layout_q="TND", layout_k="TND", mask_mode=3, cmp_ratio=1):
    """cann_ops_transformer.sparse_lightning_indexer_kl_loss_grad: (dq, dk, dw, softmax_out) of the indexer's KL
    loss against the target distribution attn_softmax_l1_norm over the selected keys. The selected scores and
    their softmax are computed here; dI = softmax_out * sum(p) - p goes through npu_lightning_indexer_grad."""
    op = "cann_ops_transformer.sparse_lightning_indexer_kl_loss_grad"
    for name, t in (("q", q), ("k", k), ("w", w), ("sparse_indices", sparse_indices),
                    ("attn_softmax_l1_norm", attn_softmax_l1_norm)):
        c.tensor(op, name, t)
    _common_checks(op, layout_q, layout_k, mask_mode, cmp_ratio, 0)
    if layout_k == "PA_BBND":
        raise ValueError(f"{op}: argument 'layout_k' must be one of ['BSND', 'TND']; got 'PA_BBND'")
    if layout_k != layout_q:
        raise c.not_supported(op, "layout_k", layout_k, f"the key's layout must be the query's ({layout_q!r})")
    for name, value in (("seqused_q", seqused_q), ("seqused_k", seqused_k)):
        if value is not None:
            raise c.not_supported(op, name, "a tensor", "the lengths come from the layout (and cu_seqlens)")
    if sparse_indices.dtype != torch.int32:
        raise TypeError(f"{op}: argument 'sparse_indices' must be int32; got {sparse_indices.dtype}")
    if attn_softmax_l1_norm.shape != sparse_indices.shape:
        raise ValueError(f"{op}: argument 'attn_softmax_l1_norm' must have sparse_indices' shape "
                         f"{tuple(sparse_indices.shape)}; got {tuple(attn_softmax_l1_norm.shape)}")
    rows = c.query_rows(op, q, layout_q, cu_seqlens_q, None)
    k_lens = _key_lengths(op, k, layout_k, rows, cu_seqlens_k, None)
    visible = _kl_visible(op, rows, k_lens, mask_mode, cmp_ratio, cmp_residual_k)
    n_rows, n1, d = rows.batch.shape[0], q.shape[-2], q.shape[-1]
    dev = sparse_indices.device
    idx = sparse_indices.reshape(n_rows, -1, sparse_indices.shape[-1]).to(torch.int64)
    keep = (idx >= 0) & (idx < visible.view(-1, 1, 1).to(dev)) & rows.valid.view(-1, 1, 1).to(dev)
    starts = torch.tensor([0] + list(torch.tensor(k_lens).cumsum(0)[:-1].tolist()), dtype=torch.long) \
        if layout_k == "TND" else torch.arange(rows.batch_size) * (k.shape[1] if k.dim() == 4 else 0)
    flat_k = k.reshape(-1, k.shape[-2], d)
    row_ids = torch.where(keep, idx + starts[rows.batch].view(-1, 1, 1).to(dev), 0)
    n2 = flat_k.shape[1]
    k_rows = flat_k[row_ids, torch.arange(n2, device=dev).view(1, -1, 1)]  # [R, N2, K, D]
    scores = _indexer_scores(q.reshape(n_rows, n1, d), k_rows, w.reshape(n_rows, n1))
    y = torch.softmax(scores.masked_fill(~keep, float("-inf")), -1).nan_to_num(0.0).masked_fill(~keep, 0.0)
    p = attn_softmax_l1_norm.reshape(keep.shape).to(y.dtype).masked_fill(~keep, 0.0)
    d_scores = y * p.sum(-1, keepdim=True) - p
    clean = torch.where(keep, idx, -1).to(torch.int32).reshape(sparse_indices.shape)
    lens = (rows.ends, _cumulative(k_lens)) if layout_q == "TND" else (None, None)
    dq, dk, dw = npu_lightning_indexer_grad(q, k, d_scores.reshape(sparse_indices.shape), clean, w, lens[0],
                                            lens[1], layout=layout_q, sparse_mode=0)
    return dq, dk, dw, y.to(torch.float32 if q.dtype != torch.float64 else q.dtype).reshape(sparse_indices.shape)


def _cumulative(lengths: list) -> list:
    out, total = [], 0
    for n in lengths:
        total += n
        out.append(total)
    return out


def _kl_visible(op: str, rows: c.Rows, k_lens: list, mask_mode: int, cmp_ratio: int, cmp_residual_k) -> Tensor:
    """Keys each row sees: all of its sequence (mask_mode 0) or the right-down causal prefix, over the compressed
    key when cmp_ratio > 1 (then with cmp_residual_k)."""
    k_len = torch.tensor(k_lens, dtype=torch.long)[rows.batch]
    if mask_mode == 0:
        return k_len
    res = c.residuals(op, "cmp_residual_k", cmp_residual_k, rows.batch_size, cmp_ratio) \
        if cmp_ratio > 1 or cmp_residual_k is not None else torch.zeros(rows.batch_size, dtype=torch.long)
    return c.compressed_visible(k_len, rows, cmp_ratio, res[rows.batch])
