"""`torch_npu.profiler` of the shim: torch_npu's profiler API over `torch.profiler`.

torch_npu's profiler is torch.profiler's interface with NPU additions: an `NPU` activity, and an experimental config
that chooses what the NPU's own collector records (AI Core counters, L2 cache, operator attributes, the level of
detail) and how the result is exported. On the simulated device every kernel runs on the host, so:

- `ProfilerActivity.NPU` profiles as torch.profiler's CPU activity (the device's kernels are CPU functions; they
  appear as the `npu_fa::*` ops they are);
- `profile`, `schedule`, `tensorboard_trace_handler`, `ProfilerAction`, `record_function` are torch.profiler's,
  with torch_npu's argument names (`experimental_config`, `with_modules`);
- `_ExperimentalConfig` (also `ExperimentalConfig`) holds and checks its settings; the hardware counters they select
  do not exist here, so they change nothing, except `export_type=ExportType.Db` (torch_npu writes an SQLite
  database), which raises NotImplementedError: the traces are Chrome/TensorBoard JSON (`ExportType.Text`).
- `dynamic_profile` (profiling driven by a watched config file or the msMonitor daemon) is not simulated: its
  functions raise NotImplementedError.
"""
import enum
import types
from typing import Iterable, Optional

import torch.profiler as _tp

from .._internal.real_torch_npu import NOT_IMPLEMENTED_MARK

schedule = _tp.schedule
ProfilerAction = _tp.ProfilerAction
record_function = _tp.record_function

__all__ = ["ProfilerActivity", "ProfilerLevel", "AiCMetrics", "ExportType", "ExperimentalConfig",
           "_ExperimentalConfig", "profile", "schedule", "tensorboard_trace_handler", "ProfilerAction",
           "record_function", "supported_activities", "supported_profiler_level", "supported_ai_core_metrics",
           "supported_export_type", "dynamic_profile"]


class ProfilerActivity(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"


class ProfilerLevel:
    Level_none = "Level_none"
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"


class AiCMetrics:
    AiCoreNone = "AiCoreNone"
    PipeUtilization = "PipeUtilization"
    ArithmeticUtilization = "ArithmeticUtilization"
    Memory = "Memory"
    MemoryL0 = "MemoryL0"
    ResourceConflictRatio = "ResourceConflictRatio"
    MemoryUB = "MemoryUB"
    L2Cache = "L2Cache"
    MemoryAccess = "MemoryAccess"


class ExportType:
    Text = "text"
    Db = "db"


def _values(cls) -> list:
    return [v for k, v in vars(cls).items() if not k.startswith("_")]


def supported_activities() -> list:
    return [ProfilerActivity.CPU, ProfilerActivity.NPU]


def supported_profiler_level() -> set:
    return set(_values(ProfilerLevel))


def supported_ai_core_metrics() -> set:
    return set(_values(AiCMetrics))


def supported_export_type() -> set:
    return set(_values(ExportType))


def _check_choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"torch_npu.profiler._ExperimentalConfig: argument '{name}' must be one of "
                         f"{sorted(allowed)}; got {value!r}")


