"""Automatic mixed precision on the simulated npu device: `torch.autocast("npu")`, `torch.npu.amp.autocast()` and
`torch.amp.GradScaler("npu")` behave as on CUDA (docs/npu_sim.md).

PyTorch ships autocast kernels for CUDA and CPU only; a PrivateUse1 backend registers its own at the
AutocastPrivateUse1 key. Here: matmul-like ops run in the autocast dtype, numerically sensitive ones in float32
(the op lists follow CUDA's policy, abridged to the ops a transformer uses), every other op falls through unchanged.
"""
import functools
import types

import torch

_KEY = "AutocastPrivateUse1"
_DEVICE = "npu"

# Ops that run in the autocast dtype (fp16/bf16): the matrix products.
LOWER_PRECISION = ("mm", "bmm", "matmul", "linear", "addmm", "addbmm", "baddbmm", "addmv", "mv", "einsum",
                   "conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose1d",
                   "conv_transpose2d.input", "conv_transpose3d.input", "prelu", "scaled_dot_product_attention")
# Ops that run in float32: reductions over exponentials, norms and losses.
FLOAT32 = ("softmax.int", "log_softmax.int", "layer_norm", "native_layer_norm", "group_norm", "rms_norm",
           "logsumexp", "exp", "log", "log1p", "expm1", "rsqrt", "reciprocal", "pow.Tensor_Scalar",
           "pow.Tensor_Tensor", "nll_loss", "nll_loss_nd", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
           "kl_div", "binary_cross_entropy_with_logits", "cosine_similarity", "cumsum", "cumprod", "norm.Scalar",
           "norm.ScalarOpt_dim", "dist", "cdist", "softplus")

_libraries = []


def _op(qualified: str):
    name, _, overload = qualified.partition(".")
    return getattr(getattr(torch.ops.aten, name), overload or "default")


def _cast(value, dtype):
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.device.type == _DEVICE and value.dtype != torch.float64:
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _kernel(op, to_float32: bool):
    excluded = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

    def kernel(*args, **kwargs):
        dtype = torch.float32 if to_float32 else torch.get_autocast_dtype(_DEVICE)
        args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return op(*args, **kwargs)

    return kernel


def install() -> None:
    """Registers the autocast kernels (once per process; called by npu_sim.enable())."""
    if _libraries:
        return
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)
    lib = torch.library.Library("aten", "IMPL")
    for names, to_float32 in ((LOWER_PRECISION, False), (FLOAT32, True)):
        for qualified in names:
            lib.impl(qualified, _kernel(_op(qualified), to_float32), _KEY)
    _libraries.extend([fallthrough, lib])


def amp_module() -> types.ModuleType:
    """torch.npu.amp: autocast (torch.autocast on "npu", default float16 as on CUDA) and GradScaler."""
    amp = types.ModuleType("torch.npu.amp")

    class autocast(torch.autocast):  # noqa: N801  (torch's own spelling)
        def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
            super().__init__(_DEVICE, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    amp.autocast = autocast
    amp.GradScaler = functools.partial(torch.amp.GradScaler, _DEVICE)
    return amp
