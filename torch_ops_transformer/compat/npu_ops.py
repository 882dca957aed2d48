"""`torch.ops.npu.<name>` for the torch_npu functions the shim mirrors.

torch_npu registers its functions as operators of the `npu` namespace too, and code written for it calls them that
way (vLLM-Ascend's `torch.ops.npu.npu_fused_infer_attention_score(...)`, graph-mode code that wants one node per
op). `register()` defines, for every schema line of torch_npu_functions.yaml's `mirrored` list whose function this
package implements, an operator `npu::<name>` with **upstream's schema line unchanged**, and gives it:

- a kernel for every backend (CompositeExplicitAutograd: the CPU and the simulated npu device) that calls our
  torch_npu-compatible wrapper (`torch_npu.<name>`);
- a fake kernel (torch.compile, FakeTensor, meta): the same wrapper on the fake tensors, as torch.compile traces it,
  which runs the fake kernels of the `npu_fa` ops it calls; an integer result read from the device (the seed and
  offset of npu_fusion_attention) is 0 in the trace (upstream's schema types it `int`, a value the trace bakes
  in), and a result that is one of the inputs a fresh tensor of its shape;
- an autograd kernel: with grad enabled and an input that requires grad, the call is the wrapper itself, so the
  gradient is that of our ops (what `torch_npu.<name>` gives); otherwise it dispatches below autograd to the two
  kernels above, so a compiled graph holds one `npu.<name>` node.

Nothing is written per op: the list is read when `register()` runs, so a function added to the mirrored list (and
implemented) is an operator at the next install. The torch_npu shim's `install()` calls it; it does nothing when a
real torch_npu is loaded (its operators are the real ones), and leaves alone a name the namespace already holds.
"""
import contextlib
from typing import Dict, List, Optional

import torch

from .._internal import args as _args
from .._internal.real_torch_npu import real_torch_npu_loaded

NAMESPACE = "npu"
_LIBRARY: Optional[torch.library.Library] = None
_REGISTERED: List[str] = []


def _schema_name(line: str) -> str:
    return line.split("(", 1)[0].strip()


def _flat_tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _flat_tensors(v)


def _fresh_if_input(result, inputs):
    """Under the fake kernel: a result that is an input tensor gets a fresh tensor of its shape and strides (the
    schema declares a new tensor)."""
    ids = {id(t) for t in inputs}

    def fresh(t):
        if isinstance(t, torch.Tensor) and id(t) in ids:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        return t

    if isinstance(result, tuple):
        return tuple(fresh(r) for r in result)
    if isinstance(result, list):
        return [fresh(r) for r in result]
    return fresh(result)


@contextlib.contextmanager
def _as_traced():
    """Runs a wrapper as torch.compile traces it: the integer results it reads from the device with .item() in
    eager mode (npu_fusion_attention's seed and offset) stay 0-d tensors."""
    previous = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = previous


def _int_results(result, int_slots):
    """An integer result the wrapper reads from the device (a 0-d tensor here) cannot be known while tracing, and
    upstream's schema types it `int` (a concrete value): the fake gives 0, the value of npu_fusion_attention's seed
    and offset without dropout and with the default seed."""
    if not int_slots:
        return result
    values = list(result)
    for i in int_slots:
        if isinstance(values[i], torch.Tensor):
            values[i] = 0
    return tuple(values)


def _kernels(name: str, fn, schema):
    int_slots = [i for i, r in enumerate(schema.returns) if str(r.type) in ("int", "SymInt")]

    def kernel(*args, **kwargs):
        return fn(*args, **kwargs)

    def fake(*args, **kwargs):
        with _as_traced():
            result = fn(*args, **kwargs)
        result = _int_results(result, int_slots)
        return _fresh_if_input(result, list(_flat_tensors(list(args) + list(kwargs.values()))))

    def autograd(*args, **kwargs):
        if torch.is_grad_enabled() and any(
                t.requires_grad for t in _flat_tensors(list(args) + list(kwargs.values()))):
            return fn(*args, **kwargs)  # differentiable: our ops' own autograd
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(torch.ops.npu, name)(*args, **kwargs)

    for k in (kernel, fake, autograd):
        k.__name__ = k.__qualname__ = f"{name}_{k.__name__}"
    return kernel, fake, autograd


def _exists(name: str) -> bool:
    return hasattr(getattr(torch.ops, NAMESPACE), name)


def mirrored_schemas() -> Dict[str, str]:
    """name -> upstream schema line, for every mirrored function this package implements (read now, not cached)."""
    from . import upstream_functions  # lazy: compat imports this module (circular at import time)

    lines = {_schema_name(line): line for line in upstream_functions()["mirrored"]}
    return {name: line for name, line in lines.items() if name in _args.TORCH_NPU_API}


def register() -> bool:
    """Defines `torch.ops.npu.<name>` for every mirrored function (idempotent; names already defined are left as
    they are). Returns False, registering nothing, when a real torch_npu is loaded."""
    global _LIBRARY
    if real_torch_npu_loaded():
        return False
    for name, line in mirrored_schemas().items():
        if name in _REGISTERED or _exists(name):
            continue
        if _LIBRARY is None:
            _LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
        kernel, fake, autograd = _kernels(name, _args.TORCH_NPU_API[name], torch._C.parse_schema(line))
        _LIBRARY.define(line)
        _LIBRARY.impl(name, kernel, "CompositeExplicitAutograd")
        _LIBRARY.impl(name, autograd, "Autograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
        _REGISTERED.append(name)
    return True


def registered() -> List[str]:
    """The operators `register()` defined in this process."""
    return list(_REGISTERED)
