"""Load the compiled kernels and wire the generated Python registrations, exactly once."""
import ctypes
import functools
import glob
import os

import torch

from .generated import registrations

_loaded = False


def _library_path() -> str:
    # TOT_EXTENSION: another build of _C to load instead, e.g. the AddressSanitizer one (docs/sanitizers.md).
    override = os.environ.get("TOT_EXTENSION")
    if override:
        if not os.path.isfile(override):
            raise ImportError(f"torch_ops_transformer: TOT_EXTENSION={override!r} is not a file")
        return os.path.abspath(override)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package directory, where _C is built
    candidates = sorted(glob.glob(os.path.join(here, "_C*.so")) + glob.glob(os.path.join(here, "_C*.pyd")))
    if not candidates:
        raise ImportError(
            "torch_ops_transformer: the compiled extension _C is missing; build it with README's setup command: "
            "pip install torch==2.13.0 ninja pyyaml \"setuptools>=64\" wheel && "
            "pip install --no-build-isolation -e \".[all]\""
        )
    return candidates[0]


@functools.lru_cache(maxsize=None)
def extension_cdll() -> ctypes.CDLL:
    """The extension as a ctypes library, for its plain C entry points (the simulated device, the SDPA hook, the
    Ascend C runtime's counters). Opening the already-loaded .so again returns the same handle and globals."""
    return ctypes.CDLL(_library_path())


def load() -> None:
    global _loaded
    if _loaded:
        return
    torch.ops.load_library(_library_path())
    registrations.register()
    _loaded = True
