"""Fake (meta) kernels of the MC2 ops: output shapes only, no communication (torch.compile traces through them)."""
import torch


def _matmul_shape_checks(op, x1, x2):
    torch._check(x1.shape[-1] == x2.shape[0], lambda: f"{op}: x1's last dim must equal x2's first dim; got "
                 f"{tuple(x1.shape)} and {tuple(x2.shape)}")
    torch._check(x1.dtype == x2.dtype, lambda: f"{op}: x2's dtype ({x2.dtype}) must equal x1's ({x1.dtype})")


def _empty_or_like(t, like):
    return like.new_empty(0) if t is None else torch.empty_like(t)


def all_gather_matmul(a):
    _matmul_shape_checks("all_gather_matmul", a.x1, a.x2)
    m, k = a.x1.shape
    out = a.x1.new_empty((a.world_size * m, a.x2.shape[1]))
    gathered = a.x1.new_empty((a.world_size * m, k)) if a.gather_output else a.x1.new_empty((0, k))
    return out, gathered


def all_gather_matmul_grad(a):
    return torch.empty_like(a.x1), torch.empty_like(a.x2), _empty_or_like(a.bias, a.x1)


def matmul_reduce_scatter(a):
    _matmul_shape_checks("matmul_reduce_scatter", a.x1, a.x2)
    torch._check(a.x1.shape[0] % a.world_size == 0,
                 lambda: f"matmul_reduce_scatter: x1's first dim must be divisible by world_size ({a.world_size})")
    return a.x1.new_empty((a.x1.shape[0] // a.world_size, a.x2.shape[1]))


def matmul_reduce_scatter_grad(a):
    return torch.empty_like(a.x1), torch.empty_like(a.x2), _empty_or_like(a.bias, a.x1)


def _x3_check(op, x3, shape):
    if x3 is not None:
        torch._check(tuple(x3.shape) == tuple(shape),
                     lambda: f"{op}: x3 must have the output's shape {tuple(shape)}; got {tuple(x3.shape)}")


def matmul_all_reduce(a):
    _matmul_shape_checks("matmul_all_reduce", a.x1, a.x2)
    shape = (*a.x1.shape[:-1], a.x2.shape[1])
    _x3_check("matmul_all_reduce", a.x3, shape)
    return a.x1.new_empty(shape)


def matmul_all_reduce_grad(a):
    return (torch.empty_like(a.x1), torch.empty_like(a.x2), _empty_or_like(a.bias, a.x1),
            _empty_or_like(a.x3, a.x1))


def matmul_all_reduce_add_rms_norm(a):
    _matmul_shape_checks("matmul_all_reduce_add_rms_norm", a.x1, a.x2)
    _x3_check("matmul_all_reduce_add_rms_norm", a.x3, a.residual.shape)
    return torch.empty_like(a.residual), torch.empty_like(a.residual)
