"""Plain-PyTorch reference of sparse flash attention (the documented formula, token by token) and the input
builders the sparse flash attention tests share.

For query token i of sequence b and query head n (KV head n // G): the selected KV positions are, slot by slot,
[v * sparse_block_size, (v + 1) * sparse_block_size) for every index v != -1 of the token's row, clipped to the
sequence's KV length (and, in sparse_mode 3, to positions j <= kv_len - q_len + i); a position selected twice counts
twice. s_j = scale * (q · k_j + q_rope · k_rope_j); out = Σ e^{s_j - m} v_j / (Σ e^{s_j - m} + e^{sink - m}),
m = max(s, sink). No selected key: out 0, softmax_max -inf, softmax_sum 0 (with a sink: m = sink, sum 1)."""
import math
from typing import List, Optional

import torch
from torch import Tensor


def _ends(lengths) -> List[int]:
    return [int(x) for x in (lengths.tolist() if isinstance(lengths, Tensor) else lengths)]


def sequences_q(query: Tensor, layout: str, lq) -> List[Tensor]:
    """Per sequence: its query rows [q_len, N, D] (views of query)."""
    if layout == "TND":
        ends = _ends(lq)
        starts = [0] + ends[:-1]
        return [query[s:e] for s, e in zip(starts, ends)]
    lens = _ends(lq) if lq is not None else [query.shape[1]] * query.shape[0]
    return [query[b, :n] for b, n in enumerate(lens)]


def sequences_kv(key: Tensor, layout: str, lkv, block_table: Optional[Tensor], batch: int) -> List[Tensor]:
    """Per sequence: its KV rows [kv_len, N2, D] (gathered from the blocks of a paged cache)."""
    if layout == "TND":
        ends = _ends(lkv)
        starts = [0] + ends[:-1]
        return [key[s:e] for s, e in zip(starts, ends)]
    if layout == "PA_BSND":
        bs = key.shape[1]
        out = []
        for b, n in enumerate(_ends(lkv)):
            blocks = [key[int(block_table[b, j])] for j in range(math.ceil(n / bs))]
            rows = torch.cat(blocks, 0) if blocks else key[:0, 0]
            out.append(rows[:n])
        return out
    lens = _ends(lkv) if lkv is not None else [key.shape[1]] * batch
    return [key[b, :n] for b, n in enumerate(lens)]


def selected_positions(row: List[int], kv_len: int, q_len: int, i: int, sbs: int, sparse_mode: int) -> List[int]:
    limit = kv_len if sparse_mode == 0 else min(kv_len, kv_len - q_len + i + 1)
    pos = []
    for v in row:
        if v == -1:
            continue
        pos.extend(range(v * sbs, min(v * sbs + sbs, limit)))
    return pos


