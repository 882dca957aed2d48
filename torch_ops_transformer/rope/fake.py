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


def rotary_position_embedding(a):
    _check("rotary_position_embedding", a.x, a.cos, a.sin, a.mode)
    return a.x.new_empty(a.x.shape)


def rotary_position_embedding_grad(a):
    _check("rotary_position_embedding_grad", a.x, a.cos, a.sin, a.mode)
    return a.x.new_empty(a.x.shape), a.cos.new_empty(a.cos.shape), a.sin.new_empty(a.sin.shape)


def apply_rotary_pos_emb(a):
    op = "apply_rotary_pos_emb"
    torch._check(a.layout in ("BSND", "BSH", "BNSD", "SBND", "TND"),
                 lambda: f"{op}: unknown layout '{a.layout}'; expected BSND (or BSH), BNSD, SBND or TND")
    torch._check(a.rotary_mode in _MODES, lambda: f"{op}: unknown rotary_mode '{a.rotary_mode}'; expected 'half', "
                                                f"'interleave', 'quarter' or 'interleave-half'")
    return None


def rope_with_sin_cos_cache(a):
    op = "rope_with_sin_cos_cache"
    rot = a.cos_sin_cache.shape[-1]
    torch._check(a.cos_sin_cache.dim() == 2, lambda: f"{op}: cos_sin_cache must be 2-D [max_position, rot_dim]")
    torch._check(rot % 2 == 0 and rot <= a.head_size,
                 lambda: f"{op}: rot_dim ({rot}) must be even, positive and at most head_size={a.head_size}")
    torch._check(a.cache_mode in ("default", "interleave"),
                 lambda: f"{op}: cache_mode must be 'default' or 'interleave'; got '{a.cache_mode}'")
    sec = list(a.mrope_section or ())
    if any(v != 0 for v in sec):
        torch._check(len(sec) in (3, 4) and min(sec) >= 0 and sum(sec) == rot // 2,
                     lambda: f"{op}: mrope_section {sec} must have 3 or 4 non-negative entries summing to rot_dim/2")
        torch._check(a.positions.dim() == 2 and a.positions.shape[0] == len(sec),
                     lambda: f"{op}: with mrope_section {sec}, positions must be 2-D [{len(sec)}, num_tokens]")
    return a.query.new_empty(a.query.shape), a.key.new_empty(a.key.shape)


def _check_interleave(op, x, cos, sin):
    torch._check(x.dim() >= 1, lambda: f"{op}: x must have at least one dimension")
    d = x.shape[-1]
    torch._check(d % 2 == 0 and d > 0,
                 lambda: f"{op}: argument 'x' must end in an even, positive head dimension D; got shape {tuple(x.shape)}")
    torch._check(tuple(cos.shape) == tuple(sin.shape),
                 lambda: f"{op}: arguments 'cos' {tuple(cos.shape)} and 'sin' {tuple(sin.shape)} must have the same shape")
    torch._check(1 <= cos.dim() <= x.dim() and cos.shape[-1] == d,
                 lambda: f"{op}: cos of shape {tuple(cos.shape)} must end in the head dimension D={d} and have at "
                         f"most x's rank")


def interleave_rope(a):
    _check_interleave("interleave_rope", a.x, a.cos, a.sin)
    return a.x.new_empty(a.x.shape)


def interleave_rope_grad(a):
    _check_interleave("interleave_rope_grad", a.x, a.cos, a.sin)
    return a.x.new_empty(a.x.shape), a.cos.new_empty(a.cos.shape), a.sin.new_empty(a.sin.shape)
