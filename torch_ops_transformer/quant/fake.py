"""Fake (meta) kernels of the activation-quantisation and SwiGLU ops: shape formulas plus the checks that need no
data."""
import torch


_BLOCK_QUANT_DTYPES = {1: torch.int8, 24: torch.float8_e4m3fn, 23: torch.float8_e5m2}


def dynamic_block_quant(a):
    op = "dynamic_block_quant"
    x = a.x
    torch._check(x.dim() in (2, 3), lambda: f"{op}: argument 'x' must be 2-D [M, N] or 3-D [B, M, N]")
    torch._check(a.dst_type in _BLOCK_QUANT_DTYPES,
                 lambda: f"{op}: argument 'dst_type' must be 1 (int8), 24 (float8_e4m3fn) or 23 (float8_e5m2)")
    torch._check(a.row_block_size >= 1 and a.col_block_size >= 1,
                 lambda: f"{op}: arguments 'row_block_size' and 'col_block_size' must be >= 1")
    blocks = ((x.shape[-2] + a.row_block_size - 1) // a.row_block_size,
              (x.shape[-1] + a.col_block_size - 1) // a.col_block_size)
    return (x.new_empty(x.shape, dtype=_BLOCK_QUANT_DTYPES[a.dst_type]),
            x.new_empty((*x.shape[:-2], *blocks), dtype=torch.float32))


def dynamic_quant(a):
    op = "dynamic_quant"
    x = a.x
    torch._check(x.dim() >= 2, lambda: f"{op}: argument 'x' must have at least 2 dimensions")
    torch._check(a.bits in (8, 4), lambda: f"{op}: argument 'bits' must be 8 or 4; got {a.bits}")
    rows = tuple(x.shape[:-1])
    if a.bits == 4:
        torch._check(x.shape[-1] % 8 == 0, lambda: f"{op}: x.size(-1) must be a multiple of 8 for int4")
        y = x.new_empty((*rows, x.shape[-1] // 8), dtype=torch.int32)
    else:
        y = x.new_empty(x.shape, dtype=torch.int8)
    scale = x.new_empty(rows, dtype=torch.float32)
    offset = x.new_empty(rows if a.asymmetric else (0,), dtype=torch.float32)
    return y, scale, offset


def _half_shape(op, x, dim):
    torch._check(-x.dim() <= dim < x.dim(), lambda: f"{op}: argument 'dim' must be in [{-x.dim()}, {x.dim() - 1}]")
    d = dim % x.dim()
    torch._check(x.shape[d] % 2 == 0, lambda: f"{op}: argument 'x' must have an even size along dim {dim}")
    shape = list(x.shape)
    shape[d] = shape[d] // 2
    return shape


def swiglu(a):
    return a.x.new_empty(_half_shape("swiglu", a.x, a.dim))


def swiglu_grad(a):
    _half_shape("swiglu_grad", a.x, a.dim)
    return a.x.new_empty(a.x.shape)


# ---- Quantised matmul ------------------------------------------------------------------------------------------
def trans_quant_param(a):
    op = "trans_quant_param"
    scale = a.scale
    torch._check(scale.dtype == torch.float32, lambda: f"{op}: argument 'scale' must be float32")
    torch._check(scale.dim() in (1, 2), lambda: f"{op}: argument 'scale' must be 1-D or 2-D")
    shape = tuple(scale.shape)
    if a.offset is not None and scale.dim() == 1:
        shape = (max(scale.shape[0], a.offset.numel()),)
    return scale.new_empty(shape, dtype=torch.int64)


_QUANTIZE_DTYPES = {0: torch.uint8, 13: torch.uint8, 1: torch.int8, 12: torch.int8, 3: torch.int32, 14: torch.int32,
                    16: torch.int32}


def quantize(a):
    op = "quantize"
    torch._check(a.dtype in _QUANTIZE_DTYPES, lambda: f"{op}: argument 'dtype' must be a quantised dtype code")
    x = a.input
    if a.dtype == 16:
        torch._check(x.shape[-1] % 8 == 0, lambda: f"{op}: quint4x2 needs a last size that is a multiple of 8")
        return x.new_empty((*x.shape[:-1], x.shape[-1] // 8), dtype=torch.int32)
    return x.new_empty(x.shape, dtype=_QUANTIZE_DTYPES[a.dtype])


_MATMUL_OUT = {1: torch.int8, 3: torch.int32, 5: torch.float16, 6: torch.float32, 15: torch.bfloat16}


def quant_matmul(a):
    op = "quant_matmul"
    x1, x2 = a.x1, a.x2
    torch._check(2 <= x1.dim() <= 6 and 2 <= x2.dim() <= 6, lambda: f"{op}: x1 and x2 must have 2 to 6 dimensions")
    torch._check(a.output_dtype in _MATMUL_OUT, lambda: f"{op}: unsupported output_dtype {a.output_dtype}")
    M, K = x1.shape[-2], x1.shape[-1]
    if a.group_sizes is not None and any(g != 0 for g in a.group_sizes):
        # Per-group A8W4 (int8 x1, x2 [K, N/8]) / A4W4 (int32 x1 [M, K/8], x2 [K, N/8] or [K/8, N]): 2-D.
        torch._check(x2.dtype == torch.int32 and x1.dtype in (torch.int8, torch.int32),
                     lambda: f"{op}: per-group quantisation needs an int32 x2 and an int8 or int32 x1")
        K = K if x1.dtype == torch.int8 else K * 8
        N = x2.shape[-1] * 8 if x2.shape[-2] == K else x2.shape[-1]
        return x1.new_empty((M, N), dtype=_MATMUL_OUT[a.output_dtype])
    torch._check(x1.dtype == x2.dtype and x1.dtype in (torch.int8, torch.int32),
                 lambda: f"{op}: arguments 'x1' and 'x2' must both be int8 or both int32")
    if x1.dtype == torch.int32:
        K = K * 8
        N = x2.shape[-1] * 8 if x2.shape[-2] == K else x2.shape[-1]
    else:
        N = x2.shape[-1]
        torch._check(x2.shape[-2] == K, lambda: f"{op}: x1 and x2 must agree on K")
    batch = torch.broadcast_shapes(tuple(x1.shape[:-2]), tuple(x2.shape[:-2]))
    return x1.new_empty((*batch, M, N), dtype=_MATMUL_OUT[a.output_dtype])


def weight_quant_batchmatmul(a):
    op = "weight_quant_batchmatmul"
    x, w = a.x, a.weight
    torch._check(2 <= w.dim() <= 6, lambda: f"{op}: argument 'weight' must be [.., K, N]")
    K = x.shape[-1]
    if w.dtype == torch.int32:
        N = w.shape[-1] * 8 if w.shape[-2] == K else w.shape[-1]
    else:
        torch._check(w.shape[-2] == K, lambda: f"{op}: x and weight must agree on K")
        N = w.shape[-1]
    dtype = torch.int8 if a.quant_scale is not None else x.dtype
    if w.dim() == 2:
        return x.new_empty((*x.shape[:-1], N), dtype=dtype)
    batch = torch.broadcast_shapes(tuple(x.shape[:-2]), tuple(w.shape[:-2]))
    return x.new_empty((*batch, x.shape[-2], N), dtype=dtype)


def convert_weight_to_int4pack(a):
    w = a.weight
    torch._check(w.dim() == 2 and w.shape[1] % 8 == 0,
                 lambda: "convert_weight_to_int4pack: weight must be 2-D with a last size that is a multiple of 8")
    return w.new_empty((w.shape[0], w.shape[1] // 8), dtype=torch.int32)


def clipped_swiglu(a):
    return a.x.new_empty(_half_shape("clipped_swiglu", a.x, a.dim))


def transpose_batchmatmul(a):
    x = a.input.permute(a.perm_x1)
    w = a.weight.permute(a.perm_x2)
    B, M, N = x.shape[0], x.shape[1], w.shape[2]
    if a.scale is not None:
        return x.new_empty((M, 1, B * N), dtype=torch.int8)
    if a.batch_split_factor > 1:
        s = a.batch_split_factor
        return x.new_empty((s, M, B * N // s))
    y = x.new_empty((B, M, N)).permute(a.perm_y)
    return y.new_empty(y.shape)


def dequant_swiglu_quant(a):
    op = "dequant_swiglu_quant"
    x = a.x
    torch._check(x.dtype in (torch.int32, torch.float16, torch.bfloat16),
                 lambda: f"{op}: argument 'x' must be int32, float16 or bfloat16; got {x.dtype}")
    torch._check(x.dim() >= 2, lambda: f"{op}: argument 'x' must have at least 2 dimensions")
    torch._check(a.quant_mode in (0, 1), lambda: f"{op}: argument 'quant_mode' must be 0 or 1; got {a.quant_mode}")
    torch._check(a.swiglu_mode in (0, 1, 2), lambda: f"{op}: argument 'swiglu_mode' must be 0, 1 or 2")
    shape = _half_shape(op, x, a.activate_dim)
    return x.new_empty(shape, dtype=torch.int8), x.new_empty(shape[:-1], dtype=torch.float32)
