"""Is a real torch_npu here? The one answer the simulated device, the SDPA hook, the oracle and the torch_npu shim
(`compat`) share: a real torch_npu owns the "npu" device and always wins over ours."""
import importlib.machinery
import sys
from pathlib import Path
from typing import Optional

SHIM_MARK = "__torch_ops_transformer_shim__"
# Set (True) on a shim object that only raises NotImplementedError naming itself (tools/vllm_ascend_names.py).
NOT_IMPLEMENTED_MARK = "__torch_ops_transformer_not_implemented__"
# The directory `PYTHONPATH=$(python -m torch_ops_transformer.compat --pythonpath)` adds: its torch_npu is the shim.
PYTHONPATH_DIR = Path(__file__).resolve().parent.parent / "compat" / "pythonpath"


def not_implemented_stub(module: str, name: str, by: str, doc: str):
    """`module.name` of a stand-in (the torch_npu shim, the cann_ops_transformer stand-in) that this project does not
    implement: calling it raises NotImplementedError naming it, `by` (who leaves it out) and the page `doc` that
    lists what is provided."""
    def stub(*args, **kwargs):
        raise NotImplementedError(f"{module}.{name} is not implemented by {by}; see {doc} for the functions it "
                                  f"provides")

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = f"{module}.{name}: not implemented by torch_ops_transformer (calling it raises)."
    setattr(stub, NOT_IMPLEMENTED_MARK, True)
    return stub


def is_shim(module) -> bool:
    """The shim, or the placeholder module `import torch_npu` creates from PYTHONPATH_DIR before install() fills it."""
    return bool(getattr(module, SHIM_MARK, False)) or str(getattr(module, "__file__", "")).startswith(
        str(PYTHONPATH_DIR))


def real_torch_npu_loaded() -> bool:
    """A real torch_npu (not the shim) is imported in this process."""
    loaded = sys.modules.get("torch_npu")
    return loaded is not None and not is_shim(loaded)


def real_module_spec(name: str, shim_dir: Path, exclude: Optional[str] = None):
    """The import spec of an installed module `name` found outside the shim's PYTHONPATH directory (and `exclude`),
    or None. Shared by the torch_npu and flash_attn shims."""
    skip = {shim_dir} | ({Path(exclude).resolve()} if exclude is not None else set())
    paths = [p for p in sys.path if Path(p or ".").resolve() not in skip]
    return importlib.machinery.PathFinder.find_spec(name, paths)


def real_torch_npu_spec(exclude: Optional[str] = None):
    """The import spec of an installed torch_npu that is not the shim, or None."""
    return real_module_spec("torch_npu", PYTHONPATH_DIR, exclude)
