"""Fake (meta) kernels of grouped_matmul and its backward: output shapes follow from the input shapes alone
(never from group_list's values), so torch.compile traces one graph for every group composition."""
import torch

_ACTS = (0, 1, 2, 4, 5)


def _check(op, x, weight, group_type, group_list_type, act_type):
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
    _check("grouped_matmul", x, weight, group_type, group_list_type, act_type)
    shapes = _out_shapes(x, weight, group_list, group_type)
    outs = [x[0].new_empty(s) for s in shapes]
    pres = [x[0].new_empty(s if act_type else (0,)) for s in shapes]
    return outs, pres


def grouped_matmul_grad(grad_out, x, weight, bias, group_list, act_input, group_type=0, group_list_type=0,
                        act_type=0):
    _check("grouped_matmul_grad", x, weight, group_type, group_list_type, act_type)
    return ([t.new_empty(t.shape) for t in x], [t.new_empty(t.shape) for t in weight],
            [t.new_empty(t.shape) for t in bias])
