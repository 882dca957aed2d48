"""MoE gating and routing with torch_npu's Python signatures, on top of `torch.ops.npu_fa` (docs/moe.md).

A routing pipeline, token-major (v2) flavour:

    y, expert_idx, _ = npu_moe_gating_top_k_softmax_v2(logits, k=2, renorm=1)          # weights, experts [N, k]
    expanded_x, row_idx, counts, _ = npu_moe_init_routing_v2(
        x, expert_idx, expert_num=E, expert_tokens_num_type=1, expert_tokens_num_flag=True)  # rows grouped by expert
    expert_out = <per-expert FFN over expanded_x, groups given by counts>
    out = npu_moe_finalize_routing(expert_out, None, None, None, y, row_idx, expert_idx, drop_pad_mode=2)

The v1 flavour (`npu_moe_gating_top_k_softmax` → `npu_moe_init_routing` → `npu_moe_finalize_routing` with
drop_pad_mode=0) indexes pairs column-major (j*N + i), as CANN's v1 ops do. `npu_moe_token_permute` /
`npu_moe_token_unpermute` are the Megatron pair. Differentiable: the three gatings (in x),
init_routing_v2 (in x), finalize_routing (rows, skips, bias, scales), token permute (tokens) and unpermute
(permuted tokens, probs).
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .._internal import args as _args

_OPS = torch.ops.npu_fa


@_args.torch_npu_api
def npu_moe_gating_top_k_softmax(x: Tensor, finished: Optional[Tensor] = None, k: int = 1
                                 ) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_gating_top_k_softmax: (y, expert_idx, row_idx) = top-k of softmax(x) over the experts."""
    return _OPS.moe_gating_top_k_softmax(x, finished, k)


