"""Fake (meta) kernels of the attention ops: output shapes, dtypes and strides for torch.compile.

They mirror the C++ kernels exactly (contiguous outputs) and repeat the shape checks that need no data,
so a bad call fails at trace time with the same message the kernel gives in eager mode.
"""
import torch

from ..layout import attention_dims


def flash_attention_score(query, key, value, head_num, input_layout, pse=None, atten_mask=None,
                          actual_seq_qlen=None, actual_seq_kvlen=None, scale=1.0, keep_prob=1.0,
                          pre_tokens=2147483647, next_tokens=2147483647, inner_precise=0, sparse_mode=0,
                          pse_type=1, seed=None, offset=None):
    d = attention_dims("flash_attention_score", query, key, value, head_num, input_layout)
    out = query.new_empty(d.out_shape)
    stats = query.new_empty(d.stats_shape, dtype=torch.float32)
    scalar = query.new_empty((), dtype=torch.int64)
    return out, stats, stats.new_empty(d.stats_shape), query.new_empty((0,)), scalar, scalar.new_empty(())


def flash_attention_score_grad(query, key, value, dy, head_num, input_layout, *, pse=None, atten_mask=None,
                               softmax_max, softmax_sum, attention_in, actual_seq_qlen=None, actual_seq_kvlen=None,
                               scale=1.0, keep_prob=1.0, pre_tokens=2147483647, next_tokens=2147483647,
                               inner_precise=0, sparse_mode=0, pse_type=1, seed=None, offset=None):
    attention_dims("flash_attention_score_grad", query, key, value, head_num, input_layout)
    dpse = query.new_empty(pse.shape, dtype=pse.dtype) if pse is not None else query.new_empty((0,))
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape), dpse


def dropout_gen_mask(seed, offset, rows, cols, keep_prob):
    return seed.new_empty((rows, cols), dtype=torch.bool)
