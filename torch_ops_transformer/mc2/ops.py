"""MC2: matmul fused with collective communication, with torch_npu's signatures (and MindSpeed's for
`npu_mm_all_reduce_add_rms_norm`).

`hcom` names the communication group: a c10d group name (`group.group_name`), a ProcessGroup, or on Ascend the
HCCL communicator name torch_npu users get from `get_hccl_comm_name(rank)` (with the torch_npu shim, that call gives
the c10d name on any group: mc2/hccl_names.py). The ops run on any torch.distributed backend (gloo here, hccl on
Ascend, nccl on CUDA) through PyTorch's functional collectives.

Arguments are checked in torch_npu's order, before any communication: values, dtypes and scales first (bad ones
raise ArgumentError, a ValueError and RuntimeError), then the upstream features not implemented here
(NotImplementedError naming them), then the group behind `hcom`. The int8 forms (dequant / per-token / per-channel
scales, weight-only int8) run in mc2/quant.py, their checks are in mc2/quant_checks.py.
"""
from typing import List, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .._internal import args as _args
from . import quant as _quant
from . import quant_checks as _qc

OPS = torch.ops.npu_fa

GroupLike = Union[str, "dist.ProcessGroup"]

# torch_npu's communication modes ("ai_cpu": the AI CPU drives HCCL, the default; "aiv": the vector cores do);
# hardware hints with no effect here.
COMM_MODES = ("ai_cpu", "aiv")
# The world sizes torch_npu's all-gather / reduce-scatter MC2 kernels accept for an explicit `world_size`
# (npu_all_gather_quant_mm's kernel also 64).
WORLD_SIZES = (2, 4, 8, 16, 32)
QUANT_MM_WORLD_SIZES = (2, 4, 8, 16, 32, 64)
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


