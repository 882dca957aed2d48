"""The Ascend C runtime's per-core counters, read through the extension's C hooks: what `bench npu-model` feeds
the NPU performance model (npu_perf_model) with.

A launch made in count-only mode on the simulated npu device checks and counts every instruction but moves and
computes no data; `tot_ascendc_last_stats` then hands back npu_perf_model.VALUES_PER_CORE numbers per core. The
model itself stays free of torch and ctypes (its unit tests feed it hand-made records); this module is the bridge.
"""
import ctypes
from typing import Callable, List, Optional, Tuple

import torch

from .._library.loader import extension_cdll
from . import npu_perf_model as pm

HOOKS = ("tot_ascendc_set_count_only", "tot_ascendc_last_stats")
MAX_CORES = 128


def runtime_hooks() -> Tuple[Optional[ctypes.CDLL], str]:
    """The extension's counter hooks (ctypes handle), or None and why not."""
    try:
        lib = extension_cdll()
    except (ImportError, OSError) as e:  # no extension built, or TOT_EXTENSION names one that does not open
        return None, f"the compiled extension could not be opened ({e})"
    missing = [h for h in HOOKS if not hasattr(lib, h)]
    if missing:
        return None, (f"the extension does not export {', '.join(missing)} "
                      "(the FlashAttention Ascend C kernel is not built in)")
    lib.tot_ascendc_set_count_only.argtypes = [ctypes.c_int]
    lib.tot_ascendc_last_stats.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int]
    lib.tot_ascendc_last_stats.restype = ctypes.c_int
    return lib, ""


def counted_launch(lib, launch: Callable[[], object], count_only: bool = True) -> List[pm.CoreCounts]:
    """Per-core counters of the last Ascend C launch made by `launch()`, run on the simulated npu in count-only
    mode (every instruction checked and counted, no data moved or computed) unless count_only is False."""
    lib.tot_ascendc_set_count_only(1 if count_only else 0)
    try:
        with torch.no_grad():
            launch()
        buf = (ctypes.c_ulonglong * (pm.VALUES_PER_CORE * MAX_CORES))()
        cores = lib.tot_ascendc_last_stats(buf, MAX_CORES)
    finally:
        lib.tot_ascendc_set_count_only(0)  # later launches compute again, even when this one raised
    if cores <= 0:
        raise RuntimeError(f"tot_ascendc_last_stats returned {cores}: the launch recorded no cores")
    return pm.records_from_flat(list(buf), min(cores, MAX_CORES))
