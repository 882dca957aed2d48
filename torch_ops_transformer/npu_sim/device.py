"""A simulated NPU: PyTorch's PrivateUse1 device renamed "npu", backed by CPU memory (docs/npu_sim.md).

`enable()` installs it for the rest of the process (PyTorch cannot rename PrivateUse1 twice or unregister a
backend); `TOT_NPU_SIM=1` in the environment enables it when the package is imported. It refuses when a real
`torch_npu` is importable or PrivateUse1 already belongs to another backend, so it never shadows real hardware.
`TOT_NPU_SIM_DEVICES=N` (read by `enable()`, default 1) gives it N devices, "npu:0" to "npu:N-1", all in host memory.

On the device, `torch.ops.npu_fa.*` ops run their CPU kernels on CPU aliases of the same memory (the list comes
from native_functions.yaml via the codegen); other aten ops run through PyTorch's boxed CPU fallback.
"""
import ctypes
import functools
import io
import os
import platform
import sys
import time
import types
import uuid
from multiprocessing.reduction import ForkingPickler

import torch
from torch.multiprocessing.reductions import reduce_tensor as _TORCH_REDUCE_TENSOR

from .._internal.real_torch_npu import real_torch_npu_loaded, real_torch_npu_spec
from .._library.loader import extension_cdll
from . import amp, inductor, sdpa

ENV_VAR = "TOT_NPU_SIM"
DEVICES_ENV_VAR = "TOT_NPU_SIM_DEVICES"
_BACKEND = "npu"
_enabled = False
_device_count = 1


def is_enabled() -> bool:
    """True once enable() has installed the simulated device in this process."""
    return _enabled


def _real_torch_npu_present(installed_torch_npu_failed: bool) -> bool:
    """A real torch_npu imported, or installed (unless the caller tried importing it and it failed). Our own
    torch_npu shim (torch_ops_transformer.compat) does not count."""
    if real_torch_npu_loaded():
        return True
    return not installed_torch_npu_failed and real_torch_npu_spec() is not None


def _refusal_reason(installed_torch_npu_failed: bool = False):
    """Why the simulator must not be installed here, or None."""
    if _real_torch_npu_present(installed_torch_npu_failed):
        return ("torch_npu is installed: the real Ascend NPU backend owns the 'npu' device, so the simulated "
                "NPU is not installed (unset TOT_NPU_SIM / do not call npu_sim.enable())")
    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        return (f"the PrivateUse1 backend is already renamed to {name!r} by another extension; the simulated NPU "
                "needs it unused (expected name 'privateuseone')")
    return None


@functools.lru_cache(maxsize=None)
def _sim_fn(name: str, *argtypes):
    """A C function of aten_ops/npu_sim/device.cpp (returning int) through ctypes."""
    fn = getattr(extension_cdll(), name)
    fn.argtypes, fn.restype = list(argtypes), ctypes.c_int
    return fn


def _call_checked(fn: str, name: str, index: int) -> None:
    """Calls `name`(index, error, len) of device.cpp; its error (an index out of range) becomes a ValueError naming
    `fn` and its argument 'device'."""
    error = ctypes.create_string_buffer(1024)
    if _sim_fn(name, ctypes.c_int, ctypes.c_char_p, ctypes.c_int)(index, error, len(error)):
        message = error.value.decode(errors="replace").removeprefix("npu_sim: ")
        raise ValueError(f"torch.npu.{fn}: argument 'device': {message}")


def max_devices() -> int:
    """The most devices the simulator offers (TOT_NPU_SIM_DEVICES may not exceed it)."""
    return _sim_fn("tot_npu_sim_max_devices")()


def device_count_from_environment(environ=None) -> int:
    """The number of simulated devices TOT_NPU_SIM_DEVICES asks for: 1 when unset or empty, else a positive integer
    up to max_devices(); ValueError naming the variable and its value otherwise."""
    text = (os.environ if environ is None else environ).get(DEVICES_ENV_VAR, "").strip()
    if not text:
        return 1
    limit = max_devices()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= limit:
        raise ValueError(f"{DEVICES_ENV_VAR} must be a positive integer, the number of simulated npu devices "
                         f"(1 to {limit}); got {text!r}")
    return int(text)


