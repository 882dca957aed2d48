"""Registers attn_implementation="npu_fa" with transformers without importing transformers.

`install()` (called by `import torch_ops_transformer`) registers at once when transformers' attention interface
module (`transformers.modeling_utils`) is already imported; otherwise it puts a finder at the front of
`sys.meta_path` that waits for that module: when it is imported (by `from transformers import
AutoModelForCausalLM`, a model class, ...), the finder lets the normal machinery find and load it and, right
after the module has executed, runs `hf.register_hf_attention()` and removes itself. Only that one import is
affected; `import torch_ops_transformer` never imports transformers (it may not even be installed).

A failure of the registration is a warning, never a failed transformers import; `tot.register_hf_attention()`
then raises the real error.
"""
import importlib.abc
import sys
import threading
import warnings

TARGET = "transformers.modeling_utils"  # defines AttentionInterface / ALL_ATTENTION_FUNCTIONS


def _register() -> None:
    module = sys.modules.get(f"{__package__}.hf")
    if module is not None and not hasattr(module, "register_hf_attention"):
        return  # hf.py is being imported (its `import transformers` got us here): it registers when it is done
    try:
        from . import hf  # lazy: imports transformers, which the user is importing right now

        hf.register_hf_attention()
        hf.register_hf_experts()  # experts_implementation="npu_moe"
    except Exception as e:  # never break the user's transformers import
        warnings.warn(f"torch_ops_transformer: registering attn_implementation='npu_fa' with transformers failed "
                      f"({type(e).__name__}: {e}); call torch_ops_transformer.register_hf_attention() to see why",
                      RuntimeWarning, stacklevel=2)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds TARGET with the other finders and wraps its loader's exec_module to register afterwards."""

    def __init__(self):
        self._lock = threading.Lock()
        self._searching = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET or self._searching:
            return None
        with self._lock:
            self._searching = True
            try:
                spec = None
                for finder in sys.meta_path:
                    if finder is self or not hasattr(finder, "find_spec"):
                        continue
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
            finally:
                self._searching = False
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return None  # let the import system report it as usual
        original = loader.exec_module

        def exec_module(module):
            if getattr(module, "__name__", None) != TARGET:  # a loader shared with other modules
                return original(module)
            try:
                original(module)
            finally:
                try:
                    del loader.exec_module  # the loader object is this module's own: restore its method
                except AttributeError:
                    pass
            uninstall()
            _register()

        try:
            loader.exec_module = exec_module
        except (AttributeError, TypeError):  # a loader we cannot patch: leave registration to the user
            return None
        return spec


_finder = _RegisterAfterImport()


def install() -> None:
    """Register now if transformers' attention interface is loaded, else when it gets imported."""
    if TARGET in sys.modules:
        _register()
    elif _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    try:
        sys.meta_path.remove(_finder)
    except ValueError:
        pass
