"""opcheck cases of the activation-quantisation and SwiGLU ops (test/ops/test_opcheck.py)."""
import torch


def _dq(asymmetric=False, bits=8, smooth=None, groups=False, dtype=torch.float32):
    def make():
        g = torch.Generator().manual_seed(1)
        x = torch.randn(2, 3, 16, generator=g).to(dtype)
        smooth_scales = group_index = None
        if smooth == "row":
            smooth_scales = torch.rand(16, generator=g).to(dtype) + 0.5
        elif smooth == "groups":
            smooth_scales = torch.rand(3, 16, generator=g).to(dtype) + 0.5
            group_index = torch.tensor([2, 2, 6], dtype=torch.int32)
        return (x, smooth_scales, group_index, asymmetric, bits), {}
    return make


def _dbq(shape, dtype=torch.bfloat16, dst_type=1, rows=1, cols=128, min_scale=0.0):
    def make():
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(2)).to(dtype)
        return (x, min_scale, "rint", dst_type, rows, cols), {}
    return make


def _swiglu(shape, dim, dtype=torch.float32, grad=False):
    def make():
        x = torch.randn(*shape, dtype=dtype, requires_grad=not grad)
        if not grad:
            return (x, dim), {}
        out_shape = list(shape)
        out_shape[dim] //= 2
        return (torch.randn(out_shape, dtype=dtype), x, dim), {}
    return make


def _tqp(offset=False, round_mode=0):
    def make():
        g = torch.Generator().manual_seed(2)
        scale = torch.rand(8, generator=g) + 0.1
        return (scale, torch.randn(8, generator=g) * 50 if offset else None, round_mode), {}
    return make


def _quantize(div_mode, code, axis, dtype=torch.float32, zp=True):
    def make():
        g = torch.Generator().manual_seed(3)
        x = torch.randn(2, 4, 16, generator=g).to(dtype)
        if div_mode:
            c = x.shape[axis]
            scales = torch.rand(c, generator=g) * 0.05 + 0.01
            zero_points = torch.randint(-3, 4, (c,), generator=g, dtype=torch.int32) if zp else None
        else:
            c = x.shape[-1] if axis != -2 else x.shape[-2]
            scales = (torch.rand(c, generator=g) * 3 + 1).to(dtype)
            zero_points = torch.randn(c, generator=g).to(dtype) if zp else None
        return (x, scales, zero_points, code, axis, div_mode), {}
    return make


