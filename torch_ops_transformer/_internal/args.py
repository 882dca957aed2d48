"""Argument conversion and checks shared by the Python wrappers (attention, inference, MoE, MC2, hf).

Exception policy of the wrappers (docs/architecture.md, "Errors"):

- ``ValueError`` — a bad value: out of range, wrong length, a reserved argument given, an option the upstream API
  itself does not have (e.g. ``reduce_op`` other than ``"sum"``).
- ``NotImplementedError`` — a valid upstream feature this project does not implement (quantisation, ALiBi,
  prefix sparse mode, shared prefixes, soft-capping, ...). The message names every such argument that was given.
- ``TypeError`` — an argument of the wrong Python type or dtype (e.g. a list of floats for sequence lengths).

Every message starts with the public function's name and names the argument. (The ops' C++ checks raise ValueError
and TypeError only: an integer mode an op does not implement is a ValueError there.)

torch_npu raises RuntimeError for the bad values its C++ checks reject. The torch_npu-compatible wrappers (decorated
with `torch_npu_api`) therefore raise `ArgumentError`, a ValueError that is also a RuntimeError, so that code written
for either convention catches it.
"""
import functools
import operator
from typing import Callable, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

IntList = Optional[Union[int, Sequence[int], Tensor]]
SeqLens = Optional[Union[Sequence[int], Tensor]]  # per-batch sequence lengths: a list, or a tensor on any device
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
MAX_TOKENS = 2147483647  # the default pre_tokens / next_tokens of the attention ops: no band


def dropout_seed(keep_prob: float, device) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Seed and offset of the attention ops' dropout stream, drawn from torch's default generator (traceable by
    torch.compile); None, None without dropout."""
    if keep_prob >= 1.0:
        return None, None
    seed = torch.randint(0, 2**62, (), dtype=torch.int64, device=device)
    return seed, torch.zeros((), dtype=torch.int64, device=device)


class ArgumentError(ValueError, RuntimeError):
    """A bad argument value: a ValueError (this project's convention) and a RuntimeError (torch_npu's)."""


# Every torch_npu function this package implements, by its torch_npu name (filled by `torch_npu_api`).
TORCH_NPU_API: Dict[str, Callable] = {}


def torch_npu_api(fn: Callable) -> Callable:
    """Marks `fn` as the implementation of `torch_npu.<fn.__name__>` (compat shim, signature parity test) and turns
    the ValueErrors raised under it (its own checks and the ops' C++ checks) into ArgumentError."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except ArgumentError:
            raise
        except ValueError as e:
            raise ArgumentError(*e.args).with_traceback(e.__traceback__) from None

    TORCH_NPU_API[fn.__name__] = wrapper
    return wrapper


def _check_int64(op: str, name: str, values: Sequence[int]) -> None:
    """A Python int is unbounded; one beyond int64 would make torch.tensor raise an overflow error that does not say
    which argument it came from."""
    for v in values:
        if not INT64_MIN <= v <= INT64_MAX:
            raise ValueError(f"{op}: argument '{name}' must hold int64 values; got {v}")


def int_tensor(op: str, name: str, value: IntList, device) -> Optional[Tensor]:
    """A list of ints (or one int) as an int64 tensor on `device`; None and tensors pass through unchanged.

    Used for sequence lengths and group lists: the ops take them as tensors so that torch.compile does not guard on
    (and recompile for) every new list of lengths."""
    if value is None or isinstance(value, Tensor):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                       for v in value):
        raise TypeError(f"{op}: argument '{name}' must be a list of ints or an integer tensor; got {value!r}")
    _check_int64(op, name, value)
    return torch.tensor(list(value), dtype=torch.int64, device=device)


def int_scalar_tensor(op: str, name: str, value: Union[int, Tensor, None], device) -> Optional[Tensor]:
    """One int as a 0-d int64 tensor on `device` (an argument the op takes as a one-element tensor, such as a
    padding or a dropout seed); None and tensors pass through unchanged."""
    if value is None or isinstance(value, Tensor):
        return value
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{op}: argument '{name}' must be an int or a one-element integer tensor; got {value!r}")
    _check_int64(op, name, [value])
    return torch.tensor(value, dtype=torch.int64, device=device)


def window(op: str, name: str, value) -> Tuple[int, int]:
    """A (left, right) window of FlashAttention-2 as two Python ints, each >= -1 (-1 = unbounded).

    FlashAttention-2 takes the pair in any form that unpacks to two integers; its own tests pass a 2-element tensor
    (`torch.randint(0, seqlen, (2,))`), so a tuple, a list and a 1-D integer tensor of 2 elements are all accepted
    (entries may be ints, numpy integers or 0-d integer tensors; bools and floats are not)."""
    expected = (f"{op}: argument '{name}' must be a pair (left, right) of ints >= -1 (-1 = unbounded): a tuple, a "
                f"list or a 2-element integer tensor; got {value!r}")
    if isinstance(value, Tensor):
        if value.dtype == torch.bool or value.dtype.is_floating_point or value.dtype.is_complex:
            raise TypeError(f"{expected} of dtype {value.dtype}")
        if value.dim() != 1 or value.numel() != 2:
            raise ValueError(f"{expected} of shape {list(value.shape)}")
        entries = value.tolist()
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        entries = list(value)
    else:
        raise ValueError(expected)
    pair = []
    for entry in entries:
        if isinstance(entry, bool) or (isinstance(entry, Tensor) and entry.dtype == torch.bool):
            raise TypeError(expected)
        try:
            pair.append(operator.index(entry))  # int, numpy integer, 0-d integer tensor; not a float
        except TypeError:
            raise TypeError(expected) from None
    if pair[0] < -1 or pair[1] < -1:
        raise ValueError(expected)
    return pair[0], pair[1]