class _ExperimentalConfig:
    """torch_npu.profiler._ExperimentalConfig: what the NPU's collector records. Checked and kept; the counters it
    selects do not exist on the simulated device. `export_type` Db is not available (NotImplementedError)."""

    def __init__(self, profiler_level: str = ProfilerLevel.Level0, aic_metrics: str = AiCMetrics.AiCoreNone,
                 l2_cache: bool = False, msprof_tx: bool = False, data_simplification: bool = True,
                 record_op_args: bool = False, op_attr: bool = False, gc_detect_threshold: Optional[float] = None,
                 export_type=ExportType.Text, host_sys: Iterable = (), mstx_domain_include: Iterable = (),
                 mstx_domain_exclude: Iterable = (), sys_io: bool = False, sys_interconnection: bool = False,
                 mstx: bool = False):
        _check_choice("profiler_level", profiler_level, supported_profiler_level())
        _check_choice("aic_metrics", aic_metrics, supported_ai_core_metrics())
        types_ = export_type if isinstance(export_type, (list, tuple)) else [export_type]
        for t in types_:
            _check_choice("export_type", t, supported_export_type())
        if ExportType.Db in types_:
            raise NotImplementedError("torch_npu.profiler._ExperimentalConfig: export_type=ExportType.Db (torch_npu's "
                                      "SQLite export) is not available in the torch_npu shim; use ExportType.Text "
                                      "(Chrome/TensorBoard JSON traces)")
        if gc_detect_threshold is not None and (not isinstance(gc_detect_threshold, (int, float))
                                                or gc_detect_threshold < 0):
            raise ValueError("torch_npu.profiler._ExperimentalConfig: argument 'gc_detect_threshold' must be None or "
                             f"a non-negative number (ms); got {gc_detect_threshold!r}")
        self.profiler_level, self.aic_metrics, self.l2_cache = profiler_level, aic_metrics, l2_cache
        self.msprof_tx, self.data_simplification, self.record_op_args = msprof_tx, data_simplification, record_op_args
        self.op_attr, self.gc_detect_threshold, self.export_type = op_attr, gc_detect_threshold, list(types_)
        self.host_sys, self.mstx = list(host_sys), mstx
        self.mstx_domain_include, self.mstx_domain_exclude = list(mstx_domain_include), list(mstx_domain_exclude)
        self.sys_io, self.sys_interconnection = sys_io, sys_interconnection

    def __repr__(self) -> str:
        return f"_ExperimentalConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


ExperimentalConfig = _ExperimentalConfig


def _torch_activities(activities) -> list:
    if activities is None:
        return [_tp.ProfilerActivity.CPU]
    out = []
    for a in activities:
        if a in (ProfilerActivity.CPU, ProfilerActivity.NPU, _tp.ProfilerActivity.CPU):
            if _tp.ProfilerActivity.CPU not in out:
                out.append(_tp.ProfilerActivity.CPU)  # the simulated device's kernels run on the host
        else:
            raise ValueError(f"torch_npu.profiler.profile: argument 'activities' holds {a!r}; supported: "
                             f"{supported_activities()}")
    return out


class profile(_tp.profile):
    """torch_npu.profiler.profile: torch.profiler.profile with torch_npu's arguments (NPU activity = CPU here)."""

    def __init__(self, activities=None, schedule=None, on_trace_ready=None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config: Optional[_ExperimentalConfig] = None,
                 use_cuda=None, custom_trace_id_callback=None):
        if experimental_config is not None and not isinstance(experimental_config, _ExperimentalConfig):
            raise TypeError("torch_npu.profiler.profile: argument 'experimental_config' must be a "
                            f"torch_npu.profiler._ExperimentalConfig; got {type(experimental_config).__name__}")
        if use_cuda:
            raise ValueError("torch_npu.profiler.profile: argument 'use_cuda' is not supported (no CUDA device)")
        self.experimental_config = experimental_config
        super().__init__(activities=_torch_activities(activities), schedule=schedule, on_trace_ready=on_trace_ready,
                         record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack,
                         with_flops=with_flops, with_modules=with_modules)


def tensorboard_trace_handler(dir_name: Optional[str] = None, worker_name: Optional[str] = None,
                              analyse_flag: bool = True, async_mode: bool = False):
    """torch_npu.profiler.tensorboard_trace_handler: writes each trace as TensorBoard JSON into `dir_name` (the
    current directory when None). `analyse_flag` / `async_mode` choose how torch_npu post-processes its NPU data
    (there is none here); the trace file is written when the handler runs."""
    return _tp.tensorboard_trace_handler(dir_name if dir_name is not None else ".", worker_name=worker_name)


def _dynamic_not_simulated(name):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"torch_npu.profiler.dynamic_profile.{name}: dynamic profiling (a watched config "
                                  f"file, the msMonitor daemon) is not simulated by the torch_npu shim; use "
                                  f"torch_npu.profiler.profile")

    fn.__name__ = fn.__qualname__ = name
    setattr(fn, NOT_IMPLEMENTED_MARK, True)
    return fn


dynamic_profile = types.ModuleType("torch_npu.profiler.dynamic_profile")
dynamic_profile.__doc__ = "torch_npu.profiler.dynamic_profile: not simulated (each function raises)."
for _name in ("init", "step", "start"):
    setattr(dynamic_profile, _name, _dynamic_not_simulated(_name))
del _name
