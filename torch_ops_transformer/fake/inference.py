"""Fake (meta) kernels of the inference attention ops: output shapes and dtypes for torch.compile.

They repeat the checks that need no data (layouts, ranks, head counts, dtypes, query length 1), so a bad call fails
at trace time with the message the kernel gives in eager mode. Value-dependent checks (block_table entries,
sequence lengths) are left to the kernel.
"""
import torch

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