def _given(value, empty_is_none: bool) -> bool:
    if value is None:
        return False
    return not (empty_is_none and isinstance(value, (list, tuple)) and len(value) == 0)


def not_implemented(op: str, feature: str, *, empty_is_none: bool = False, **args) -> None:
    """NotImplementedError naming every argument of `args` that was given (not None; with `empty_is_none` an empty
    list counts as not given, as in torch_npu's list-valued defaults). `feature` says what they would enable."""
    given = [name for name, value in args.items() if _given(value, empty_is_none)]
    if given:
        names = ", ".join(f"'{n}'" for n in given)
        raise NotImplementedError(f"{op}: {feature} is not implemented; argument{'s' if len(given) > 1 else ''} "
                                  f"{names} must be None")


def not_implemented_unless_zero(op: str, feature: str, **args) -> None:
    """NotImplementedError naming every integer mode of `args` that is not 0 (0 = the implemented mode)."""
    given = [f"'{name}'={value}" for name, value in args.items() if value != 0]
    if given:
        raise NotImplementedError(f"{op}: {feature} is not implemented; {', '.join(given)} must be 0")


def reserved(op: str, **args) -> None:
    """ValueError for an argument that the upstream API reserves (it must stay None)."""
    for name, value in args.items():
        if value is not None:
            raise ValueError(f"{op}: argument '{name}' is reserved in torch_npu and must be None")


def single_tensor(op: str, name: str, value):
    """One tensor out of an argument torch_npu also accepts as a list of tensors (only one-element lists here)."""
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise NotImplementedError(f"{op}: argument '{name}' as a list of {len(value)} tensors is not "
                                      f"implemented; pass one tensor")
        return value[0]
    return value


def _named_tensors(name: str, value):
    if isinstance(value, Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, t in enumerate(value):
            if isinstance(t, Tensor):
                yield f"{name}[{i}]", t


def check_devices(op: str, arguments, host: Tuple[str, ...] = ()) -> None:
    """The device rule of native_functions.yaml, as the generated C++ wrappers apply it, for the fake kernels: every
    tensor on the device of the first non-host tensor; host tensors (lengths read on the host) there or on the CPU.

    It matters because a tensor on `meta` next to CPU tensors dispatches to the fake kernel, which would otherwise
    return uninitialised memory for a real call. `arguments` are (name, value) pairs in schema order."""
    device = first = None
    hosted = []
    for name, value in arguments:
        for n, t in _named_tensors(name, value):
            if name in host:
                hosted.append((n, t))
            elif device is None:
                device, first = t.device, n
            elif t.device != device:
                raise ValueError(f"{op}: argument '{n}' must be on device {device} like argument "
                                 f"'{first}'; got a tensor on device {t.device}")
    for n, t in hosted:
        if device is not None and t.device.type != "cpu" and t.device != device:
            raise ValueError(f"{op}: argument '{n}' must be on device {device} like argument '{first}' "
                             f"or on the host (cpu); got a tensor on device {t.device}")


def host_int_tensor(op: str, name: str, value: IntList, device) -> Optional[Tensor]:
    """Like `int_tensor`, for integer arguments the kernels read on the host (sequence lengths, a padding size; the
    `host_tensors` of native_functions.yaml): a list becomes an int64 tensor on `device`, a CPU tensor passes, and a
    tensor on another accelerator than `device` (npu lengths next to CPU inputs) comes to the host, where every op
    takes it. torch_npu reads these on the host too (its schema has int[] for most of them)."""
    t = int_tensor(op, name, value, device)
    if isinstance(t, Tensor) and t.device.type != "cpu" and t.device != torch.device(device):
        t = t.cpu()
    return t


# torch_npu's `int?` dtype arguments (output_dtype, x_dtype...) take a torch.dtype or its ScalarType code; the codes
# of the dtypes torch itself lacks (hifloat8, float4, float8_e8m0...) and the 8-bit float and int8 formats are
# quantised data, which this package does not implement.
SCALAR_TYPE_CODES = {0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
                      5: torch.float16, 6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16}
DTYPE_CODES = {dtype: code for code, dtype in SCALAR_TYPE_CODES.items()}  # the inverse: dtype -> its code
# torch_npu's own dtype constants (integer codes of formats torch lacks), exposed by the shim so code naming them
# runs; passing one selects a quantised format (NotImplementedError here).
TORCH_NPU_DTYPE_CODES = {"hifloat8": 290, "float8_e8m0fnu": 293, "float4_e2m1fn_x2": 296, "float4_e1m2fn_x2": 297}


def same_dtype_or_none(op: str, name: str, value, dtype: Optional[torch.dtype], feature: str) -> None:
    """`value` — None, a torch.dtype or torch_npu's integer dtype code — must be None or name `dtype` (the dtype the
    tensor already has; None when there is no such tensor). Anything else selects `feature` (a quantised format):
    NotImplementedError naming the argument."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, torch.dtype)):
        raise TypeError(f"{op}: argument '{name}' must be None, a torch.dtype or a torch_npu dtype code (int); "
                        f"got {value!r}")
    resolved = SCALAR_TYPE_CODES.get(value) if isinstance(value, int) else value
    if dtype is None or resolved != dtype:
        expected = "None" if dtype is None else f"None or {dtype}"
        raise NotImplementedError(f"{op}: {feature} is not implemented; argument '{name}' must be {expected}; "
                                  f"got {value!r}")


def optional_int(op: str, name: str, value, default: int) -> int:
    """An `int?` argument of torch_npu: None means the default."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: argument '{name}' must be an int or None; got {value!r}")
    return value