@_args.torch_npu_api
def npu_moe_gating_top_k_softmax_v2(x: Tensor, *, k: int = 1, finished: Optional[Tensor] = None,
                                    renorm: Optional[int] = 0, output_softmax: Optional[bool] = False
                                    ) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_gating_top_k_softmax_v2 (CANN MoeGatingTopKSoftmaxV2): (y, expert_idx, softmax_result).
    renorm=1 is top-k, then softmax over the k; softmax_result (fp32 [..., E]) only with output_softmax and renorm 0.
    None for renorm / output_softmax means their defaults."""
    op = "npu_moe_gating_top_k_softmax_v2"
    renorm = _args.optional_int(op, "renorm", renorm, 0)
    if output_softmax is None:
        output_softmax = False
    if not isinstance(output_softmax, bool):
        raise TypeError(f"{op}: argument 'output_softmax' must be a bool or None; got {output_softmax!r}")
    return _OPS.moe_gating_top_k_softmax_v2(x, finished, k, renorm, output_softmax)


_HASH_MAX_K = 64  # CANN's hash routing reads at most 64 experts per token


def _hash_gating(op: str, x: Tensor, k: int, bias: Optional[Tensor], input_ids: Tensor, tid2eid: Tensor,
                 k_group: int, group_count: int, group_select_mode: int, renorm: int, norm_type: int,
                 out_flag: bool, routed_scaling_factor: float, eps: float) -> Tuple[Tensor, Tensor, Tensor]:
    """Hash routing (CANN MoeGatingTopKV2): the experts of token i are the row tid2eid[input_ids[i]] (no top-k);
    their weights are the normalised scores (softmax or sigmoid of x) at those experts, divided by their sum + eps
    for sigmoid, times routed_scaling_factor. bias only steers top-k selection, so it has no effect here."""
    if x.dim() != 2:
        raise ValueError(f"{op}: argument 'x' must be 2-D [N, E]; got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"{op}: argument 'x' must be float16, bfloat16, float32 or float64; got {x.dtype}")
    n, e = x.shape
    for name, t in (("input_ids", input_ids), ("tid2eid", tid2eid)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{op}: argument '{name}' must be int32 or int64; got {t.dtype}")
    if input_ids.dim() != 1 or input_ids.shape[0] != n:
        raise ValueError(f"{op}: argument 'input_ids' of shape {tuple(input_ids.shape)} must be [N] = [{n}] (one "
                         f"id per row of x)")
    if tid2eid.dim() != 2 or tid2eid.shape[1] != k:
        raise ValueError(f"{op}: argument 'tid2eid' of shape {tuple(tid2eid.shape)} must be [num_ids, k] with "
                         f"k = {k}")
    if not 1 <= k <= min(e, _HASH_MAX_K):
        raise ValueError(f"{op}: argument 'k' must be in [1, min(E = {e}, {_HASH_MAX_K})] in hash mode; got {k}")
    if group_count < 1 or e % group_count or not 1 <= k_group <= group_count:
        raise ValueError(f"{op}: arguments 'group_count' ({group_count}) and 'k_group' ({k_group}) must satisfy "
                         f"E % group_count == 0 (E = {e}) and 1 <= k_group <= group_count")
    if not (k_group == group_count or group_count == e):
        raise ValueError(f"{op}: hash mode (input_ids, tid2eid) keeps every group: 'k_group' must equal "
                         f"'group_count' or 'group_count' must equal E = {e}; got k_group={k_group}, "
                         f"group_count={group_count}")
    if group_select_mode not in (0, 1) or renorm != 0 or norm_type not in (0, 1):
        raise ValueError(f"{op}: arguments 'group_select_mode' (0 or 1), 'renorm' (0) and 'norm_type' (0 softmax, "
                         f"1 sigmoid) are out of range; got {group_select_mode}, {renorm}, {norm_type}")
    if not math.isfinite(routed_scaling_factor) or not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{op}: arguments 'routed_scaling_factor' ({routed_scaling_factor}) and 'eps' ({eps}) must "
                         f"be finite, eps >= 0")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != e):
        raise ValueError(f"{op}: argument 'bias' of shape {tuple(bias.shape)} must be [E] = [{e}]")
    ids = input_ids.long()
    if n and (int(ids.min()) < 0 or int(ids.max()) >= tid2eid.shape[0]):
        raise ValueError(f"{op}: argument 'input_ids' holds ids outside [0, {tid2eid.shape[0]}) (the rows of "
                         f"'tid2eid')")
    experts = tid2eid.long()[ids]
    if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= e):
        raise ValueError(f"{op}: argument 'tid2eid' names experts outside [0, E = {e}) for the given input_ids")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    scores = torch.softmax(x.to(acc), -1) if norm_type == 0 else torch.sigmoid(x.to(acc))
    y = scores.gather(1, experts)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    y = (y * routed_scaling_factor).to(x.dtype)
    out = scores.float() if out_flag else x.new_empty((0,), dtype=torch.float32)
    return y, experts.int(), out


@_args.torch_npu_api
def npu_moe_gating_top_k(x: Tensor, k: int, *, bias: Optional[Tensor] = None, input_ids: Optional[Tensor] = None,
                         tid2eid: Optional[Tensor] = None, k_group: int = 1, group_count: int = 1,
                         group_select_mode: int = 0, renorm: int = 0, norm_type: int = 0, out_flag: bool = False,
                         routed_scaling_factor: float = 1.0, eps: float = 1e-20) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_gating_top_k (DeepSeek-V3 group-limited routing): (y, expert_idx, out).

    norm_type 0 = softmax (y = the selected probabilities * routed_scaling_factor), 1 = sigmoid (y = the selected
    scores / (their sum + eps) * routed_scaling_factor; DeepSeek-V3 uses 1 with a bias). With input_ids and tid2eid
    (both or neither) the experts come from the table, tid2eid[input_ids] (hash routing), instead of top-k."""
    op = "npu_moe_gating_top_k"
    if (input_ids is None) != (tid2eid is None):
        raise ValueError(f"{op}: arguments 'input_ids' and 'tid2eid' must be given together (hash routing) or "
                         f"both be None")
    if bias is not None and bias.dtype != x.dtype:
        raise TypeError(f"{op}: argument 'bias' ({bias.dtype}) must have the dtype of 'x' ({x.dtype})")
    if input_ids is not None:
        return _hash_gating(op, x, k, bias, input_ids, tid2eid, k_group, group_count, group_select_mode, renorm,
                            norm_type, out_flag, routed_scaling_factor, eps)
    return _OPS.moe_gating_top_k(x, k, bias, k_group, group_count, group_select_mode, renorm, norm_type, out_flag,
                                 routed_scaling_factor, eps)


@_args.torch_npu_api
def npu_moe_gating_top_k_backward(x_norm: Tensor, grad_y: Tensor, expertIdx: Tensor, *, renorm: int = 0,  # noqa: N803
                                  norm_type: int = 0, routed_scaling_factor: float = 1.0, eps: float = 1e-20
                                  ) -> Tensor:
    """torch_npu.npu_moe_gating_top_k_backward: d x of npu_moe_gating_top_k from its scores x_norm (the fp32 out
    of out_flag=True: softmax or sigmoid of x), the gradient of y and the selected experts (expertIdx, upstream's
    name). [N, E] in grad_y's dtype."""
    return _OPS.moe_gating_top_k_grad(x_norm, grad_y, expertIdx, renorm, norm_type, routed_scaling_factor, eps, None)


