"""cann_ops_transformer's sparse_flash_mla (+ _grad) with upstream's Python signatures, on this package's
npu_sparse_flash_attention (+ _grad): docs/sparse_attention.md, "cann_ops_transformer stand-in".

Upstream attends, per query token, to one softmax over two shared-KV sources: a window of the original cache
`ori_kv` and the compressed cache `cmp_kv` (all of its visible entries, or the ones `cmp_sparse_indices` picks).
Here each sequence's two sources are gathered into one KV sequence [ori tokens, cmp tokens] (TND), and each query
row's visible entries become its row of `sparse_indices` (block size 1, no mask of our own), so our op computes
exactly that softmax; the gradient of the gathered cache is scattered back to `ori_kv` and `cmp_kv`."""
import math
from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import Tensor

from ...sparse_attention import npu_sparse_flash_attention, npu_sparse_flash_attention_grad
from . import _common as c

_LAYOUTS_KV = ("BSND", "TND", "PA_BBND")


@dataclass
class _Source:
    """One KV source flattened to rows [N, N2, D], the rows of each sequence's tokens and its token counts."""
    flat: Tensor
    rows: List[Tensor]
    lens: List[int]


def _source(op: str, name: str, kv: Optional[Tensor], layout_kv: str, batch: int, cu, seqused, block_table,
            default_lens: Optional[List[int]] = None) -> Optional[_Source]:
    if kv is None:
        return None
    c.tensor(op, name, kv)
    want_dim = 3 if layout_kv == "TND" else 4
    if kv.dim() != want_dim:
        raise ValueError(f"{op}: argument '{name}' must be {want_dim}-D for layout_kv {layout_kv!r}; got shape "
                         f"{tuple(kv.shape)}")
    used = c.host_ints(op, f"seqused_{name}", seqused, batch)
    if layout_kv == "TND":
        ends = c.cumulative(op, f"cu_seqlens_{name}", cu, "for layout_kv 'TND'")
        if len(ends) != batch or ends[-1] > kv.shape[0]:
            raise ValueError(f"{op}: argument 'cu_seqlens_{name}' must describe {batch} sequences within the "
                             f"{kv.shape[0]} tokens of '{name}'; got ends {ends}")
        lens = used if used is not None else c.lengths_from(ends)
        starts = [e - n for e, n in zip(ends, c.lengths_from(ends))]
        return _Source(kv, [s + torch.arange(n) for s, n in zip(starts, lens)], lens)
    if layout_kv == "BSND":
        if kv.shape[0] != batch:
            raise ValueError(f"{op}: argument '{name}' must have the query's batch {batch}; got {kv.shape[0]}")
        lens = used if used is not None else [kv.shape[1]] * batch
        return _Source(kv.reshape(-1, kv.shape[2], kv.shape[3]),
                       [b * kv.shape[1] + torch.arange(n) for b, n in enumerate(lens)], lens)
    return _paged(op, name, kv, batch, used if used is not None else default_lens, block_table)


