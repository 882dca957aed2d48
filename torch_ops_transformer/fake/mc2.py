"""Fake (meta) kernels of the MC2 ops: output shapes only, no communication (torch.compile traces through them)."""
import torch


def _matmul_shape_checks(op, x1, x2):
    torch._check(x1.shape[-1] == x2.shape[0], lambda: f"{op}: x1's last dim must equal x2's first dim; got "
                 f"{tuple(x1.shape)} and {tuple(x2.shape)}")
    torch._check(x1.dtype == x2.dtype, lambda: f"{op}: x2's dtype ({x2.dtype}) must equal x1's ({x1.dtype})")


def _empty_or_like(t, like):
    return like.new_empty(0) if t is None else torch.empty_like(t)


def all_gather_matmul(x1, x2, group_name, world_size, bias=None, gather_index=0, gather_output=True, chunks=0):
    _matmul_shape_checks("all_gather_matmul", x1, x2)
    m, k = x1.shape
    out = x1.new_empty((world_size * m, x2.shape[1]))
    gathered = x1.new_empty((world_size * m, k)) if gather_output else x1.new_empty((0, k))
    return out, gathered


def all_gather_matmul_grad(grad_out, x1, x2, gather_out, group_name, world_size, bias=None, chunks=0):
    return torch.empty_like(x1), torch.empty_like(x2), _empty_or_like(bias, x1)


def matmul_reduce_scatter(x1, x2, group_name, world_size, bias=None, chunks=0):
    _matmul_shape_checks("matmul_reduce_scatter", x1, x2)
    torch._check(x1.shape[0] % world_size == 0,
                 lambda: f"matmul_reduce_scatter: x1's first dim must be divisible by world_size ({world_size})")
    return x1.new_empty((x1.shape[0] // world_size, x2.shape[1]))


def matmul_reduce_scatter_grad(grad_out, x1, x2, group_name, world_size, bias=None, chunks=0):
    return torch.empty_like(x1), torch.empty_like(x2), _empty_or_like(bias, x1)


def matmul_all_reduce(x1, x2, group_name, bias=None, chunks=0):
    _matmul_shape_checks("matmul_all_reduce", x1, x2)
    return x1.new_empty((*x1.shape[:-1], x2.shape[1]))


def matmul_all_reduce_grad(grad_out, x1, x2, bias=None):
    return torch.empty_like(x1), torch.empty_like(x2), _empty_or_like(bias, x1)


def matmul_all_reduce_add_rms_norm(x1, x2, residual, gamma, group_name, bias=None, epsilon=1e-6, chunks=0):
    _matmul_shape_checks("matmul_all_reduce_add_rms_norm", x1, x2)
    return torch.empty_like(residual), torch.empty_like(residual)
