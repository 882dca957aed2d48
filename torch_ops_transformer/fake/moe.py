"""Fake (meta) kernels of the MoE family: gating, routing, token permutation and grouped_matmul.

Routing ops: Every output shape follows from the input shapes and the integer
arguments (no data-dependent sizes), so these are plain shape formulas plus the checks that need no data."""
import torch


def _gating_shape(op, x, k):
    e = x.shape[-1]
    torch._check(x.dim() in (2, 3), lambda: f"{op}: argument 'x' must be 2-D [N, E] or 3-D [B, S, E]")
    torch._check(1 <= k <= e, lambda: f"{op}: argument 'k' must satisfy 1 <= k <= num_experts ({e}); got k={k}")
    torch._check(k <= 1024, lambda: f"{op}: argument 'k' must be at most 1024; got k={k}")
    return (*x.shape[:-1], k)


def moe_gating_top_k_softmax(x, finished=None, k=1):
    shape = _gating_shape("moe_gating_top_k_softmax", x, k)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), x.new_empty(shape, dtype=torch.int32)


def _acc(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def moe_gating_top_k_softmax_v2(x, finished=None, k=1, renorm=0, output_softmax_result_flag=False):
    shape = _gating_shape("moe_gating_top_k_softmax_v2", x, k)
    sm = x.new_empty(x.shape, dtype=_acc(x)) if (output_softmax_result_flag and renorm == 0) \
        else x.new_empty((0,), dtype=_acc(x))
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int32), sm


def moe_gating_top_k_softmax_grad(grad_y, x, k, renorm=0):
    _gating_shape("moe_gating_top_k_softmax_grad", x, k)
    return x.new_empty(x.shape)


def moe_gating_top_k(x, k, bias=None, k_group=1, group_count=1, group_select_mode=0, renorm=0, norm_type=0,
                     out_flag=False, routed_scaling_factor=1.0, eps=1e-20):
    op = "moe_gating_top_k"
    torch._check(x.dim() == 2, lambda: f"{op}: argument 'x' must be 2-D [N, E]")
    n, e = x.shape
    torch._check(renorm == 0, lambda: f"{op}: argument 'renorm' must be 0; got {renorm}")
    torch._check(1 <= k <= 1024, lambda: f"{op}: argument 'k' must be in [1, 1024]; got {k}")
    out = x.new_empty((n, e), dtype=torch.float32) if out_flag else x.new_empty((0,), dtype=torch.float32)
    return x.new_empty((n, k)), x.new_empty((n, k), dtype=torch.int32), out


def moe_init_routing(x, row_idx, expert_idx, active_num):
    n, k = expert_idx.shape
    kept = torch.sym_min(n, active_num) * k
    return (x.new_empty((kept, x.shape[1])), x.new_empty((n * k,), dtype=torch.int32),
            x.new_empty((n * k,), dtype=torch.int32))


def moe_init_routing_v2(x, expert_idx, scale=None, offset=None, active_num=-1, expert_capacity=-1, expert_num=-1,
                        drop_pad_mode=0, expert_tokens_num_type=0, expert_tokens_num_flag=False, quant_mode=-1,
                        active_expert_range=(), row_idx_type=0):
    op = "moe_init_routing_v2"
    torch._check(quant_mode == -1, lambda: f"{op}: argument 'quant_mode' must be -1; got {quant_mode}")
    torch._check(drop_pad_mode in (0, 1), lambda: f"{op}: argument 'drop_pad_mode' must be 0 or 1")
    n_pairs = expert_idx.numel()
    h = x.shape[1]
    if drop_pad_mode == 1:
        torch._check(expert_num > 0 and expert_capacity > 0,
                     lambda: f"{op}: capacity mode needs expert_num > 0 and expert_capacity > 0")
        expanded = x.new_empty((expert_num, expert_capacity, h))
        rows = expert_num * expert_capacity
    else:
        rows = torch.sym_min(active_num, n_pairs) if active_num > 0 else n_pairs
        expanded = x.new_empty((rows, h))
    counted = 0
    if expert_tokens_num_flag:
        counted = active_expert_range[1] - active_expert_range[0] if len(active_expert_range) else expert_num
    tokens = x.new_empty((counted,), dtype=torch.int64)
    expanded_scale = x.new_empty((rows,) if scale is not None else (0,), dtype=torch.float32)
    return expanded, x.new_empty((n_pairs,), dtype=torch.int32), tokens, expanded_scale


def moe_init_routing_v2_grad(grad_expanded_x, expanded_row_idx, x, expert_idx, row_idx_type=0):
    return x.new_empty(x.shape)


def moe_compute_expert_tokens(sorted_expert_for_source_row, num_expert):
    torch._check(num_expert > 0, lambda: f"moe_compute_expert_tokens: argument 'num_expert' must be > 0")
    return sorted_expert_for_source_row.new_empty((num_expert,), dtype=torch.int32)