def _paged(op, name, kv, batch, lens, block_table) -> _Source:
    """A paged cache [blocks, block_size, N2, D]: token j of sequence b is row j % block_size of block
    block_table[b, j // block_size]."""
    if lens is None:
        raise ValueError(f"{op}: argument 'seqused_{name}' is required for layout_kv 'PA_BBND'")
    table_name = f"{name[:3]}_block_table"
    if not isinstance(block_table, Tensor) or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"{op}: argument '{table_name}' must be a [B={batch}, max_blocks] tensor for layout_kv "
                         f"'PA_BBND'; got {block_table if not isinstance(block_table, Tensor) else block_table.shape}")
    bs = kv.shape[1]
    table = block_table.cpu().to(torch.int64)
    rows = []
    for b, n in enumerate(lens):
        j = torch.arange(n)
        if n and (n - 1) // bs >= table.shape[1]:
            raise ValueError(f"{op}: argument '{table_name}' has too few blocks for the {n} tokens of sequence {b}")
        blocks = table[b, j // bs]
        if n and (blocks.min() < 0 or blocks.max() >= kv.shape[0]):
            raise ValueError(f"{op}: argument '{table_name}' names a block outside the {kv.shape[0]} of '{name}'")
        rows.append(blocks * bs + j % bs)
    return _Source(kv.reshape(-1, kv.shape[2], kv.shape[3]), rows, list(lens))


@dataclass
class _Selection:
    kv: Tensor             # the gathered sequences [sum_b (ori_len + cmp_len), N2, D]
    gather: Tensor         # kv = cat(ori.flat, cmp.flat)[gather]
    n_ori: int             # rows of ori.flat (the cmp rows follow it in the concatenation)
    indices: Tensor        # int32 [R, N2, K_ori + K_cmp]: positions in each gathered sequence, -1 unused
    k_ori: int             # the window's slots come first
    kv_ends: List[int]     # cumulative lengths of the gathered sequences


def _window(rows: c.Rows, ori_len: Tensor, mode: int, left: int, right: int, max_len: int) -> Tensor:
    """The ori_kv entries of each row, [R, K] (-1 unused): all (mode 0), the causal prefix (3) or the band
    [p - left, p + right] (4, -1 = unbounded side), p = ori_len - q_len + i (aligned to the bottom right)."""
    p = ori_len - rows.q_len + rows.local
    start = torch.zeros_like(p)
    end = ori_len - 1
    width = max_len
    if mode == 3:
        end = torch.minimum(end, p)
    elif mode == 4:
        if left >= 0:
            start = p - left
        if right >= 0:
            end = torch.minimum(end, p + right)
        if left >= 0 and right >= 0:
            width = min(width, left + right + 1)
    start = start.clamp(min=0)
    entries = start.view(-1, 1) + torch.arange(width).view(1, -1)
    return torch.where(entries <= end.view(-1, 1), entries, -1)


def _compressed(op, rows, cmp_len, cmp_indices, n2, mode, ratio, residual, max_len) -> Tensor:
    """The cmp_kv entries of each row, [R, N2, K] (-1 unused): cmp_sparse_indices' picks or every entry, keeping
    those the row sees (cmp_mask_mode 3: the compressed groups that end at or before the token)."""
    seen = c.compressed_visible(cmp_len, rows, ratio, residual) if mode == 3 else cmp_len
    if cmp_indices is None:
        entries = torch.arange(max_len).view(1, 1, -1).expand(rows.batch.shape[0], n2, -1)
    else:
        if cmp_indices.dtype != torch.int32:
            raise TypeError(f"{op}: argument 'cmp_sparse_indices' must be int32; got {cmp_indices.dtype}")
        entries = cmp_indices.reshape(rows.batch.shape[0], n2, -1).cpu().to(torch.int64)
    return torch.where((entries >= 0) & (entries < seen.view(-1, 1, 1)), entries, -1)


def _select(op, q, rows, ori, cmp, cmp_indices, cmp_residual_kv, cmp_ratio, ori_mask_mode, cmp_mask_mode,
            ori_win_left, ori_win_right) -> _Selection:
    batch = rows.batch_size
    some = ori if ori is not None else cmp
    n2, d = some.flat.shape[1], some.flat.shape[2]
    ori_lens = ori.lens if ori is not None else [0] * batch
    ori_len = torch.tensor(ori_lens, dtype=torch.long)[rows.batch]
    parts = []
    if ori is not None:
        win = _window(rows, ori_len, ori_mask_mode, ori_win_left, ori_win_right, max(ori_lens, default=0))
        parts.append(win.view(win.shape[0], 1, -1).expand(-1, n2, -1))
    k_ori = parts[0].shape[-1] if parts else 0
    if cmp is not None:
        residual = None
        if cmp_mask_mode == 3:
            residual = c.residuals(op, "cmp_residual_kv", cmp_residual_kv, batch, cmp_ratio)[rows.batch] \
                if cmp_ratio > 1 or cmp_residual_kv is not None else None
        ent = _compressed(op, rows, torch.tensor(cmp.lens, dtype=torch.long)[rows.batch], cmp_indices, n2,
                          cmp_mask_mode, cmp_ratio, residual, max(cmp.lens, default=0))
        parts.append(torch.where(ent >= 0, ent + ori_len.view(-1, 1, 1), -1))
    indices = torch.cat(parts, -1) if parts else torch.empty(rows.batch.shape[0], n2, 0, dtype=torch.long)
    indices = indices.masked_fill(~rows.valid.view(-1, 1, 1), -1).to(torch.int32)
    n_ori = ori.flat.shape[0] if ori is not None else 0
    gather, ends, total = [], [], 0
    for b in range(batch):
        if ori is not None:
            gather.append(ori.rows[b])
        if cmp is not None:
            gather.append(cmp.rows[b] + n_ori)
        total += ori_lens[b] + (cmp.lens[b] if cmp is not None else 0)
        ends.append(total)
    flat = torch.cat([s.flat for s in (ori, cmp) if s is not None])
    index = torch.cat(gather).to(flat.device) if gather else torch.empty(0, dtype=torch.long)
    return _Selection(flat.index_select(0, index), index, n_ori, indices.to(q.device), k_ori, ends)


def _checks(op, q, layout_q, layout_kv, ori_kv, cmp_kv, cmp_ratio, ori_mask_mode, cmp_mask_mode, reserved):
    c.tensor(op, "q", q)
    c.choice(op, "layout_q", layout_q, c.LAYOUTS_Q)
    c.choice(op, "layout_kv", layout_kv, _LAYOUTS_KV)
    if layout_kv != "PA_BBND" and layout_kv != layout_q:
        raise ValueError(f"{op}: argument 'layout_kv' must be layout_q ({layout_q!r}) or 'PA_BBND'; got "
                         f"{layout_kv!r}")
    c.int_in(op, "cmp_ratio", cmp_ratio, 1, 128)
    c.choice(op, "ori_mask_mode", ori_mask_mode, (0, 3, 4))
    c.choice(op, "cmp_mask_mode", cmp_mask_mode, (0, 3))
    if ori_kv is None and cmp_kv is None:
        raise ValueError(f"{op}: arguments 'ori_kv' and 'cmp_kv' are both None; at least one KV source is needed")
    for name, value in reserved.items():
        if value is not None:
            raise c.not_supported(op, name, "a tensor", "reserved upstream (it must be None in this release)")


def _lse_layout(stats: Tensor, layout_q: str, q: Tensor) -> Tensor:
    """Our TND statistics [N2, T1, G] in upstream's softmax_lse layout ([B, N2, S1, G] for BSND)."""
    if layout_q == "TND":
        return stats
    return stats.view(stats.shape[0], q.shape[0], q.shape[1], stats.shape[2]).permute(1, 0, 2, 3).contiguous()


def _tnd_stats(lse: Tensor, layout_q: str) -> Tensor:
    return lse if layout_q == "TND" else lse.permute(1, 0, 2, 3).reshape(lse.shape[1], -1, lse.shape[3])


def _prepare(op, q, ori_kv, cmp_kv, cmp_sparse_indices, ori_block_table, cmp_block_table, cu_seqlens_q,
             cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q, seqused_ori_kv, seqused_cmp_kv, cmp_residual_kv,
             cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right, layout_q, layout_kv):
    rows = c.query_rows(op, q, layout_q, cu_seqlens_q, seqused_q)
    batch = rows.batch_size
    ori = _source(op, "ori_kv", ori_kv, layout_kv, batch, cu_seqlens_ori_kv, seqused_ori_kv, ori_block_table)
    # a paged cmp cache without seqused_cmp_kv holds the complete cmp_ratio groups of the original tokens
    default = [n // cmp_ratio for n in ori.lens] if ori is not None else None
    cmp = _source(op, "cmp_kv", cmp_kv, layout_kv, batch, cu_seqlens_cmp_kv, seqused_cmp_kv, cmp_block_table,
                  default)
    sel = _select(op, q, rows, ori, cmp, cmp_sparse_indices, cmp_residual_kv, cmp_ratio, ori_mask_mode,
                  cmp_mask_mode, ori_win_left, ori_win_right)
    return rows, ori, cmp, sel


def sparse_flash_mla(q, *, ori_kv=None, cmp_kv=None, ori_sparse_indices=None, cmp_sparse_indices=None,
                     ori_block_table=None, cmp_block_table=None, cu_seqlens_q=None, cu_seqlens_ori_kv=None,
                     cu_seqlens_cmp_kv=None, seqused_q=None, seqused_ori_kv=None, seqused_cmp_kv=None,
                     cmp_residual_kv=None, ori_topk_length=None, cmp_topk_length=None, sinks=None, metadata=None,
                     softmax_scale=1.0, cmp_ratio=1, ori_mask_mode=0, cmp_mask_mode=0, ori_win_left=-1,
                     ori_win_right=-1, layout_q="BSND", layout_kv="BSND", topk_value_mode=1,
                     return_softmax_lse=False):
    """cann_ops_transformer.sparse_flash_mla: (attention_out in q's shape and dtype, softmax_lse float32 [B, N2, S1,
    G] / [N2, T1, G] when return_softmax_lse, else a 0-d placeholder), on npu_sparse_flash_attention. Differentiable
    in q, ori_kv, cmp_kv and sinks. `metadata` is a tiling hint on the NPU and is not needed here."""
    op = "cann_ops_transformer.sparse_flash_mla"
    _checks(op, q, layout_q, layout_kv, ori_kv, cmp_kv, cmp_ratio, ori_mask_mode, cmp_mask_mode,
            {"ori_sparse_indices": ori_sparse_indices, "ori_topk_length": ori_topk_length,
             "cmp_topk_length": cmp_topk_length})
    c.choice(op, "topk_value_mode", topk_value_mode, (1,))
    rows, _, _, sel = _prepare(op, q, ori_kv, cmp_kv, cmp_sparse_indices, ori_block_table, cmp_block_table,
                               cu_seqlens_q, cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q, seqused_ori_kv,
                               seqused_cmp_kv, cmp_residual_kv, cmp_ratio, ori_mask_mode, cmp_mask_mode,
                               ori_win_left, ori_win_right, layout_q, layout_kv)
    n1, d = q.shape[-2], q.shape[-1]
    out, smax, ssum = npu_sparse_flash_attention(
        q.reshape(-1, n1, d), sel.kv, sel.kv, sel.indices, float(softmax_scale), actual_seq_lengths_query=rows.ends,
        actual_seq_lengths_kv=sel.kv_ends, layout_query="TND", layout_kv="TND", sparse_mode=0, attention_mode=0,
        return_softmax_lse=bool(return_softmax_lse), sinks=sinks)
    if not return_softmax_lse:
        return out.view(q.shape), torch.zeros((), dtype=torch.float32, device=q.device)
    return out.view(q.shape), _lse_layout(smax + ssum.log(), layout_q, q)


def sparse_flash_mla_grad(q, dout, attn_out, softmax_lse, *, ori_kv=None, cmp_kv=None, ori_sparse_indices=None,
                          cmp_sparse_indices=None, cu_seqlens_q=None, cu_seqlens_ori_kv=None, cu_seqlens_cmp_kv=None,
                          seqused_q=None, seqused_ori_kv=None, seqused_cmp_kv=None, cmp_residual_kv=None,
                          ori_topk_length=None, cmp_topk_length=None, sinks=None, metadata=None,
                          softmax_scale=None, cmp_ratio=None, ori_mask_mode=0, cmp_mask_mode=0, ori_win_left=-1,
                          ori_win_right=-1, layout_q="BSND", layout_kv="BSND"):
    """cann_ops_transformer.sparse_flash_mla_grad: (dq, dori_kv, dcmp_kv, dsinks, ori_softmax_l1norm,
    cmp_softmax_l1norm) from the forward's attn_out and softmax_lse, on npu_sparse_flash_attention_grad. dcmp_kv /
    dsinks are None without cmp_kv / sinks; cmp_softmax_l1norm (float32, cmp_sparse_indices' shape) is the mean
    over the G query heads of the probabilities of the picked cmp entries, None without cmp_sparse_indices;
    ori_softmax_l1norm is None (ori_sparse_indices is not implemented)."""
    op = "cann_ops_transformer.sparse_flash_mla_grad"
    cmp_ratio = 1 if cmp_ratio is None else cmp_ratio
    _checks(op, q, layout_q, layout_kv, ori_kv, cmp_kv, cmp_ratio, ori_mask_mode, cmp_mask_mode,
            {"ori_sparse_indices": ori_sparse_indices, "ori_topk_length": ori_topk_length,
             "cmp_topk_length": cmp_topk_length})
    if layout_kv != layout_q:
        raise ValueError(f"{op}: argument 'layout_kv' must be layout_q ({layout_q!r}); got {layout_kv!r}")
    for name, t in (("dout", dout), ("attn_out", attn_out), ("softmax_lse", softmax_lse)):
        c.tensor(op, name, t)
    if cmp_sparse_indices is not None and cmp_kv is None:
        raise ValueError(f"{op}: argument 'cmp_sparse_indices' needs cmp_kv (it picks cmp_kv entries)")
    n1, d = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    rows, ori, cmp, sel = _prepare(op, q, ori_kv, cmp_kv, cmp_sparse_indices, None, None, cu_seqlens_q,
                                   cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q, seqused_ori_kv, seqused_cmp_kv,
                                   cmp_residual_kv, cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left,
                                   ori_win_right, layout_q, layout_kv)
    lse = _tnd_stats(softmax_lse, layout_q)
    # softmax_max = lse with softmax_sum = 1 gives our kernel the same probabilities exp(s - lse)
    grads = npu_sparse_flash_attention_grad(
        q.reshape(-1, n1, d), sel.kv, sel.kv, sel.indices, dout.reshape(-1, n1, d), attn_out.reshape(-1, n1, d),
        lse, torch.ones_like(lse), scale, 1, None, None, rows.ends, sel.kv_ends, "TND", 0, attention_mode=0,
        layout_kv="TND", sinks=sinks)
    d_kv = torch.zeros(sel.n_ori + (cmp.flat.shape[0] if cmp is not None else 0), *sel.kv.shape[1:],
                       dtype=torch.float32 if q.dtype != torch.float64 else q.dtype, device=q.device)
    d_kv.index_add_(0, sel.gather, (grads[1] + grads[2]).to(d_kv.dtype))
    d_ori = d_kv[:sel.n_ori].to(ori_kv.dtype).view(ori_kv.shape) if ori_kv is not None else None
    d_cmp = d_kv[sel.n_ori:].to(cmp_kv.dtype).view(cmp_kv.shape) if cmp_kv is not None else None
    d_sinks = grads[5] if sinks is not None else None
    l1 = _cmp_l1norm(q, sel, lse, scale, rows, cmp_sparse_indices) if cmp_sparse_indices is not None else None
    return grads[0].view(q.shape), d_ori, d_cmp, d_sinks, None, l1


def _cmp_l1norm(q, sel: _Selection, lse: Tensor, scale: float, rows: c.Rows, cmp_sparse_indices) -> Tensor:
    """Mean over the G query heads of a KV head of p = exp(scale * q . kv - lse) at each picked cmp entry (0 where
    the entry is unused or unseen): the target distribution of the indexer's KL loss."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    slots = sel.indices[..., sel.k_ori:].to(torch.int64)  # [R, N2, K]
    n_rows, n2, _ = slots.shape
    n1, d = q.shape[-2], q.shape[-1]
    starts = torch.tensor([0] + sel.kv_ends[:-1], dtype=torch.long, device=slots.device)[rows.batch.to(slots.device)]
    row_ids = torch.where(slots >= 0, slots + starts.view(-1, 1, 1), 0)
    kv_rows = sel.kv.detach()[row_ids, torch.arange(n2, device=slots.device).view(1, -1, 1)].to(acc)
    qh = q.detach().reshape(n_rows, n2, n1 // n2, d).to(acc)
    s = scale * torch.einsum("rngd,rnjd->rngj", qh, kv_rows)
    p = torch.exp(s - lse.permute(1, 0, 2).reshape(n_rows, n2, -1, 1).to(acc))
    p = p.masked_fill((slots < 0).view(n_rows, n2, 1, -1), 0.0)
    return p.mean(2).to(torch.float32 if acc == torch.float32 else acc).reshape(cmp_sparse_indices.shape)
