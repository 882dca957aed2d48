"""Fake (meta) kernels of the attention ops: output shapes, dtypes and strides for torch.compile.

They mirror the C++ kernels exactly (contiguous outputs) and repeat the shape checks that need no data,
so a bad call fails at trace time with the same message the kernel gives in eager mode.
"""
import torch

from ..layout import attention_dims


def flash_attention_score(a):
    d = attention_dims("flash_attention_score", a.query, a.key, a.value, a.head_num, a.input_layout)
    out = a.query.new_empty(d.out_shape)
    stats = a.query.new_empty(d.stats_shape, dtype=torch.float32)
    scalar = a.query.new_empty((), dtype=torch.int64)
    return out, stats, stats.new_empty(d.stats_shape), a.query.new_empty((0,)), scalar, scalar.new_empty(())


def flash_attention_score_grad(a):
    attention_dims("flash_attention_score_grad", a.query, a.key, a.value, a.head_num, a.input_layout)
    dpse = a.query.new_empty(a.pse.shape, dtype=a.pse.dtype) if a.pse is not None else a.query.new_empty((0,))
    return a.query.new_empty(a.query.shape), a.key.new_empty(a.key.shape), a.value.new_empty(a.value.shape), dpse


def dropout_gen_mask(a):
    return a.seed.new_empty((a.rows, a.cols), dtype=torch.bool)
