"""Plain-PyTorch references of the MoE routing ops (CANN ops-transformer semantics), written independently of the
kernels: argsort / gather / index_put instead of counting sorts. Selections (top-k, sorts) are made on float64 values
with stable sorts, so ties go to the lower index; arithmetic runs in `dtype` (float64 for ref64, the inputs' dtype
for the "torch_same_dtype" baseline of the tolerance rule). act_ref: the activations of grouped_matmul's act_type
(also those of MOELayer's experts)."""
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def act_ref(x, act):
    """The activations of act_type, in plain PyTorch (any dtype)."""
    if act == 1:
        return F.relu(x)
    if act == 2:
        return F.gelu(x, approximate="tanh")
    if act == 4:
        return x * torch.sigmoid(1.702 * x)
    if act == 5:
        return F.silu(x)
    return x


def split_m_ref(x, w, b, counts, act, dtype):
    """Group by group in `dtype`: rows of group e times w[e] (+ b[e]), then the activation."""
    outs, r0 = [], 0
    for e, c in enumerate(counts):
        y = x[r0:r0 + c].to(dtype) @ w[e].to(dtype)
        if b is not None:
            y = y + b[e].to(dtype)
        outs.append(act_ref(y, act))
        r0 += c
    return torch.cat(outs)


def top_k_stable(v: Tensor, k: int) -> Tensor:
    """Indices of the k largest entries of the last dim, lower index first on ties."""
    return torch.sort(v.double(), dim=-1, descending=True, stable=True).indices[..., :k]


def gating_softmax(x: Tensor, k: int, finished: Optional[Tensor] = None, renorm: int = 0, dtype=torch.float64):
    """(y, expert_idx, row_idx, softmax) of moe_gating_top_k_softmax(_v2)."""
    e = x.shape[-1]
    idx = top_k_stable(x, k)
    xv = x.to(dtype)
    if renorm == 0:
        p = torch.softmax(xv, dim=-1)
        y = p.gather(-1, idx)
    else:
        p = torch.softmax(xv, dim=-1)
        y = torch.softmax(xv.gather(-1, idx), dim=-1)
    expert = idx.clone()
    if finished is not None:
        expert[finished] = e
    n = x.numel() // e
    rows = torch.arange(n).reshape(x.shape[:-1])
    row_idx = torch.stack([j * n + rows for j in range(k)], dim=-1)
    return y, expert.int(), row_idx.int(), p


