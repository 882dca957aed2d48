"""MC2: matmul fused with collective communication, with torch_npu's signatures (and MindSpeed's for
`npu_mm_all_reduce_add_rms_norm`).

`hcom` names the communication group: a c10d group name (`group.group_name`), a ProcessGroup, or on Ascend the
HCCL communicator name torch_npu users get from `get_hccl_comm_name(rank)` (with the torch_npu shim, that call gives
the c10d name on any group: mc2/hccl_names.py). The ops run on any torch.distributed backend (gloo here, hccl on
Ascend, nccl on CUDA) through PyTorch's functional collectives.

Arguments are checked in torch_npu's order, before any communication: values and dtypes first (bad ones raise
ArgumentError, a ValueError and RuntimeError), then quantisation arguments (NotImplementedError naming them), then
the group behind `hcom`.
"""
from typing import List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .._internal import args as _args

OPS = torch.ops.npu_fa

GroupLike = Union[str, "dist.ProcessGroup"]

# torch_npu's communication modes ("ai_cpu": the AI CPU drives HCCL, the default; "aiv": the vector cores do);
# hardware hints with no effect here.
COMM_MODES = ("ai_cpu", "aiv")
# The world sizes torch_npu's all-gather / reduce-scatter MC2 kernels accept for an explicit `world_size`.
WORLD_SIZES = (2, 4, 8, 16, 32)
# Output dtypes the wrappers produce by casting the result; other dtypes are quantised outputs.
RESULT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# torch_npu passes dtypes to its `int?` arguments (y_dtype, x1_dtype, ...) as c10::ScalarType codes: the float ones.
_FLOAT_CODES = {code: d for code, d in _args.SCALAR_TYPE_CODES.items() if d.is_floating_point}


def _hccl_comm_name(pg) -> Optional[str]:
    """The HCCL communicator name torch_npu reports for a group (None off Ascend)."""
    try:
        backend = pg._get_backend(torch.device("npu"))
        return backend.get_hccl_comm_name(dist.get_rank(pg))
    except Exception:  # no NPU backend in this build / group: not an HCCL name
        return None


def group_name(hcom: GroupLike, op: str = "mc2", arg: str = "hcom") -> str:
    """The c10d group name behind `hcom` (a group name, a ProcessGroup or an HCCL communicator name)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{op}: torch.distributed is not initialised; call torch.distributed.init_process_group() "
                           f"before passing argument '{arg}' ({hcom!r})")
    if isinstance(hcom, dist.ProcessGroup):
        return hcom.group_name
    if not isinstance(hcom, str):
        raise TypeError(f"{op}: argument '{arg}' must be a group name (str) or a ProcessGroup; got {type(hcom).__name__}")
    from torch.distributed.distributed_c10d import _resolve_process_group, _world  # lazy: needs dist.is_available()

    try:
        _resolve_process_group(hcom)
        return hcom
    except Exception:
        pass
    for pg in list(_world.pg_map):
        if _hccl_comm_name(pg) == hcom:
            return pg.group_name
    known = sorted(_world.pg_names.values())
    raise ValueError(f"{op}: argument '{arg}' ({hcom!r}) names no process group; known group names: {known}")


def _world_size(op: str, name: str, world_size: Optional[int]) -> int:
    if world_size is not None:
        return world_size
    from torch.distributed.distributed_c10d import _resolve_process_group  # lazy: needs dist.is_available()

    return _resolve_process_group(name).size()


def _check_world_size(op: str, world_size) -> None:
    """torch_npu requires world_size in WORLD_SIZES; None (ours) takes the group's size, whatever it is."""
    if world_size is None:
        return
    if not isinstance(world_size, int) or isinstance(world_size, bool):
        raise TypeError(f"{op}: argument 'world_size' must be an int; got {type(world_size).__name__}")
    if world_size not in WORLD_SIZES:
        raise ValueError(f"{op}: argument 'world_size' must be one of {list(WORLD_SIZES)} (the ranks torch_npu's "
                         f"kernels support), or None for the group's size; got {world_size}")


def _check_reduce_op(op: str, reduce_op) -> None:
    if reduce_op != "sum":
        raise ValueError(f"{op}: argument 'reduce_op' must be 'sum' (the only reduction torch_npu supports); "
                         f"got {reduce_op!r}")


