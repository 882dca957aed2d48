"""Fake (meta) kernels of the attention ops: output shapes, dtypes and strides for torch.compile.

They mirror the C++ kernels exactly (contiguous outputs) and repeat the shape checks that need no data,
so a bad call fails at trace time with the same message the kernel gives in eager mode.
"""
import math

import torch

from .._internal.layout import attention_dims


def _check_extras(op, a):
    """softmax_layout, sink and softcap, as the shared C++ parser checks them (messages identical)."""
    if not (math.isfinite(a.softcap) and a.softcap >= 0):
        raise ValueError(f"{op}: argument 'softcap' must be a finite value >= 0 (0 disables soft-capping); got "
                         f"{a.softcap}")
    if a.softmax_layout not in ("", "TND"):
        raise ValueError(f"{op}: argument 'softmax_layout' must be \"\" (the default) or \"TND\"; "
                         f"got '{a.softmax_layout}'")
    if a.softmax_layout == "TND" and a.input_layout != "TND":
        raise ValueError(f"{op}: argument 'softmax_layout'=\"TND\" is only supported with input_layout TND; got "
                         f"input_layout {a.input_layout}")
    if a.sink is not None:
        if a.sink.dtype != torch.float32:
            raise TypeError(f"{op}: argument 'sink' must be float32; got {a.sink.dtype}")
        if a.sink.dim() != 1 or a.sink.shape[0] != a.head_num:
            raise ValueError(f"{op}: argument 'sink' must have shape [head_num] = [{a.head_num}] (one logit per "
                             f"query head); got {list(a.sink.shape)}")
    if a.dropout_mask is not None and a.dropout_mask.dtype != torch.uint8:
        raise TypeError(f"{op}: argument 'dropout_mask' must be uint8 (a bit-packed keep mask as made by "
                        f"_npu_dropout_gen_mask); got {a.dropout_mask.dtype}")


def flash_attention_score(a):
    d = attention_dims("flash_attention_score", a.query, a.key, a.value, a.head_num, a.input_layout)
    _check_extras("flash_attention_score", a)
    out = a.query.new_empty(d.out_shape)
    stats = a.query.new_empty(d.stats_shape, dtype=torch.float32)
    scalar = a.query.new_empty((), dtype=torch.int64)
    return out, stats, stats.new_empty(d.stats_shape), a.query.new_empty((0,)), scalar, scalar.new_empty(())


def flash_attention_score_grad(a):
    attention_dims("flash_attention_score_grad", a.query, a.key, a.value, a.head_num, a.input_layout)
    _check_extras("flash_attention_score_grad", a)
    dpse = a.query.new_empty(a.pse.shape, dtype=a.pse.dtype) if a.pse is not None else a.query.new_empty((0,))
    dsink = a.key.new_empty((a.head_num if a.sink is not None else 0,), dtype=torch.float32)
    return (a.query.new_empty(a.query.shape), a.key.new_empty(a.key.shape), a.value.new_empty(a.value.shape), dpse,
            dsink)


def dropout_gen_mask(a):
    return a.seed.new_empty((a.rows, a.cols), dtype=torch.bool)


def ring_attention_update(a):
    op = "ring_attention_update"
    torch._check(a.input_layout in ("SBH", "TND"),
                 lambda: f"{op}: argument 'input_layout' must be 'SBH' or 'TND'; got {a.input_layout!r}")
    torch._check(a.prev_attn_out.dim() == 3, lambda: f"{op}: argument 'prev_attn_out' must be 3-D")
    stats = a.prev_softmax_max
    return (a.prev_attn_out.new_empty(a.prev_attn_out.shape), stats.new_empty(stats.shape, dtype=torch.float32),
            stats.new_empty(stats.shape, dtype=torch.float32))
