"""Fake (meta) kernels of the rotary position embedding ops: contiguous outputs like the C++ kernels, plus the
shape checks that need no data (so a bad call fails at trace time, as it does in eager mode)."""
import torch

_MODES = {"half": 0, "interleave": 1, "quarter": 2, "interleave-half": 3, "interleave_half": 3}


def _check(op, x, cos, sin, mode):
    torch._check(0 <= mode <= 3, lambda: f"{op}: unknown rotary mode {mode}; expected 0 (half), 1 (interleave), "
                                         f"2 (quarter) or 3 (interleave-half)")
    d = x.shape[-1]
    torch._check(d % 2 == 0, lambda: f"{op}: the last (head) dimension must be even and positive; got D={d}")
    torch._check(mode != 2 or d % 4 == 0, lambda: f"{op}: quarter mode needs D divisible by 4; got D={d}")
    for name, t in (("cos", cos), ("sin", sin)):
        torch._check(1 <= t.dim() <= x.dim() and t.shape[-1] == d,
                     lambda: f"{op}: {name} of shape {tuple(t.shape)} must end in the head dimension D={d}")


def rotary_position_embedding(x, cos, sin, mode=0):
    _check("rotary_position_embedding", x, cos, sin, mode)
    return x.new_empty(x.shape)


def rotary_position_embedding_grad(grad, cos, sin, x, mode=0):
    _check("rotary_position_embedding_grad", x, cos, sin, mode)
    return x.new_empty(x.shape), cos.new_empty(cos.shape), sin.new_empty(sin.shape)


def apply_rotary_pos_emb(query, key, cos, sin, layout="BSND", rotary_mode="half"):
    op = "apply_rotary_pos_emb"
    torch._check(layout in ("BSND", "BSH", "BNSD", "SBND", "TND"),
                 lambda: f"{op}: unknown layout '{layout}'; expected BSND (or BSH), BNSD, SBND or TND")
    torch._check(rotary_mode in _MODES, lambda: f"{op}: unknown rotary_mode '{rotary_mode}'; expected 'half', "
                                                f"'interleave', 'quarter' or 'interleave-half'")
    return None


def rope_with_sin_cos_cache(positions, query, key, cos_sin_cache, head_size, is_neox_style=True):
    op = "rope_with_sin_cos_cache"
    rot = cos_sin_cache.shape[-1]
    torch._check(cos_sin_cache.dim() == 2, lambda: f"{op}: cos_sin_cache must be 2-D [max_position, rot_dim]")
    torch._check(rot % 2 == 0 and rot <= head_size,
                 lambda: f"{op}: rot_dim ({rot}) must be even, positive and at most head_size={head_size}")
    return query.new_empty(query.shape), key.new_empty(key.shape)
