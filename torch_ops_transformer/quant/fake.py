"""Fake (meta) kernels of the activation-quantisation and SwiGLU ops: shape formulas plus the checks that need no
data."""
import torch


def dynamic_quant(a):
    op = "dynamic_quant"
    x = a.x
    torch._check(x.dim() >= 2, lambda: f"{op}: argument 'x' must have at least 2 dimensions")
    torch._check(a.bits in (8, 4), lambda: f"{op}: argument 'bits' must be 8 or 4; got {a.bits}")
    rows = tuple(x.shape[:-1])
    if a.bits == 4:
        torch._check(x.shape[-1] % 8 == 0, lambda: f"{op}: x.size(-1) must be a multiple of 8 for int4")
        y = x.new_empty((*rows, x.shape[-1] // 8), dtype=torch.int32)
    else:
        y = x.new_empty(x.shape, dtype=torch.int8)
    scale = x.new_empty(rows, dtype=torch.float32)
    offset = x.new_empty(rows if a.asymmetric else (0,), dtype=torch.float32)
    return y, scale, offset


def _half_shape(op, x, dim):
    torch._check(-x.dim() <= dim < x.dim(), lambda: f"{op}: argument 'dim' must be in [{-x.dim()}, {x.dim() - 1}]")
    d = dim % x.dim()
    torch._check(x.shape[d] % 2 == 0, lambda: f"{op}: argument 'x' must have an even size along dim {dim}")
    shape = list(x.shape)
    shape[d] = shape[d] // 2
    return shape


def swiglu(a):
    return a.x.new_empty(_half_shape("swiglu", a.x, a.dim))


def swiglu_grad(a):
    _half_shape("swiglu_grad", a.x, a.dim)
    return a.x.new_empty(a.x.shape)
