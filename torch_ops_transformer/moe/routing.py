"""MoE gating and routing with torch_npu's Python signatures, on top of `torch.ops.npu_fa` (docs/moe.md).

A routing pipeline, token-major (v2) flavour:

    y, expert_idx, _ = npu_moe_gating_top_k_softmax_v2(logits, k=2, renorm=1)          # weights, experts [N, k]
    expanded_x, row_idx, counts, _ = npu_moe_init_routing_v2(
        x, expert_idx, expert_num=E, expert_tokens_num_type=1, expert_tokens_num_flag=True)  # rows grouped by expert
    expert_out = <per-expert FFN over expanded_x, groups given by counts>
    out = npu_moe_finalize_routing(expert_out, None, None, None, y, row_idx, expert_idx, drop_pad_mode=2)

The v1 flavour (`npu_moe_gating_top_k_softmax` → `npu_moe_init_routing` → `npu_moe_finalize_routing` with
drop_pad_mode=0) indexes pairs column-major (j*N + i), as CANN's v1 ops do. `npu_moe_token_permute` /
`npu_moe_token_unpermute` are the Megatron pair. Differentiable: both top-k-softmax gatings (in x),
init_routing_v2 (in x), finalize_routing (rows, skips, bias, scales), token permute (tokens) and unpermute
(permuted tokens, probs).
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import _args

_OPS = torch.ops.npu_fa


@_args.torch_npu_api
def npu_moe_gating_top_k_softmax(x: Tensor, finished: Optional[Tensor] = None, k: int = 1
                                 ) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_gating_top_k_softmax: (y, expert_idx, row_idx) = top-k of softmax(x) over the experts."""
    return _OPS.moe_gating_top_k_softmax(x, finished, k)


@_args.torch_npu_api
def npu_moe_gating_top_k_softmax_v2(x: Tensor, finished: Optional[Tensor] = None, k: int = 1, renorm: int = 0,
                                    output_softmax_result_flag: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """CANN MoeGatingTopKSoftmaxV2: (y, expert_idx, softmax_result); renorm=1 is top-k, then softmax over the k."""
    return _OPS.moe_gating_top_k_softmax_v2(x, finished, k, renorm, output_softmax_result_flag)


@_args.torch_npu_api
def npu_moe_gating_top_k(x: Tensor, k: int, *, bias: Optional[Tensor] = None, k_group: int = 1,
                         group_count: int = 1, group_select_mode: int = 0, renorm: int = 0, norm_type: int = 0,
                         out_flag: bool = False, routed_scaling_factor: float = 1.0, eps: float = 1e-20
                         ) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_gating_top_k (DeepSeek-V3 group-limited routing): (y, expert_idx, out).

    norm_type 0 = softmax, 1 = sigmoid (DeepSeek-V3 uses 1 with a bias). The default follows the newer torch_npu
    schema (0); older torch_npu docs list 1."""
    return _OPS.moe_gating_top_k(x, k, bias, k_group, group_count, group_select_mode, renorm, norm_type, out_flag,
                                 routed_scaling_factor, eps)


@_args.torch_npu_api
def npu_moe_init_routing(x: Tensor, row_idx: Tensor, expert_idx: Tensor, active_num: int
                         ) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_init_routing: (expanded_x, expanded_row_idx, expanded_expert_idx)."""
    return _OPS.moe_init_routing(x, row_idx, expert_idx, active_num)


@_args.torch_npu_api
def npu_moe_init_routing_v2(x: Tensor, expert_idx: Tensor, *, scale: Optional[Tensor] = None,
                            offset: Optional[Tensor] = None, active_num: int = -1, expert_capacity: int = -1,
                            expert_num: int = -1, drop_pad_mode: int = 0, expert_tokens_num_type: int = 0,
                            expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                            active_expert_range: Sequence[int] = (), row_idx_type: int = 0
                            ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_init_routing_v2 (unquantized): (expanded_x, expanded_row_idx,
    expert_tokens_count_or_cumsum, expanded_scale). quant_mode defaults to -1 (the only mode implemented)."""
    return _OPS.moe_init_routing_v2(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num,
                                    drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag, quant_mode,
                                    list(active_expert_range), row_idx_type)


@_args.torch_npu_api
def npu_moe_compute_expert_tokens(sorted_expert_for_source_row: Tensor, num_expert: int) -> Tensor:
    """torch_npu.npu_moe_compute_expert_tokens: the end of each expert's run in the sorted list (int32)."""
    return _OPS.moe_compute_expert_tokens(sorted_expert_for_source_row, num_expert)


@_args.torch_npu_api
def npu_moe_finalize_routing(expanded_permuted_rows: Tensor, skip1: Optional[Tensor], skip2: Optional[Tensor],
                             bias: Optional[Tensor], scales: Optional[Tensor], expanded_src_to_dst_row: Tensor,
                             export_for_source_row: Optional[Tensor], drop_pad_mode: int = 0) -> Tensor:
    """torch_npu.npu_moe_finalize_routing: skip1 + skip2 + sum_j scales * (expert row + bias[expert])."""
    return _OPS.moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                                     export_for_source_row, drop_pad_mode)


@_args.torch_npu_api
def npu_moe_token_permute(tokens: Tensor, indices: Tensor, num_out_tokens: Optional[int] = None,
                          padded_mode: bool = False) -> Tuple[Tensor, Tensor]:
    """torch_npu.npu_moe_token_permute: (permuted_tokens, sorted_indices)."""
    return _OPS.moe_token_permute(tokens, indices, num_out_tokens, padded_mode)


@_args.torch_npu_api
def npu_moe_token_unpermute(permuted_tokens: Tensor, sorted_indices: Tensor, probs: Optional[Tensor] = None,
                            padded_mode: bool = False, restore_shape: Optional[List[int]] = None) -> Tensor:
    """torch_npu.npu_moe_token_unpermute: the probability-weighted sum of each token's expert rows."""
    shape = list(restore_shape) if restore_shape is not None else None
    return _OPS.moe_token_unpermute(permuted_tokens, sorted_indices, probs, padded_mode, shape)
