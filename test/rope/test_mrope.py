"""npu_mrope: RoPE and multimodal RoPE (Qwen2-VL .. Qwen3-VL) from a cos/sin cache, on rope_with_sin_cos_cache.
Float64 reference written from the formulas of torch_npu's documentation (sections of the rotary half gathered from
the t/h/w position rows, consecutively or interleaved), under the project's tolerance rule."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.doc_examples import run_examples
from test.common.tiers import pairwise

OPS = torch.ops.npu_fa


def ref_mrope(positions, x, cache, head_size, section, rotary_mode, cache_mode, dtype=torch.float64):
    """The documented formula in `dtype`: cos/sin rows per position row, combined per column, then rotation."""
    rot = cache.shape[1]
    half = rot // 2
    t = positions.shape[-1]
    cos, sin = cache.to(dtype)[positions].chunk(2, dim=-1)  # [T, half] or [m, T, half]
    if positions.dim() == 2:
        if cache_mode == "default":
            cols = torch.cat([torch.full((n,), i) for i, n in enumerate(section)])
        else:
            j = torch.arange(half)
            cols = torch.where((j < 3 * section[1]) & (j % 3 != 0), j % 3, 0)
        pick = cols[None, None, :].expand(1, t, half)
        cos, sin = cos.gather(0, pick)[0], sin.gather(0, pick)[0]
    x = x.to(dtype).reshape(t, -1, head_size)
    cos, sin = cos[:, None], sin[:, None]
    xr, rest = x[..., :rot], x[..., rot:]
    if rotary_mode == "half":
        x1, x2 = xr[..., :half], xr[..., half:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((out, rest), dim=-1)


def _cache(max_pos, rot, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


SECTIONS = {128: {"qwen2vl": [16, 24, 24], "qwen3vl": [24, 20, 20], "four": [16, 16, 16, 16], "rope": None},
            64: {"qwen2vl": [8, 12, 12], "qwen3vl": [12, 10, 10], "four": [8, 8, 8, 8], "rope": None}}
AXES = {"section": ("qwen2vl", "qwen3vl", "four", "rope"), "rotary_mode": ("half", "interleave"),
        "cache_mode": ("default", "interleave"), "rot": (128, 64),
        "dtype": {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}}


@pytest.mark.asan
@pytest.mark.parametrize("section,rotary_mode,cache_mode,rot,dtype", pairwise(**AXES))
def test_npu_mrope_matches_reference(section, rotary_mode, cache_mode, rot, dtype):
    sec = SECTIONS[rot][section]
    if sec is not None and len(sec) == 4 and cache_mode == "interleave":
        cache_mode = "default"  # 4 sections: consecutive only (its error has its own test)
    T, hs, max_pos = 7, 128, 50
    g = torch.Generator().manual_seed(rot + len(section))
    positions = torch.randint(0, max_pos, (T,) if sec is None else (len(sec), T), generator=g)
    cache = _cache(max_pos, rot, torch.float64)
    q = torch.randn(T, 4 * hs, generator=g, dtype=torch.float64)
    k = torch.randn(T, 2 * hs, generator=g, dtype=torch.float64)
    qd, kd, cd = q.to(dtype), k.to(dtype), cache.to(dtype)
    qo, ko = tot.npu_mrope(positions, qd, kd, cd, hs, mrope_section=sec, rotary_mode=rotary_mode,
                           cache_mode=cache_mode)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.dtype == dtype
    for name, x, xd, out in (("query", q, qd, qo), ("key", k, kd, ko)):
        ref = ref_mrope(positions, xd, cd, hs, sec, rotary_mode, cache_mode)
        same = ref_mrope(positions, xd, cd, hs, sec, rotary_mode, cache_mode, dtype=dtype)
        check_tolerance(name, out.reshape(ref.shape), ref, same)
        if rot < hs:  # partial rotary: the rest of each head passes through bit-exactly
            assert torch.equal(out.reshape(T, -1, hs)[..., rot:], xd.reshape(T, -1, hs)[..., rot:])


def test_mrope_with_equal_rows_is_rope():
    """Three identical position rows give plain RoPE for every section split and cache mode."""
    T, hs = 5, 32
    pos = torch.randint(0, 16, (T,))
    cache, q, k = _cache(16, 32, torch.float32), torch.randn(T, 2 * hs), torch.randn(T, hs)
    plain = tot.npu_mrope(pos, q, k, cache, hs)
    for mode in ("default", "interleave"):
        ours = tot.npu_mrope(pos.repeat(3, 1), q, k, cache, hs, mrope_section=[4, 6, 6], cache_mode=mode)
        assert torch.equal(ours[0], plain[0]) and torch.equal(ours[1], plain[1])


def test_zero_section_is_rope_and_cache_mode_ignored():
    T, hs = 4, 32
    pos = torch.randint(0, 8, (T,))
    cache, q, k = _cache(8, 32, torch.float32), torch.randn(T, hs), torch.randn(T, hs)
    a = tot.npu_mrope(pos, q, k, cache, hs, mrope_section=[0, 0, 0], cache_mode="interleave")
    b = tot.rope_with_sin_cos_cache(pos, q, k, cache, hs, True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_mrope_compiles_fullgraph():
    T, hs = 6, 64
    positions = torch.randint(0, 20, (3, T))
    cache, q, k = _cache(20, 64, torch.float32), torch.randn(T, 2 * hs), torch.randn(T, hs)
    f = torch.compile(lambda p, q, k: tot.npu_mrope(p, q, k, cache, hs, mrope_section=[16, 8, 8],
                                                     cache_mode="interleave"), fullgraph=True)
    for a, b in zip(f(positions, q, k), tot.npu_mrope(positions, q, k, cache, hs, mrope_section=[16, 8, 8],
                                                      cache_mode="interleave")):
        torch.testing.assert_close(a, b)


# ---- bad inputs: one test per rule --------------------------------------------------------------------------------
def _args(t=4, hs=32, rot=32, rows=3):
    return torch.zeros(rows, t, dtype=torch.long), torch.randn(t, hs), torch.randn(t, hs), _cache(8, rot, torch.float32)


def test_bad_rotary_mode():
    p, q, k, c = _args()
    with pytest.raises(RuntimeError, match="rotary_mode only support half or interleave"):
        tot.npu_mrope(p[0], q, k, c, 32, rotary_mode="quarter")


def test_bad_cache_mode():
    p, q, k, c = _args()
    with pytest.raises(RuntimeError, match="cache_mode only support default or interleave"):
        tot.npu_mrope(p[0], q, k, c, 32, cache_mode="invalid_mode")
    with pytest.raises(RuntimeError, match="cache_mode must be 'default' or 'interleave'"):
        OPS.rope_with_sin_cos_cache(p[0], q, k, c, 32, True, None, "other")


def test_bad_section_sum():
    p, q, k, c = _args()
    with pytest.raises(RuntimeError, match=r"mrope_section .* must sum to rot_dim/2 = 16"):
        tot.npu_mrope(p, q, k, c, 32, mrope_section=[4, 4, 4])


def test_bad_section_count():
    p, q, k, c = _args(rows=2)
    with pytest.raises(RuntimeError, match="mrope_section must have 3 or 4 entries"):
        tot.npu_mrope(p, q, k, c, 32, mrope_section=[8, 8])


def test_bad_section_negative():
    p, q, k, c = _args()
    with pytest.raises(RuntimeError, match="mrope_section entries must be non-negative"):
        tot.npu_mrope(p, q, k, c, 32, mrope_section=[20, -2, -2])


def test_bad_positions_rows():
    p, q, k, c = _args(rows=4)
    with pytest.raises(RuntimeError, match=r"positions must be 2-D \[3, num_tokens\]"):
        tot.npu_mrope(p, q, k, c, 32, mrope_section=[8, 4, 4])


def test_bad_interleave_with_four_sections():
    p, q, k, c = _args(rows=4)
    with pytest.raises(RuntimeError, match="cache_mode='interleave' needs a 3-entry mrope_section"):
        tot.npu_mrope(p, q, k, c, 32, mrope_section=[4, 4, 4, 4], cache_mode="interleave")


def test_bad_tokens_mismatch():
    p, _, k, c = _args()
    with pytest.raises(RuntimeError, match="query of shape .* must start with the tokens' shape"):
        tot.npu_mrope(p, torch.randn(5, 32), k, c, 32, mrope_section=[8, 4, 4])


def test_bad_dtype_mismatch():
    p, q, k, c = _args()
    with pytest.raises(TypeError, match="argument 'query' .* must have the dtype of 'cos_sin_cache'"):
        tot.npu_mrope(p[0], q.half(), k, c, 32)


def test_bad_positions_out_of_range():
    p, q, k, c = _args()
    p[1, 2] = 8
    with pytest.raises(RuntimeError, match=r"positions must lie in \[0, 8\)"):
        tot.npu_mrope(p, q, k, c, 32, mrope_section=[8, 4, 4])


def test_doc_example_npu_mrope():
    run_examples("rope.md", "npu_mrope")
