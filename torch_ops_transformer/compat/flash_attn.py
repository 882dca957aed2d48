"""A `flash_attn` (FlashAttention-2) stand-in for machines without CUDA: code that does
`from flash_attn import flash_attn_func, flash_attn_with_kvcache, ...` or
`from flash_attn.flash_attn_interface import ...` (and `flash_attn.bert_padding`'s helpers) runs on the CPU through
this project's ops (docs/attention.md, "FlashAttention-2 API"). Opt-in and separate from the torch_npu shim (its own
PYTHONPATH directory and install()):

- `torch_ops_transformer.compat.flash_attn.install()` — in this process, before `import flash_attn`;
- `PYTHONPATH=$(python -m torch_ops_transformer.compat.flash_attn --pythonpath) python infer.py` — for a whole
  program and its subprocesses, without editing it;
- `python -m torch_ops_transformer.compat.flash_attn infer.py [args]` — installs, then runs the script.

A real flash_attn always wins: when one is already imported, or is installed and imports, it is used and nothing is
installed. One that is installed but fails to import (no CUDA build) gives a warning and the shim.
"""
import importlib.machinery
import importlib.util
import runpy
import sys
import types
import warnings
from pathlib import Path
from typing import Optional

SHIM_MARK = "__torch_ops_transformer_shim__"
PYTHONPATH_DIR = Path(__file__).resolve().parent / "flash_attn_pythonpath"
# The FlashAttention-2 release whose Python API (flash_attn_interface) the shim mirrors, with our version as local tag.
API_VERSION = "2.7.4"
FUNCTIONS = ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
             "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache")
PADDING_FUNCTIONS = ("index_first_axis", "index_put_first_axis", "pad_input", "unpad_input",
                     "unpad_input_for_concatenated_sequences")
USAGE = ("usage: python -m torch_ops_transformer.compat.flash_attn --pythonpath   (the directory for PYTHONPATH)\n"
         "       python -m torch_ops_transformer.compat.flash_attn SCRIPT [ARGS...]  (runs SCRIPT with the shim)")


def is_shim(module) -> bool:
    """The shim, or the placeholder `import flash_attn` creates from PYTHONPATH_DIR before install() fills it."""
    return bool(getattr(module, SHIM_MARK, False)) or str(getattr(module, "__file__", "") or "").startswith(
        str(PYTHONPATH_DIR))


def installed() -> bool:
    return is_shim(sys.modules.get("flash_attn"))


def _real_spec():
    """The import spec of an installed flash_attn that is not this shim, or None."""
    paths = [p for p in sys.path if Path(p or ".").resolve() != PYTHONPATH_DIR]
    return importlib.machinery.PathFinder.find_spec("flash_attn", paths)


def _import_real(spec):
    """Imports the real flash_attn under its own name; returns it, or None with a warning saying why."""
    previous = sys.modules.get("flash_attn")
    real = importlib.util.module_from_spec(spec)
    sys.modules["flash_attn"] = real
    try:
        spec.loader.exec_module(real)
        return real
    except Exception as e:  # typically ImportError of its CUDA extension on a machine without CUDA
        for name in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
            del sys.modules[name]
        if previous is not None:
            sys.modules["flash_attn"] = previous
        warnings.warn(f"torch_ops_transformer.compat.flash_attn: the installed flash_attn ({spec.origin}) cannot be "
                      f"imported ({type(e).__name__}: {e}); using the CPU shim instead")
        return None


def _fill(mod: types.ModuleType, interface: types.ModuleType) -> types.ModuleType:
    """Fills the package and its flash_attn_interface; returns the new bert_padding submodule."""
    import torch_ops_transformer as tot

    for m in (mod, interface):
        for name in FUNCTIONS:
            setattr(m, name, getattr(tot, name))
        setattr(m, SHIM_MARK, True)
    mod.__version__ = f"{API_VERSION}+torch_ops_transformer.{tot.__version__}"
    mod.__doc__ = interface.__doc__ = __doc__
    mod.flash_attn_interface = interface
    from torch_ops_transformer import fa2_padding

    padding = types.ModuleType("flash_attn.bert_padding")
    for name in PADDING_FUNCTIONS:
        setattr(padding, name, getattr(fa2_padding, name))
    padding.__doc__ = fa2_padding.__doc__
    mod.bert_padding = padding
    return padding


def install(placeholder: Optional[types.ModuleType] = None) -> types.ModuleType:
    """Makes `import flash_attn` (and `flash_attn.flash_attn_interface`) work in this process; returns the flash_attn
    module in use: a real one when it is imported or importable, else the shim."""
    current = sys.modules.get("flash_attn")
    if current is not None and current is not placeholder:
        return current
    spec = _real_spec()
    if spec is not None:
        real = _import_real(spec)
        if real is not None:
            return real
    mod = placeholder if placeholder is not None else types.ModuleType("flash_attn")
    if not hasattr(mod, "__path__"):
        mod.__path__ = []  # a package, so `import flash_attn.flash_attn_interface` resolves from sys.modules
    interface = types.ModuleType("flash_attn.flash_attn_interface")
    padding = _fill(mod, interface)
    sys.modules["flash_attn"] = mod
    sys.modules["flash_attn.flash_attn_interface"] = interface
    sys.modules["flash_attn.bert_padding"] = padding
    return mod


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "--pythonpath":
        print(PYTHONPATH_DIR)
        return 0
    install()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
