"""Load the compiled kernels and wire the generated Python registrations, exactly once."""
import glob
import os

import torch

_loaded = False


def _library_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = sorted(glob.glob(os.path.join(here, "_C*.so")) + glob.glob(os.path.join(here, "_C*.pyd")))
    if not candidates:
        raise ImportError(
            "torch_ops_transformer: the compiled extension _C is missing; build it with "
            "`pip install --no-build-isolation -e .`"
        )
    return candidates[0]


def load() -> None:
    global _loaded
    if _loaded:
        return
    torch.ops.load_library(_library_path())
    from ._generated import registrations

    registrations.register()
    _loaded = True
