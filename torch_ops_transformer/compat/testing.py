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

# The SoC the simulated device answers for in SupportedDevices: the Atlas A2 series, whose semantics the CPU kernels
# follow (override with TOT_NPU_SOC to run a test written for another SoC).
SIMULATED_SOC = os.environ.get("TOT_NPU_SOC", "Ascend910B")

# torch_npu's ACL storage formats (torch_npu.npu_format_cast's acl_format codes).
ACL_FORMATS = {-1: "UNDEFINED", 0: "NCHW", 1: "NHWC", 2: "ND", 3: "NC1HWC0", 4: "FRACTAL_Z", 12: "NC1HWC0_C04",
               16: "HWCN", 27: "NDHWC", 29: "FRACTAL_NZ", 30: "NCDHW", 32: "NDC1HWC0", 33: "FRACTAL_Z_3D", 35: "NC",
               47: "NCL"}
PLAIN_FORMATS = (-1, 0, 1, 2)


def npu_format_cast(self: torch.Tensor, acl_format: int, customize_dtype=None) -> torch.Tensor:
    """torch_npu.npu_format_cast. A storage format changes how the NPU lays a tensor out in memory, never its logical
    shape or values (every op reads the logical tensor), so a private format (FRACTAL_NZ = 29 for weights and
    caches, NC1HWC0, ...) gives a new tensor with the same values, tagged with the format for get_npu_format; plain
    formats return the tensor itself. Unknown codes raise ValueError."""
    if isinstance(acl_format, bool) or acl_format not in ACL_FORMATS:
        raise ValueError(f"torch_npu.npu_format_cast: argument 'acl_format' must be one of torch_npu's ACL formats "
                         f"{sorted(ACL_FORMATS)}; got {acl_format!r}")
    out = self if customize_dtype is None else self.to(customize_dtype)
    if acl_format in PLAIN_FORMATS:
        return out
    out = out.clone() if out is self else out  # a new storage, as on the NPU
    out._npu_format = acl_format
    return out


def get_npu_format(self: torch.Tensor) -> int:
    return getattr(self, "_npu_format", 2)  # ND unless npu_format_cast tagged it


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


def get_npu_device() -> str:
    return "npu:0"


def SupportedDevices(devices):  # noqa: N802  (upstream's name)
    """Runs the test only when the (simulated) SoC is one of `devices` (prefix match, as SoC names have suffixes)."""
    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not any(SIMULATED_SOC.startswith(d) or d.startswith(SIMULATED_SOC) for d in devices):
                raise unittest.SkipTest(f"written for {devices}; the simulated npu is {SIMULATED_SOC}")
            return fn(*args, **kwargs)
        return wrapper
    return decorator


def skipIfUnsupportMultiNPU(count):  # noqa: N802  (upstream's name)
    return unittest.skipIf(count > 1, f"needs {count} NPUs; the simulated npu device is one")


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