def _check_hints(op: str, comm_turn, comm_mode=None) -> None:
    """comm_turn (torch_npu's communication split count) and comm_mode: validated, no effect on the CPU (the
    pipeline depth is our keyword-only `chunks`)."""
    if not isinstance(comm_turn, int) or isinstance(comm_turn, bool):
        raise TypeError(f"{op}: argument 'comm_turn' must be an int; got {type(comm_turn).__name__}")
    if comm_turn < 0:
        raise ValueError(f"{op}: argument 'comm_turn' must be >= 0 (0 = the default split); got {comm_turn}")
    if comm_mode is not None and not isinstance(comm_mode, str):
        raise TypeError(f"{op}: argument 'comm_mode' must be a str or None; got {type(comm_mode).__name__}")
    if comm_mode is not None and comm_mode not in COMM_MODES:
        raise ValueError(f"{op}: argument 'comm_mode' must be one of {list(COMM_MODES)} or None; got {comm_mode!r}")


def _as_dtype(op: str, name: str, value) -> Optional[torch.dtype]:
    """A torch.dtype, or an int c10::ScalarType code as torch_npu's `int?` dtype arguments carry (codes of dtypes
    torch_npu adds itself, such as hifloat8, are not ScalarTypes: NotImplementedError)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in _FLOAT_CODES:
            raise NotImplementedError(f"{op}: argument '{name}' = {value} is a quantised (fp8/fp4/hifloat8) or "
                                      f"integer dtype code; only float16 (5), bfloat16 (15), float32 (6) and "
                                      f"float64 (7) are implemented")
        return _FLOAT_CODES[value]
    raise TypeError(f"{op}: argument '{name}' must be a torch.dtype (or its int code) or None; got "
                    f"{type(value).__name__}")


def _result_dtype(op: str, name: str, value, x_dtype: torch.dtype) -> Optional[torch.dtype]:
    """The dtype to cast the result to (None: keep it). torch_npu applies output_dtype / y_dtype to quantised
    outputs only; here the floating-point result is cast to a float16 / bfloat16 / float32 request."""
    dtype = _as_dtype(op, name, value)
    if dtype is None or dtype == x_dtype:
        return None
    if dtype not in RESULT_DTYPES:
        raise NotImplementedError(f"{op}: argument '{name}' = {dtype} (a quantised or integer output) is not "
                                  f"implemented; pass None or one of {[str(d) for d in RESULT_DTYPES]}")
    return dtype


def _is_quantised_dtype(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point or dtype.itemsize == 1  # int8/int4 packed, fp8


def _check_input_dtypes(op: str, x1: torch.Tensor, x2: torch.Tensor, first: str = "x1") -> None:
    """torch_npu's dtype combinations: integer x1 needs integer x2 (ArgumentError otherwise, as torch_npu raises
    RuntimeError); quantised (int8 / fp8) inputs are not implemented."""
    for name, t in ((first, x1), ("x2", x2)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor; got {type(t).__name__}")
    if not x1.dtype.is_floating_point and x2.dtype.is_floating_point:
        raise _args.ArgumentError(f"{op}: the dtypes of {first} ({x1.dtype}) and x2 ({x2.dtype}) are no valid "
                                  f"combination: an integer {first} (quantised) needs an integer x2")
    quantised = [f"'{n}' ({t.dtype})" for n, t in ((first, x1), ("x2", x2)) if _is_quantised_dtype(t.dtype)]
    if quantised:
        raise NotImplementedError(f"{op}: quantised MC2 is not implemented; {' and '.join(quantised)} must be "
                                  f"float16, bfloat16, float32 or float64")


def _check_dims(op: str, x1: torch.Tensor, x2: torch.Tensor) -> None:
    """The all-reduce ops' shapes as torch_npu documents them (the ops themselves accept any leading dims)."""
    if x1.dim() not in (2, 3):
        raise ValueError(f"{op}: x1 must be 2-D [m, k] or 3-D [b, s, k]; got shape {tuple(x1.shape)}")
    if x2.dim() != 2:
        raise ValueError(f"{op}: x2 must be 2-D [k, n]; got shape {tuple(x2.shape)}")


def _check_same_dtype(op: str, name: str, value, dtype: torch.dtype, what: str) -> None:
    """x1_dtype / x2_dtype reinterpret an input's bytes (hifloat8, packed fp4): only its own dtype is accepted."""
    given = _as_dtype(op, name, value)
    if given is not None and given != dtype:
        raise NotImplementedError(f"{op}: argument '{name}' ({given}) reinterprets {what} ({dtype}) as another "
                                  f"(quantised) dtype, which is not implemented; pass None")


