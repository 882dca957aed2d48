"""FlashAttention-2's `flash_attn.bert_padding` helpers (2.6+ forms), which code around the varlen functions imports:
padded [batch, seqlen, ...] tensors to packed [total, ...] ones with the indices and cu_seqlens the varlen functions
take, and back. Plain PyTorch (differentiable through indexing); served as `flash_attn.bert_padding` by the opt-in
shim (torch_ops_transformer.compat.flash_attn)."""
from typing import Tuple

import torch
from torch import Tensor


def index_first_axis(input: Tensor, indices: Tensor) -> Tensor:  # noqa: A002  (FlashAttention-2's name)
    """input[indices] along the first axis (indices int64 [n])."""
    return input.index_select(0, indices)


def index_put_first_axis(values: Tensor, indices: Tensor, first_axis_dim: int) -> Tensor:
    """A zero tensor [first_axis_dim, *values.shape[1:]] with rows `indices` set to `values`."""
    out = values.new_zeros(first_axis_dim, *values.shape[1:])
    return out.index_put((indices,), values)


def _cu_seqlens(lengths: Tensor) -> Tensor:
    return torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))


def unpad_input(hidden_states: Tensor, attention_mask: Tensor, unused_mask=None
                ) -> Tuple[Tensor, Tensor, Tensor, int, Tensor]:
    """hidden_states [B, S, ...] and attention_mask [B, S] (1 = token) -> (packed [total, ...], indices int64 [total]
    into the flattened B*S positions, cu_seqlens int32 [B+1], max_seqlen (int), seqused int32 [B]).

    unused_mask [B, S] (1 = allocated but unused) adds its positions to the packed tokens and to cu_seqlens, while
    seqused counts only attention_mask's."""
    selected = attention_mask if unused_mask is None else attention_mask + unused_mask
    lengths = selected.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = selected.flatten().nonzero(as_tuple=True)[0]
    packed = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return packed, indices, _cu_seqlens(lengths), int(lengths.max()) if lengths.numel() else 0, used


def unpad_input_for_concatenated_sequences(hidden_states: Tensor, attention_mask_in_length: Tensor
                                           ) -> Tuple[Tensor, Tensor, Tensor, int]:
    """Rows holding several concatenated samples: attention_mask_in_length [B, S] lists each row's sample lengths
    (then zeros), e.g. [2, 3, 0, ...]. Returns (packed [total, ...], indices, cu_seqlens over the samples, max sample
    length): every sample becomes its own sequence."""
    b, s = attention_mask_in_length.shape
    row_len = attention_mask_in_length.sum(dim=-1)
    in_row = torch.arange(s, device=row_len.device).expand(b, s) < row_len.unsqueeze(1)
    flat = attention_mask_in_length.flatten()
    samples = flat[flat != 0]
    indices = in_row.flatten().nonzero(as_tuple=True)[0]
    packed = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return packed, indices, _cu_seqlens(samples), int(samples.max()) if samples.numel() else 0


def pad_input(hidden_states: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    """The inverse of unpad_input: packed [total, ...] back to [batch, seqlen, ...] with zeros at the padding."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.view(batch, seqlen, *hidden_states.shape[1:])
