"""torch_npu's storage formats and SoC identity, as the shim answers them.

A storage format (FRACTAL_NZ = 29, which vLLM-Ascend gives MLA weights and caches, NC1HWC0, ...) changes how the
NPU lays a tensor out in memory, never its logical shape, dtype or values: every op reads the logical tensor. So
`npu_format_cast` to a private format returns a new tensor with the same values, tagged with the format for
`get_npu_format`; plain formats return the tensor itself. `customize_dtype` (and `input_dtype`) choose the NZ
tiling's element width (its C0) on the NPU, and `input_dtype` how the input's bytes are read (packed fp4 in uint8):
both are checked and recorded, the values and dtype never change. `empty_with_format` is `torch.empty` tagged the
same way.
"""
import enum
import types
import os

import torch

# torch_npu's ACL storage formats (torch_npu.npu_format_cast's acl_format codes; torch_npu.Format).
ACL_FORMATS = {-1: "UNDEFINED", 0: "NCHW", 1: "NHWC", 2: "ND", 3: "NC1HWC0", 4: "FRACTAL_Z", 12: "NC1HWC0_C04",
               16: "HWCN", 27: "NDHWC", 29: "FRACTAL_NZ", 30: "NCDHW", 32: "NDC1HWC0", 33: "FRACTAL_Z_3D", 35: "NC",
               47: "NCL"}
PLAIN_FORMATS = (-1, 0, 1, 2)
Format = enum.IntEnum("Format", {name: code for code, name in ACL_FORMATS.items()})
Format.__doc__ = "torch_npu.Format: the ACL storage formats by name (an int: torch_npu.Format.FRACTAL_NZ == 29)."

# The SoC the simulated device answers for: the Atlas A2 series, whose semantics the CPU kernels follow (override
# with TOT_NPU_SOC to run code written for another SoC).
SIMULATED_SOC = os.environ.get("TOT_NPU_SOC", "Ascend910B")
# torch_npu.npu.get_soc_version()'s codes (torch_npu's SocVersion enum); the family name gives its first member.
SOC_VERSIONS = {"Ascend310P": 200, "Ascend310P1": 200, "Ascend310P2": 201, "Ascend310P3": 202, "Ascend310P4": 203,
                "Ascend310P5": 204, "Ascend310P7": 205, "Ascend910B": 220, "Ascend910B1": 220, "Ascend910B2": 221,
                "Ascend910B2C": 222, "Ascend910B3": 223, "Ascend910B4": 224, "Ascend910B4-1": 225,
                "Ascend910_93": 250, "Ascend910_9391": 250, "Ascend910_9381": 251, "Ascend910_9372": 252,
                "Ascend910_9392": 253, "Ascend910_9382": 254, "Ascend910_9362": 255, "Ascend950": 260}


def get_soc_version() -> int:
    """torch_npu.npu.get_soc_version: the code of the SoC the simulated device answers for (SIMULATED_SOC)."""
    if SIMULATED_SOC not in SOC_VERSIONS:
        raise ValueError(f"torch_npu.npu.get_soc_version: TOT_NPU_SOC={SIMULATED_SOC!r} is not one of "
                         f"{sorted(SOC_VERSIONS)}")
    return SOC_VERSIONS[SIMULATED_SOC]


def _check_format(fn: str, acl_format) -> int:
    if isinstance(acl_format, bool) or acl_format not in ACL_FORMATS:
        raise ValueError(f"torch_npu.{fn}: argument 'acl_format' must be one of torch_npu's ACL formats "
                         f"{sorted(ACL_FORMATS)}; got {acl_format!r}")
    return int(acl_format)


def _check_dtype_arg(name: str, value) -> None:
    """customize_dtype / input_dtype: None, a torch.dtype or an integer dtype code (torch_npu's own: 290, ...)."""
    if value is None or isinstance(value, torch.dtype) or (isinstance(value, int) and not isinstance(value, bool)):
        return
    raise TypeError(f"torch_npu.npu_format_cast: argument '{name}' must be None, a torch.dtype or an int dtype "
                    f"code; got {value!r}")


def _tag(t: torch.Tensor, acl_format: int, tiling_dtype=None) -> torch.Tensor:
    t._npu_format = acl_format
    t._npu_format_dtype = tiling_dtype
    return t


def npu_format_cast(self: torch.Tensor, acl_format: int, customize_dtype=None, *, input_dtype=None) -> torch.Tensor:
    """torch_npu.npu_format_cast: same logical values and dtype; a private format gives a new, tagged tensor."""
    acl_format = _check_format("npu_format_cast", acl_format)
    _check_dtype_arg("customize_dtype", customize_dtype)
    _check_dtype_arg("input_dtype", input_dtype)
    if acl_format in PLAIN_FORMATS:
        return self
    return _tag(self.clone(), acl_format, customize_dtype if customize_dtype is not None else input_dtype)


def get_npu_format(self: torch.Tensor) -> int:
    return getattr(self, "_npu_format", 2)  # ND unless npu_format_cast / empty_with_format tagged it


def empty_with_format(size, dtype=None, layout=torch.strided, device=None, pin_memory: bool = False,
                      acl_format: int = 2, *args, **kwargs) -> torch.Tensor:
    """torch_npu.empty_with_format: torch.empty of that size, tagged with `acl_format` (values uninitialised)."""
    acl_format = _check_format("empty_with_format", acl_format)
    if args or kwargs:
        raise TypeError(f"torch_npu.empty_with_format: unexpected arguments {args or ''}{kwargs or ''}")
    out = torch.empty(tuple(size), dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)
    return out if acl_format in PLAIN_FORMATS else _tag(out, acl_format)


# torch_npu._C's option getter, which torch_npu's tests call to save and restore `torch.npu.config` around a case:
# option name -> the config attribute it reads. Private formats only tag tensors here, so the option changes no value.
_OPTIONS = {"ALLOW_INTERNAL_FORMAT": "allow_internal_format"}


def npu_get_option(name: str):
    """torch_npu._C._npu_getOption: b"enable" or b"disable" for a known boolean option, None otherwise (as upstream
    for an option never set)."""
    attr = _OPTIONS.get(name)
    config = getattr(getattr(torch, "npu", None), "config", None)
    if attr is None or config is None:
        return None
    return b"enable" if getattr(config, attr, False) not in (False, b"disable", None) else b"disable"


def c_module():
    """The part of torch_npu._C (the C++ binding) that code written for torch_npu reads."""
    return types.SimpleNamespace(_npu_getOption=npu_get_option)