def gating_group(x: Tensor, k: int, bias=None, k_group=1, group_count=1, group_select_mode=0, norm_type=0,
                 routed_scaling_factor=1.0, eps=1e-20, dtype=torch.float64):
    """(y, expert_idx, norm) of moe_gating_top_k (DeepSeek-V3 group-limited routing)."""
    s64 = torch.softmax(x.double(), -1) if norm_type == 0 else torch.sigmoid(x.double())
    sel = s64 + (bias.double() if bias is not None else 0)
    n, e = x.shape
    if group_count > 1:
        grouped = sel.view(n, group_count, e // group_count)
        if group_select_mode == 0:
            score = grouped.max(-1).values
        else:
            score = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2].sum(-1)
        keep = torch.zeros(n, group_count, dtype=torch.bool)
        keep.scatter_(1, top_k_stable(score, k_group), True)
        sel = sel.masked_fill(~keep.repeat_interleave(e // group_count, dim=1), float("-inf"))
    idx = top_k_stable(sel, k)
    s = torch.softmax(x.to(dtype), -1) if norm_type == 0 else torch.sigmoid(x.to(dtype))
    y = s.gather(-1, idx)
    if norm_type == 1:  # sigmoid scores are normalised over the k selected; softmax probabilities are not
        y = y / (y.sum(-1, keepdim=True) + eps)
    return y * routed_scaling_factor, idx.int(), s


def init_routing_v1(x: Tensor, row_idx: Tensor, expert_idx: Tensor, active_num: int):
    n, k = expert_idx.shape
    order = torch.sort(expert_idx.flatten().long(), stable=True).indices
    sorted_row = row_idx.flatten().long()[order]
    expanded_row_idx = torch.empty(n * k, dtype=torch.long)
    expanded_row_idx[sorted_row] = torch.arange(n * k)
    kept = min(n, active_num) * k
    return x[sorted_row[:kept] % n], expanded_row_idx.int(), expert_idx.flatten()[order].int()


def init_routing_v2(x: Tensor, expert_idx: Tensor, active_num=-1, expert_capacity=-1, expert_num=-1,
                    drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False,
                    active_expert_range: Sequence[int] = (), row_idx_type=0, scale=None):
    """(expanded_x, expanded_row_idx, expert_tokens, expanded_scale) of moe_init_routing_v2."""
    n = x.shape[0]
    k = expert_idx.shape[1] if expert_idx.dim() == 2 else 1
    flat = expert_idx.flatten().long()
    lo, hi = (active_expert_range if len(active_expert_range) else (0, expert_num if expert_num > 0 else None))
    inside = (flat >= lo) & (flat < hi) if hi is not None else torch.ones_like(flat, dtype=torch.bool)
    # The NPU sorts int32 expert ids with the experts below the range replaced by INT32_MAX: the routed pairs come
    # first, then the others above the range by expert, then those below it (ties in pair order, a stable sort).
    int32_max = torch.iinfo(torch.int32).max
    key = torch.where(flat < lo, torch.full_like(flat, int32_max), flat.clamp(max=int32_max))
    key = torch.where(inside, flat - (1 << 40), key)  # (the routed ones before every other, also int32_max)
    order = torch.sort(key, stable=True).indices
    routed = int(inside.sum())
    dest = torch.full((n * k,), -1, dtype=torch.long)
    if drop_pad_mode == 0:
        rows = min(active_num, n * k) if active_num > 0 else n * k
        kept = min(routed, rows)
        dest[order[:routed]] = torch.arange(routed)  # sorted positions, also past the rows active_num keeps
        out = torch.zeros(rows, x.shape[1], dtype=x.dtype)
        out[:kept] = x[order[:kept] // k]
        src = torch.full((rows,), -1, dtype=torch.long)
        src[:kept] = order[:kept]
        counted = flat[order[:kept]]
    else:
        c = expert_capacity
        e_sorted = flat[order]
        first = torch.searchsorted(e_sorted, e_sorted, right=False)  # start of each expert's run
        pos = torch.arange(n * k) - first
        ok = pos < c
        slots = e_sorted * c + pos
        dest[order[ok]] = slots[ok]
        out = torch.zeros(expert_num * c, x.shape[1], dtype=x.dtype)
        out[slots[ok]] = x[order[ok] // k]
        out = out.view(expert_num, c, x.shape[1])
        src = torch.full((expert_num * c,), -1, dtype=torch.long)
        src[slots[ok]] = order[ok]
        counted = flat
    if row_idx_type == 1:  # the whole sorted order, the pairs outside the range included
        row_out = order
    else:
        row_out = dest
    tokens = torch.empty(0, dtype=torch.long)
    if expert_tokens_num_flag:
        width = hi - lo
        cnt = torch.bincount(counted[(counted >= lo) & (counted < hi)] - lo, minlength=width)
        tokens = cnt if expert_tokens_num_type == 1 else cnt.cumsum(0)
    expanded_scale = torch.empty(0)
    if scale is not None:
        gathered = scale[(src // k).clamp(min=0)] if scale.numel() else torch.zeros(src.shape)  # (no tokens)
        expanded_scale = torch.where(src >= 0, gathered, torch.zeros(()))
    return out, row_out.int(), tokens, expanded_scale


def finalize(rows: Tensor, skip1, skip2, bias, scales, dst_row: Tensor, experts, drop_pad_mode=0, n=None,
             dtype=torch.float64):
    """moe_finalize_routing: out[i] = skip1 + skip2 + sum_j scales[i,j] * (rows[r] + bias[e]); r = -1, or a sorted
    position past the rows (dropless modes), skipped. Pairs may read the same row."""
    h = rows.shape[-1]
    rows = rows.reshape(-1, h).to(dtype)
    n = n if n is not None else next(t.shape[0] for t in (skip1, scales, experts) if t is not None)
    k = dst_row.numel() // n
    r = dst_row.long().view(k, n).t() if drop_pad_mode <= 1 else dst_row.long().view(n, k)
    out = torch.zeros(n, h, dtype=dtype)
    for t in (skip1, skip2):
        if t is not None:
            out = out + t.to(dtype)
    for j in range(k):
        valid = ((r[:, j] >= 0) & (r[:, j] < rows.shape[0])).to(dtype)[:, None]
        term = rows[r[:, j].clamp(min=0, max=max(rows.shape[0] - 1, 0))]
        if bias is not None:
            term = term + bias.to(dtype)[experts[:, j].long()]
        w = scales[:, j].to(dtype)[:, None] if scales is not None else 1.0
        out = out + valid * w * term
    return out


def token_permute(tokens: Tensor, indices: Tensor, num_out_tokens=None):
    topk = indices.shape[1] if indices.dim() == 2 else 1
    n = indices.numel()
    order = torch.sort(indices.flatten().long(), stable=True).indices
    v = num_out_tokens or 0
    rows = n if v == 0 else (min(v, n) if v > 0 else max(n + v, 0))
    return tokens[order[:rows] // topk], torch.argsort(order).int()


def token_unpermute(permuted: Tensor, sorted_indices: Tensor, probs=None, dtype=torch.float64):
    topk = probs.shape[1] if probs is not None else 1
    n = sorted_indices.numel()
    src = sorted_indices.long()
    valid = ((src >= 0) & (src < permuted.shape[0])).to(dtype)[:, None]  # -1: routed nowhere
    full = permuted.to(dtype)[src.clamp(min=0, max=max(permuted.shape[0] - 1, 0))] * valid
    full = full.view(n // topk, topk, -1)
    if probs is not None:
        full = full * probs.to(dtype)[..., None]
    return full.sum(1)