def _cast(t: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.Tensor:
    return t if dtype is None else t.to(dtype)


def _per_rank_addend(op: str, x3: Optional[torch.Tensor], bias: Optional[torch.Tensor], x1: torch.Tensor,
                     x2: torch.Tensor) -> Optional[torch.Tensor]:
    """torch_npu adds bias (and x3) on every rank before the all-reduce, AllReduce(x1 @ x2 + bias + x3): both go
    into the op's per-rank addend x3 (a broadcast view of bias when x3 is not given)."""
    shape = (*x1.shape[:-1], x2.shape[-1])
    for name, t, want in (("x3", x3, f"the output's shape {shape}"), ("bias", bias, f"shape ({shape[-1]},)")):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: argument '{name}' must be a Tensor or None; got {type(t).__name__}")
        if tuple(t.shape) != (shape if name == "x3" else (shape[-1],)):
            raise ValueError(f"{op}: {name} must have {want} (x2's last dim n = {shape[-1]}); got "
                             f"{tuple(t.shape)}")
        if t.dtype != x1.dtype:
            raise ValueError(f"{op}: {name}'s dtype ({t.dtype}) must equal x1's ({x1.dtype}), the output's")
    if bias is None:
        return x3
    return bias.expand(shape) if x3 is None else x3 + bias


@_args.torch_npu_api
def npu_all_gather_base_mm(input: torch.Tensor, x2: torch.Tensor, hcom: GroupLike, world_size: Optional[int] = None,
                           *, bias: Optional[torch.Tensor] = None, x1_scale: Optional[torch.Tensor] = None,
                           x2_scale: Optional[torch.Tensor] = None, gather_index: int = 0,
                           gather_output: bool = True, comm_turn: int = 0,
                           output_dtype: Optional[torch.dtype] = None, comm_mode: Optional[str] = None,
                           chunks: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(AllGather(input) @ x2 + bias, AllGather(input)) over the group `hcom` (the gathered input is empty when not
    gather_output). Extensions: world_size None takes the group's size; `chunks` sets the pipeline depth (0 =
    automatic); output_dtype float16/bfloat16/float32 casts the first output."""
    op = "npu_all_gather_base_mm"
    _check_world_size(op, world_size)
    _check_hints(op, comm_turn, comm_mode)
    if comm_mode == "aiv" and not gather_output:
        raise ValueError(f"{op}: argument 'gather_output' must be True when comm_mode is 'aiv' (torch_npu's aiv "
                         f"mode always returns the gathered input)")
    _check_input_dtypes(op, input, x2, first="input")
    _args.not_implemented(op, "quantised MC2", x1_scale=x1_scale, x2_scale=x2_scale)
    dtype = _result_dtype(op, "output_dtype", output_dtype, input.dtype)
    name = group_name(hcom, op)
    out, gathered = OPS.all_gather_matmul(input, x2, name, _world_size(op, name, world_size), bias, gather_index,
                                          gather_output, chunks)
    return _cast(out, dtype), gathered


@_args.torch_npu_api
def npu_mm_reduce_scatter_base(input: torch.Tensor, x2: torch.Tensor, hcom: GroupLike,
                               world_size: Optional[int] = None, *, reduce_op: str = "sum",
                               bias: Optional[torch.Tensor] = None, x1_scale: Optional[torch.Tensor] = None,
                               x2_scale: Optional[torch.Tensor] = None, comm_turn: int = 0,
                               output_dtype: Optional[torch.dtype] = None, comm_mode: Optional[str] = None,
                               chunks: int = 0) -> torch.Tensor:
    """ReduceScatter(input @ x2) + bias: this rank's m / world_size rows of the group sum. The bias is added once,
    after the reduction (torch_npu documents bias here as unsupported). Extensions as npu_all_gather_base_mm."""
    op = "npu_mm_reduce_scatter_base"
    _check_world_size(op, world_size)
    _check_reduce_op(op, reduce_op)
    _check_hints(op, comm_turn, comm_mode)
    _check_input_dtypes(op, input, x2, first="input")
    _args.not_implemented(op, "quantised MC2", x1_scale=x1_scale, x2_scale=x2_scale)
    dtype = _result_dtype(op, "output_dtype", output_dtype, input.dtype)
    name = group_name(hcom, op)
    return _cast(OPS.matmul_reduce_scatter(input, x2, name, _world_size(op, name, world_size), bias, chunks), dtype)


@_args.torch_npu_api
def npu_mm_all_reduce_base(x1: torch.Tensor, x2: torch.Tensor, hcom: GroupLike, *, reduce_op: str = "sum",
                           bias: Optional[torch.Tensor] = None, antiquant_scale: Optional[torch.Tensor] = None,
                           antiquant_offset: Optional[torch.Tensor] = None, x3: Optional[torch.Tensor] = None,
                           dequant_scale: Optional[torch.Tensor] = None,
                           pertoken_scale: Optional[torch.Tensor] = None,
                           comm_quant_scale_1: Optional[torch.Tensor] = None,
                           comm_quant_scale_2: Optional[torch.Tensor] = None, antiquant_group_size: int = 0,
                           comm_turn: int = 0, group_sizes: Optional[List[int]] = None,
                           y_dtype: Optional[int] = None, x1_dtype: Optional[int] = None,
                           x2_dtype: Optional[int] = None, dequant_scale_dtype: Optional[int] = None,
                           pertoken_scale_dtype: Optional[int] = None, comm_quant_mode: int = 0,
                           comm_mode: Optional[str] = None, chunks: int = 0) -> torch.Tensor:
    """AllReduce(x1 @ x2 + bias + x3), x1 [m, k] or [b, s, k]: as torch_npu, bias and x3 are this rank's addends,
    summed over the group with the products. y_dtype (a torch.dtype or its int code) float16/bfloat16/float32
    casts the result. Quantisation arguments must be None / 0."""
    op = "npu_mm_all_reduce_base"
    _check_reduce_op(op, reduce_op)
    _check_hints(op, comm_turn, comm_mode)
    _check_input_dtypes(op, x1, x2)
    _check_dims(op, x1, x2)
    _args.not_implemented(op, "quantised MC2", antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                          dequant_scale=dequant_scale, pertoken_scale=pertoken_scale,
                          comm_quant_scale_1=comm_quant_scale_1, comm_quant_scale_2=comm_quant_scale_2,
                          dequant_scale_dtype=dequant_scale_dtype, pertoken_scale_dtype=pertoken_scale_dtype)
    _args.not_implemented(op, "quantised MC2", empty_is_none=True, group_sizes=group_sizes)
    _args.not_implemented_unless_zero(op, "quantised MC2", antiquant_group_size=antiquant_group_size,
                                      comm_quant_mode=comm_quant_mode)
    _check_same_dtype(op, "x1_dtype", x1_dtype, x1.dtype, "x1")
    _check_same_dtype(op, "x2_dtype", x2_dtype, x2.dtype, "x2")
    dtype = _result_dtype(op, "y_dtype", y_dtype, x1.dtype)
    addend = _per_rank_addend(op, x3, bias, x1, x2)
    out = OPS.matmul_all_reduce(x1, x2, group_name(hcom, op), None, chunks, addend)
    return _cast(out, dtype)


@_args.torch_npu_api
def npu_mm_all_reduce_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor,
                                   hcom: GroupLike, *, reduce_op: str = "sum", epsilon: float = 1e-6,
                                   bias: Optional[torch.Tensor] = None, antiquant_scale=None, antiquant_offset=None,
                                   dequant_scale=None, antiquant_group_size: int = 0, comm_turn: int = 0,
                                   chunks: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """MindSpeed's (y, norm_out): y = AllReduce(x1 @ x2 + bias) + residual (bias is this rank's addend, summed
    over the group), norm_out = RMSNorm(y) * gamma."""
    op = "npu_mm_all_reduce_add_rms_norm"
    _check_reduce_op(op, reduce_op)
    _check_hints(op, comm_turn)
    _check_input_dtypes(op, x1, x2)
    _check_dims(op, x1, x2)
    _args.not_implemented(op, "quantised MC2", antiquant_scale=antiquant_scale, antiquant_offset=antiquant_offset,
                          dequant_scale=dequant_scale)
    _args.not_implemented_unless_zero(op, "quantised MC2", antiquant_group_size=antiquant_group_size)
    addend = _per_rank_addend(op, None, bias, x1, x2)
    return OPS.matmul_all_reduce_add_rms_norm(x1, x2, residual, gamma, group_name(hcom, op), None, epsilon, chunks,
                                              addend)


def mc2_validation(enable: Optional[bool] = None) -> bool:
    """Query (None) or set cross-rank validation of the MC2 ops (on by default; one tiny all-gather per call)."""
    return OPS.mc2_validation(-1 if enable is None else int(bool(enable)))
