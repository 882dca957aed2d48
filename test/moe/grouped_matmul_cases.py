"""opcheck cases of grouped_matmul and its backward (all group types, activation, bias, empty groups), of
grouped_matmul_quant (W8A8, weight-only int8/int4) and grouped_matmul_swiglu_quant."""
import torch


def _gmm(group_type, act=0, bias=True, dtype=torch.float32, list_type=0):
    def make():
        g = dict(requires_grad=True, dtype=dtype)
        if group_type == -1:
            x = [torch.randn(5, 8, **g), torch.randn(2, 3, 4, **g)]
            w = [torch.randn(8, 6, **g), torch.randn(4, 7, **g)]
            b = [torch.randn(6, **g), torch.randn(7, **g)] if bias else []
            return (x, w, b, None, -1, 0, act), {}
        if group_type == 0:
            counts = torch.tensor([3, 0, 5, 2])
            gl = counts if list_type == 1 else torch.cumsum(counts, 0)
            x, w = torch.randn(10, 8, **g), torch.randn(4, 8, 6, **g)
            return ([x], [w], [torch.randn(4, 6, **g)] if bias else [], gl, 0, list_type, act), {}
        gl = torch.tensor([3, 3, 7, 10])  # K split 3, 0, 4, 3
        return ([torch.randn(10, 5, **g).t()], [torch.randn(10, 6, **g)], [], gl, 2, 0, 0), {}
    return make


def _gmm_grad(group_type, act):
    def make():
        (x, w, b, gl, gt, glt, a), _ = _gmm(group_type, act)()
        out, pre = torch.ops.npu_fa.grouped_matmul(x, w, b, gl, gt, glt, a)
        detach = lambda ts: [t.detach() for t in ts]  # noqa: E731
        grads = [torch.randn_like(o) for o in out]
        return (grads, detach(x), detach(w), detach(b), gl, detach(pre), gt, glt, a), {}
    return make


def _i8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8)


def _gmm_quant(kind):
    def make():
        gl = torch.tensor([3, 0, 5, 2])
        if kind == "w8a8_per_token":  # bf16 output, int32 bias, silu, counts
            return ([_i8(10, 16)], [_i8(4, 16, 8)], [torch.randint(-9, 9, (4, 8), dtype=torch.int32)],
                    [torch.rand(4, 8)], [torch.rand(10)], [], [], gl, 0, 1, 5, 15), {}
        if kind == "w8a8_int32_pairs":  # raw accumulation, (expert, count) pairs ending short of M
            return ([_i8(10, 16)], [_i8(4, 16, 8)], [], [], [], [], [], torch.tensor([[2, 4], [0, 3]]), 0, 2, 0,
                    3), {}
        if kind == "w8a8_lists_int8_out":
            return ([_i8(3, 16), _i8(2, 2, 8)], [_i8(16, 6), _i8(8, 6)], [], [torch.rand(6), torch.rand(1)], [],
                    [], [], None, -1, 0, 0, -1), {}
        # weight-only int4 per group (G=2) with offset, bf16
        w = torch.randint(-2**31, 2**31 - 1, (4, 16, 1), dtype=torch.int32)
        return ([torch.randn(10, 16, dtype=torch.bfloat16)], [w], [torch.randn(4, 8)], [], [],
                [torch.rand(4, 2, 8, dtype=torch.bfloat16)], [torch.randn(4, 2, 8, dtype=torch.bfloat16)],
                torch.cumsum(gl, 0), 0, 0, 0, -1), {}
    return make


def _swiglu_quant():
    return (_i8(12, 16), _i8(3, 16, 8), torch.tensor([4, 4, 10]), torch.rand(3, 8), torch.rand(12), 0), {}


OPCHECK_CASES = {
    "grouped_matmul_quant": {k: _gmm_quant(k) for k in ("w8a8_per_token", "w8a8_int32_pairs",
                                                         "w8a8_lists_int8_out", "weight_only_int4_group")},
    "grouped_matmul_swiglu_quant": {"cumsum_short": _swiglu_quant},
    "grouped_matmul": {
        "lists_bias_relu": _gmm(-1, act=1),
        "split_m_bias_silu": _gmm(0, act=5),
        "split_m_counts_gelu_bf16": _gmm(0, act=2, dtype=torch.bfloat16, list_type=1),
        "split_m_no_bias": _gmm(0, bias=False),
        "split_k": _gmm(2),
    },
    "grouped_matmul_grad": {
        "lists_fast_gelu": _gmm_grad(-1, 4),
        "split_m_silu": _gmm_grad(0, 5),
        "split_k": _gmm_grad(2, 0),
    },
}


# MindSpeed's npu_grouped_matmul_add_ (y[g] += x_g^T @ w_g)
def _gmm_add(group_list_type, dtype):
    def make():
        x, w = torch.randn(7, 4).to(dtype), torch.randn(7, 3).to(dtype)
        gl = torch.tensor([3, 3, 7]) if group_list_type == 0 else torch.tensor([3, 0, 4])
        return (torch.randn(3 * 4, 3), x, w, gl, True, False, 2, group_list_type), {}
    return make


OPCHECK_CASES.update({"grouped_matmul_add": {"cumsum_fp32": _gmm_add(0, torch.float32),
                                             "counts_bf16": _gmm_add(1, torch.bfloat16)}})