def sfa_reference(query, key, value, sparse_indices, scale, *, block_table=None, lq=None, lkv=None,
                  query_rope=None, key_rope=None, sbs=1, layout_query="BSND", layout_kv="BSND", sparse_mode=3,
                  sinks=None, dtype=torch.float64):
    """(out, softmax_max, softmax_sum) computed in `dtype` from tensors that may require grad (autograd flows).
    out has query's layout with value's head dim; the statistics have the op's layout (BSND [B, N2, S1, G], TND
    [N2, T1, G])."""
    cast = (lambda t: None if t is None else t.to(dtype))
    q, k, v, qr, kr = map(cast, (query, key, value, query_rope, key_rope))
    layout_kv = layout_kv or layout_query
    qs = sequences_q(q, layout_query, lq)
    qrs = sequences_q(qr, layout_query, lq) if qr is not None else [None] * len(qs)
    idx = sequences_q(sparse_indices, layout_query, lq)
    B = len(qs)
    ks = sequences_kv(k, layout_kv, lkv, block_table, B)
    vs = sequences_kv(v, layout_kv, lkv, block_table, B)
    krs = sequences_kv(kr, layout_kv, lkv, block_table, B) if kr is not None else [None] * B
    N1, N2 = q.shape[-2], k.shape[-2]
    G = N1 // N2
    Dv = v.shape[-1]
    out_rows, max_rows, sum_rows = [], [], []
    for b in range(B):
        q_len, kv_len = qs[b].shape[0], ks[b].shape[0]
        seq_out, seq_max, seq_sum = [], [], []
        for i in range(q_len):
            heads_out, heads_max, heads_sum = [], [], []
            for n2 in range(N2):
                pos = selected_positions([int(x) for x in idx[b][i, n2]], kv_len, q_len, i, sbs, sparse_mode)
                sel = torch.tensor(pos, dtype=torch.long)
                qg = qs[b][i, n2 * G:(n2 + 1) * G]                      # [G, D]
                kg = ks[b][sel, n2]                                     # [M, D]
                s = qg @ kg.t()
                if qr is not None:
                    s = s + qrs[b][i, n2 * G:(n2 + 1) * G] @ krs[b][sel, n2].t()
                s = s * scale                                           # [G, M]
                if sinks is not None:
                    sink = sinks[n2 * G:(n2 + 1) * G].to(dtype)[:, None]
                    m = torch.cat([s, sink], 1).max(1, keepdim=True).values
                    e = torch.exp(s - m)
                    den = e.sum(1, keepdim=True) + torch.exp(sink - m)
                elif len(pos) == 0:
                    heads_out.append(torch.zeros(G, Dv, dtype=dtype) + 0 * qg.sum())
                    heads_max.append(torch.full((G,), -math.inf, dtype=dtype))
                    heads_sum.append(torch.zeros(G, dtype=dtype))
                    continue
                else:
                    m = s.max(1, keepdim=True).values
                    e = torch.exp(s - m)
                    den = e.sum(1, keepdim=True)
                heads_out.append((e @ vs[b][sel, n2]) / den)
                heads_max.append(m[:, 0])
                heads_sum.append(den[:, 0])
            seq_out.append(torch.cat(heads_out, 0))                      # [N1, Dv]
            seq_max.append(torch.stack(heads_max, 0))                    # [N2, G]
            seq_sum.append(torch.stack(heads_sum, 0))
        out_rows.append(seq_out)
        max_rows.append(seq_max)
        sum_rows.append(seq_sum)
    # assemble in the op's layouts; padding rows (BSND beyond q_len) are 0 / -inf / 0
    if layout_query == "TND":
        T1 = query.shape[0]
        flat_o = [o for seq in out_rows for o in seq]
        flat_m = [m for seq in max_rows for m in seq]
        flat_s = [s for seq in sum_rows for s in seq]
        pad = T1 - len(flat_o)
        out = torch.stack(flat_o + [torch.zeros(N1, Dv, dtype=dtype)] * pad, 0)
        smax = torch.stack(flat_m + [torch.full((N2, G), -math.inf, dtype=dtype)] * pad, 1)
        ssum = torch.stack(flat_s + [torch.zeros(N2, G, dtype=dtype)] * pad, 1)
        return out, smax, ssum
    S1 = query.shape[1]
    outs, maxs, sums = [], [], []
    for b in range(B):
        pad = S1 - len(out_rows[b])
        outs.append(torch.stack(out_rows[b] + [torch.zeros(N1, Dv, dtype=dtype)] * pad, 0))
        maxs.append(torch.stack(max_rows[b] + [torch.full((N2, G), -math.inf, dtype=dtype)] * pad, 1))
        sums.append(torch.stack(sum_rows[b] + [torch.zeros(N2, G, dtype=dtype)] * pad, 1))
    return torch.stack(outs, 0), torch.stack(maxs, 0), torch.stack(sums, 0)