def _finalize_tokens(skip1, scales, export_for_source_row):
    for t in (skip1, scales, export_for_source_row):
        if t is not None:
            return t.shape[0]
    torch._check(False, lambda: "moe_finalize_routing: one of 'skip1', 'scales' or 'export_for_source_row' is needed")


def moe_finalize_routing(expanded_permuted_rows, skip1, skip2, bias, scales, expanded_src_to_dst_row,
                         export_for_source_row, drop_pad_mode=0):
    n = _finalize_tokens(skip1, scales, export_for_source_row)
    return expanded_permuted_rows.new_empty((n, expanded_permuted_rows.shape[-1]))


def moe_finalize_routing_grad(grad_out, expanded_permuted_rows, skip1, bias, scales, expanded_src_to_dst_row,
                              export_for_source_row, drop_pad_mode=0):
    d_rows = expanded_permuted_rows.new_empty(expanded_permuted_rows.shape)
    d_skip = grad_out.new_empty(grad_out.shape, dtype=expanded_permuted_rows.dtype)
    d_scales = scales.new_empty(scales.shape) if scales is not None else d_skip.new_empty((0,))
    d_bias = bias.new_empty(bias.shape) if bias is not None else d_skip.new_empty((0,))
    return d_rows, d_skip, d_scales, d_bias


def _kept_rows(n, num_out_tokens):
    v = num_out_tokens or 0
    if v == 0:
        return n
    return torch.sym_min(v, n) if v > 0 else torch.sym_max(n + v, 0)


def moe_token_permute(tokens, indices, num_out_tokens=None, padded_mode=False):
    torch._check(not padded_mode, lambda: "moe_token_permute: argument 'padded_mode' must be False")
    n = indices.numel()
    rows = _kept_rows(n, num_out_tokens)
    return tokens.new_empty((rows, tokens.shape[1])), indices.new_empty((n,), dtype=torch.int32)


def moe_token_permute_grad(grad_permuted_tokens, sorted_indices, indices):
    return grad_permuted_tokens.new_empty((indices.shape[0], grad_permuted_tokens.shape[1]))


def moe_token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False, restore_shape=None):
    torch._check(not padded_mode, lambda: "moe_token_unpermute: argument 'padded_mode' must be False")
    topk = probs.shape[-1] if probs is not None else 1
    return permuted_tokens.new_empty((sorted_indices.numel() // topk, permuted_tokens.shape[1]))


def moe_token_unpermute_grad(permuted_tokens, grad_unpermuted_tokens, sorted_indices, probs=None, padded_mode=False,
                             restore_shape=None):
    d_probs = probs.new_empty(probs.shape) if probs is not None else permuted_tokens.new_empty((0,))
    return permuted_tokens.new_empty(permuted_tokens.shape), d_probs


# grouped_matmul and its backward: output shapes follow from the input shapes alone (never from group_list's
# values), so torch.compile traces one graph for every group composition.

_ACTS = (0, 1, 2, 4, 5)


def _check_grouped(op, x, weight, group_type, group_list_type, act_type):
    torch._check(group_type in (-1, 0, 2), lambda: f"{op}: group_type must be -1 (lists), 0 (split x along M) or "
                                                   f"2 (split along K); got {group_type}")
    torch._check(group_list_type in (0, 1), lambda: f"{op}: group_list_type must be 0 (cumulative ends) or 1 "
                                                    f"(per-group counts); got {group_list_type}")
    torch._check(act_type in _ACTS, lambda: f"{op}: act_type must be 0 (none), 1 (relu), 2 (gelu_tanh), "
                                            f"4 (fast_gelu) or 5 (silu); got {act_type}")
    torch._check(len(x) > 0 and len(weight) > 0, lambda: f"{op}: x and weight must be non-empty lists")
    for i, t in enumerate(list(x) + list(weight)):
        torch._check(t.dtype == x[0].dtype, lambda: f"{op}: x and weight must share one dtype; got {t.dtype} "
                                                    f"and {x[0].dtype}")


def _out_shapes(x, weight, group_list, group_type):
    if group_type == -1:
        return [tuple(xi.shape[:-1]) + (wi.shape[1],) for xi, wi in zip(x, weight)]
    n = weight[0].shape[-1]
    if group_type == 0:
        return [(x[0].shape[0], n)]
    return [(group_list.shape[0], x[0].shape[0], n)]


def grouped_matmul(x, weight, bias, group_list=None, group_type=0, group_list_type=0, act_type=0):
    _check_grouped("grouped_matmul", x, weight, group_type, group_list_type, act_type)
    shapes = _out_shapes(x, weight, group_list, group_type)
    outs = [x[0].new_empty(s) for s in shapes]
    pres = [x[0].new_empty(s if act_type else (0,)) for s in shapes]
    return outs, pres


def grouped_matmul_grad(grad_out, x, weight, bias, group_list, act_input, group_type=0, group_list_type=0,
                        act_type=0):
    _check_grouped("grouped_matmul_grad", x, weight, group_type, group_list_type, act_type)
    return ([t.new_empty(t.shape) for t in x], [t.new_empty(t.shape) for t in weight],
            [t.new_empty(t.shape) for t in bias])
