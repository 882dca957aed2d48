"""The package's old dotted module paths, still importable: one table, one finder, one DeprecationWarning each.

The package was reorganised family-first (attention/, inference/, rope/, ...) with role packages (integrations/,
npu_sim/, compat/, bench/) and private ones (_internal/, _library/). Code that imports an old path —
`import torch_ops_transformer.sdpa`, `from torch_ops_transformer import fa2`, `torch_ops_transformer.tuning` as an
attribute — gets the new module itself (the same object, so monkeypatching and isinstance work) and a
DeprecationWarning naming the new path. Nothing is imported until an old path is used.
"""
import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Optional

PACKAGE = __name__.split(".")[0]

# old path (relative to the package) -> new path. Families whose flat module became a package of the same name
# (attention, inference, rope, kv_cache, quant, mla, npu_sim) keep their path and re-export their public API.
OLD_PATHS = {
    "_args": "_internal.args",
    "_optional": "_internal.optional",
    "_spawn": "_internal.spawn",
    "layout": "_internal.layout",
    "_ops_loader": "_library.loader",
    "_generated": "_library.generated",
    "_generated.registrations": "_library.generated.registrations",
    "fa2": "attention.fa2",
    "fa2_dmask": "attention.fa2",
    "tuning": "attention.tuning",
    "mla_prolog": "mla.prolog",
    "fake": None,  # held the fake kernels by family; now each family package has its fake.py
    "fake.attention": "attention.fake",
    "fake.inference": "inference.fake",
    "fake.rope": "rope.fake",
    "fake.kv_cache": "kv_cache.fake",
    "fake.mla": "mla.fake",
    "fake.moe": "moe.fake",
    "fake.distribute": "moe.fake",
    "fake.mc2": "mc2.fake",
    "fake.quant": "quant.fake",
    "sdpa": "integrations.sdpa",
    "inductor_lowering": "integrations.inductor_lowering",
    "hf": "integrations.hf",
    "_hf_autoregister": "integrations.hf_autoregister",
    "npu_sdpa": "npu_sim.sdpa",
    "npu_amp": "npu_sim.amp",
    "npu_inductor": "npu_sim.inductor",
    "fa2_padding": "compat.bert_padding",
    "mc2.hccl_names": "compat.hccl_names",
    "npu_perf_model": "bench.npu_perf_model",
    "demo": "bench.demo",
}


def is_old_path(name: str) -> bool:
    prefix = PACKAGE + "."
    return name.startswith(prefix) and name[len(prefix):] in OLD_PATHS


def new_path(old: str) -> Optional[str]:
    """The new absolute module path of an old absolute one (None for an old package that only held moved modules)."""
    target = OLD_PATHS[old[len(PACKAGE) + 1:]]
    return None if target is None else f"{PACKAGE}.{target}"


def resolve(old: str):
    """Imports and returns the module an old path names, with the DeprecationWarning (stacklevel: the importer)."""
    new = new_path(old)
    warnings.warn(f"{old} moved to {new}; the old path will be removed in a future release", DeprecationWarning,
                  stacklevel=3)
    return importlib.import_module(new)


class _EmptyPackageLoader(importlib.abc.Loader):
    """An old package whose modules all moved: an empty package, so that its old submodule paths still import."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = f"{module.__name__}: moved; see {__name__}.OLD_PATHS"


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system the already-imported new module, and keeps that module's own __spec__ (the import
    system stamps the alias spec on whatever create_module returns)."""

    def __init__(self, module):
        self._module = module
        self._spec = module.__spec__

    def create_module(self, spec):
        return self._module

    def exec_module(self, module):
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not is_old_path(fullname):
            return None
        if new_path(fullname) is None:
            warnings.warn(f"{fullname} moved: its modules are in the family packages ({__name__}.OLD_PATHS)",
                          DeprecationWarning, stacklevel=2)
            return importlib.util.spec_from_loader(fullname, _EmptyPackageLoader(), is_package=True)
        module = resolve(fullname)
        return importlib.util.spec_from_loader(fullname, _AliasLoader(module),
                                               is_package=hasattr(module, "__path__"))


_FINDER = _AliasFinder()


def install() -> None:
    """Puts the finder first on sys.meta_path (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def attribute(name: str):
    """`torch_ops_transformer.<name>` for an old module name that is no longer an attribute, or AttributeError."""
    old = f"{PACKAGE}.{name}"
    if not is_old_path(old):
        raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}")
    return resolve(old) if new_path(old) is not None else importlib.import_module(old)
