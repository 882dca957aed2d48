"""Quantised MC2: the int8 forms of the torch_npu MC2 functions (docs/mc2.md, "Quantised MC2").

Each rank's product is computed by the quantised matmul kernels (`quant_matmul`: int8 x int8 in int32 on oneDNN,
dequantised in fp32; `weight_quant_batchmatmul`: int8 weight, activations in float16 / bfloat16), and moved by
PyTorch's functional collectives (`torch.ops._c10d_functional`, the path the C++ MC2 ops take), row chunk by row
chunk so the collective of chunk c is in flight while chunk c+1 is multiplied.

What is reduced (all-reduce, reduce-scatter) is each rank's fp32 dequantised value, widened to float64: the sum of
a few fp32 values is exact in float64 (unless their magnitudes differ by more than 2^29 / world_size), so the result
is the exact group sum rounded once to the output dtype, whatever order the backend adds in. torch_npu reduces the
float16 / bfloat16 output buffer instead (one rounding per addition); ours is never further from the exact sum.

These paths are Python over existing kernels, not ops of their own: they are inference forms (no autograd), as in
torch_npu.
"""
from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

OPS = torch.ops.npu_fa

# The automatic pipeline depth of the C++ MC2 ops (aten_ops/cpu/mc2/ops.cpp, choose_chunks): chunks below these
# sizes cost more in per-collective latency than their overlap gains.
_MIN_CHUNK_ROWS, _MIN_CHUNK_BYTES, _MAX_AUTO_CHUNKS = 64, 128 * 1024, 4
# quant_matmul's output_dtype codes (c10::ScalarType): the fp32 dequantised product, and the final outputs.
FLOAT32_CODE = 6
OUTPUT_CODES = {torch.float16: 5, torch.float32: 6, torch.bfloat16: 15}
# Op ids of the cross-rank signature (the C++ ops use 1-4).
OP_IDS = {"all_reduce": 11, "all_gather": 12, "reduce_scatter": 13}


def _c10d():
    return torch.ops._c10d_functional


@dataclass
class Group:
    name: str
    size: int
    device: torch.device  # where the inputs and results live
    via_host: bool        # the group has no backend for `device` (gloo with npu tensors): communicate host copies


def resolve(op: str, name: str, world_size: Optional[int], device: torch.device) -> Group:
    """The group behind a c10d group name (the wrappers resolved `hcom` to one); world_size must be its size."""
    from torch.distributed.distributed_c10d import _resolve_process_group  # lazy: needs dist.is_available()

    pg = _resolve_process_group(name)
    if world_size is not None and world_size != pg.size():
        raise ValueError(f"{op}: argument 'world_size' ({world_size}) must equal the size of group '{name}' "
                         f"({pg.size()})")
    via_host = device.type != "cpu" and device.type not in {d.type for d in pg._device_types}
    return Group(name, pg.size(), device, via_host)


