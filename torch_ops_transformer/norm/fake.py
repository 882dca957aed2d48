"""Fake (meta) kernels of the RMSNorm ops: shape formulas plus the checks that need no data."""
import torch


def _acc(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_gamma(op, gamma, x, xname="x"):
    k = gamma.dim()
    torch._check(1 <= k <= x.dim() and tuple(gamma.shape) == tuple(x.shape[x.dim() - k:]),
                 lambda: f"{op}: argument 'gamma' must have the shape of the trailing dimensions of {xname}; got "
                         f"{tuple(gamma.shape)} for {tuple(x.shape)}")


def _rstd(op, x, gamma):
    _check_gamma(op, gamma, x)
    k = gamma.dim()
    return x.new_empty((*x.shape[:x.dim() - k], *([1] * k)), dtype=_acc(x))


def rms_norm(a):
    return a.x.new_empty(a.x.shape), _rstd("rms_norm", a.x, a.gamma)


def rms_norm_grad(a):
    _check_gamma("rms_norm_grad", a.gamma, a.x)
    return a.x.new_empty(a.x.shape), a.x.new_empty(a.gamma.shape, dtype=_acc(a.x))


def _check_add(op, a):
    torch._check(tuple(a.x2.shape) == tuple(a.x1.shape),
                 lambda: f"{op}: argument 'x2' must have x1's shape {tuple(a.x1.shape)}; got {tuple(a.x2.shape)}")
    return _rstd(op, a.x1, a.gamma)


def add_rms_norm(a):
    rstd = _check_add("add_rms_norm", a)
    return a.x1.new_empty(a.x1.shape), rstd, a.x1.new_empty(a.x1.shape)


def add_rms_norm_cast(a):
    rstd = _check_add("add_rms_norm_cast", a)
    x = a.x1
    return x.new_empty(x.shape, dtype=torch.float32), x.new_empty(x.shape), rstd, x.new_empty(x.shape)


def add_rms_norm_quant(a):
    op = "add_rms_norm_quant"
    _check_add(op, a)
    torch._check(a.axis == -1, lambda: f"{op}: argument 'axis' must be -1; got {a.axis}")
    x = a.x1
    return x.new_empty(x.shape, dtype=torch.int8), x.new_empty(x.shape, dtype=torch.int8), x.new_empty(x.shape)


def add_rms_norm_dynamic_quant(a):
    op = "add_rms_norm_dynamic_quant"
    _check_add(op, a)
    torch._check(a.gamma.dim() == 1, lambda: f"{op}: argument 'gamma' must be 1-D [H]")
    torch._check(a.output_y1 or a.output_y2, lambda: f"{op}: at least one of the outputs y1, y2 must be asked for")
    x = a.x1
    outs = []
    for want in (a.output_y1, a.output_y2):
        outs.append((x.new_empty(x.shape if want else (), dtype=torch.int8),
                     x.new_empty(tuple(x.shape[:-1]) if want else (), dtype=torch.float32)))
    return outs[0][0], outs[1][0], x.new_empty(x.shape), outs[0][1], outs[1][1]


def rms_norm_quant(a):
    op = "rms_norm_quant"
    torch._check(a.x.dim() >= 1, lambda: f"{op}: argument 'x' must have at least 1 dimension")
    return a.x.new_empty(a.x.shape, dtype=torch.int8)
