"""A `cann_ops_transformer` stand-in (ops-transformer's own PyTorch extension) for machines without CANN: code that
calls its DeepSeek sparse attention functions — `cann_ops_transformer.ops.lightning_indexer(...)`,
`sparse_flash_mla(...)`, their `_metadata` functions, `sparse_flash_mla_grad`,
`sparse_lightning_indexer_kl_loss_grad` — runs on this package's DSA ops (docs/sparse_attention.md,
"cann_ops_transformer stand-in"). Opt-in, as the torch_npu shim:

- `torch_ops_transformer.compat.cann_ops_transformer.install()` — in this process, before
  `import cann_ops_transformer`;
- `PYTHONPATH=$(python -m torch_ops_transformer.compat --pythonpath) python train.py` — the torch_npu shim's
  directory holds `cann_ops_transformer` too, so the same PYTHONPATH gives both.

A real cann_ops_transformer always wins (already imported, or installed and importable). Installing the stand-in
installs the torch_npu shim as well (upstream's package imports torch_npu). Every other function of upstream's
`ops` is a stub that raises NotImplementedError naming it. `module()` builds the stand-in without installing it.
"""
import functools
import sys
import types
from pathlib import Path
from typing import Optional

import yaml

from ..._internal.real_torch_npu import PYTHONPATH_DIR, SHIM_MARK, not_implemented_stub, real_module_spec
from ..._internal.version import __version__
from . import indexer, metadata, sparse_flash_mla

NAME = "cann_ops_transformer"
_FUNCTIONS_FILE = Path(__file__).resolve().parent / "functions.yaml"
_MODULES = (indexer, metadata, sparse_flash_mla)


@functools.lru_cache(maxsize=None)
def upstream_functions() -> dict:
    """functions.yaml: the documented signatures of the implemented functions, the names of the others."""
    with open(_FUNCTIONS_FILE) as f:
        return yaml.safe_load(f)


def implemented_names():
    return [line.split("(", 1)[0] for line in upstream_functions()["implemented"]]


def _stub(name: str):
    return not_implemented_stub("cann_ops_transformer", name, "torch_ops_transformer's stand-in",
                                "docs/sparse_attention.md")


def _function(name: str):
    for mod in _MODULES:
        if hasattr(mod, name):
            return getattr(mod, name)
    raise LookupError(f"functions.yaml lists {name}, which no module of the stand-in defines")


def _fill(pkg: types.ModuleType) -> types.ModuleType:
    """Puts the functions into `pkg` and its `ops` submodule (upstream's package re-exports ops' names)."""
    ops = types.ModuleType(f"{NAME}.ops")
    for mod in (pkg, ops):
        for name in upstream_functions()["not_implemented"]:
            setattr(mod, name, _stub(name))
        for name in implemented_names():
            setattr(mod, name, _function(name))
        setattr(mod, SHIM_MARK, True)
        mod.__doc__ = __doc__
    pkg.ops = ops
    pkg.__version__ = f"0+torch_ops_transformer.{__version__}"
    return ops


@functools.lru_cache(maxsize=None)
def module() -> types.ModuleType:
    """The stand-in as a module object (with `.ops`), not installed anywhere."""
    pkg = types.ModuleType(NAME)
    _fill(pkg)
    return pkg


def is_shim(mod) -> bool:
    """The stand-in, or the placeholder `import cann_ops_transformer` creates from PYTHONPATH_DIR."""
    return bool(getattr(mod, SHIM_MARK, False)) or str(getattr(mod, "__file__", "") or "").startswith(
        str(PYTHONPATH_DIR / NAME))


def installed() -> bool:
    return is_shim(sys.modules.get(NAME))


def install(placeholder: Optional[types.ModuleType] = None) -> types.ModuleType:
    """Makes `import cann_ops_transformer` (and `cann_ops_transformer.ops`) work in this process; returns the module
    in use: a real one when it is imported or importable, else the stand-in (with the torch_npu shim installed)."""
    current = sys.modules.get(NAME)
    if current is not None and current is not placeholder:
        return current
    from .. import import_real_module, install as install_torch_npu  # lazy: compat imports this package

    spec = real_module_spec(NAME, PYTHONPATH_DIR)
    if spec is not None:
        real = import_real_module(NAME, spec, "torch_ops_transformer.compat.cann_ops_transformer")
        if real is not None:
            return real
    install_torch_npu()
    pkg = placeholder if placeholder is not None else types.ModuleType(NAME)
    if not hasattr(pkg, "__path__"):
        pkg.__path__ = []  # a package, so `import cann_ops_transformer.ops` resolves from sys.modules
    ops = _fill(pkg)
    sys.modules[NAME] = pkg
    sys.modules[f"{NAME}.ops"] = ops
    return pkg