def _qmm(out_code, scale_kind="float", batch=(), pertoken=False, bias=None, int4=False):
    def make():
        g = torch.Generator().manual_seed(4)
        M, K, N = 5, 32, 16
        if int4:
            x1 = torch.randint(-2**31, 2**31 - 1, (*batch, M, K // 8), generator=g, dtype=torch.int32)
            x2 = torch.randint(-2**31, 2**31 - 1, (K, N // 8), generator=g, dtype=torch.int32)
        else:
            x1 = torch.randint(-128, 128, (*batch, M, K), generator=g, dtype=torch.int8)
            x2 = torch.randint(-128, 128, (*batch, K, N), generator=g, dtype=torch.int8)
        scale = torch.rand(N, generator=g) * 1e-3
        if scale_kind == "int64":
            scale = torch.ops.npu_fa.trans_quant_param(scale)
        pts = torch.rand(M, generator=g) if pertoken else None
        b = None
        if bias == "int32":
            b = torch.randint(-1000, 1000, (N,), generator=g, dtype=torch.int32)
        elif bias is not None:
            b = torch.randn(N, generator=g).to(bias)
        return (x1, x2, scale, None, pts, b, out_code), {}
    return make


def _qmm_group(a8w4=True, out_code=5, x2_transposed=False):
    """Per-group forms, group_sizes [0, 0, 16] over K = 64: A8W4 (int64 scale, y_offset) or A4W4 (zero points)."""
    def make():
        g = torch.Generator().manual_seed(9)
        M, K, N, G = 3, 64, 16, 16
        if a8w4:
            x1 = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
            scale = torch.ops.npu_fa.trans_quant_param(torch.rand(K // G * N, generator=g)).view(K // G, N)
            offset = torch.randn(N, generator=g)
        else:
            x1 = torch.randint(-2**31, 2**31 - 1, (M, K // 8), generator=g, dtype=torch.int32)
            scale = torch.rand(K // G, N, generator=g)
            offset = torch.randint(-3, 4, (K // G, N), generator=g).half()
        if x2_transposed:
            x2 = torch.randint(-2**31, 2**31 - 1, (N, K // 8), generator=g, dtype=torch.int32).t()
        else:
            x2 = torch.randint(-2**31, 2**31 - 1, (K, N // 8), generator=g, dtype=torch.int32)
        pts = torch.rand(M, 1, generator=g)
        return (x1, x2, scale, offset, pts, None, out_code, [0, 0, G]), {}
    return make


def _wqbmm(int4=False, group=0, offset=True, dtype=torch.bfloat16, bias=False):
    def make():
        g = torch.Generator().manual_seed(5)
        M, K, N = 3, 64, 24
        x = torch.randn(M, K, generator=g).to(dtype)
        if int4:
            w = torch.randint(-2**31, 2**31 - 1, (K, N // 8), generator=g, dtype=torch.int32)
        else:
            w = torch.randint(-128, 128, (K, N), generator=g, dtype=torch.int8)
        shape = (K // group, N) if group else (N,)
        s = (torch.rand(shape, generator=g) * 0.02).to(dtype)
        o = torch.randn(shape, generator=g).to(dtype) if offset else None
        b = torch.randn(N, generator=g).to(dtype) if bias else None
        return (x, w, s, o, None, None, b, group), {}
    return make


def _int4pack():
    def make():
        return (torch.randint(-8, 8, (16, 32), generator=torch.Generator().manual_seed(6), dtype=torch.int32), 0), {}
    return make


def _clipped(shape, dim, interleaved, dtype=torch.float32, groups=False):
    def make():
        g = torch.Generator().manual_seed(7)
        x = (torch.randn(shape, generator=g) * 5).to(dtype)
        gi = torch.tensor([2, 1], dtype=torch.int64) if groups else None
        return (x, gi, dim, 1.702, 7.0, 1.0, interleaved), {}
    return make


def _tbmm(scale=False, split=1, dtype=torch.float32):
    def make():
        g = torch.Generator().manual_seed(8)
        M, B, K, N = 3, 2, 16, 8
        x = torch.randn(M, B, K, generator=g).to(dtype)
        w = torch.randn(B, K, N, generator=g).to(dtype)
        s = torch.ops.npu_fa.trans_quant_param(torch.rand(B * N, generator=g)) if scale else None
        return (x, w, s, [1, 0, 2], [0, 1, 2], [1, 0, 2], split), {}
    return make


def _dsq(quant_mode=1, swiglu_mode=0, groups=False, float_x=False, dim=-1):
    def make():
        g = torch.Generator().manual_seed(8)
        if float_x:
            x = (torch.randn(2, 4, 16, generator=g) * 3).to(torch.bfloat16)
            ws = act = None
        else:
            x = torch.randint(-200, 200, (2, 4, 16), dtype=torch.int32, generator=g)
            ws = torch.rand(2 if groups else 1, 16, generator=g) * 0.02
            act = torch.rand(2, 4, generator=g) + 0.5
        gi = torch.tensor([3, 4], dtype=torch.int64) if groups else None
        n = 16 if dim != -1 else 8
        qs = torch.rand(n, generator=g) * (0.05 if quant_mode == 0 else 1.0) + 0.01
        qo = torch.randn(1, generator=g) if quant_mode == 0 else None
        return (x, ws, act, None, qs, qo, gi, True, quant_mode, dim, swiglu_mode, 7.0, 1.702, 1.0), {}
    return make


OPCHECK_CASES = {
    "dequant_swiglu_quant": {"dynamic": _dsq(), "static_clamped_halves": _dsq(0, 2),
                             "groups_interleaved": _dsq(1, 1, groups=True), "bf16_static": _dsq(0, float_x=True),
                             "dim1_static": _dsq(0, dim=1)},
    "convert_weight_to_int4pack": {"k_n": _int4pack()},
    "clipped_swiglu": {"interleaved": _clipped((4, 8), -1, True), "halves_dim1_bf16": _clipped((4, 2, 3), 1, False,
                                                                                               torch.bfloat16),
                       "groups": _clipped((2, 3, 8), -1, True, groups=True)},
    "transpose_batchmatmul": {"fp32": _tbmm(), "int8_scale": _tbmm(True), "split_bf16": _tbmm(split=2,
                                                                                          dtype=torch.bfloat16)},

    "trans_quant_param": {"scale": _tqp(), "offset_round": _tqp(True, 1)},
    "quantize": {"per_channel_qint8": _quantize(True, 12, 1), "per_channel_int32_no_zp": _quantize(True, 14, 2,
                                                                                                   zp=False),
                 "mul_int8_fp16": _quantize(False, 12, -1, torch.float16),
                 "mul_int4_axis_m2_bf16": _quantize(False, 16, -2, torch.bfloat16)},
    "quant_matmul": {"int8_out": _qmm(1), "fp16_int64_scale": _qmm(5, "int64"),
                     "bf16_pertoken_batch": _qmm(15, batch=(2,), pertoken=True, bias=torch.bfloat16),
                     "int32_bias": _qmm(3, bias="int32"), "int4_fp16": _qmm(5, "int64", int4=True),
                     "a8w4_group_fp16": _qmm_group(), "a4w4_group_bf16_x2_transposed": _qmm_group(False, 15, True)},
    "weight_quant_batchmatmul": {"w8_channel_bf16": _wqbmm(), "w4_group_fp16": _wqbmm(True, 32, dtype=torch.float16),
                                 "w8_bias_no_offset": _wqbmm(offset=False, bias=True)},

    "dynamic_quant": {"int8": _dq(), "int8_smooth_bf16": _dq(smooth="row", dtype=torch.bfloat16),
                      "int4_groups": _dq(bits=4, smooth="groups"), "asymmetric_fp16": _dq(True, dtype=torch.float16)},
    "dynamic_block_quant": {"int8_rows": _dbq((3, 200)), "e4m3_3d_blocks": _dbq((2, 5, 40), torch.float16, 24, 2, 16),
                            "e5m2_min_scale_fp32": _dbq((4, 8), torch.float32, 23, 3, 5, min_scale=0.5)},
    "swiglu": {"last_dim": _swiglu((3, 8), -1), "dim0_bf16": _swiglu((4, 3, 2), 0, torch.bfloat16)},
    "swiglu_grad": {"last_dim": _swiglu((3, 8), -1, grad=True), "middle_dim": _swiglu((2, 6, 3), 1, grad=True)},
}
