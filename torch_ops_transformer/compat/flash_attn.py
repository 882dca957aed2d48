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
import sys
import types
from pathlib import Path
from typing import Optional

from .._internal.real_torch_npu import SHIM_MARK, real_module_spec
from .._internal.version import __version__
from ..attention import fa2
from . import bert_padding, import_real_module, run_with_shim

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


def _fill(mod: types.ModuleType, interface: types.ModuleType) -> types.ModuleType:
    """Fills the package and its flash_attn_interface; returns the new bert_padding submodule."""
    for m in (mod, interface):
        for name in FUNCTIONS:
            setattr(m, name, getattr(fa2, name))
        setattr(m, SHIM_MARK, True)
    # The interface's helpers code around the functions imports: the key-block width that S_dmask's running maxima
    # use (return_attn_probs with dropout), and the flag of FlashAttention-2's ROCm Triton backend (not in use).
    interface._get_block_size_n = fa2.get_block_size_n
    interface.USE_TRITON_ROCM = False
    mod.__version__ = f"{API_VERSION}+torch_ops_transformer.{__version__}"
    mod.__doc__ = interface.__doc__ = __doc__
    mod.flash_attn_interface = interface
    padding = types.ModuleType("flash_attn.bert_padding")
    for name in PADDING_FUNCTIONS:
        setattr(padding, name, getattr(bert_padding, name))
    padding.__doc__ = bert_padding.__doc__
    mod.bert_padding = padding
    return padding


def install(placeholder: Optional[types.ModuleType] = None) -> types.ModuleType:
    """Makes `import flash_attn` (and `flash_attn.flash_attn_interface`) work in this process; returns the flash_attn
    module in use: a real one when it is imported or importable, else the shim."""
    current = sys.modules.get("flash_attn")
    if current is not None and current is not placeholder:
        return current
    spec = real_module_spec("flash_attn", PYTHONPATH_DIR)
    if spec is not None:
        real = import_real_module("flash_attn", spec, "torch_ops_transformer.compat.flash_attn")
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
    return run_with_shim(argv, USAGE, PYTHONPATH_DIR, install)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
