"""Fake (meta) kernels of the sparse attention ops: output shapes from the input shapes and the fixed sparse_count,
no data-dependent sizes. The sparse flash attention fakes also make the checks that need no data (so a
bad call fails at trace time, as it does in eager mode)."""
import torch


def _indexer_out_shape(query, key, layout_key, sparse_count):
    n2 = key.shape[-2]
    return (*query.shape[:-2], n2, sparse_count)


def lightning_indexer(a):
    op = "lightning_indexer"
    torch._check(a.query.dim() in (3, 4), lambda: f"{op}: argument 'query' must be 3-D (TND) or 4-D (BSND); "
                                                  f"got shape {tuple(a.query.shape)}")
    shape = _indexer_out_shape(a.query, a.key, a.layout_key, a.sparse_count)
    indices = a.query.new_empty(shape, dtype=torch.int32)
    values = a.query.new_empty(shape if a.return_value else (0,))
    return indices, values


def lightning_indexer_grad(a):
    return a.query.new_empty(a.query.shape), a.key.new_empty(a.key.shape), a.weights.new_empty(a.weights.shape)


def quant_lightning_indexer(a):
    op = "quant_lightning_indexer"
    torch._check(a.query.dim() in (3, 4), lambda: f"{op}: argument 'query' must be 3-D (TND) or 4-D (BSND); "
                                                  f"got shape {tuple(a.query.shape)}")
    return a.query.new_empty(_indexer_out_shape(a.query, a.key, a.layout_key, a.sparse_count), dtype=torch.int32)


def sparse_lightning_indexer_grad_kl_loss(a):
    loss_dtype = torch.float64 if a.query_index.dtype == torch.float64 else torch.float32
    return (a.query_index.new_empty(a.query_index.shape), a.key_index.new_empty(a.key_index.shape),
            a.weights.new_empty(a.weights.shape), a.query_index.new_empty((1,), dtype=loss_dtype))


def _check_layouts(op, a_layout_query, a_layout_kv, query, key):
    layout_kv = a_layout_kv or a_layout_query
    torch._check(a_layout_query in ("BSND", "TND"),
                 lambda: f"{op}: argument 'layout_query' must be BSND or TND; got '{a_layout_query}'")
    torch._check(layout_kv in ("BSND", "TND", "PA_BSND"),
                 lambda: f"{op}: argument 'layout_kv' must be BSND, TND or PA_BSND; got '{layout_kv}'")
    torch._check(query.dim() == (3 if a_layout_query == "TND" else 4),
                 lambda: f"{op}: argument 'query' must be {'3-D (TND)' if a_layout_query == 'TND' else '4-D (BSND)'}"
                         f"; got shape {tuple(query.shape)}")
    torch._check(key.dim() == (3 if layout_kv == "TND" else 4),
                 lambda: f"{op}: argument 'key' has the wrong rank for layout_kv {layout_kv}; got shape "
                         f"{tuple(key.shape)}")


def _stat_dtype(query):
    return torch.float64 if query.dtype == torch.float64 else torch.float32


def sparse_flash_attention(a):
    op = "sparse_flash_attention"
    _check_layouts(op, a.layout_query, a.layout_kv, a.query, a.key)
    out = a.query.new_empty(tuple(a.query.shape[:-1]) + (a.value.shape[-1],))
    n1, n2 = a.query.shape[-2], a.key.shape[-2]
    torch._check(n2 > 0 and n1 % n2 == 0,
                 lambda: f"{op}: the query heads ({n1}) must be a multiple of the key heads ({n2})")
    if a.return_softmax_lse:
        g = n1 // n2
        shape = (n2, a.query.shape[0], g) if a.layout_query == "TND" else (a.query.shape[0], n2, a.query.shape[1], g)
    else:
        shape = (0,)
    dtype = _stat_dtype(a.query)
    return out, a.query.new_empty(shape, dtype=dtype), a.query.new_empty(shape, dtype=dtype)


def sparse_flash_attention_grad(a):
    op = "sparse_flash_attention_grad"
    _check_layouts(op, a.layout, a.layout_kv, a.query, a.key)
    dqr = a.query.new_empty(a.query_rope.shape) if a.query_rope is not None else a.query.new_empty((0,))
    dkr = a.key.new_empty(a.key_rope.shape) if a.key_rope is not None else a.key.new_empty((0,))
    dsinks = a.sinks.new_empty(a.sinks.shape) if a.sinks is not None else a.query.new_empty((0,), dtype=torch.float32)
    return (a.query.new_empty(a.query.shape), a.key.new_empty(a.key.shape), a.value.new_empty(a.value.shape), dqr,
            dkr, dsinks)


def kv_quant_sparse_flash_attention(a):
    op = "kv_quant_sparse_flash_attention"
    _check_layouts(op, a.layout_query, a.layout_kv, a.query, a.key)
    torch._check(0 <= a.rope_head_dim < a.query.shape[-1],
                 lambda: f"{op}: argument 'rope_head_dim' must lie in [0, query's head dim {a.query.shape[-1]}); "
                         f"got {a.rope_head_dim}")
    return a.query.new_empty(tuple(a.query.shape[:-1]) + (a.query.shape[-1] - a.rope_head_dim,))
