"""torch_npu.profiler of the torch_npu shim (torch_ops_transformer.compat.profiler: torch.profiler underneath)."""
from torch_ops_transformer.compat.profiler import *  # noqa: F401,F403
from torch_ops_transformer.compat.profiler import _ExperimentalConfig  # noqa: F401
