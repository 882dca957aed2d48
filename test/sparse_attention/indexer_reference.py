"""Plain-PyTorch references of the lightning indexer (written from the documented formulas, not from our kernels):
sequences split from the layouts, the scores sum_h w_h * ReLU(q_h . k_s) per key head, the right-down causal rule,
the descending selection with ties to the lower position, and the KL loss of the indexer against the main attention."""
import torch


def split_query(x, layout, lengths):
    """[(start row, q_len)] per sequence and x as [rows, ...] (BSND flattened over B, S1)."""
    if layout == "TND":
        ends = [int(v) for v in lengths]
        starts = [0] + ends[:-1]
        return x, [(s, e - s) for s, e in zip(starts, ends)]
    B, S1 = x.shape[:2]
    lens = [S1] * B if lengths is None else [int(v) for v in lengths]
    return x.reshape(B * S1, *x.shape[2:]), [(b * S1, lens[b]) for b in range(B)]


def gather_keys(key, layout, lengths, block_table, B):
    """Per sequence, its key tokens [k_len, N2, D] (a view or a gather of the paged cache)."""
    if layout == "TND":
        ends = [int(v) for v in lengths]
        starts = [0] + ends[:-1]
        return [key[s:e] for s, e in zip(starts, ends)]
    if layout == "BSND":
        S2 = key.shape[1]
        lens = [S2] * B if lengths is None else [int(v) for v in lengths]
        return [key[b, :lens[b]] for b in range(B)]
    bs = key.shape[1]
    out = []
    for b in range(B):
        n = int(lengths[b])
        rows = [key[int(block_table[b, s // bs]), s % bs] for s in range(n)]
        out.append(torch.stack(rows) if rows else key.new_zeros(0, *key.shape[2:]))
    return out


def visible(q_len, k_len, sparse_mode):
    """Keys query i sees: all k_len (mode 0), or k_len - q_len + i + 1 clipped to [0, k_len] (mode 3)."""
    if sparse_mode == 0:
        return [k_len] * q_len
    return [max(0, min(k_len, k_len - q_len + i + 1)) for i in range(q_len)]


def indexer_scores(q, k, w, qscale=None, kscale=None):
    """q [T, N1, D], k [S, N2, D], w [T, N1] -> scores [T, N2, S] = sum_h w * ReLU(q_h . k) over each key head's
    group of query heads (quantised form: the dot product times qscale [T, N1] * kscale [S, N2] before the ReLU)."""
    T, N1, D = q.shape
    S, N2, _ = k.shape
    G = N1 // N2
    dots = torch.einsum("tngd,snd->tngs", q.reshape(T, N2, G, D), k)
    if qscale is not None:
        dots = dots * qscale.reshape(T, N2, G, 1) * kscale.t().reshape(1, N2, 1, S)
    return (dots.clamp_min(0) * w.reshape(T, N2, G, 1)).sum(2)


def lightning_indexer_ref(query, key, weights, *, asq=None, ask=None, block_table=None, layout_query="BSND",
                          layout_key="BSND", sparse_count=2048, sparse_mode=3, qscale=None, kscale=None,
                          round_dtype=None, dtype=torch.float64):
    """(indices int64 of the output's shape, scores per row: list of (row, n2, [vis] score tensor in `dtype`)).
    Scores are computed in `dtype` and, for the selection, rounded to round_dtype."""
    qf, seqs = split_query(query.to(dtype), layout_query, asq)
    wf, _ = split_query(weights.to(dtype), layout_query, asq)
    qsf = split_query(qscale.to(dtype), layout_query, asq)[0] if qscale is not None else None
    B = len(seqs)
    keys = gather_keys(key.to(dtype), layout_key, ask, block_table, B)
    kss = gather_keys(kscale.to(dtype).unsqueeze(-1), layout_key, ask, block_table, B) if kscale is not None else None
    N2 = key.shape[-2]
    rows = qf.shape[0]
    idx = torch.full((rows, N2, sparse_count), -1, dtype=torch.int64)
    rows_scores = []
    for b, (start, q_len) in enumerate(seqs):
        if q_len == 0:
            continue
        kb = keys[b]
        sc = indexer_scores(qf[start:start + q_len], kb, wf[start:start + q_len],
                            qsf[start:start + q_len] if qsf is not None else None,
                            kss[b].squeeze(-1) if kss is not None else None)
        for i, vis in enumerate(visible(q_len, kb.shape[0], sparse_mode)):
            for n2 in range(N2):
                s = sc[i, n2, :vis]
                rows_scores.append((start + i, n2, s))
                if vis == 0:
                    continue
                key_s = s.to(round_dtype).to(dtype) if round_dtype is not None else s
                order = torch.sort(-key_s, stable=True).indices[:sparse_count]
                idx[start + i, n2, :order.numel()] = order
    shape = (*query.shape[:-2], N2, sparse_count)
    return idx.reshape(shape), rows_scores


def kl_loss_ref(query, key, query_index, key_index, weights, sparse_indices, softmax_max, softmax_sum, scale, *,
                query_rope=None, key_rope=None, asq=None, ask=None, layout="BSND", sparse_mode=3, sinks=None):
    """The indexer's KL loss in the input dtype (call with float64 tensors; query_index, key_index and weights may
    require grad): sum over tokens of KL(p || softmax(I)) over the selected keys."""
    tnd = layout == "TND"
    qf, seqs = split_query(query, layout, asq)
    qif = split_query(query_index, layout, asq)[0]
    wf = split_query(weights, layout, asq)[0]
    qrf = split_query(query_rope, layout, asq)[0] if query_rope is not None else None
    idxf = split_query(sparse_indices, layout, asq)[0]
    B = len(seqs)
    keys = gather_keys(key, layout, ask, None, B)
    kidx = gather_keys(key_index, layout, ask, None, B)
    krs = gather_keys(key_rope, layout, ask, None, B) if key_rope is not None else None
    N1 = query.shape[-2]
    # softmax_max / softmax_sum as [rows, N1]
    smax = softmax_max.reshape(-1, N1) if tnd else softmax_max[:, 0].reshape(-1, N1)
    ssum = softmax_sum.reshape(-1, N1) if tnd else softmax_sum[:, 0].reshape(-1, N1)
    loss = query_index.new_zeros(())
    for b, (start, q_len) in enumerate(seqs):
        for i, vis in enumerate(visible(q_len, keys[b].shape[0], sparse_mode)):
            t = start + i
            sel = [int(j) for j in idxf[t, 0] if 0 <= int(j) < vis]
            if not sel:
                continue
            sel_t = torch.tensor(sel)
            logits = qf[t] @ keys[b][sel_t, 0].t()
            if qrf is not None:
                logits = logits + qrf[t] @ krs[b][sel_t, 0].t()
            den = ssum[t]
            if sinks is not None:
                den = den + torch.exp(sinks - smax[t])
            p = (torch.exp(scale * logits - smax[t][:, None]) / den[:, None]).sum(0)
            if not float(p.sum()) > 0:
                continue
            p = p / p.sum()
            s = qif[t] @ kidx[b][sel_t, 0].t()
            score = (s.clamp_min(0) * wf[t][:, None]).sum(0)
            logpi = torch.log_softmax(score, 0)
            pos = p > 0
            loss = loss + (p[pos] * (torch.log(p[pos]) - logpi[pos])).sum()
    return loss
