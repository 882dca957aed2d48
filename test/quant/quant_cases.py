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


def _swiglu(shape, dim, dtype=torch.float32, grad=False):
    def make():
        x = torch.randn(*shape, dtype=dtype, requires_grad=not grad)
        if not grad:
            return (x, dim), {}
        out_shape = list(shape)
        out_shape[dim] //= 2
        return (torch.randn(out_shape, dtype=dtype), x, dim), {}
    return make


OPCHECK_CASES = {
    "dynamic_quant": {"int8": _dq(), "int8_smooth_bf16": _dq(smooth="row", dtype=torch.bfloat16),
                      "int4_groups": _dq(bits=4, smooth="groups"), "asymmetric_fp16": _dq(True, dtype=torch.float16)},
    "swiglu": {"last_dim": _swiglu((3, 8), -1), "dim0_bf16": _swiglu((4, 3, 2), 0, torch.bfloat16)},
    "swiglu_grad": {"last_dim": _swiglu((3, 8), -1, grad=True), "middle_dim": _swiglu((2, 6, 3), 1, grad=True)},
}