def make_inputs(*, layout_query="BSND", layout_kv="BSND", B=2, S1=3, N1=4, N2=1, Dn=32, Dr=8, S2=20, K=6, sbs=1,
                block_size=8, q_lens=None, kv_lens=None, dtype=torch.float32, seed=0, rope=True, fill=0.0):
    """Random inputs of one sparse flash attention call: a dict of the op's keyword arguments plus 'ref' (the
    arguments of sfa_reference). Indices are random blocks of the sequence (some -1 at the end of a row when
    `fill` > 0, duplicates possible)."""
    g = torch.Generator().manual_seed(seed)
    q_lens = list(q_lens) if q_lens is not None else [S1] * B
    kv_lens = list(kv_lens) if kv_lens is not None else [S2] * B
    if layout_query == "TND":
        T1 = sum(q_lens)
        query = torch.randn(T1, N1, Dn, generator=g)
        query_rope = torch.randn(T1, N1, Dr, generator=g) if rope else None
        lq = torch.tensor(q_lens).cumsum(0)
    else:
        query = torch.randn(B, S1, N1, Dn, generator=g)
        query_rope = torch.randn(B, S1, N1, Dr, generator=g) if rope else None
        lq = torch.tensor(q_lens) if q_lens != [S1] * B else None
    if layout_kv == "TND":
        T2 = sum(kv_lens)
        key = torch.randn(T2, N2, Dn, generator=g)
        key_rope = torch.randn(T2, N2, Dr, generator=g) if rope else None
        lkv = torch.tensor(kv_lens).cumsum(0)
        block_table = None
    elif layout_kv == "PA_BSND":
        per = [math.ceil(n / block_size) for n in kv_lens]
        nblocks = sum(per) + 2
        key = torch.randn(nblocks, block_size, N2, Dn, generator=g)
        key_rope = torch.randn(nblocks, block_size, N2, Dr, generator=g) if rope else None
        perm = torch.randperm(nblocks, generator=g)
        block_table = torch.zeros(B, max(per) + 1, dtype=torch.int32)
        used = 0
        for b, n in enumerate(per):
            block_table[b, :n] = perm[used:used + n]
            used += n
        lkv = torch.tensor(kv_lens)
    else:
        key = torch.randn(B, S2, N2, Dn, generator=g)
        key_rope = torch.randn(B, S2, N2, Dr, generator=g) if rope else None
        lkv = torch.tensor(kv_lens) if kv_lens != [S2] * B else None
        block_table = None
    value = key if rope else torch.randn(key.shape[:-1] + (Dn + 4,), generator=g)
    rows = query.shape[0] if layout_query == "TND" else B * S1
    # per query row: blocks of its sequence's KV (drawn below the sequence length; -1 tails)
    row_batch = []
    for b, n in enumerate(q_lens):
        row_batch += [b] * (n if layout_query == "TND" else S1)
    idx = torch.full((rows, N2, K), -1, dtype=torch.int32)
    for r in range(rows):
        nblk = max(1, math.ceil(kv_lens[row_batch[r]] / sbs))
        for n2 in range(N2):
            valid = K - int(round(fill * K * float(torch.rand(1, generator=g))))
            idx[r, n2, :valid] = torch.randint(0, nblk, (valid,), generator=g, dtype=torch.int32)
    if layout_query != "TND":
        idx = idx.view(B, S1, N2, K)
    cast = (lambda t: None if t is None else t.to(dtype))
    query, key, query_rope, key_rope = map(cast, (query, key, query_rope, key_rope))
    value = key if rope else value.to(dtype)
    kwargs = dict(block_table=block_table, actual_seq_lengths_query=lq, actual_seq_lengths_kv=lkv,
                  query_rope=query_rope, key_rope=key_rope, sparse_block_size=sbs, layout_query=layout_query,
                  layout_kv=layout_kv, attention_mode=2 if rope else 0)
    return dict(query=query, key=key, value=value, sparse_indices=idx, scale_value=1.0 / math.sqrt(Dn + Dr),
                kwargs=kwargs)


def reference_of(inp, dtype=torch.float64, sparse_mode=3, sinks=None, **tensors):
    """sfa_reference of make_inputs' call (tensors overridden by name, e.g. leaves that require grad)."""
    t = dict(query=inp["query"], key=inp["key"], value=inp["value"], query_rope=inp["kwargs"]["query_rope"],
             key_rope=inp["kwargs"]["key_rope"])
    t.update(tensors)
    kw = inp["kwargs"]
    return sfa_reference(t["query"], t["key"], t["value"], inp["sparse_indices"], inp["scale_value"],
                         block_table=kw["block_table"], lq=kw["actual_seq_lengths_query"],
                         lkv=kw["actual_seq_lengths_kv"], query_rope=t["query_rope"], key_rope=t["key_rope"],
                         sbs=kw["sparse_block_size"], layout_query=kw["layout_query"], layout_kv=kw["layout_kv"],
                         sparse_mode=sparse_mode, sinks=sinks, dtype=dtype)