@_args.torch_npu_api
def npu_moe_init_routing(x: Tensor, row_idx: Tensor, expert_idx: Tensor, active_num: int
                         ) -> Tuple[Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_init_routing: (expanded_x, expanded_row_idx, expanded_expert_idx)."""
    return _OPS.moe_init_routing(x, row_idx, expert_idx, active_num)


# quant_mode values of torch_npu whose expanded_x is a format other than int8 (MXFP8/MXFP4, HIF8, FP8 per-block or
# per-group, int4): not implemented. -1 (unquantised), 0 (static int8) and 1 (dynamic int8) are.
_OTHER_QUANT_MODES = (2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17)


@_args.torch_npu_api
def npu_moe_init_routing_v2(x: Tensor, expert_idx: Tensor, *, scale: Optional[Tensor] = None,
                            offset: Optional[Tensor] = None, active_num: int = -1, expert_capacity: int = -1,
                            expert_num: int = -1, drop_pad_mode: int = 0, expert_tokens_num_type: int = 0,
                            expert_tokens_num_flag: bool = False, quant_mode: int = -1,
                            active_expert_range: Sequence[int] = (), row_idx_type: int = 0,
                            x_dtype: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """torch_npu.npu_moe_init_routing_v2: (expanded_x, expanded_row_idx, expert_tokens_count_or_cumsum,
    expanded_scale). quant_mode -1 routes x as it is (any dtype, int8 included; scale [N] is gathered with the rows);
    0 quantises the rows to int8 with the static scale and offset (one float32 each); 1 quantises each row to int8
    with its own scale max|row * smooth| / 127 (scale = the smooth scales, [1, H] or one row per expert of the
    range), returned in expanded_scale. The other (float8, hifloat8, int4) modes are not implemented; x_dtype (a
    quantised input format) must be None or x's dtype."""
    op = "npu_moe_init_routing_v2"
    if quant_mode in _OTHER_QUANT_MODES:
        raise NotImplementedError(f"{op}: quantised routing to a format other than int8 is not implemented; "
                                  f"argument 'quant_mode' must be -1, 0 or 1; got {quant_mode}")
    _args.same_dtype_or_none(op, "x_dtype", x_dtype, x.dtype, "a quantised x format")
    return _OPS.moe_init_routing_v2(x, expert_idx, scale, offset, active_num, expert_capacity, expert_num,
                                    drop_pad_mode, expert_tokens_num_type, expert_tokens_num_flag, quant_mode,
                                    list(active_expert_range or ()), row_idx_type)


@_args.torch_npu_api
def npu_moe_compute_expert_tokens(sorted_expert_for_source_row: Tensor, num_expert: int) -> Tensor:
    """torch_npu.npu_moe_compute_expert_tokens: the end of each expert's run in the sorted list (int32)."""
    return _OPS.moe_compute_expert_tokens(sorted_expert_for_source_row, num_expert)


@_args.torch_npu_api
def npu_moe_finalize_routing(expanded_permuted_rows: Tensor, skip1: Optional[Tensor], skip2: Optional[Tensor],
                             bias: Optional[Tensor], scales: Optional[Tensor], expanded_src_to_dst_row: Tensor,
                             export_for_source_row: Optional[Tensor], drop_pad_mode: Optional[int] = 0,
                             k: Optional[int] = 1) -> Tensor:
    """torch_npu.npu_moe_finalize_routing: skip1 + skip2 + sum_j scales * (expert row + bias[expert]).

    The token count N is scales.size(0), or without scales expanded_src_to_dst_row.numel() / k (k = the experts
    per token, default 1, as in torch_npu). skip2 needs skip1. None for drop_pad_mode / k means their defaults."""
    op = "npu_moe_finalize_routing"
    drop_pad_mode = _args.optional_int(op, "drop_pad_mode", drop_pad_mode, 0)
    k = _args.optional_int(op, "k", k, 1)
    if skip2 is not None and skip1 is None:
        raise ValueError(f"{op}: argument 'skip2' needs 'skip1' (pass the residual as skip1)")
    if k < 1:
        raise ValueError(f"{op}: argument 'k' (experts per token) must be >= 1; got {k}")
    if scales is None:
        pairs = expanded_src_to_dst_row.numel()
        if pairs % k:
            raise ValueError(f"{op}: argument 'expanded_src_to_dst_row' has {pairs} entries, not a multiple of "
                             f"k = {k} (the experts per token, which gives the token count without 'scales')")
        n = pairs // k
        for name, t in (("skip1", skip1), ("export_for_source_row", export_for_source_row)):
            if t is not None and (t.dim() != 2 or t.shape[0] != n):
                raise ValueError(f"{op}: argument '{name}' of shape {tuple(t.shape)} must have N = "
                                 f"expanded_src_to_dst_row.numel() / k = {pairs} / {k} = {n} rows (pass k, the "
                                 f"experts per token, when 'scales' is None)")
        if skip1 is None and export_for_source_row is None:
            # The op reads N from skip1, scales or export_for_source_row: unit weights give it N and k.
            scales = expanded_permuted_rows.new_ones((n, k))
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
