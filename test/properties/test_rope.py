"""The rotary position embedding ops on random valid calls against the float64 references of test.rope.test_rope
(ref_rope: half / interleave / quarter / interleave-half; ref_cache_rope: the vLLM cos/sin cache), under the
tolerance rule: rotary_position_embedding forward and dx/dcos/dsin over random ranks, head dims and broadcast
shapes of cos and sin (each its own), strided x; apply_rotary_pos_emb in place over the four layouts with query and
key head counts of their own and 2-D or broadcast tables; rope_with_sin_cos_cache over 1-D and 2-D positions,
partial rotary dims, flat and 3-D query/key, both styles."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.properties.strategies import (DTYPES, broadcast_shape, dtype_names, examples, generator, randn,
                                        randint, seeds)
from test.rope.test_rope import ref_cache_rope, ref_rope

OPS = torch.ops.npu_fa
MODE_NAMES = ("half", "interleave", "quarter", "interleave-half")  # rotary_mode names of modes 0-3


def _head_dim(draw, mode: int, most: int = 24) -> int:
    return 4 * draw(st.integers(1, most // 4)) if mode == 2 else 2 * draw(st.integers(1, most // 2))


def _tables(gen, shape, dtype):
    ang = randn(gen, shape, torch.float64, std=2.0)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _strided_like(x: torch.Tensor) -> torch.Tensor:
    """The same values in reversed axis order: a non-contiguous view."""
    return x.permute(*reversed(range(x.dim()))).contiguous().permute(*reversed(range(x.dim())))


# ---- rotary_position_embedding (+ grad) -------------------------------------------------------------------------
@st.composite
def rotary_calls(draw):
    mode = draw(st.integers(0, 3))
    lead = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    shape = tuple(lead) + (_head_dim(draw, mode),)
    cos_shape = broadcast_shape(draw, shape)
    sin_shape = cos_shape if draw(st.booleans()) else broadcast_shape(draw, shape)
    return dict(mode=mode, shape=shape, cos_shape=cos_shape, sin_shape=sin_shape, dtype=draw(dtype_names),
                strided=draw(st.booleans()), seed=draw(seeds))


@settings(max_examples=examples(150))
@given(c=rotary_calls(), grads=st.booleans())
def test_rotary_position_embedding_matches_reference(c, grads):
    dt, gen, mode = DTYPES[c["dtype"]], generator(c["seed"]), c["mode"]
    x = randn(gen, c["shape"], dt)
    if c["strided"]:
        x = _strided_like(x)
    cos, sin = _tables(gen, c["cos_shape"], dt)[0], _tables(gen, c["sin_shape"], dt)[1]
    leaves = [t.detach().requires_grad_(grads) for t in (x, cos, sin)]
    out = OPS.rotary_position_embedding(*leaves, mode)
    assert out.dtype == dt and out.shape == x.shape and out.is_contiguous()
    refs = {}
    for name, cd in (("ref64", torch.float64), ("same", dt)):
        r_leaves = [t.detach().to(cd).requires_grad_(grads) for t in (x, cos, sin)]
        refs[name] = (ref_rope(*r_leaves, mode), r_leaves)
    check_tolerance(f"mode {mode} out", out, refs["ref64"][0], refs["same"][0])
    if grads:
        dy = randn(gen, c["shape"], dt)
        got = torch.autograd.grad(out, leaves, dy)
        want = {name: torch.autograd.grad(r, rl, dy.to(r.dtype)) for name, (r, rl) in refs.items()}
        for i, name in enumerate(("dx", "dcos", "dsin")):
            assert got[i].shape == leaves[i].shape and got[i].dtype == dt
            check_tolerance(f"mode {mode} {name}", got[i], want["ref64"][i], want["same"][i])


# ---- apply_rotary_pos_emb (in place) ----------------------------------------------------------------------------
SEQ_AXIS = {"BSND": 1, "BNSD": 2, "SBND": 0, "TND": 0}
HEAD_AXIS = {"BSND": 2, "BNSD": 1, "SBND": 2, "TND": 1}


def _layout_shape(layout, b, s, n, d):
    return {"BSND": (b, s, n, d), "BNSD": (b, n, s, d), "SBND": (s, b, n, d), "TND": (s, n, d)}[layout]


@st.composite
def apply_calls(draw):
    layout = draw(st.sampled_from(("BSND", "BNSD", "SBND", "TND")))
    mode = draw(st.integers(0, 3))
    b, s, nq, nk = (draw(st.integers(1, 4)) for _ in range(4))
    d = _head_dim(draw, mode)
    q_shape, k_shape = _layout_shape(layout, b, s, nq, d), _layout_shape(layout, b, s, nk, d)
    if draw(st.booleans()):
        table = (s, d)  # 2-D: placed on the layout's sequence axis
    else:  # broadcasts to query and key: one head, batch and sequence kept or 1
        table = list(q_shape)
        table[HEAD_AXIS[layout]] = 1
        for axis in range(len(table) - 1):
            if axis != SEQ_AXIS[layout] and draw(st.booleans()):
                table[axis] = 1
        table = tuple(table)
    return dict(layout=layout, alias=layout == "BSND" and draw(st.booleans()), mode=mode, q_shape=q_shape,
                k_shape=k_shape, table=table, dtype=draw(dtype_names), fp32_table=draw(st.booleans()),
                strided=draw(st.booleans()), seed=draw(seeds))


def _aligned(table: torch.Tensor, layout: str, rank: int) -> torch.Tensor:
    """A 2-D [S, D] table on the layout's sequence axis (what the op documents), other shapes as they are."""
    if table.dim() != 2:
        return table
    shape = [1] * rank
    shape[SEQ_AXIS[layout]], shape[-1] = table.shape
    return table.reshape(shape)


