"""opcheck cases of the rotary position embedding ops."""
import torch


def _rpe(mode, x_shape, c_shape, dtype=torch.float32, grad=True):
    def make():
        x = torch.randn(x_shape, dtype=dtype, requires_grad=grad)
        cos = torch.randn(c_shape, dtype=dtype, requires_grad=grad)
        sin = torch.randn(c_shape, dtype=dtype, requires_grad=grad)
        return (x, cos, sin, mode), {}
    return make


def _rpe_grad(mode, x_shape, c_shape):
    def make():
        x = torch.randn(x_shape)
        return (torch.randn(x_shape), torch.randn(c_shape), torch.randn(c_shape), x, mode), {}
    return make


def _apply(layout, mode, q_shape, k_shape, c_shape):
    def make():
        return (torch.randn(q_shape), torch.randn(k_shape), torch.randn(c_shape), torch.randn(c_shape),
                layout, mode), {}
    return make


def _cache(q_shape, k_shape, head_size, rot, neox):
    def make():
        positions = torch.randint(0, 32, (q_shape[0],))
        return (positions, torch.randn(q_shape), torch.randn(k_shape), torch.randn(32, rot), head_size, neox), {}
    return make


def _interleave(x_shape, c_shape, dtype=torch.float32, grad=True):
    def make():
        x = torch.randn(x_shape, dtype=dtype, requires_grad=grad)
        cos = torch.randn(c_shape, dtype=dtype, requires_grad=grad)
        sin = torch.randn(c_shape, dtype=dtype, requires_grad=grad)
        return (x, cos, sin), {}
    return make


def _interleave_grad(x_shape, c_shape):
    def make():
        return (torch.randn(x_shape), torch.randn(x_shape), torch.randn(c_shape), torch.randn(c_shape)), {}
    return make


OPCHECK_CASES = {
    "rotary_position_embedding": {
        "half_bsnd_1s1d": _rpe(0, (2, 5, 3, 8), (1, 5, 1, 8)),
        "interleave_bnsd_bf16": _rpe(1, (2, 3, 5, 8), (1, 1, 5, 8), torch.bfloat16),
        "quarter_tnd": _rpe(2, (7, 2, 8), (7, 1, 8)),
        "interleave_half_sd": _rpe(3, (2, 3, 5, 8), (5, 8)),
    },
    "rotary_position_embedding_grad": {
        "half": _rpe_grad(0, (2, 5, 3, 8), (1, 5, 1, 8)),
        "interleave_full": _rpe_grad(1, (2, 5, 3, 8), (2, 5, 3, 8)),
    },
    "apply_rotary_pos_emb": {
        "bsnd_gqa": _apply("BSND", "half", (2, 5, 4, 8), (2, 5, 2, 8), (2, 5, 1, 8)),
        "tnd_interleave": _apply("TND", "interleave", (6, 4, 8), (6, 2, 8), (6, 1, 8)),
    },
    "rope_with_sin_cos_cache": {
        "neox_flat": _cache((5, 4 * 16), (5, 2 * 16), 16, 16, True),
        "gptj_partial_3d": _cache((5, 4, 16), (5, 2, 16), 16, 8, False),
        "mrope_sections": lambda: ((torch.randint(0, 32, (3, 5)), torch.randn(5, 2 * 32), torch.randn(5, 32),
                                    torch.randn(32, 16), 32, True, [4, 2, 2], "default"), {}),
        "mrope_interleave_gptj": lambda: ((torch.randint(0, 32, (3, 5)), torch.randn(5, 2 * 32), torch.randn(5, 32),
                                           torch.randn(32, 32), 32, False, [6, 5, 5], "interleave"), {}),
    },
    "interleave_rope": {
        "bnsd_b1sd": _interleave((2, 4, 3, 16), (2, 1, 3, 16)),
        "decode_bf16": _interleave((3, 4, 1, 64), (3, 1, 1, 64), torch.bfloat16),
    },
    "interleave_rope_grad": {
        "broadcast": _interleave_grad((2, 4, 3, 16), (2, 1, 3, 16)),
        "full": _interleave_grad((2, 3, 8), (2, 3, 8)),
    },
}
