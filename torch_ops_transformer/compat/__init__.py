"""A `torch_npu` stand-in for machines without CANN: code written for torch_npu runs unchanged on the CPU
(docs/torch_npu_compat.md). A development and CI shim, opt-in and explicit:

- `torch_ops_transformer.compat.install()` — in this process: `import torch_npu` then gives the shim, tensors go to
  the simulated "npu" device (`.npu()`, `device="npu"`, `torch.npu.*`);
- `PYTHONPATH=$(python -m torch_ops_transformer.compat --pythonpath) python train.py` — the same for a whole program
  and its subprocesses, without editing it;
- `python -m torch_ops_transformer.compat train.py [args]` — installs, then runs the script as `__main__`.

Never shadows the real thing: when a real torch_npu imports, it is used and nothing is installed. The shim holds every
`torch_npu.npu_*` function this package implements (upstream's signatures, held to them by
test/compat/test_signature_parity.py) and, for every other upstream function, a stub that raises NotImplementedError
naming it. `module()` builds the shim without installing anything (for tests that compare against the CPU backend).
"""
import functools
import importlib.util
import os
import runpy
import sys
import types
import warnings
from pathlib import Path
from typing import Optional

import torch
import yaml

from .. import npu_sim
from .._internal import args as _args
from .._internal.real_torch_npu import (NOT_IMPLEMENTED_MARK, PYTHONPATH_DIR, SHIM_MARK,  # noqa: F401 (API)
                                        is_shim, not_implemented_stub, real_module_spec, real_torch_npu_loaded,
                                        real_torch_npu_spec)
from .._internal.version import __version__
from . import hccl_names

_FUNCTIONS_FILE = Path(__file__).resolve().parent / "torch_npu_functions.yaml"


@functools.lru_cache(maxsize=None)
def upstream_functions() -> dict:
    """torch_npu_functions.yaml: upstream's schema lines of the mirrored functions, the names of the others."""
    with open(_FUNCTIONS_FILE) as f:
        return yaml.safe_load(f)






def _not_implemented_stub(name: str):
    return not_implemented_stub("torch_npu", name, "torch_ops_transformer (the torch_npu shim)",
                                "docs/torch_npu_compat.md")


def _fill(mod: types.ModuleType) -> types.ModuleType:
    """Puts the shim's contents into `mod` (a fresh module, or the placeholder `import torch_npu` created)."""
    for name in upstream_functions()["not_implemented"]:
        setattr(mod, name, _not_implemented_stub(name))
    for name, fn in _args.TORCH_NPU_API.items():
        setattr(mod, name, fn)
    for name, code in _args.TORCH_NPU_DTYPE_CODES.items():  # torch_npu.hifloat8, float4_e2m1fn_x2, ...
        setattr(mod, name, code)
    from . import atb, formats  # lazy: atb imports the package (circular at import time)

    mod.npu_format_cast, mod.get_npu_format = formats.npu_format_cast, formats.get_npu_format
    mod.empty_with_format, mod.Format = formats.empty_with_format, formats.Format
    mod._C = formats.c_module()  # torch_npu._C._npu_getOption (the option torch_npu's tests save and restore)
    for name, fn in atb.FUNCTIONS.items():  # the ATB functions torch_npu puts on itself (op_plugin.atb._atb_ops)
        setattr(mod, name, fn)
    setattr(mod, SHIM_MARK, True)
    mod.__version__ = f"0+torch_ops_transformer.{__version__}"
    mod.__doc__ = __doc__
    # torch_npu.npu is torch.npu (the device module) once the simulated device is installed.
    mod.npu = getattr(torch, "npu", None) if npu_sim.is_enabled() else npu_sim.unavailable_device_module()
    mod.npu.get_soc_version = formats.get_soc_version
    return mod


@functools.lru_cache(maxsize=None)
def module() -> types.ModuleType:
    """The shim as a module object, not installed anywhere (`torch_npu.npu.is_available()` is False unless the
    simulated device is enabled)."""
    return _fill(types.ModuleType("torch_npu"))