def _device_index(fn: str, device) -> int:
    """The device index an argument names: k, "npu:k", torch.device("npu", k); None, -1, "npu" for the calling
    thread's current device. Raises ValueError naming `fn` when it names no simulated device."""
    index = device
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError:
            raise ValueError(f"torch.npu.{fn}: argument 'device' must be an npu device; got {device!r}") from None
    if isinstance(device, torch.device):
        if device.type != _BACKEND:
            raise ValueError(f"torch.npu.{fn}: argument 'device' must be an npu device; got {device}")
        index = device.index
    if index is None or (isinstance(index, int) and index == -1):
        return _current_device()
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"torch.npu.{fn}: argument 'device' must be an int, a str or a torch.device; got {device!r}")
    _call_checked(fn, "tot_npu_sim_check_device", index)
    return index


def _current_device() -> int:
    """torch.npu.current_device(): the calling thread's current device (each thread has its own, as with CUDA)."""
    return _sim_fn("tot_npu_sim_current_device")()


def _set_device(device) -> None:
    """torch.npu.set_device(device): the calling thread's current device; None or -1 leave it unchanged."""
    if device is None or device == -1:
        return
    _call_checked("set_device", "tot_npu_sim_set_device", _device_index("set_device", device))


def _device_of(obj) -> "_DeviceContext":
    """torch.npu.device_of(tensor): the device context of an npu tensor (a no-op one for other tensors)."""
    return _DeviceContext(obj.get_device() if getattr(obj, "is_npu", False) else -1)


def _device_module() -> types.ModuleType:
    """torch.npu: what torch.compile, opcheck and the autograd engine ask of a device module."""
    mod = types.ModuleType("torch_ops_transformer.npu_sim.device_module")
    mod.is_available = lambda: True
    mod.is_initialized = lambda: True
    mod._lazy_init = lambda: None
    mod.device_count = lambda: _device_count
    mod.current_device = _current_device
    mod.set_device = _set_device
    mod.device_of = _device_of
    mod.synchronize = _synchronize
    mod._is_in_bad_fork = lambda: False
    # Random numbers on the device are drawn by CPU kernels from the CPU default generator, so its state is ours.
    mod.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    mod.manual_seed_all = lambda seed: torch.default_generator.manual_seed(int(seed))
    mod.get_rng_state = lambda device="npu": torch.get_rng_state()
    mod.set_rng_state = lambda new_state, device="npu": torch.set_rng_state(new_state)
    mod.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    mod.is_bf16_supported = lambda: True
    mod.get_device_name = lambda device=None: "simulated NPU (CPU memory, torch_ops_transformer)"
    mod.empty_cache = lambda: None
    mod.memory_allocated = lambda device=None: 0
    mod.max_memory_allocated = lambda device=None: 0
    mod.reset_peak_memory_stats = lambda device=None: None
    _add_memory(mod)
    _add_streams(mod)
    mod.set_compile_mode = _set_compile_mode
    mod.config = types.SimpleNamespace(allow_internal_format=False)  # torch_npu's private formats (NZ): none here
    mod.amp = amp.amp_module()
    # Inductor's code generators for the device, looked up by name when it first compiles for npu (inductor.py)
    mod.__getattr__ = inductor.device_module_attr
    return mod


def _synchronize(device=None) -> None:
    """torch.npu.synchronize: every kernel runs synchronously on the host, so there is nothing to wait for."""
    _device_index("synchronize", device)


def _set_compile_mode(jit_compile: bool = False) -> None:
    """torch.npu.set_compile_mode: chooses online kernel compilation on Ascend; nothing to choose here."""
    if not isinstance(jit_compile, bool):
        raise TypeError(f"torch.npu.set_compile_mode: argument 'jit_compile' must be a bool; got {jit_compile!r}")


def _host_memory() -> tuple:
    """(available, total) bytes of host memory, which the simulated device allocates from."""
    info = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    page = os.sysconf("SC_PAGE_SIZE")
    total = info.get("MemTotal", page * os.sysconf("SC_PHYS_PAGES"))
    return info.get("MemAvailable", page * os.sysconf("SC_AVPHYS_PAGES")), total


