"""Fake (meta) kernels of the inference attention ops (decode, prefill, attention_update): output shapes and
dtypes for torch.compile.

They repeat the checks that need no data (layouts, ranks, head counts, dtypes, query length 1), so a bad call fails
at trace time with the message the kernel gives in eager mode. Value-dependent checks (block_table entries,
sequence lengths) are left to the kernel.
"""
import torch

from .._internal.layout import attention_dims

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def incre_flash_attention(a):
    op = "incre_flash_attention"
    if a.input_layout not in ("BSH", "BSND", "BNSD"):
        raise ValueError(f"{op}: argument 'input_layout' must be one of BSH, BSND, BNSD; got '{a.input_layout}'")
    if a.num_heads <= 0:
        raise ValueError(f"{op}: argument 'num_heads' must be positive; got {a.num_heads}")
    n2 = a.num_key_value_heads or a.num_heads
    if a.num_key_value_heads < 0 or a.num_heads % n2:
        raise ValueError(f"{op}: argument 'num_heads' ({a.num_heads}) must be a multiple of "
                         f"'num_key_value_heads' ({n2})")
    if a.query.dtype not in _FLOATS:
        raise TypeError(f"{op}: argument 'query' must be float32, float16 or bfloat16; got {a.query.dtype}")
    if a.key.dtype == torch.int8 and a.value.dtype == torch.int8:  # an int8 cache (KV antiquant)
        if a.query.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"{op}: int8 key/value need a float16 or bfloat16 'query' (as torch_npu); got "
                            f"{a.query.dtype}")
    elif a.key.dtype != a.query.dtype or a.value.dtype != a.query.dtype:
        raise TypeError(f"{op}: arguments 'key' and 'value' must have query's dtype {a.query.dtype}; got "
                        f"{a.key.dtype} and {a.value.dtype}")
    rank = 3 if a.input_layout == "BSH" else 4
    if a.query.dim() != rank:
        raise ValueError(f"{op}: argument 'query' must be a {rank}-D tensor for input_layout {a.input_layout}; got "
                         f"shape {list(a.query.shape)}")
    sq = a.query.shape[2] if a.input_layout == "BNSD" else a.query.shape[1]
    if sq != 1:
        raise ValueError(f"{op}: argument 'query' must have query length 1 (one decode token per sequence); got {sq}")
    if a.block_table is not None:
        if not (0 < a.block_size <= 512 and a.block_size % 16 == 0):
            raise ValueError(f"{op}: argument 'block_size' must be a positive multiple of 16 and <= 512 with a "
                             f"paged cache; got {a.block_size}")
    return a.query.new_empty(a.query.shape)


# ---- prefill ----

PROMPT_LAYOUTS = ("BSH", "BSND", "BNSD", "BNSD_BSND", "TND")


def _prompt_out_shape(op, query, key, value, num_heads, input_layout):
    if input_layout not in PROMPT_LAYOUTS:
        raise ValueError(f"{op}: argument 'input_layout' must be one of {', '.join(PROMPT_LAYOUTS)}; "
                         f"got '{input_layout}'")
    base = "BNSD" if input_layout == "BNSD_BSND" else input_layout
    d = attention_dims(op, query, key, value, num_heads, base)
    if input_layout == "BNSD_BSND":
        return (d.batch, d.q_len, d.q_heads, d.v_head_dim), d
    return d.out_shape, d


def prompt_flash_attention(a):
    shape, _ = _prompt_out_shape("prompt_flash_attention", a.query, a.key, a.value, a.num_heads, a.input_layout)
    return a.query.new_empty(shape)


def _check_learnable_sink(op, a):
    s = a.learnable_sink
    if s is None:
        return
    if s.dtype != torch.float32:
        raise TypeError(f"{op}: argument 'learnable_sink' must be a float32 tensor (one logit per query head); got "
                        f"{s.dtype}")
    if tuple(s.shape) != (a.num_heads,):
        raise ValueError(f"{op}: argument 'learnable_sink' must have shape [num_heads={a.num_heads}] (one logit per "
                         f"query head); got {list(s.shape)}")


def fused_infer_attention_score(a):
    if (a.query_rope is None) != (a.key_rope is None):
        raise ValueError("fused_infer_attention_score: arguments 'query_rope' and 'key_rope' must be given together "
                         f"(MLA); got only '{'query_rope' if a.query_rope is not None else 'key_rope'}'")
    _check_learnable_sink("fused_infer_attention_score", a)
    empty_lse = a.query.new_empty((0,), dtype=torch.float32)
    if a.block_table is not None:  # paged decode: the output has the query's shape
        if not a.softmax_lse_flag:
            return a.query.new_empty(a.query.shape), empty_lse
        if a.input_layout == "TND":  # paged TND: lse per token [T, N1, 1]
            return a.query.new_empty(a.query.shape), a.query.new_empty((a.query.shape[0], a.num_heads, 1),
                                                                       dtype=torch.float32)
        sq = a.query.shape[2] if a.input_layout == "BNSD" else a.query.shape[1]
        lse = a.query.new_empty((a.query.shape[0], a.num_heads, sq, 1), dtype=torch.float32)
        return a.query.new_empty(a.query.shape), lse
    shape, d = _prompt_out_shape("fused_infer_attention_score", a.query, a.key, a.value, a.num_heads, a.input_layout)
    if not a.softmax_lse_flag:
        return a.query.new_empty(shape), empty_lse
    lse_shape = (d.q_len, d.q_heads, 1) if a.input_layout == "TND" else (d.batch, d.q_heads, d.q_len, 1)
    return a.query.new_empty(shape), a.query.new_empty(lse_shape, dtype=torch.float32)


def fused_infer_attention_score_grad(a):
    if a.learnable_sink is None:
        return a.query.new_empty((0,), dtype=torch.float32)
    return a.learnable_sink.new_empty(a.learnable_sink.shape, dtype=torch.float32)


def _check_update(op, lse, out):
    plain = out.dim() == lse.dim() + 1 and tuple(out.shape[:-1]) == tuple(lse.shape)
    keepdim = (out.dim() == lse.dim() and lse.dim() >= 1 and lse.shape[-1] == 1
               and tuple(out.shape[:-1]) == tuple(lse.shape[:-1]))
    if lse.dim() < 1 or not (plain or keepdim):
        raise ValueError(f"{op}: argument 'out' must have shape [*lse.shape, D] (or lse may carry a trailing 1: "
                         f"[K, ..., 1] with out [K, ..., D]); got lse {list(lse.shape)} and out {list(out.shape)}")


def attention_update(a):
    _check_update("attention_update", a.lse, a.out)
    return a.out.new_empty(a.out.shape[1:]), a.lse.new_empty(a.lse.shape[1:])


def attention_update_grad(a):
    _check_update("attention_update_grad", a.lse, a.out)
    return a.lse.new_empty(a.lse.shape), a.out.new_empty(a.out.shape)