def import_real_module(name: str, spec, shim: str):
    """Imports the real module `name` from `spec` under its own name; returns it, or None (its partial imports
    undone) with a warning naming the reason and that `shim` takes over. Shared by the torch_npu and flash_attn
    shims (a real torch_npu without CANN, a real flash_attn without CUDA fail here)."""
    previous = sys.modules.get(name)
    real = importlib.util.module_from_spec(spec)
    sys.modules[name] = real
    try:
        spec.loader.exec_module(real)
        return real
    except Exception as e:  # ImportError, OSError, RuntimeError depending on the package and its release
        for loaded in [n for n in sys.modules if n == name or n.startswith(name + ".")]:
            del sys.modules[loaded]
        if previous is not None:
            sys.modules[name] = previous
        warnings.warn(f"{shim}: the installed {name} ({spec.origin}) cannot be imported ({type(e).__name__}: {e}); "
                      f"using the CPU shim instead")
        return None


def run_with_shim(argv, usage: str, shim_dir: Path, install_shim) -> int:
    """`python -m <shim> --pythonpath | SCRIPT [ARGS...]`: prints the shim's PYTHONPATH directory, or installs the
    shim and runs SCRIPT as `__main__`. Shared by the torch_npu and flash_attn shims."""
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] == "--pythonpath":
        print(shim_dir)
        return 0
    install_shim()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")
    return 0




def install(placeholder: Optional[types.ModuleType] = None) -> types.ModuleType:
    """Makes `import torch_npu` work in this process; returns the torch_npu module in use.

    A real torch_npu (already imported, or installed and importable) wins and nothing else happens. Otherwise the
    simulated npu device is enabled and the shim becomes `sys.modules["torch_npu"]` (and `torch_npu.npu`)."""
    current = sys.modules.get("torch_npu")
    if current is not None and current is not placeholder:
        return current
    spec = real_torch_npu_spec()
    if spec is not None:
        real = import_real_module("torch_npu", spec, "torch_ops_transformer.compat")
        if real is not None:
            return real
    npu_sim.enable(installed_torch_npu_failed=spec is not None)
    mod = _fill(placeholder if placeholder is not None else types.ModuleType("torch_npu"))
    # torch_npu.contrib, .profiler, .op_plugin: the shim's submodule files (PYTHONPATH_DIR/torch_npu)
    mod.__path__ = [str(PYTHONPATH_DIR / "torch_npu")]
    if not getattr(mod, "__file__", None):
        mod.__file__ = str(PYTHONPATH_DIR / "torch_npu" / "__init__.py")
    sys.modules["torch_npu"] = mod
    sys.modules["torch_npu.npu"] = mod.npu
    utils = types.ModuleType("torch_npu.npu.utils")  # torch_npu's device utilities: the device module's functions
    utils.__dict__.update({k: v for k, v in vars(mod.npu).items() if not k.startswith("__")})
    mod.npu.utils = sys.modules["torch_npu.npu.utils"] = utils
    hccl_names.install()  # group.get_hccl_comm_name(rank) and friends, for the MC2 functions' `hcom`
    from . import npu_ops  # lazy: only when the shim is installed

    npu_ops.register()  # torch.ops.npu.<name> for every mirrored function
    from . import testing  # lazy: as in _fill

    for name, sub in testing.modules().items():  # torch_npu.testing: what torch_npu's own tests import
        sys.modules[name] = sub
    mod.testing = sys.modules["torch_npu.testing"]
    # torch_npu adds these Tensor methods; plain formats only here
    torch.Tensor.npu_format_cast = testing.npu_format_cast
    for name in ("contrib", "profiler", "op_plugin"):  # importable as attributes too (`torch_npu.profiler.profile`)
        importlib.import_module(f"torch_npu.{name}")
    return mod


def installed() -> bool:
    return is_shim(sys.modules.get("torch_npu"))
