"""The simulated NPU and what rides on it (docs/npu_sim.md, docs/npu_sdpa.md).

- `device` — PyTorch's PrivateUse1 device renamed "npu", backed by CPU memory: `enable()`, or TOT_NPU_SIM=1;
- `amp` — torch.npu.amp / autocast on the device;
- `inductor` — Inductor's code generators for the device (torch.compile on npu tensors);
- `sdpa` — F.scaled_dot_product_attention on npu tensors through PyTorch's overrideable SDPA hook.
"""
from . import amp, inductor, sdpa
from .device import ENV_VAR, enable, enable_from_environment, is_enabled, unavailable_device_module
