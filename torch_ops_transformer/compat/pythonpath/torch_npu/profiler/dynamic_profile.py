"""torch_npu.profiler.dynamic_profile of the torch_npu shim: not simulated (each function raises)."""
from torch_ops_transformer.compat.profiler import dynamic_profile as _dp

init, step, start = _dp.init, _dp.step, _dp.start
