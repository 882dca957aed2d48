"""opcheck cases of moe_ffn (gated and plain, both plain layouts, packed, biases, an empty expert) and
moe_ffn_prepack."""
import torch


def _ffn(layout="nk", activation="swiglu", bias=False, dtype=torch.float32):
    def make():
        g = torch.Generator().manual_seed(0)
        T, H, F, E, k = 12, 16, 24, 4, 2
        n = 2 * F if activation == "swiglu" else F
        x = torch.randn(T, H, generator=g).to(dtype)
        w13, w2 = torch.randn(E, n, H, generator=g).to(dtype), torch.randn(E, H, F, generator=g).to(dtype)
        ids = torch.tensor([[0, 2], [2, 3]] * (T // 2), dtype=torch.int32)  # expert 1 gets no rows
        tw = torch.rand(T, k, generator=g)
        b13 = torch.randn(E, n, generator=g).to(dtype) if bias else None
        b2 = torch.randn(E, H, generator=g).to(dtype) if bias else None
        if layout == "kn":
            w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
        elif layout == "packed":
            w13 = torch.ops.npu_fa.moe_ffn_prepack(w13, "nk", activation == "swiglu")
            w2 = torch.ops.npu_fa.moe_ffn_prepack(w2, "nk", False)
        return (x, w13, w2, tw, ids, b13, b2, activation, layout), {}
    return make


def _prepack(layout, gated, dtype):
    def make():
        w = torch.randn(3, 40, 18).to(dtype)
        return (w, layout, gated), {}
    return make


OPCHECK_CASES = {
    "moe_ffn": {
        "swiglu_nk": _ffn(),
        "swiglu_kn_bf16": _ffn("kn", dtype=torch.bfloat16),
        "swiglu_packed_bias": _ffn("packed", bias=True),
        "gelu_tanh_bias": _ffn(activation="gelu_tanh", bias=True),
    },
    "moe_ffn_prepack": {
        "nk_gated": _prepack("nk", True, torch.float32),
        "kn_plain_bf16": _prepack("kn", False, torch.bfloat16),
    },
}
