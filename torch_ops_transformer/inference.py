"""Python API of the inference attention ops (torch_npu-compatible signatures).

Sections: prefill (`npu_prompt_flash_attention`, `npu_fused_infer_attention_score`, `attention_update`), then
decode (`npu_incre_flash_attention`). Arguments are checked and converted by `_args` (ValueError for a bad value,
NotImplementedError for the quantisation / shared-prefix / rope variants that are not implemented).

Mask polarity: `atten_mask` follows CANN — True / 1 means *masked out* (the opposite of SDPA's boolean mask).
"""
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _args
from .attention import MAX_TOKENS, SeqLens

_OPS = torch.ops.npu_fa


# ================================================================================================================
# Prefill: prompt_flash_attention / fused_infer_attention_score / attention_update
# ================================================================================================================

@_args.torch_npu_api
def npu_prompt_flash_attention(query: Tensor, key: Tensor, value: Tensor, *, padding_mask: Optional[Tensor] = None,
                               atten_mask: Optional[Tensor] = None, pse_shift: Optional[Tensor] = None,
                               actual_seq_lengths: SeqLens = None, deq_scale1: Optional[Tensor] = None,
                               quant_scale1: Optional[Tensor] = None, deq_scale2: Optional[Tensor] = None,
                               quant_scale2: Optional[Tensor] = None, quant_offset2: Optional[Tensor] = None,
                               num_heads: int = 1, scale_value: float = 1.0, pre_tokens: int = MAX_TOKENS,
                               next_tokens: int = 0, input_layout: str = "BSH", num_key_value_heads: int = 0,
                               actual_seq_lengths_kv: SeqLens = None, sparse_mode: int = 0) -> Tensor:
    """torch_npu.npu_prompt_flash_attention with its exact signature (prefill attention).

    out = Softmax(Mask(scale_value·QKᵀ + pse_shift))·V, fp32/fp16/bf16, accumulation in fp32.
    Layouts: BSH [B,S,N·D], BSND, BNSD, BNSD_BSND (BNSD in, BSND out), TND [T,N,D].
    `actual_seq_lengths` / `actual_seq_lengths_kv`: per-batch lengths (list or int tensor, each ≤ the padded S)
    for the dense layouts — query rows past a sequence's length come out as zeros, keys past it are ignored;
    cumulative ends for TND. `num_key_value_heads` (0 = num_heads) for GQA/MQA.
    `sparse_mode` 0–4 as in CANN. **next_tokens defaults to 0, as in torch_npu**: in sparse_mode 0 *with* an
    atten_mask the visible band is i − pre_tokens ≤ j ≤ i + next_tokens, i.e. the default is top-left causal on top
    of the mask (pass next_tokens=2147483647 for a mask-only call); *without* a mask CANN ignores pre/next_tokens in
    mode 0, so the default call is full (non-causal) attention — use sparse_mode 2/3 for causal without a mask.
    `scale_value` defaults to 1.0 as upstream: pass 1/sqrt(D) yourself. The quantisation arguments raise
    NotImplementedError; `padding_mask` is reserved upstream (ValueError unless None).
    """
    op = "npu_prompt_flash_attention"
    _args.reserved(op, padding_mask=padding_mask)
    _args.not_implemented(op, "quantised attention", deq_scale1=deq_scale1, quant_scale1=quant_scale1,
                          deq_scale2=deq_scale2, quant_scale2=quant_scale2, quant_offset2=quant_offset2)
    return _OPS.prompt_flash_attention(
        query, key, value, atten_mask=atten_mask, pse_shift=pse_shift,
        actual_seq_lengths=_args.int_tensor(op, "actual_seq_lengths", actual_seq_lengths, query.device),
        actual_seq_lengths_kv=_args.int_tensor(op, "actual_seq_lengths_kv", actual_seq_lengths_kv, query.device),
        num_heads=num_heads, scale_value=scale_value, pre_tokens=pre_tokens, next_tokens=next_tokens,
        input_layout=input_layout, num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
        inner_precise=1)


