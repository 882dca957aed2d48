"""Fake (meta) kernels of the MoE family: gating, routing, token permutation, grouped_matmul, and (last section)
the expert-parallel dispatch / combine.

Routing ops: Every output shape follows from the input shapes and the integer
arguments (no data-dependent sizes), so these are plain shape formulas plus the checks that need no data."""
import torch

from .._internal.args import SCALAR_TYPE_CODES


def _gating_shape(op, x, k):
    e = x.shape[-1]
    torch._check(x.dim() in (2, 3), lambda: f"{op}: argument 'x' must be 2-D [N, E] or 3-D [B, S, E]")
    torch._check(1 <= k <= e, lambda: f"{op}: argument 'k' must satisfy 1 <= k <= num_experts ({e}); got k={k}")
    torch._check(k <= 1024, lambda: f"{op}: argument 'k' must be at most 1024; got k={k}")
    return (*x.shape[:-1], k)


def moe_gating_top_k_softmax(a):
    shape = _gating_shape("moe_gating_top_k_softmax", a.x, a.k)
    return a.x.new_empty(shape), a.x.new_empty(shape, dtype=torch.int32), a.x.new_empty(shape, dtype=torch.int32)


def _acc(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def moe_gating_top_k_softmax_v2(a):
    shape = _gating_shape("moe_gating_top_k_softmax_v2", a.x, a.k)
    sm = a.x.new_empty(a.x.shape, dtype=_acc(a.x)) if (a.output_softmax_result_flag and a.renorm == 0) \
        else a.x.new_empty((0,), dtype=_acc(a.x))
    return a.x.new_empty(shape), a.x.new_empty(shape, dtype=torch.int32), sm


def moe_gating_top_k_softmax_grad(a):
    _gating_shape("moe_gating_top_k_softmax_grad", a.x, a.k)
    return a.x.new_empty(a.x.shape)


def moe_gating_top_k(a):
    op = "moe_gating_top_k"
    torch._check(a.x.dim() == 2, lambda: f"{op}: argument 'x' must be 2-D [N, E]")
    n, e = a.x.shape
    torch._check(a.renorm == 0, lambda: f"{op}: argument 'renorm' must be 0; got {a.renorm}")
    torch._check(1 <= a.k <= 1024, lambda: f"{op}: argument 'k' must be in [1, 1024]; got {a.k}")
    out = a.x.new_empty((n, e), dtype=torch.float32) if a.out_flag else a.x.new_empty((0,), dtype=torch.float32)
    return a.x.new_empty((n, a.k)), a.x.new_empty((n, a.k), dtype=torch.int32), out


def moe_gating_top_k_grad(a):
    op = "moe_gating_top_k_grad"
    torch._check(a.grad_y.dim() == 2, lambda: f"{op}: argument 'grad_y' must be 2-D [N, k]")
    src = a.x if (a.x is not None and a.x_norm.numel() == 0) else a.x_norm
    torch._check(src.dim() == 2, lambda: f"{op}: argument 'x_norm' must be [N, E] (or empty with 'x' given)")
    dtype = a.x.dtype if src is a.x else a.grad_y.dtype
    return a.grad_y.new_empty((a.grad_y.shape[0], src.shape[1]), dtype=dtype)


def moe_init_routing(a):
    n, k = a.expert_idx.shape
    kept = torch.sym_min(n, a.active_num) * k
    return (a.x.new_empty((kept, a.x.shape[1])), a.x.new_empty((n * k,), dtype=torch.int32),
            a.x.new_empty((n * k,), dtype=torch.int32))


def moe_init_routing_v2(a):
    op = "moe_init_routing_v2"
    torch._check(a.quant_mode in (-1, 0, 1), lambda: f"{op}: argument 'quant_mode' must be -1, 0 or 1; got "
                                                      f"{a.quant_mode}")
    out_dtype = a.x.dtype if a.quant_mode == -1 else torch.int8
    torch._check(a.drop_pad_mode in (0, 1), lambda: f"{op}: argument 'drop_pad_mode' must be 0 or 1")
    n_pairs = a.expert_idx.numel()
    h = a.x.shape[1]
    if a.drop_pad_mode == 1:
        torch._check(a.expert_num > 0 and a.expert_capacity > 0,
                     lambda: f"{op}: capacity mode needs expert_num > 0 and expert_capacity > 0")
        expanded = a.x.new_empty((a.expert_num, a.expert_capacity, h), dtype=out_dtype)
        rows = a.expert_num * a.expert_capacity
    else:
        rows = torch.sym_min(a.active_num, n_pairs) if a.active_num > 0 else n_pairs
        expanded = a.x.new_empty((rows, h), dtype=out_dtype)
    counted = 0
    if a.expert_tokens_num_flag:
        counted = a.active_expert_range[1] - a.active_expert_range[0] if len(a.active_expert_range) else a.expert_num
    if a.expert_tokens_num_flag and a.expert_tokens_num_type == 2:  # (expert, count) rows
        tokens = a.x.new_empty((a.expert_num, 2), dtype=torch.int64)
    else:
        tokens = a.x.new_empty((counted,), dtype=torch.int64)
    # scale gathered per row (-1), the dynamic per-row scales (1), nothing (0: static)
    with_scale = a.quant_mode == 1 or (a.quant_mode == -1 and a.scale is not None)
    expanded_scale = a.x.new_empty((rows,) if with_scale else (0,), dtype=torch.float32)
    return expanded, a.x.new_empty((n_pairs,), dtype=torch.int32), tokens, expanded_scale


def moe_init_routing_v2_grad(a):
    return a.x.new_empty(a.x.shape)


def moe_compute_expert_tokens(a):
    torch._check(a.num_expert > 0, lambda: f"moe_compute_expert_tokens: argument 'num_expert' must be > 0")
    return a.sorted_expert_for_source_row.new_empty((a.num_expert,), dtype=torch.int32)


def _finalize_tokens(skip1, scales, export_for_source_row):
    for t in (skip1, scales, export_for_source_row):
        if t is not None:
            return t.shape[0]
    torch._check(False, lambda: "moe_finalize_routing: one of 'skip1', 'scales' or 'export_for_source_row' is needed")


def moe_finalize_routing(a):
    n = _finalize_tokens(a.skip1, a.scales, a.export_for_source_row)
    return a.expanded_permuted_rows.new_empty((n, a.expanded_permuted_rows.shape[-1]))


def moe_finalize_routing_grad(a):
    d_rows = a.expanded_permuted_rows.new_empty(a.expanded_permuted_rows.shape)
    d_skip = a.grad_out.new_empty(a.grad_out.shape, dtype=a.expanded_permuted_rows.dtype)
    d_scales = a.scales.new_empty(a.scales.shape) if a.scales is not None else d_skip.new_empty((0,))
    d_bias = a.bias.new_empty(a.bias.shape) if a.bias is not None else d_skip.new_empty((0,))
    return d_rows, d_skip, d_scales, d_bias


def _kept_rows(n, num_out_tokens):
    v = num_out_tokens or 0
    if v == 0:
        return n
    return torch.sym_min(v, n) if v > 0 else torch.sym_max(n + v, 0)


def moe_token_permute(a):
    torch._check(not a.padded_mode, lambda: "moe_token_permute: argument 'padded_mode' must be False")
    n = a.indices.numel()
    rows = _kept_rows(n, a.num_out_tokens)
    return a.tokens.new_empty((rows, a.tokens.shape[1])), a.indices.new_empty((n,), dtype=torch.int32)


def moe_token_permute_grad(a):
    return a.grad_permuted_tokens.new_empty((a.indices.shape[0], a.grad_permuted_tokens.shape[1]))


def moe_token_unpermute(a):
    torch._check(not a.padded_mode, lambda: "moe_token_unpermute: argument 'padded_mode' must be False")
    topk = a.probs.shape[-1] if a.probs is not None else 1
    return a.permuted_tokens.new_empty((a.sorted_indices.numel() // topk, a.permuted_tokens.shape[1]))


def moe_token_unpermute_grad(a):
    d_probs = a.probs.new_empty(a.probs.shape) if a.probs is not None else a.permuted_tokens.new_empty((0,))
    return a.permuted_tokens.new_empty(a.permuted_tokens.shape), d_probs


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


def grouped_matmul(a):
    _check_grouped("grouped_matmul", a.x, a.weight, a.group_type, a.group_list_type, a.act_type)
    shapes = _out_shapes(a.x, a.weight, a.group_list, a.group_type)
    outs = [a.x[0].new_empty(s) for s in shapes]
    pres = [a.x[0].new_empty(s if a.act_type else (0,)) for s in shapes]
    return outs, pres


def grouped_matmul_grad(a):
    _check_grouped("grouped_matmul_grad", a.x, a.weight, a.group_type, a.group_list_type, a.act_type)
    return ([t.new_empty(t.shape) for t in a.x], [t.new_empty(t.shape) for t in a.weight],
            [t.new_empty(t.shape) for t in a.bias])


# Quantised grouped matmul: int32 weights hold eight int4 values along N.
def _quant_n(w):
    return w.shape[-1] * (8 if w.dtype == torch.int32 else 1)


def grouped_matmul_quant(a):
    op = "grouped_matmul_quant"
    torch._check(len(a.x) > 0 and len(a.weight) > 0, lambda: f"{op}: x and weight must be non-empty lists")
    torch._check(a.group_type in (-1, 0), lambda: f"{op}: argument 'group_type' must be -1 or 0; got {a.group_type}")
    xdt = a.x[0].dtype
    weight_only = xdt in (torch.bfloat16, torch.float16)
    if a.output_dtype == -1:
        odt = xdt if weight_only else (torch.int32 if len(a.scale) == 0 else torch.int8)
    else:
        odt = SCALAR_TYPE_CODES.get(a.output_dtype)
        torch._check(odt is not None, lambda: f"{op}: unsupported output_dtype code {a.output_dtype}")
    if a.group_type == -1:
        return [xi.new_empty(tuple(xi.shape[:-1]) + (_quant_n(wi),), dtype=odt) for xi, wi in zip(a.x, a.weight)]
    return [a.x[0].new_empty((a.x[0].shape[0], _quant_n(a.weight[0])), dtype=odt)]


def grouped_matmul_swiglu_quant(a):
    op = "grouped_matmul_swiglu_quant"
    torch._check(a.x.dim() == 2 and a.weight.dim() == 3 and a.weight.shape[2] % 2 == 0,
                 lambda: f"{op}: x must be [M, K] and weight [E, K, N] with N even")
    m, n = a.x.shape[0], a.weight.shape[2]
    return (a.x.new_empty((m, n // 2), dtype=torch.int8), a.x.new_empty((m,), dtype=torch.float32),
            a.x.new_empty((), dtype=torch.float32))


def moe_ffn(a):
    torch._check(a.x.dim() == 2, lambda: f"moe_ffn: argument 'x' must be [T, H]; got shape {tuple(a.x.shape)}")
    return a.x.new_empty(a.x.shape)


def moe_ffn_prepack(a):
    w = a.weight
    torch._check(w.dim() == 3, lambda: f"moe_ffn_prepack: argument 'weight' must be 3-D; got shape {tuple(w.shape)}")
    n, k = (w.shape[1], w.shape[2]) if a.weight_layout == "nk" else (w.shape[2], w.shape[1])
    blocks = (n // 2 + 31) // 32 if a.gated else (n + 63) // 64
    kp = (k + 1) // 2 * 2 if w.element_size() == 2 else k
    return w.new_empty((w.shape[0], blocks, kp, 2, 32) if a.gated else (w.shape[0], blocks, kp, 64))


# ---- Expert-parallel dispatch / combine -------------------------------------------------------------------------
# Fake (meta) kernels of the expert-parallel dispatch / combine ops: output shapes only, no communication. The
# received row count is data-dependent, so dispatch's outputs have the static capacity A = G * min(L, K) of
# upstream's kernel (G = global_bs, or BS * ep_world_size; L = moe_expert_num / ep_world_size).

def _capacity(a):
    bs, k = a.expert_ids.shape
    g = a.global_bs if a.global_bs else bs * a.ep_world_size
    return g * min(a.moe_expert_num // a.ep_world_size, k)


def moe_distribute_dispatch_v2(a):
    bs, h = a.x.shape
    k = a.expert_ids.shape[1]
    cap = _capacity(a)
    local = a.moe_expert_num // a.ep_world_size
    x = a.x
    return (x.new_empty((cap, h), dtype=torch.int8 if a.quant_mode == 2 else x.dtype),
            x.new_empty((cap,), dtype=torch.float32),
            x.new_empty((max(bs * k, 128 * cap),), dtype=torch.int32),
            x.new_empty((local,), dtype=torch.int64),
            x.new_empty((a.ep_world_size * local,), dtype=torch.int32),
            x.new_empty((a.tp_world_size,), dtype=torch.int32),
            x.new_empty((cap,), dtype=torch.float32))


def moe_distribute_dispatch_v2_grad(a):
    return torch.empty_like(a.x, memory_format=torch.contiguous_format)


def moe_distribute_combine_v2(a):
    return a.expand_x.new_empty((a.expert_ids.shape[0], a.expand_x.shape[1]))


def moe_distribute_combine_v2_grad(a):
    shared = a.shared_expert_x
    return (torch.empty_like(a.expand_x, memory_format=torch.contiguous_format),
            torch.empty_like(a.expert_scales, memory_format=torch.contiguous_format),
            a.expand_x.new_empty(0) if shared is None else torch.empty_like(shared,
                                                                             memory_format=torch.contiguous_format))


def grouped_matmul_add(a):
    op = "grouped_matmul_add"
    torch._check(a.group_type == 2, lambda: f"{op}: argument 'group_type' must be 2; got {a.group_type}")
    torch._check(a.x.dim() == 2 and a.weight.dim() == 2,
                 lambda: f"{op}: arguments 'x' and 'weight' must be 2-D [M, K] and [M, N]")
    return None
