"""`torch_npu.testing` of the shim: the helpers torch_npu's own per-op tests import (TestCase with assertRtolEqual,
run_tests, create_common_tensor, SupportedDevices, skipIfUnsupportMultiNPU), so those test files run unchanged
against this project (`python -m tools.compat.upstream_tests`). Written from their documented behaviour.
"""
import functools
import os
import types
import unittest

import numpy as np
import torch
from torch.testing._internal import common_utils

from .. import npu_sim
from .formats import (ACL_FORMATS, PLAIN_FORMATS, SIMULATED_SOC, get_npu_format,  # noqa: F401 (torch_npu API)
                      npu_format_cast)


def _numpy(t: torch.Tensor):
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _rtol_equal(case: unittest.TestCase, x, y, prec: float, prec16: float) -> None:
    """torch_npu's criterion: NaNs in the same places, then every element within `prec` absolutely, or every element
    within `prec` relatively, or at most size*prec elements outside both (prec16 for float16)."""
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        for a, b in zip(x, y):
            _rtol_equal(case, a, b, prec, prec16)
        return
    if isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor):
        y = torch.as_tensor(y, dtype=x.dtype)
    if isinstance(y, torch.Tensor) and not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x, dtype=y.dtype)
    # numpy has no bfloat16: its values are compared in float32, which holds them exactly
    x = _numpy(x) if isinstance(x, torch.Tensor) else np.asarray(x)
    y = _numpy(y) if isinstance(y, torch.Tensor) else np.asarray(y)
    case.assertEqual(x.shape, y.shape, "shape error")
    case.assertEqual(x.dtype, y.dtype, "dtype error")
    if x.dtype == np.bool_:
        case.assertTrue(np.array_equal(x, y), "result error")
        return
    tol, floor = (prec16, 6e-8) if x.dtype == np.float16 else (prec, 1e-9)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    nan = np.isnan(x64)
    case.assertTrue(np.array_equal(nan, np.isnan(y64)), "NaN positions differ")
    diff = np.abs(np.where(nan, 0.0, y64 - x64))
    within_abs = diff <= tol
    within_rel = diff / (np.maximum(np.abs(x64), np.abs(y64)) + floor) <= tol
    if within_abs.all() or within_rel.all():
        return
    allowed = x.size * tol
    if (~within_rel).sum() > allowed and (~within_abs).sum() > allowed:
        case.fail(f"result error: {(~within_abs).sum()} of {x.size} elements beyond {tol} (max diff {diff.max()})")


class TestCase(common_utils.TestCase):
    def assertRtolEqual(self, x, y, prec=1.e-4, prec16=1.e-3, auto_trans_dtype=False, message=None):  # noqa: N802
        if auto_trans_dtype and isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            x = x.to(y.dtype)
        _rtol_equal(self, x, y, prec, prec16)


def run_tests() -> None:
    common_utils.run_tests()


def create_common_tensor(item, minValue, maxValue, device=None):  # noqa: N803  (upstream's names)
    """item = [numpy dtype, format, shape]: uniform values in [minValue, maxValue); returns (cpu, npu) copies."""
    dtype, fmt, shape = item[0], item[1], item[2]
    values = torch.from_numpy(np.random.uniform(minValue, maxValue, shape).astype(dtype))
    device_tensor = values.to(device or "npu")
    if fmt != -1:
        device_tensor = npu_format_cast(device_tensor, fmt)
    return values, device_tensor


def _npu_device_count() -> int:
    """The simulated npu devices of this process (TOT_NPU_SIM_DEVICES); 0 when the simulator is not enabled."""
    return torch.npu.device_count() if npu_sim.is_enabled() else 0


def get_npu_device() -> str:
    """The calling thread's current npu device, as a string ("npu:0" unless torch.npu.set_device chose another)."""
    return f"npu:{torch.npu.current_device() if npu_sim.is_enabled() else 0}"


def SupportedDevices(devices):  # noqa: N802  (upstream's name)
    """Runs the test only when the (simulated) SoC is one of `devices` (prefix match, as SoC names have suffixes),
    or on any SoC with TOT_ANY_SOC=1 (`python -m tools.upstream_tests --any-soc`: cases written for a SoC we do not
    simulate, whose operators the CPU kernels implement all the same)."""
    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if os.environ.get("TOT_ANY_SOC") != "1" and not any(SIMULATED_SOC.startswith(d) or d.startswith(SIMULATED_SOC) for d in devices):
                raise unittest.SkipTest(f"written for {devices}; the simulated npu is {SIMULATED_SOC}")
            return fn(*args, **kwargs)
        return wrapper
    return decorator


def skipIfUnsupportMultiNPU(count):  # noqa: N802  (upstream's name)
    """Runs the test only when there are at least `count` npu devices: with the simulated device, when
    TOT_NPU_SIM_DEVICES gives that many (checked when the test runs, so the count of the test's process counts)."""
    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            have = _npu_device_count()
            if have < count:
                raise unittest.SkipTest(f"needs {count} NPUs; the simulated npu device has {have} "
                                        f"(TOT_NPU_SIM_DEVICES={count} gives {count})")
            return fn(*args, **kwargs)
        return wrapper
    return decorator


def modules() -> dict:
    """torch_npu.testing and its submodules, as module objects for sys.modules."""
    testing = types.ModuleType("torch_npu.testing")
    testcase = types.ModuleType("torch_npu.testing.testcase")
    testcase.TestCase, testcase.run_tests = TestCase, run_tests
    utils = types.ModuleType("torch_npu.testing.common_utils")
    utils.create_common_tensor, utils.SupportedDevices = create_common_tensor, SupportedDevices
    utils.get_npu_device = get_npu_device
    distributed = types.ModuleType("torch_npu.testing.common_distributed")
    distributed.skipIfUnsupportMultiNPU = skipIfUnsupportMultiNPU
    testing.testcase, testing.common_utils, testing.common_distributed = testcase, utils, distributed
    return {"torch_npu.testing": testing, "torch_npu.testing.testcase": testcase,
            "torch_npu.testing.common_utils": utils, "torch_npu.testing.common_distributed": distributed}


# ---- torch_npu.testing.common_utils.SkipIfNotGteCANNVersion ---------------------------------------------------------
def SkipIfNotGteCANNVersion(version):  # noqa: N802  (upstream's name)
    """Upstream skips a test on a CANN older than `version`. The shim has no CANN: its kernels implement the
    feature such a test exercises, so the test runs (a call the shim does not implement raises NotImplementedError,
    naming it)."""
    def decorator(fn):
        return fn
    return decorator


def _with_cann_version_skip(build):
    @functools.wraps(build)
    def wrapper() -> dict:
        mods = build()
        mods["torch_npu.testing.common_utils"].SkipIfNotGteCANNVersion = SkipIfNotGteCANNVersion
        return mods
    return wrapper


modules = _with_cann_version_skip(modules)