def _check_device(fn: str, device) -> int:
    """The index of a simulated device: None, -1 (current), k, "npu", "npu:k" or torch.device("npu", k)."""
    return _device_index(fn, device)


class _DeviceProperties:
    """torch.npu.get_device_properties: a simulated device (host memory, one "core" per host CPU); every device
    has the same properties, and its own uuid."""

    def __init__(self, index: int = 0):
        cores = os.cpu_count() or 1
        self.name = "simulated NPU (CPU memory, torch_ops_transformer)"
        self.total_memory = _host_memory()[1]
        self.cube_core_num = self.vector_core_num = cores
        self.L2_cache_size = 0
        self.uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"npu{index}." + platform.node()))

    def __repr__(self) -> str:
        return (f"_NPUDeviceProperties(name='{self.name}', total_memory={self.total_memory // 2**20}MB, "
                f"cube_core_num={self.cube_core_num}, vector_core_num={self.vector_core_num})")


class _DeviceContext:
    """torch.npu.device(device): makes `device` the calling thread's current device inside the block and restores
    the previous one on exit; None or -1 change nothing."""

    def __init__(self, device):
        self.idx = -1 if device is None or device == -1 else _device_index("device", device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx != -1:
            self.prev_idx = _current_device()
            _set_device(self.idx)
        return self

    def __exit__(self, *exc) -> None:
        if self.idx != -1:
            _set_device(self.prev_idx)


_MEMORY_STAT_KEYS = ("allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
                     "allocated_bytes.all.freed", "reserved_bytes.all.current", "reserved_bytes.all.peak",
                     "active_bytes.all.current", "active_bytes.all.peak", "num_alloc_retries", "num_ooms")


def _add_memory(mod: types.ModuleType) -> None:
    """Memory queries. The simulated device's tensors are CPU allocations that no device allocator tracks: the
    allocator counters are 0 (as memory_allocated), and mem_get_info / total_memory are the host's memory."""

    def mem_get_info(device=None):
        _check_device("mem_get_info", device)
        return _host_memory()

    def memory_stats(device=None):
        _check_device("memory_stats", device)
        return {key: 0 for key in _MEMORY_STAT_KEYS}

    def get_device_properties(device=None):
        return _DeviceProperties(_check_device("get_device_properties", device))

    mod.mem_get_info, mod.memory_stats, mod.get_device_properties = mem_get_info, memory_stats, get_device_properties
    mod.memory_reserved = mod.max_memory_reserved = lambda device=None: 0
    mod.device = _DeviceContext


class _Stream:
    """torch.npu.Stream basics: one synchronous stream per device (its default stream), so waiting and
    synchronising return at once."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = torch.device(_BACKEND, _check_device("Stream", device))
        self.priority = priority

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event if event is not None else _Event()
        event.record(self)
        return event

    def __eq__(self, other) -> bool:
        return isinstance(other, _Stream) and other.device == self.device

    def __hash__(self) -> int:
        return hash(self.device)

    def __repr__(self) -> str:
        return f"<torch.npu.Stream device={self.device} (the simulated default stream)>"


class _Event:
    """torch.npu.Event basics: timing uses the host clock (every kernel has finished when it returns)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._time = None

    def record(self, stream=None) -> None:
        self._time = time.perf_counter()

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end) -> float:
        if not self.enable_timing or self._time is None or end._time is None:
            raise RuntimeError("torch.npu.Event.elapsed_time: both events must be created with enable_timing=True "
                               "and recorded")
        return (end._time - self._time) * 1000.0


class _StreamContext:
    """torch.npu.stream(s): like torch.cuda.stream, also makes the stream's device current inside the block."""

    def __init__(self, stream):
        self.stream = stream
        self._device = _DeviceContext(stream.device if stream is not None else None)

    def __enter__(self):
        self._device.__enter__()
        return self.stream

    def __exit__(self, *exc) -> None:
        self._device.__exit__(*exc)


class _NotSimulated:
    """torch.npu.NPUGraph / torch.npu.graph: NPU graph capture replays recorded kernels on the device; there is
    nothing to record on the simulated one, so using it raises NotImplementedError naming it."""

    name = "torch.npu.NPUGraph"
    __torch_ops_transformer_not_implemented__ = True  # real_torch_npu.NOT_IMPLEMENTED_MARK

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"{self.name}: NPU graph capture is not simulated (the simulated npu device runs "
                                  f"every kernel synchronously on the host); call the model eagerly")