def _check_world_size(op: str, world_size, sizes=WORLD_SIZES) -> None:
    """torch_npu requires world_size in `sizes`; None (ours) takes the group's size, whatever it is."""
    if world_size is None:
        return
    if not isinstance(world_size, int) or isinstance(world_size, bool):
        raise TypeError(f"{op}: argument 'world_size' must be an int; got {type(world_size).__name__}")
    if world_size not in sizes:
        raise ValueError(f"{op}: argument 'world_size' must be one of {list(sizes)} (the ranks torch_npu's "
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


def _check_2d(op: str, x1: torch.Tensor, x2: torch.Tensor, first: str = "input") -> None:
    """The all-gather / reduce-scatter forms: 2-D [m, k] @ [k, n] (the float ops check this themselves)."""
    if x1.dim() != 2 or x2.dim() != 2:
        raise ValueError(f"{op}: {first} and x2 must be 2-D ([m, k], [k, n]); got shapes {tuple(x1.shape)} and "
                         f"{tuple(x2.shape)}")
    _qc.check_k(op, x1, x2, first)


def _same_dtype_inputs(op: str, kind: str, x1: torch.Tensor, x2: torch.Tensor) -> None:
    """All-gather / reduce-scatter take x1 and x2 of one dtype: a weight-only int8 x2 is an all-reduce form."""
    if kind == "weight_int8":
        raise _args.ArgumentError(f"{op}: x2's dtype ({x2.dtype}) must equal input's ({x1.dtype}); a weight-only "
                                  f"int8 x2 is a form of npu_mm_all_reduce_base only")


def _quant_bias_not_implemented(op: str, bias) -> None:
    if bias is not None:
        raise NotImplementedError(f"{op}: bias with int8 inputs is not implemented (torch_npu documents it as "
                                  f"unsupported there); pass None")


def _all_gather_quant(op: str, input: torch.Tensor, x2: torch.Tensor, hcom: GroupLike, world_size,
                      bias, x1_scale, x2_scale, gather_index: int, gather_output: bool, dtype_arg: str, dtype_value,
                      chunks: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The int8 all-gather: (AllGather(x1_scale) * x2_scale) * (AllGather(input) @ x2), AllGather(input)."""
    _check_2d(op, input, x2)
    _qc.scale_args(op, "int8", x1_scale, x2_scale, input.shape[0], x2.shape[1])
    _quant_bias_not_implemented(op, bias)
    if gather_index != 0:
        raise ValueError(f"{op}: argument 'gather_index' must be 0 (gather x1, as torch_npu supports); got "
                         f"{gather_index}")
    dtype = _qc.scaled_output_dtype(op, dtype_arg, dtype_value, x2_scale, torch.bfloat16)
    name = group_name(hcom, op)
    g = _quant.resolve(op, name, world_size, input.device)
    x1s = None if x1_scale is None else x1_scale.reshape(-1)
    return _quant.all_gather_matmul(op, g, input, x2, x1s, x2_scale, gather_output, dtype, chunks)


@_args.torch_npu_api
def npu_all_gather_base_mm(input: torch.Tensor, x2: torch.Tensor, hcom: GroupLike, world_size: Optional[int] = None,
                           *, bias: Optional[torch.Tensor] = None, x1_scale: Optional[torch.Tensor] = None,
                           x2_scale: Optional[torch.Tensor] = None, gather_index: int = 0,
                           gather_output: bool = True, comm_turn: int = 0,
                           output_dtype: Optional[torch.dtype] = None, comm_mode: Optional[str] = None,
                           chunks: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(AllGather(input) @ x2 + bias, AllGather(input)) over the group `hcom` (the gathered input is empty when not
    gather_output). int8 input and x2: ((AllGather(x1_scale) * x2_scale) * (AllGather(input) @ x2), AllGather(input))
    with x1_scale float32 [m, 1] (optional) and x2_scale float32 / int64 [1, n], of output_dtype (bfloat16 by
    default; float16 with an int64 x2_scale). Extensions: world_size None takes the group's size; `chunks` sets the
    pipeline depth (0 = automatic); output_dtype float16/bfloat16/float32 casts a float input's first output."""
    op = "npu_all_gather_base_mm"
    _check_world_size(op, world_size)
    _check_hints(op, comm_turn, comm_mode)
    if comm_mode == "aiv" and not gather_output:
        raise ValueError(f"{op}: argument 'gather_output' must be True when comm_mode is 'aiv' (torch_npu's aiv "
                         f"mode always returns the gathered input)")
    kind = _qc.input_kind(op, input, x2, first="input")
    _same_dtype_inputs(op, kind, input, x2)
    if kind == "int8":
        return _all_gather_quant(op, input, x2, hcom, world_size, bias, x1_scale, x2_scale, gather_index,
                                 gather_output, "output_dtype", output_dtype, chunks)
    _qc.scale_args(op, kind, x1_scale, x2_scale, input.shape[0], x2.shape[-1])
    dtype = _result_dtype(op, "output_dtype", output_dtype, input.dtype)
    name = group_name(hcom, op)
    out, gathered = OPS.all_gather_matmul(input, x2, name, _world_size(op, name, world_size), bias, gather_index,
                                          gather_output, chunks)
    return _cast(out, dtype), gathered


def _group_sizes_zero(op: str, group_sizes) -> None:
    """None, [] or zeros (torch_npu's 'no per-block quantisation'); anything else is not implemented."""
    if group_sizes is None or (isinstance(group_sizes, (list, tuple)) and not any(group_sizes)):
        return
    raise NotImplementedError(f"{op}: per-block quantisation is not implemented; argument 'group_sizes' must be "
                              f"None or zeros; got {group_sizes!r}")


def _quant_mm_y_dtype(op: str, kind: str, input: torch.Tensor, y_dtype) -> None:
    """torch_npu's rule: a float16 / bfloat16 input gives its own dtype (y_dtype None or that), an int8 input needs
    y_dtype."""
    if kind == "int8":
        if y_dtype is None:
            raise ValueError(f"{op}: y_dtype should be provided when input dtype is not bf16 or fp16 (input is "
                             f"{input.dtype}); pass torch.float16 or torch.bfloat16 (or its code)")
        return
    given = _as_dtype(op, "y_dtype", y_dtype)
    if given is not None and given != input.dtype:
        raise ValueError(f"{op}: argument 'y_dtype': When input is float16 or bfloat16, output should be the same "
                         f"as input dtype. Expected output dtype: {input.dtype}, but got: {given}")


@_args.torch_npu_api
def npu_all_gather_quant_mm(input: torch.Tensor, x2: torch.Tensor, hcom: GroupLike, world_size: Optional[int], *,
                            bias: Optional[torch.Tensor] = None, x1_scale: Optional[torch.Tensor] = None,
                            x2_scale: Optional[torch.Tensor] = None, quant_scale: Optional[torch.Tensor] = None,
                            block_size: int = 0, gather_index: int = 0, gather_output: bool = True,
                            comm_turn: int = 0, group_sizes: Optional[List[int]] = None, amax_output: bool = False,
                            y_dtype: Optional[int] = None, x1_dtype: Optional[int] = None,
                            x2_dtype: Optional[int] = None, x1_scale_dtype: Optional[int] = None,
                            x2_scale_dtype: Optional[int] = None, comm_mode: Optional[str] = None,
                            chunks: int = 0) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """torch_npu's (output, gather_out, amax_out): npu_all_gather_base_mm's computation with the output dtype in
    y_dtype (required for int8 inputs: float16 / bfloat16 / float32; a float input's own dtype otherwise). amax_out
    is None (amax_output=True, quant_scale, a non-zero block_size and group_sizes select torch_npu's float8 output
    quantisation: NotImplementedError). world_size may be None (the group's size); `chunks` as there."""
    op = "npu_all_gather_quant_mm"
    _check_world_size(op, world_size, QUANT_MM_WORLD_SIZES)
    _group_sizes_zero(op, group_sizes)
    _check_hints(op, comm_turn, comm_mode)
    kind = _qc.input_kind(op, input, x2, first="input")
    _same_dtype_inputs(op, kind, input, x2)
    _quant_mm_y_dtype(op, kind, input, y_dtype)
    for name, value, t in (("x1_dtype", x1_dtype, input), ("x2_dtype", x2_dtype, x2),
                           ("x1_scale_dtype", x1_scale_dtype, x1_scale), ("x2_scale_dtype", x2_scale_dtype, x2_scale)):
        _args.same_dtype_or_none(op, name, value, None if t is None else t.dtype,
                                 "reinterpreting a tensor as another (float8 / float4 / hifloat8) dtype")
    _args.not_implemented(op, "output quantisation (float8 outputs)", quant_scale=quant_scale)
    _args.not_implemented_unless_zero(op, "per-block output quantisation", block_size=block_size)
    if amax_output:
        raise NotImplementedError(f"{op}: amax_output=True (the output's absolute maximum, for float8 output "
                                  f"quantisation) is not implemented; pass False")
    if kind == "int8":
        out, gathered = _all_gather_quant(op, input, x2, hcom, world_size, bias, x1_scale, x2_scale, gather_index,
                                          gather_output, "y_dtype", y_dtype, chunks)
        return out, gathered, None
    _qc.scale_args(op, kind, x1_scale, x2_scale, input.shape[0], x2.shape[-1])
    name = group_name(hcom, op)
    out, gathered = OPS.all_gather_matmul(input, x2, name, _world_size(op, name, world_size), bias, gather_index,
                                          gather_output, chunks)
    return out, gathered, None


@_args.torch_npu_api
def npu_mm_reduce_scatter_base(input: torch.Tensor, x2: torch.Tensor, hcom: GroupLike,
                               world_size: Optional[int] = None, *, reduce_op: str = "sum",
                               bias: Optional[torch.Tensor] = None, x1_scale: Optional[torch.Tensor] = None,
                               x2_scale: Optional[torch.Tensor] = None, comm_turn: int = 0,
                               output_dtype: Optional[torch.dtype] = None, comm_mode: Optional[str] = None,
                               chunks: int = 0) -> torch.Tensor:
    """ReduceScatter(input @ x2) + bias: this rank's m / world_size rows of the group sum. The bias is added once,
    after the reduction (torch_npu documents bias here as unsupported). int8 input and x2:
    ReduceScatter((x1_scale * x2_scale) * (input @ x2)), scales and output dtype as npu_all_gather_base_mm's.
    Extensions as npu_all_gather_base_mm."""
    op = "npu_mm_reduce_scatter_base"
    _check_world_size(op, world_size)
    _check_reduce_op(op, reduce_op)
    _check_hints(op, comm_turn, comm_mode)
    kind = _qc.input_kind(op, input, x2, first="input")
    _same_dtype_inputs(op, kind, input, x2)
    if kind == "int8":
        _check_2d(op, input, x2)
        _qc.scale_args(op, kind, x1_scale, x2_scale, input.shape[0], x2.shape[1])
        _quant_bias_not_implemented(op, bias)
        dtype = _qc.scaled_output_dtype(op, "output_dtype", output_dtype, x2_scale, torch.bfloat16)
        name = group_name(hcom, op)
        g = _quant.resolve(op, name, world_size, input.device)
        if input.shape[0] % g.size:
            raise ValueError(f"{op}: input's first dim (m = {input.shape[0]}) must be divisible by world_size "
                             f"({g.size}): reduce-scatter gives each rank m / world_size rows")
        x1s = None if x1_scale is None else x1_scale.reshape(-1)
        return _quant.matmul_reduce_scatter(op, g, input, x2, x1s, x2_scale, dtype, chunks)
    _qc.scale_args(op, kind, x1_scale, x2_scale, input.shape[0], x2.shape[-1])
    dtype = _result_dtype(op, "output_dtype", output_dtype, input.dtype)
    name = group_name(hcom, op)
    return _cast(OPS.matmul_reduce_scatter(input, x2, name, _world_size(op, name, world_size), bias, chunks), dtype)


def _dtype_args(op: str, x1, x2, dequant_scale, pertoken_scale, x1_dtype, x2_dtype, dequant_scale_dtype,
                pertoken_scale_dtype) -> None:
    """torch_npu's `int?` dtype arguments reinterpret a tensor's bytes (hifloat8, float8_e8m0, float4): only the
    tensor's own dtype (or None) is accepted."""
    _check_same_dtype(op, "x1_dtype", x1_dtype, x1.dtype, "x1")
    _check_same_dtype(op, "x2_dtype", x2_dtype, x2.dtype, "x2")
    for name, value, t in (("dequant_scale_dtype", dequant_scale_dtype, dequant_scale),
                           ("pertoken_scale_dtype", pertoken_scale_dtype, pertoken_scale)):
        _args.same_dtype_or_none(op, name, value, None if t is None else t.dtype,
                                 "reinterpreting a scale as another (float8_e8m0) dtype")


def _int8_product(x1: torch.Tensor, x2: torch.Tensor, dequant_scale: torch.Tensor, pertoken_scale, bias,
                  x3: Optional[torch.Tensor]):
    """This rank's fp32 rows [b, e) of dequant_scale * pertoken_scale * (x1 @ x2 + bias) + x3."""
    a, n = x1.reshape(-1, x1.shape[-1]), x2.shape[1]
    scale = dequant_scale.view(torch.int64) if dequant_scale.dtype == torch.uint64 else dequant_scale  # same bits
    x3 = None if x3 is None else x3.reshape(-1, n)

    def product(b: int, e: int) -> torch.Tensor:
        p = _quant.dequantised(a[b:e], x2, scale, None if pertoken_scale is None else pertoken_scale[b:e], bias)
        return p if x3 is None else p + x3[b:e].float()
    return product


def _weight_int8_product(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, offset, group_size: int, bias,
                         x3: Optional[torch.Tensor]):
    """This rank's fp32 rows [b, e) of x1 @ ((x2 + offset) * scale) + bias + x3 (the product in x1's dtype, as
    npu_weight_quant_batchmatmul gives it, the additions in fp32)."""
    a, n = x1.reshape(-1, x1.shape[-1]), x2.shape[1]
    x3 = None if x3 is None else x3.reshape(-1, n)

    def product(b: int, e: int) -> torch.Tensor:
        p = OPS.weight_quant_batchmatmul(a[b:e], x2, scale, offset, None, None, None, group_size).float()
        if bias is not None:
            p = p + bias.float()
        return p if x3 is None else p + x3[b:e].float()
    return product


def _all_reduce_quant(op: str, kind: str, x1, x2, hcom, bias, antiquant_scale, antiquant_offset, x3, dequant_scale,
                      pertoken_scale, antiquant_group_size: int, y_dtype, chunks: int) -> torch.Tensor:
    """AllReduce(dequant_scale * pertoken_scale * (x1 @ x2 + bias) + x3) for int8 x1 and x2, AllReduce(x1 @ ((x2 +
    antiquant_offset) * antiquant_scale) + bias + x3) for a weight-only int8 x2: each rank's fp32 value, summed over
    the group in float64 and rounded once to the output dtype (mc2/quant.py)."""
    n = x2.shape[1]
    shape = (*x1.shape[:-1], n)
    if kind == "int8":
        _qc.dequant(op, dequant_scale, pertoken_scale, n)
        _qc.bias(op, bias, n, torch.int32, "with int8 x1 and x2 (it is added to the int32 product)")
        product = _int8_product(x1, x2, dequant_scale, pertoken_scale, bias, x3)
    else:
        _qc.antiquant(op, x1, x2, antiquant_scale, antiquant_offset, antiquant_group_size)
        _qc.bias(op, bias, n, x1.dtype, "(x1's dtype) with a weight-only int8 x2")
        product = _weight_int8_product(x1, x2, antiquant_scale, antiquant_offset, antiquant_group_size, bias, x3)
    out_dtype = _qc.quant_output_dtype(op, y_dtype) or _qc.all_reduce_output_dtype(kind, x1, dequant_scale)
    g = _quant.resolve(op, group_name(hcom, op), None, x1.device)
    rows = x1.numel() // x1.shape[-1] if x1.shape[-1] else 0
    return _quant.all_reduce(op, g, rows, n, chunks, out_dtype, product).view(shape)


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
    summed over the group with the products. int8 x1 and x2: AllReduce(dequant_scale * pertoken_scale * (x1 @ x2 +
    bias) + x3), float16 (bfloat16 with a bfloat16 dequant_scale); float16 / bfloat16 x1 with int8 x2:
    AllReduce(x1 @ ((x2 + antiquant_offset) * antiquant_scale) + bias + x3), x1's dtype (docs/mc2.md, "Quantised
    MC2"). y_dtype (a torch.dtype or its int code) float16/bfloat16/float32 casts the result."""
    op = "npu_mm_all_reduce_base"
    _check_reduce_op(op, reduce_op)
    _check_hints(op, comm_turn, comm_mode)
    kind = _qc.input_kind(op, x1, x2)
    _check_dims(op, x1, x2)
    _qc.all_reduce_scales(op, kind, antiquant_scale, antiquant_offset, dequant_scale)
    shape = (*x1.shape[:-1], x2.shape[-1])
    if kind != "float":
        _qc.check_k(op, x1, x2)
        _qc.all_reduce_x3(op, x3, shape, _qc.all_reduce_output_dtype(kind, x1, dequant_scale))
    _qc.pertoken(op, pertoken_scale, dequant_scale, x1.numel() // max(x1.shape[-1], 1))
    _args.not_implemented(op, "low-bit (int8) communication", comm_quant_scale_1=comm_quant_scale_1,
                          comm_quant_scale_2=comm_quant_scale_2)
    _args.not_implemented_unless_zero(op, "low-bit (int8) communication", comm_quant_mode=comm_quant_mode)
    _args.not_implemented(op, "per-block quantisation", empty_is_none=True, group_sizes=group_sizes)
    _dtype_args(op, x1, x2, dequant_scale, pertoken_scale, x1_dtype, x2_dtype, dequant_scale_dtype,
                pertoken_scale_dtype)
    if kind != "weight_int8" and antiquant_group_size != 0:
        raise ValueError(f"{op}: argument 'antiquant_group_size' applies to a weight-only int8 x2 and must be 0 "
                         f"here; got {antiquant_group_size}")
    if kind != "float":
        return _all_reduce_quant(op, kind, x1, x2, hcom, bias, antiquant_scale, antiquant_offset, x3, dequant_scale,
                                 pertoken_scale, antiquant_group_size, y_dtype, chunks)
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