@_args.torch_npu_api
def npu_fused_infer_attention_score(query: Tensor, key, value, *, pse_shift: Optional[Tensor] = None,
                                    atten_mask: Optional[Tensor] = None, actual_seq_lengths: SeqLens = None,
                                    actual_seq_lengths_kv: SeqLens = None, dequant_scale1=None, quant_scale1=None,
                                    dequant_scale2=None, quant_scale2=None, quant_offset2=None, antiquant_scale=None,
                                    antiquant_offset=None, key_antiquant_scale=None, key_antiquant_offset=None,
                                    value_antiquant_scale=None, value_antiquant_offset=None,
                                    block_table: Optional[Tensor] = None, query_padding_size=None,
                                    kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None,
                                    actual_shared_prefix_len=None, query_rope=None, key_rope=None,
                                    key_rope_antiquant_scale=None, num_heads: int = 1, scale: float = 1.0,
                                    pre_tokens: int = MAX_TOKENS, next_tokens: int = MAX_TOKENS,
                                    input_layout: str = "BSH", num_key_value_heads: int = 0, sparse_mode: int = 0,
                                    inner_precise: int = 0, block_size: int = 0, antiquant_mode: int = 0,
                                    key_antiquant_mode: int = 0, value_antiquant_mode: int = 0,
                                    softmax_lse_flag: bool = False) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_fused_infer_attention_score (keyword arguments as upstream). Returns (attention_out, softmax_lse).

    Without `block_table`: the prefill path of `npu_prompt_flash_attention` (same layouts, per-batch lengths,
    masks, sparse modes, pse_shift; any Sq), but `next_tokens` defaults to 2147483647 here, as upstream.
    With `block_table` (paged KV cache): the same result as the keys laid out contiguously, for every sparse mode,
    band, mask, pse_shift, query length and softmax_lse_flag. One-token calls whose band hides no key run
    `npu_fa::incre_flash_attention` on the cache in place (`actual_seq_lengths_kv` as its per-batch KV lengths); the
    others gather the used blocks and run the prefill path (docs/inference.md). Blocks may be shared between
    sequences (read-only).
    `softmax_lse_flag=True` returns the fp32 log-sum-exp [B,N,Sq,1] ([T,N,1] for TND; -inf for rows that see no
    key); otherwise softmax_lse is an empty tensor. Quantisation, shared-prefix, rope and padding-size arguments raise NotImplementedError.
    """
    op = "npu_fused_infer_attention_score"
    _args.not_implemented(op, "quantised attention", dequant_scale1=dequant_scale1, quant_scale1=quant_scale1,
                          dequant_scale2=dequant_scale2, quant_scale2=quant_scale2, quant_offset2=quant_offset2,
                          antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                          key_antiquant_scale=key_antiquant_scale, key_antiquant_offset=key_antiquant_offset,
                          value_antiquant_scale=value_antiquant_scale, value_antiquant_offset=value_antiquant_offset,
                          key_rope_antiquant_scale=key_rope_antiquant_scale)
    _args.not_implemented_unless_zero(op, "quantised attention", antiquant_mode=antiquant_mode,
                                      key_antiquant_mode=key_antiquant_mode, value_antiquant_mode=value_antiquant_mode)
    _args.not_implemented(op, "attention with padding sizes", query_padding_size=query_padding_size,
                          kv_padding_size=kv_padding_size)
    _args.not_implemented(op, "attention with a shared prefix", key_shared_prefix=key_shared_prefix,
                          value_shared_prefix=value_shared_prefix, actual_shared_prefix_len=actual_shared_prefix_len)
    _args.not_implemented(op, "attention with separate rope parts", query_rope=query_rope, key_rope=key_rope)
    return _OPS.fused_infer_attention_score(
        query, _args.single_tensor(op, "key", key), _args.single_tensor(op, "value", value), pse_shift=pse_shift,
        atten_mask=atten_mask,
        actual_seq_lengths=_args.int_tensor(op, "actual_seq_lengths", actual_seq_lengths, query.device),
        actual_seq_lengths_kv=_args.int_tensor(op, "actual_seq_lengths_kv", actual_seq_lengths_kv, query.device),
        block_table=block_table, num_heads=num_heads, scale=scale, pre_tokens=pre_tokens, next_tokens=next_tokens,
        input_layout=input_layout, num_key_value_heads=num_key_value_heads, sparse_mode=sparse_mode,
        inner_precise=inner_precise, block_size=block_size, softmax_lse_flag=softmax_lse_flag)


def attention_update(lse: Union[Tensor, Sequence[Tensor]], out: Union[Tensor, Sequence[Tensor]]
                     ) -> Tuple[Tensor, Tensor]:
    """Merges partial attention results computed over disjoint key ranges (ring / context-parallel attention).

    `lse`: a list of K fp32 log-sum-exp tensors [...] (or one stacked [K, ...] tensor); `out`: a list of K partial
    outputs [..., D] (or stacked [K, ..., D]). Returns (out [..., D], lse [...]) with
    lse = log Σ exp(lse_i) and out = Σ exp(lse_i − lse)·out_i. A partial lse of −inf (an empty key range) gets
    weight exactly 0 (rows where all are −inf give 0 and −inf). Differentiable in lse and out.
    """
    if isinstance(lse, (list, tuple)):
        lse = torch.stack(list(lse))
    if isinstance(out, (list, tuple)):
        out = torch.stack(list(out))
    return _OPS.attention_update(lse, out)


# ================================================================================================================
# Decode: incre_flash_attention (one query token per sequence, contiguous or paged KV cache)
# ================================================================================================================


@_args.torch_npu_api
def npu_incre_flash_attention(query: Tensor, key: Tensor, value: Tensor, *, padding_mask: Optional[Tensor] = None,
                              atten_mask: Optional[Tensor] = None, pse_shift: Optional[Tensor] = None,
                              actual_seq_lengths: Union[Sequence[int], Tensor, None] = None,
                              antiquant_scale: Optional[Tensor] = None, antiquant_offset: Optional[Tensor] = None,
                              block_table: Optional[Tensor] = None, dequant_scale1: Optional[Tensor] = None,
                              quant_scale1: Optional[Tensor] = None, dequant_scale2: Optional[Tensor] = None,
                              quant_scale2: Optional[Tensor] = None, quant_offset2: Optional[Tensor] = None,
                              kv_padding_size: Union[int, Tensor, None] = None, num_heads: int = 1,
                              scale_value: float = 1.0, input_layout: str = "BSH", num_key_value_heads: int = 0,
                              block_size: int = 0, inner_precise: int = 1) -> Tensor:
    """Decode attention with torch_npu's signature: one query token per sequence against a contiguous or paged KV
    cache. See `torch.ops.npu_fa.incre_flash_attention` and docs/inference.md for the semantics.

    A paged cache may also be given as (num_blocks, block_size, N2, D) (PagedKVCache's default layout), viewed as
    (num_blocks, block_size, N2*D). padding_mask is reserved upstream and must be None. Quantisation arguments (antiquant_*, dequant_*, quant_*)
    are not supported by the CPU kernels and raise NotImplementedError. actual_seq_lengths may be a list of ints or an
    int64 tensor; kv_padding_size an int or a one-element int64 tensor.
    """
    op = "npu_incre_flash_attention"
    _args.reserved(op, padding_mask=padding_mask)
    _args.not_implemented(op, "quantised attention", antiquant_scale=antiquant_scale,
                          antiquant_offset=antiquant_offset, dequant_scale1=dequant_scale1, quant_scale1=quant_scale1,
                          dequant_scale2=dequant_scale2, quant_scale2=quant_scale2, quant_offset2=quant_offset2)
    lengths = _args.int_tensor(op, "actual_seq_lengths", actual_seq_lengths, query.device)
    if block_table is not None and input_layout != "BNSD":
        # PagedKVCache's default (num_blocks, block_size, N2, D) is the kernel's (num_blocks, block_size, N2*D).
        key, value = (t.flatten(2) if t.dim() == 4 and t.shape[1] == block_size else t for t in (key, value))
    kv_padding_size = _args.int_scalar_tensor(op, "kv_padding_size", kv_padding_size, query.device)
    return _OPS.incre_flash_attention(query, key, value, atten_mask, pse_shift, lengths, block_table,
                                      kv_padding_size, num_heads, scale_value, input_layout, num_key_value_heads,
                                      block_size, inner_precise)