@settings(max_examples=examples(90))
@given(c=apply_calls())
def test_apply_rotary_pos_emb_in_place_matches_reference(c):
    dt, gen, layout = DTYPES[c["dtype"]], generator(c["seed"]), c["layout"]
    q, k = randn(gen, c["q_shape"], dt), randn(gen, c["k_shape"], dt)
    if c["strided"]:
        q = _strided_like(q)
    cos, sin = _tables(gen, c["table"], torch.float32 if c["fp32_table"] else dt)
    q0, k0 = q.clone(), k.clone()
    q_ptr, k_ptr = q.data_ptr(), k.data_ptr()
    ret = OPS.apply_rotary_pos_emb(q, k, cos, sin, "BSH" if c["alias"] else layout, MODE_NAMES[c["mode"]])
    assert ret is None and q.data_ptr() == q_ptr and k.data_ptr() == k_ptr
    c4, s4 = (_aligned(t, layout, q.dim()) for t in (cos, sin))
    for name, ours, x0 in (("query", q, q0), ("key", k, k0)):
        check_tolerance(f"{layout} {MODE_NAMES[c['mode']]} {name}", ours,
                        ref_rope(x0.double(), c4.double(), s4.double(), c["mode"]),
                        ref_rope(x0, c4.to(dt), s4.to(dt), c["mode"]))


# ---- rope_with_sin_cos_cache ------------------------------------------------------------------------------------
@st.composite
def cache_calls(draw):
    positions = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=2)))
    head_size = 2 * draw(st.integers(1, 12))
    rot = 2 * draw(st.integers(1, head_size // 2))
    return dict(positions=positions, head_size=head_size, rot=rot, max_pos=draw(st.integers(1, 40)),
                nq=draw(st.integers(1, 4)), nk=draw(st.integers(1, 3)), flat=draw(st.booleans()),
                neox=draw(st.booleans()), dtype=draw(dtype_names), fp32_cache=draw(st.booleans()),
                int32=draw(st.booleans()), seed=draw(seeds))


@settings(max_examples=examples(90))
@given(c=cache_calls())
def test_rope_with_sin_cos_cache_matches_reference(c):
    dt, gen, hs = DTYPES[c["dtype"]], generator(c["seed"]), c["head_size"]
    positions = randint(gen, 0, c["max_pos"], c["positions"])
    if c["int32"]:
        positions = positions.int()
    ang = randn(gen, (c["max_pos"], c["rot"] // 2), torch.float64, std=2.0)
    cache = torch.cat((ang.cos(), ang.sin()), -1).to(torch.float32 if c["fp32_cache"] else dt)
    xs = []
    for n in (c["nq"], c["nk"]):
        tail = (n * hs,) if c["flat"] else (n, hs)
        xs.append(randn(gen, c["positions"] + tail, dt))
    q0, k0 = (x.clone() for x in xs)
    qo, ko = tot.rope_with_sin_cos_cache(positions, xs[0], xs[1], cache, hs, c["neox"])
    assert torch.equal(xs[0], q0) and torch.equal(xs[1], k0), "the inputs must stay untouched"
    flat_pos = positions.reshape(-1).long()
    t = flat_pos.numel()
    for name, ours, x in (("query", qo, q0), ("key", ko, k0)):
        assert ours.shape == x.shape and ours.dtype == dt and ours.is_contiguous()
        check_tolerance(f"cache rope {name}", ours.reshape(t, -1, hs),
                        ref_cache_rope(flat_pos, x.reshape(t, -1), cache, hs, c["neox"]),
                        ref_cache_rope(flat_pos, x.reshape(t, -1), cache, hs, c["neox"], dtype=dt))