class _NotSimulatedGraphContext(_NotSimulated):
    name = "torch.npu.graph"


def _add_streams(mod: types.ModuleType) -> None:
    mod.NPUGraph, mod.graph = _NotSimulated, _NotSimulatedGraphContext
    mod.Stream, mod.Event = _Stream, _Event
    mod.current_stream = lambda device=None: _Stream(device)
    mod.default_stream = lambda device=None: _Stream(device)
    mod.set_stream = lambda stream: None
    mod.stream = _StreamContext


def unavailable_device_module() -> types.ModuleType:
    """torch_npu.npu of the shim when the simulated device is not enabled: says no device is available."""
    mod = types.ModuleType("torch_npu.npu")
    mod.is_available = lambda: False
    mod.device_count = lambda: 0
    mod.is_initialized = lambda: False
    return mod


def _install_cpp(devices: int) -> None:
    """Flips the C++ switch: the `devices` devices, hooks and the npu_fa registrations (the list of ops served by
    their CPU kernel is generated into the library) are installed by tot_npu_sim_enable."""
    error = ctypes.create_string_buffer(2048)
    fn = _sim_fn("tot_npu_sim_enable", ctypes.c_int, ctypes.c_char_p, ctypes.c_int)
    if fn(devices, error, len(error)) != 0:
        raise RuntimeError(f"npu_sim.enable(): {error.value.decode(errors='replace')}")


def enable(installed_torch_npu_failed: bool = False) -> None:
    """Install the simulated "npu" device for this process (idempotent). Raises RuntimeError when refused.

    `installed_torch_npu_failed`: the caller (the torch_npu shim) tried importing the installed torch_npu and it
    failed (no CANN runtime), so it does not own the device. The number of devices is TOT_NPU_SIM_DEVICES
    (default 1; ValueError when it is not a positive integer up to max_devices())."""
    global _enabled, _device_count
    if _enabled:
        return
    reason = _refusal_reason(installed_torch_npu_failed)
    if reason is not None:
        raise RuntimeError(f"npu_sim.enable() refused: {reason}")
    devices = device_count_from_environment()
    _install_cpp(devices)
    _device_count = devices
    if devices > 1:
        _send_host_tensors_by_value()
    torch.utils.rename_privateuse1_backend(_BACKEND)
    torch._register_device_module(_BACKEND, _device_module())
    torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)
    amp.install()
    _enabled = True
    # F.scaled_dot_product_attention on npu tensors -> our flash attention (PyTorch's overrideable SDPA hook).
    sdpa.enable()


def _rebuild_from_bytes(data: bytes) -> torch.Tensor:
    return torch.load(io.BytesIO(data), weights_only=True)


def _reduce_host_tensor_by_value(tensor: torch.Tensor):
    """Pickles a host tensor's values (torch.save) instead of a handle to its shared memory; other tensors (npu
    tensors, tensors requiring grad, subclasses) keep torch's own reduction."""
    if tensor.device.type != "cpu" or tensor.requires_grad or type(tensor) is not torch.Tensor:
        return _TORCH_REDUCE_TENSOR(tensor)
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return _rebuild_from_bytes, (buffer.getvalue(),)


def _send_host_tensors_by_value() -> None:
    """Several simulated devices stand for the ranks of a multi-NPU job, one process per rank; torch_npu's tests spawn
    them and send results back through torch.multiprocessing queues. torch's reduction sends a handle to the
    tensor's shared memory, which the receiver can open only while the sender keeps the tensor: a real rank's
    teardown takes long enough, a simulated rank exits at once and the parent then fails (FileNotFoundError).
    Host tensors are sent by value instead (the queue's feeder thread flushes them before the process ends)."""
    ForkingPickler.register(torch.Tensor, _reduce_host_tensor_by_value)


def enable_from_environment() -> None:
    """Called at package import: TOT_NPU_SIM=1 enables the simulated device."""
    if os.environ.get(ENV_VAR, "") == "1":
        enable()
