"""opcheck cases of grouped_matmul and its backward (all group types, activation, bias, empty groups)."""
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


OPCHECK_CASES = {
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
