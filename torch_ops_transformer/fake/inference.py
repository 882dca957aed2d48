"""Fake (meta) kernels of the inference attention ops (decode, prefill, attention_update): output shapes and
dtypes for torch.compile.

They repeat the checks that need no data (layouts, ranks, head counts, dtypes, query length 1), so a bad call fails
at trace time with the message the kernel gives in eager mode. Value-dependent checks (block_table entries,
sequence lengths) are left to the kernel.
"""
import torch

from ..layout import attention_dims

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def incre_flash_attention(query, key, value, atten_mask=None, pse_shift=None, actual_seq_lengths=None,
                          block_table=None, kv_padding_size=None, num_heads=1, scale_value=1.0, input_layout="BSH",
                          num_key_value_heads=0, block_size=0, inner_precise=1):
    op = "incre_flash_attention"
    if input_layout not in ("BSH", "BSND", "BNSD"):
        raise ValueError(f"{op}: argument 'input_layout' must be one of BSH, BSND, BNSD; got '{input_layout}'")
    if num_heads <= 0:
        raise ValueError(f"{op}: argument 'num_heads' must be positive; got {num_heads}")
    n2 = num_key_value_heads or num_heads
    if num_key_value_heads < 0 or num_heads % n2:
        raise ValueError(f"{op}: argument 'num_heads' ({num_heads}) must be a multiple of 'num_key_value_heads' ({n2})")
    if query.dtype not in _FLOATS:
        raise TypeError(f"{op}: argument 'query' must be float32, float16 or bfloat16; got {query.dtype}")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"{op}: arguments 'key' and 'value' must have query's dtype {query.dtype}; got "
                        f"{key.dtype} and {value.dtype}")
    rank = 3 if input_layout == "BSH" else 4
    if query.dim() != rank:
        raise ValueError(f"{op}: argument 'query' must be a {rank}-D tensor for input_layout {input_layout}; got "
                         f"shape {list(query.shape)}")
    sq = query.shape[2] if input_layout == "BNSD" else query.shape[1]
    if sq != 1:
        raise ValueError(f"{op}: argument 'query' must have query length 1 (one decode token per sequence); got {sq}")
    if block_table is not None:
        if not (0 < block_size <= 512 and block_size % 16 == 0):
            raise ValueError(f"{op}: argument 'block_size' must be a positive multiple of 16 and <= 512 with a "
                             f"paged cache; got {block_size}")
    return query.new_empty(query.shape)


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


def prompt_flash_attention(query, key, value, padding_mask=None, atten_mask=None, pse_shift=None,
                           actual_seq_lengths=None, actual_seq_lengths_kv=None, num_heads=1, scale_value=1.0,
                           pre_tokens=2147483647, next_tokens=0, input_layout="BSH", num_key_value_heads=0,
                           sparse_mode=0, inner_precise=1):
    shape, _ = _prompt_out_shape("prompt_flash_attention", query, key, value, num_heads, input_layout)
    return query.new_empty(shape)


def fused_infer_attention_score(query, key, value, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                                actual_seq_lengths_kv=None, block_table=None, num_heads=1, scale=1.0,
                                pre_tokens=2147483647, next_tokens=2147483647, input_layout="BSH",
                                num_key_value_heads=0, sparse_mode=0, inner_precise=0, block_size=0,
                                softmax_lse_flag=False):
    empty_lse = query.new_empty((0,), dtype=torch.float32)
    if block_table is not None:  # paged decode: the output has the query's shape
        if not softmax_lse_flag:
            return query.new_empty(query.shape), empty_lse
        sq = query.shape[2] if input_layout == "BNSD" else query.shape[1]
        return query.new_empty(query.shape), query.new_empty((query.shape[0], num_heads, sq, 1), dtype=torch.float32)
    shape, d = _prompt_out_shape("fused_infer_attention_score", query, key, value, num_heads, input_layout)
    if not softmax_lse_flag:
        return query.new_empty(shape), empty_lse
    lse_shape = (d.q_len, d.q_heads, 1) if input_layout == "TND" else (d.batch, d.q_heads, d.q_len, 1)
    return query.new_empty(shape), query.new_empty(lse_shape, dtype=torch.float32)


def _check_update(op, lse, out):
    plain = out.dim() == lse.dim() + 1 and tuple(out.shape[:-1]) == tuple(lse.shape)
    keepdim = (out.dim() == lse.dim() and lse.dim() >= 1 and lse.shape[-1] == 1
               and tuple(out.shape[:-1]) == tuple(lse.shape[:-1]))
    if lse.dim() < 1 or not (plain or keepdim):
        raise ValueError(f"{op}: argument 'out' must have shape [*lse.shape, D] (or lse may carry a trailing 1: "
                         f"[K, ..., 1] with out [K, ..., D]); got lse {list(lse.shape)} and out {list(out.shape)}")


def attention_update(lse, out):
    _check_update("attention_update", lse, out)
    return out.new_empty(out.shape[1:]), lse.new_empty(lse.shape[1:])


def attention_update_grad(lse, out, softmax_lse, attention_out, grad_attention_out, grad_softmax_lse):
    _check_update("attention_update_grad", lse, out)
    return lse.new_empty(lse.shape), out.new_empty(out.shape)
