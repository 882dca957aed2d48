"""Fake (meta) kernels of the sparse attention ops: output shapes from the input shapes and the fixed sparse_count,
no data-dependent sizes."""
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