def choose_chunks(op: str, requested, rows: int, bytes_per_row: int, world: int) -> int:
    if isinstance(requested, bool) or not isinstance(requested, int):
        raise TypeError(f"{op}: argument 'chunks' must be an int; got {type(requested).__name__}")
    if requested < 0:
        raise ValueError(f"{op}: argument 'chunks' must be >= 0 (0 = automatic); got {requested}")
    if requested > 0:
        return max(1, min(requested, rows))
    if world == 1:
        return 1
    return max(1, min(_MAX_AUTO_CHUNKS, rows // _MIN_CHUNK_ROWS, rows * bytes_per_row // _MIN_CHUNK_BYTES))


def _bound(c: int, n: int, rows: int) -> int:
    """Row c * rows / n: chunk sizes differ by at most one."""
    return c * rows // n


def _send(t: torch.Tensor, g: Group) -> torch.Tensor:
    return (t.cpu() if g.via_host else t).contiguous()


def _wait(pending: torch.Tensor, g: Group) -> torch.Tensor:
    done = _c10d().wait_tensor(pending)
    return done.to(g.device) if g.via_host else done


def validate(op: str, g: Group, fields: Dict[str, int]) -> None:
    """Every rank all-gathers the integers of `fields` (what it is about to communicate) and raises the same error
    when any rank differs, instead of a collective of mismatched sizes (mc2_validation switches it, like the C++
    ops' check). Skipped while tracing: the values are not known then."""
    if torch.compiler.is_compiling() or not OPS.mc2_validation(-1):
        return
    mine = torch.tensor(list(fields.values()), dtype=torch.int64)
    every = _c10d().wait_tensor(_c10d().all_gather_into_tensor(mine, g.size, g.name)).view(g.size, -1)
    for i, what in enumerate(fields):
        values = every[:, i].tolist()
        if any(v != values[0] for v in values):
            per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise ValueError(f"{op}: ranks of group '{g.name}' disagree on {what} ({per_rank})")


def dequantised(x1: torch.Tensor, x2: torch.Tensor, scale: torch.Tensor, pertoken: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], code: int = FLOAT32_CODE) -> torch.Tensor:
    """quant_matmul: (x1 @ x2 + bias) in int32, times scale[n] and pertoken[m] in fp32, as dtype `code`."""
    return OPS.quant_matmul(x1, x2, scale, None, pertoken, bias, code, None)


def all_reduce(op: str, g: Group, rows: int, n: int, chunks, out_dtype: torch.dtype,
               product: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """Sum over the group of `product(b, e)` (this rank's fp32 [e - b, n] value of rows [b, e)), chunk by chunk:
    chunk c's all-reduce (in float64) runs while chunk c+1 is computed. Returns [rows, n] of out_dtype."""
    count = choose_chunks(op, chunks, rows, n * 8, g.size)
    validate(op, g, {"the op called": OP_IDS["all_reduce"], "the rows of x1": rows, "x2.shape[1]": n,
                     "argument 'chunks'": count})
    pending = []
    for c in range(count):
        part = product(_bound(c, count, rows), _bound(c + 1, count, rows)).to(torch.float64)
        pending.append(_c10d().all_reduce(_send(part, g), "sum", g.name))
    out = torch.empty(rows, n, dtype=out_dtype, device=g.device)
    for c, p in enumerate(pending):
        out[_bound(c, count, rows):_bound(c + 1, count, rows)] = _wait(p, g)  # the one rounding to out_dtype
    return out


def all_gather_matmul(op: str, g: Group, x1: torch.Tensor, x2: torch.Tensor, x1_scale: Optional[torch.Tensor],
                      x2_scale: torch.Tensor, gather_output: bool, out_dtype: torch.dtype, chunks):
    """(x1_scale * x2_scale) * (AllGather(x1) @ x2) and AllGather(x1): the int8 rows (and their per-token scales)
    of every rank are gathered chunk by chunk and each gathered chunk is one quant_matmul, while later chunks are
    still in flight. x1 int8 [m, k], x1_scale fp32 [m] or None, x2_scale as quant_matmul's scale."""
    m, k = x1.shape
    W = g.size
    count = choose_chunks(op, chunks, m, k * W, W)
    validate(op, g, {"the op called": OP_IDS["all_gather"], "x1.shape[0]": m, "x1.shape[1]": k,
                     "argument 'chunks'": count, "whether x1_scale is given": int(x1_scale is not None)})
    pending = []
    for c in range(count):
        b, e = _bound(c, count, m), _bound(c + 1, count, m)
        scales = None if x1_scale is None else _c10d().all_gather_into_tensor(_send(x1_scale[b:e], g), W, g.name)
        pending.append((_c10d().all_gather_into_tensor(_send(x1[b:e], g), W, g.name), scales))
    out = torch.empty(W * m, x2.shape[1], dtype=out_dtype, device=g.device)
    gathered = x1.new_empty((W * m if gather_output else 0, k))
    for c, (rows_pending, scales_pending) in enumerate(pending):
        b, e = _bound(c, count, m), _bound(c + 1, count, m)
        part = _wait(rows_pending, g)  # [W * (e - b), k], rank-major
        scales = None if scales_pending is None else _wait(scales_pending, g)
        y = dequantised(part, x2, x2_scale, scales, None, OUTPUT_CODES[out_dtype])
        for r in range(W):
            src = slice(r * (e - b), (r + 1) * (e - b))
            out[r * m + b:r * m + e] = y[src]
            if gather_output:
                gathered[r * m + b:r * m + e] = part[src]
    return out, gathered


def matmul_reduce_scatter(op: str, g: Group, x1: torch.Tensor, x2: torch.Tensor, x1_scale: Optional[torch.Tensor],
                          x2_scale: torch.Tensor, out_dtype: torch.dtype, chunks) -> torch.Tensor:
    """ReduceScatter((x1_scale * x2_scale) * (x1 @ x2)): rank r gets rows [r m/W, (r+1) m/W) of the group sum.
    Chunk c takes rows [b, e) of every rank's block, is dequantised in one quant_matmul and reduce-scattered (in
    float64) while chunk c+1 is computed."""
    m, n = x1.shape[0], x2.shape[1]
    W = g.size
    local = m // W
    count = choose_chunks(op, chunks, local, n * 8 * W, W)
    validate(op, g, {"the op called": OP_IDS["reduce_scatter"], "x1.shape[0]": m, "x2.shape[1]": n,
                     "argument 'chunks'": count, "whether x1_scale is given": int(x1_scale is not None)})
    pending = []
    for c in range(count):
        b, e = _bound(c, count, local), _bound(c + 1, count, local)
        rows = torch.cat([torch.arange(r * local + b, r * local + e, device=x1.device) for r in range(W)])
        scales = None if x1_scale is None else x1_scale[rows]
        part = dequantised(x1[rows], x2, x2_scale, scales, None).to(torch.float64)
        pending.append(_c10d().reduce_scatter_tensor(_send(part, g), "sum", W, g.name))
    out = torch.empty(local, n, dtype=out_dtype, device=g.device)
    for c, p in enumerate(pending):
        out[_bound(c, count, local):_bound(c + 1, count, local)] = _wait(p, g)
    return out
