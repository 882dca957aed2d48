"""torch_npu-compatible wrappers of the inference attention ops (CANN IncreFlashAttention)."""
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

_OPS = torch.ops.npu_fa


def _lengths(arg: str, value, device) -> Optional[Tensor]:
    """actual_seq_lengths as an int64 tensor (torch_npu takes a list of ints; the op takes a tensor so that
    torch.compile does not recompile for every new set of lengths)."""
    if value is None or isinstance(value, Tensor):
        return value
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
        raise TypeError(f"npu_incre_flash_attention: argument '{arg}' must be a list of ints or an int64 tensor; "
                        f"got {type(value).__name__}")
    return torch.tensor(list(value), dtype=torch.int64, device=device)


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

    padding_mask is reserved upstream and must be None. Quantisation arguments (antiquant_*, dequant_*, quant_*)
    are not supported by the CPU kernels and raise NotImplementedError. actual_seq_lengths may be a list of ints or an
    int64 tensor; kv_padding_size an int or a one-element int64 tensor.
    """
    if padding_mask is not None:
        raise ValueError("npu_incre_flash_attention: argument 'padding_mask' is reserved and must be None")
    quant = dict(antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset, dequant_scale1=dequant_scale1,
                 quant_scale1=quant_scale1, dequant_scale2=dequant_scale2, quant_scale2=quant_scale2,
                 quant_offset2=quant_offset2)
    given = [k for k, v in quant.items() if v is not None]
    if given:
        raise NotImplementedError(f"npu_incre_flash_attention: quantised attention is not supported "
                                  f"(argument(s) {', '.join(given)} must be None)")
    lengths = _lengths("actual_seq_lengths", actual_seq_lengths, query.device)
    if isinstance(kv_padding_size, int):
        kv_padding_size = torch.tensor(kv_padding_size, dtype=torch.int64, device=query.device)
    return _OPS.incre_flash_attention(query, key, value, atten_mask, pse_shift, lengths, block_table,
                                      kv_padding_size, num_heads, scale_value, input_layout, num_key_value_heads,
                                      block_size, inner_precise)
