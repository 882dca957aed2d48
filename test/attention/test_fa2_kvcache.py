"""flash_attn_with_kvcache against FlashAttention-2's semantics written out in plain PyTorch (fa2_reference): the
attention output and lse against float64 (tolerance rule), and the in-place cache update compared entry by entry
with what FlashAttention-2 writes. Grid: dtypes x cache kinds (contiguous, cache_batch_idx, paged with blocks of
16 / 32 / 256) x scenarios (decode, chunked prefill, GQA, causal, window, rotary interleaved or not and partial,
left padding, cache_seqlens as an int, rows without keys)."""
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import pytest
import torch

import torch_ops_transformer as tot
from test.attention.fa2_reference import attend, rotary
from test.common.reference import DTYPES, check_tolerance
from test.common.tiers import pairwise
from torch_ops_transformer.attention import fa2
from torch_ops_transformer._internal.args import ArgumentError

CAP = 40  # logical cache length per sequence (contiguous); paged caches round it up to whole blocks


@dataclass(frozen=True)
class Scenario:
    sq: int = 1
    new: int = 1
    heads: Tuple[int, int] = (4, 2)
    d: int = 16
    causal: bool = False
    window: Tuple[int, int] = (-1, -1)
    rotary: Optional[str] = None      # None, "interleaved", "half"
    rot_dim: int = 16
    leftpad: bool = False
    seqlens: object = None            # None = random per sequence; an int = passed as an int
    lse: bool = True
    softcap: float = 0.0
    alibi: bool = False
    batch: int = 3


SCENARIOS = {
    "decode_rope_gqa": Scenario(causal=True, rotary="interleaved"),
    "decode_no_new": Scenario(new=0, heads=(4, 1)),
    "prefill_chunk_rope_half_partial": Scenario(sq=5, new=5, causal=True, rotary="half", rot_dim=8),
    "sq_ne_new_noncausal_rope": Scenario(sq=3, new=2, heads=(2, 2), rotary="interleaved", rot_dim=8),
    "window_local_rope": Scenario(sq=4, new=4, window=(3, 0), rotary="half"),
    "window_both_sides": Scenario(sq=3, new=0, window=(2, 1), lse=True),
    "window_past_cache_rope": Scenario(sq=3, new=3, window=(1000, 1000), rotary="half"),
    "leftpad_causal_rope": Scenario(sq=2, new=2, causal=True, rotary="interleaved", leftpad=True),
    "seqlens_int": Scenario(seqlens=7, lse=False),
    "empty_rows": Scenario(sq=3, new=0, causal=True, seqlens=(0, 2, 5)),
    "softcap": Scenario(sq=2, new=1, causal=True, softcap=3.0),
    "alibi": Scenario(sq=3, new=2, causal=True, alibi=True),
}
KINDS = ("contiguous", "batch_idx", "paged16", "paged32", "paged256")


def _setup(sc: Scenario, kind: str, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n, n2 = sc.heads
    b, d = sc.batch, sc.d
    paged = kind.startswith("paged")
    args = {}
    if paged:
        bs = int(kind[5:])
        max_blocks = math.ceil(CAP / bs)
        num_blocks = b * max_blocks + 3
        k_cache = torch.randn(num_blocks, bs, n2, d, generator=gen).to(dtype)
        v_cache = torch.randn(num_blocks, bs, n2, d, generator=gen).to(dtype)
        args["block_table"] = torch.randperm(num_blocks, generator=gen)[:b * max_blocks].view(b, max_blocks).to(
            torch.int32)
        capacity = max_blocks * bs
    else:
        rows = b + 2 if kind == "batch_idx" else b
        k_cache = torch.randn(rows, CAP, n2, d, generator=gen).to(dtype)
        v_cache = torch.randn(rows, CAP, n2, d, generator=gen).to(dtype)
        if kind == "batch_idx":
            args["cache_batch_idx"] = torch.randperm(rows, generator=gen)[:b].to(torch.int32)
        capacity = CAP
    top = min(capacity, CAP) - max(sc.new, sc.sq if sc.rotary and (sc.causal or sc.window != (-1, -1)) else 0)
    if sc.seqlens is None:
        seqlens = torch.randint(0 if sc.new else 1, top + 1, (b,), generator=gen, dtype=torch.int32)
        args["cache_seqlens"] = seqlens
        seqlist = seqlens.tolist()
    elif isinstance(sc.seqlens, int):
        args["cache_seqlens"] = sc.seqlens
        seqlist = [sc.seqlens] * b
    else:
        args["cache_seqlens"] = torch.tensor(sc.seqlens, dtype=torch.int32)
        seqlist = list(sc.seqlens)
    if sc.leftpad:
        args["cache_leftpad"] = torch.tensor([int(torch.randint(0, s, (1,), generator=gen)) if s > 0 else 0
                                              for s in seqlist], dtype=torch.int32)
    q = torch.randn(b, sc.sq, n, d, generator=gen).to(dtype)
    if sc.new:
        args["k"] = torch.randn(b, sc.new, n2, d, generator=gen).to(dtype)
        args["v"] = torch.randn(b, sc.new, n2, d, generator=gen).to(dtype)
    if sc.rotary:
        angle = torch.rand(capacity, sc.rot_dim // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
        args["rotary_cos"], args["rotary_sin"] = angle.cos().to(dtype), angle.sin().to(dtype)
        args["rotary_interleaved"] = sc.rotary == "interleaved"
    if sc.alibi:
        args["alibi_slopes"] = torch.rand(b, n, generator=gen) * 0.3
    args.update(causal=sc.causal, window_size=sc.window, return_softmax_lse=sc.lse)
    if sc.softcap:
        args["softcap"] = sc.softcap
    return q, k_cache, v_cache, args, seqlist


def _logical(cache, b, args):
    """Sequence b's logical cache [capacity, N2, D] (a copy)."""
    if "block_table" in args:
        return cache[args["block_table"][b].long()].flatten(0, 1).clone()
    row = int(args["cache_batch_idx"][b]) if "cache_batch_idx" in args else b
    return cache[row].clone()


def _reference(q, k_cache, v_cache, args, seqlist, sc: Scenario, dtype):
    """FlashAttention-2's result in `dtype` arithmetic: (out [B, Sq, N, D], lse [B, N, Sq], rotated new keys)."""
    b, sq = q.shape[:2]
    q, k_cache, v_cache = q.to(dtype), k_cache.to(dtype), v_cache.to(dtype)
    k_new = args["k"].to(dtype) if sc.new else None
    if sc.rotary:
        cos, sin, inter = args["rotary_cos"].to(dtype), args["rotary_sin"].to(dtype), args["rotary_interleaved"]
        # FlashAttention-2: a window side reaching past the cache length is unbounded, and is not "local"
        capacity = args["block_table"].shape[1] * k_cache.shape[1] if "block_table" in args else k_cache.shape[1]
        local = sc.causal or any(0 <= w < capacity for w in sc.window)
        q = torch.stack([rotary(q[i], cos, sin, torch.tensor([s + (j if local else 0) for j in range(sq)]), inter)
                         for i, s in enumerate(seqlist)])
        k_new = torch.stack([rotary(k_new[i], cos, sin, torch.arange(s, s + sc.new), inter)
                             for i, s in enumerate(seqlist)])
    leftpad = args["cache_leftpad"].tolist() if "cache_leftpad" in args else [0] * b
    scale = args.get("softmax_scale") or sc.d ** -0.5
    outs, lses = [], []
    for i, s in enumerate(seqlist):
        kl, vl = _logical(k_cache, i, args), _logical(v_cache, i, args)
        if sc.new:
            kl[s:s + sc.new] = k_new[i]
            vl[s:s + sc.new] = args["v"][i].to(dtype)
        end = s + sc.new
        slopes = args["alibi_slopes"][i] if sc.alibi else None
        o, lse = attend(q[i], kl[leftpad[i]:end], vl[leftpad[i]:end], scale, sc.causal, sc.window, sc.softcap, slopes)
        outs.append(o)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses), k_new


def _expected_caches(k_cache, v_cache, args, seqlist, k_rot, sc: Scenario):
    """The caches after FlashAttention-2's in-place append: new token i of sequence b at logical position
    cache_seqlens[b] + i of its row (cache_batch_idx) or of its blocks (block_table); nothing else changes."""
    ke, ve = k_cache.clone(), v_cache.clone()
    for b, s in enumerate(seqlist):
        for i in range(sc.new):
            pos = s + i
            if "block_table" in args:
                bs = k_cache.shape[1]
                where = (int(args["block_table"][b, pos // bs]), pos % bs)
            else:
                where = (int(args["cache_batch_idx"][b]) if "cache_batch_idx" in args else b, pos)
            ke[where] = k_rot[b, i].to(k_cache.dtype)
            ve[where] = args["v"][b, i]
    return ke, ve


@pytest.mark.parametrize("name,kind,dtype", pairwise(name=list(SCENARIOS), kind=KINDS, dtype=list(DTYPES)))
def test_kvcache(name, kind, dtype):
    sc = SCENARIOS[name]
    dt = DTYPES[dtype]
    q, k_cache, v_cache, args, seqlist = _setup(sc, kind, dt)
    k0, v0 = k_cache.clone(), v_cache.clone()
    ref, ref_lse, k_rot64 = _reference(q, k0, v0, args, seqlist, sc, torch.float64)
    same, same_lse, _ = _reference(q, k0, v0, args, seqlist, sc, dt)
    k_ptr = k_cache.data_ptr()
    res = tot.flash_attn_with_kvcache(q, k_cache, v_cache, **args)
    out, lse = res if sc.lse else (res, None)
    assert out.shape == q.shape and out.dtype == dt
    check_tolerance(f"{name}/{kind} out", out, ref, same)
    if sc.lse:
        assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
        assert torch.equal(torch.isposinf(lse), torch.isposinf(ref_lse)), "rows without keys must give lse +inf"
        check_tolerance(f"{name}/{kind} lse", lse, ref_lse, same_lse)
    # the cache is updated in place, exactly where FlashAttention-2 writes
    assert k_cache.data_ptr() == k_ptr
    ke, ve = _expected_caches(k0, v0, args, seqlist, k_rot64 if sc.new else None, sc)
    assert torch.equal(v_cache, ve)
    written = (ke != k0).any(-1).any(-1) | (k_cache != k0).any(-1).any(-1)
    assert torch.equal(k_cache[~written], k0[~written]), "keys outside the appended positions changed"
    if sc.rotary:  # rotated in the kernel's arithmetic: within rounding of the float64 rotation
        torch.testing.assert_close(k_cache, ke, atol=1e-5, rtol={torch.float32: 1e-5}.get(dt, 1e-2))
    else:
        assert torch.equal(k_cache, ke)


def test_plain_calls_read_the_cache_in_place(monkeypatch):
    """No softcap / ALiBi / window / left padding: the inference op runs on the cache itself (no gathering)."""
    def forbidden(*a, **k):
        raise AssertionError("the gathered path was taken")

    monkeypatch.setattr(fa2, "_gathered", forbidden)
    for kind in ("contiguous", "paged16", "paged256"):
        for sc in (SCENARIOS["decode_rope_gqa"], SCENARIOS["prefill_chunk_rope_half_partial"]):
            q, k_cache, v_cache, args, _ = _setup(sc, kind, torch.float32)
            tot.flash_attn_with_kvcache(q, k_cache, v_cache, **args)


def test_num_splits_and_softmax_scale():
    sc = Scenario(sq=2, new=1, causal=True)
    q, k_cache, v_cache, args, seqlist = _setup(sc, "contiguous", torch.float32)
    base_k, base_v = k_cache.clone(), v_cache.clone()
    outs = []
    for splits in (0, 1, 4):
        kc, vc = base_k.clone(), base_v.clone()
        outs.append(tot.flash_attn_with_kvcache(q, kc, vc, num_splits=splits, **args)[0])
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    kc, vc = base_k.clone(), base_v.clone()
    args["softmax_scale"] = 0.05
    out, _ = tot.flash_attn_with_kvcache(q, kc, vc, **args)
    ref, _, _ = _reference(q, base_k, base_v, args, seqlist, sc, torch.float64)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_cache_seqlens_none_uses_whole_cache():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, 2, 8, generator=gen)
    kc, vc = torch.randn(2, 6, 2, 8, generator=gen), torch.randn(2, 6, 2, 8, generator=gen)
    out = tot.flash_attn_with_kvcache(q, kc, vc)
    ref = torch.stack([attend(q[b].double(), kc[b].double(), vc[b].double(), 8 ** -0.5)[0] for b in range(2)])
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_matches_flash_attn_func_on_full_cache():
    """With cache_seqlens = 0 and k/v of the whole length, flash_attn_with_kvcache is flash_attn_func on k/v."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 4, 16, generator=gen) for _ in range(3))
    k, v = k[:, :, :2], v[:, :, :2]
    kc, vc = torch.zeros(2, 5, 2, 16), torch.zeros(2, 5, 2, 16)
    out = tot.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=0, causal=True)
    torch.testing.assert_close(out, tot.flash_attn_func(q, k, v, causal=True), atol=1e-6, rtol=1e-6)
    assert torch.equal(kc, k) and torch.equal(vc, v)


# ---- bad inputs: one test per rule; the error names the argument, what it must be and what it got ----

def _base(**over):
    gen = torch.Generator().manual_seed(0)
    kw = dict(q=torch.randn(2, 1, 4, 8, generator=gen), k_cache=torch.randn(2, 10, 2, 8, generator=gen),
              v_cache=torch.randn(2, 10, 2, 8, generator=gen), k=torch.randn(2, 1, 2, 8, generator=gen),
              v=torch.randn(2, 1, 2, 8, generator=gen), cache_seqlens=torch.tensor([3, 4], dtype=torch.int32))
    kw.update(over)
    return kw


def _paged(**over):
    gen = torch.Generator().manual_seed(0)
    kw = _base(k_cache=torch.randn(6, 16, 2, 8, generator=gen), v_cache=torch.randn(6, 16, 2, 8, generator=gen),
               block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    kw.update(over)
    return kw


BAD = {
    "q_not_4d": (_base(q=torch.randn(2, 4, 8)), ValueError, r"argument 'q' must have shape .* got \[2, 4, 8\]"),
    "k_cache_headdim": (_base(k_cache=torch.randn(2, 10, 2, 4)), ValueError,
                        r"argument 'k_cache' must have shape .*headdim.* = \[\*, \*, \*, 8\]; got \[2, 10, 2, 4\]"),
    "v_cache_shape": (_base(v_cache=torch.randn(2, 9, 2, 8)), ValueError,
                      r"argument 'v_cache' must have shape .* got \[2, 9, 2, 8\]"),
    "k_cache_dtype": (_base(k_cache=torch.randn(2, 10, 2, 8, dtype=torch.float16)), TypeError,
                      r"argument 'k_cache' must have the dtype of 'q' \(torch.float32\); got torch.float16"),
    "heads_not_multiple": (_base(q=torch.randn(2, 1, 3, 8)), ValueError,
                           r"heads of 'q' \(3\) must be a multiple of that of 'k_cache' \(2\)"),
    "cache_seqlens_too_large": (_base(cache_seqlens=torch.tensor([3, 10], dtype=torch.int32)), ValueError,
                                r"argument 'cache_seqlens' must be in \[0, 9\] .* got 10 for sequence 1"),
    "cache_seqlens_negative": (_base(cache_seqlens=-1), ValueError,
                               r"argument 'cache_seqlens' must be in \[0, 9\] .* got -1"),
    "cache_seqlens_dtype": (_base(cache_seqlens=torch.tensor([3.0, 4.0])), TypeError,
                            r"argument 'cache_seqlens' must be an int32 tensor .* got torch.float32"),
    "cache_seqlens_shape": (_base(cache_seqlens=torch.tensor([3, 4, 5], dtype=torch.int32)), ValueError,
                            r"argument 'cache_seqlens' must have shape \[batch\] = \[2\]; got \[3\]"),
    "cache_leftpad_past_seqlens": (_base(cache_leftpad=torch.tensor([0, 5], dtype=torch.int32)), ValueError,
                                   r"argument 'cache_leftpad' must be in \[0, cache_seqlens\[b\]\] = \[0, 4\]; got 5"),
    "cache_batch_idx_range": (_base(cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32)), ValueError,
                              r"argument 'cache_batch_idx' entries must be in \[0, 2\) .* got 2"),
    "cache_batch_idx_paged": (_paged(cache_batch_idx=torch.tensor([0, 1], dtype=torch.int32)), ValueError,
                              r"argument 'cache_batch_idx' must be None with a paged cache"),
    "block_table_dtype": (_paged(block_table=torch.tensor([[0.0, 1.0], [2.0, 3.0]])), TypeError,
                          r"argument 'block_table' must be an int32 tensor .* got torch.float32"),
    "block_table_batch": (_paged(block_table=torch.tensor([[0, 1]], dtype=torch.int32)), ValueError,
                          r"argument 'block_table' must have shape \[batch, max_blocks_per_seq\] with batch = 2; "
                          r"got \[1, 2\]"),
    # past the paged cache: FlashAttention-2 raises a RuntimeError naming block_table (ArgumentError is both)
    "paged_seqlens_past_blocks": (_paged(cache_seqlens=torch.tensor([3, 32], dtype=torch.int32)), ArgumentError,
                                  r"argument 'block_table' must have enough columns .* its 2 blocks per sequence of "
                                  r"page_block_size 16 hold 32 tokens; got cache_seqlens 32 \(\+ 1 new = 33\) for "
                                  r"sequence 1"),
    "block_table_entry_range": (_paged(block_table=torch.tensor([[0, 1], [2, 6]], dtype=torch.int32),
                                       cache_seqlens=torch.tensor([3, 20], dtype=torch.int32)), ValueError,
                                r"argument 'block_table' entries of the blocks in use must be in \[0, 6\) .* got 6 for "
                                r"sequence 1"),
    "softcap_negative": (_base(softcap=-1.0), ValueError,
                         r"argument 'softcap' must be a finite number >= 0 .* got -1.0"),
    "alibi_dtype": (_base(alibi_slopes=torch.ones(4, dtype=torch.float64)), TypeError,
                    r"argument 'alibi_slopes' must be a float32 tensor .* got torch.float64"),
    "alibi_shape": (_base(alibi_slopes=torch.ones(3)), ValueError,
                    r"argument 'alibi_slopes' must have shape \[nheads\] = \[4\] or \[batch, nheads\] = \[2, 4\]; "
                    r"got \[3\]"),
    "k_without_cache_seqlens": (_base(cache_seqlens=None), ValueError,
                                r"argument 'cache_seqlens' must be given with new keys/values 'k' and 'v' .* got None"),
    "k_without_v": (_base(v=None), ValueError, r"arguments 'k' and 'v' must be given together"),
    "k_shape": (_base(k=torch.randn(2, 1, 4, 8)), ValueError,
                r"argument 'k' must have shape .* = \[2, \*, 2, 8\]; got \[2, 1, 4, 8\]"),
    "k_dtype": (_base(k=torch.randn(2, 1, 2, 8, dtype=torch.float64)), TypeError,
                r"argument 'k' must have the dtype of 'q' \(torch.float32\); got torch.float64"),
    "rotary_without_k": (_base(k=None, v=None, rotary_cos=torch.ones(16, 4), rotary_sin=torch.zeros(16, 4)),
                         ValueError, r"arguments 'rotary_cos'/'rotary_sin' need the new keys 'k' and 'v'"),
    "rotary_cos_short": (_base(rotary_cos=torch.ones(4, 4), rotary_sin=torch.zeros(4, 4)), ValueError,
                         r"argument 'rotary_cos' must have at least 5 rows .* got 4"),
    "rotary_dim_too_large": (_base(rotary_cos=torch.ones(16, 8), rotary_sin=torch.zeros(16, 8)), ValueError,
                             r"argument 'rotary_cos' must have .* rotary_dim <= headdim = 8; got rotary_dim 16"),
    "rotary_sin_shape": (_base(rotary_cos=torch.ones(16, 4), rotary_sin=torch.zeros(16, 2)), ValueError,
                         r"argument 'rotary_sin' must have shape .* = \[16, 4\]; got \[16, 2\]"),
    "window_size": (_base(window_size=(-2, 0)), ValueError,
                    r"argument 'window_size' must be a pair \(left, right\) of ints >= -1 .* got \(-2, 0\)"),
    "window_size_3_entries": (_base(window_size=torch.tensor([4, 0, 1])), ValueError,
                              r"argument 'window_size' must be a pair .* 2-element integer tensor; got tensor\(\[4, 0, "
                              r"1\]\) of shape \[3\]"),
    "window_size_float_tensor": (_base(window_size=torch.tensor([4.0, 0.0])), TypeError,
                                 r"argument 'window_size' must be a pair .* of dtype torch.float32"),
    "window_size_floats": (_base(window_size=(4.5, 0)), TypeError,
                           r"argument 'window_size' must be a pair \(left, right\) of ints .* got \(4.5, 0\)"),
    "window_size_not_a_pair": (_base(window_size=4), ValueError, r"argument 'window_size' must be a pair .* got 4$"),
    "num_splits": (_base(num_splits=-1), ValueError, r"argument 'num_splits' must be an int >= 0 .* got -1"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input(name):
    kwargs, exc, pattern = BAD[name]
    kc = kwargs["k_cache"].clone()
    with pytest.raises(exc, match=pattern):
        tot.flash_attn_with_kvcache(**kwargs)
    assert torch.equal(kwargs["k_cache"], kc), "a rejected call must not touch the cache"


@pytest.mark.parametrize("kind", ["contiguous", "batch_idx"])
@pytest.mark.parametrize("name", ["decode_rope_gqa", "prefill_chunk_rope_half_partial", "leftpad_causal_rope",
                                  "window_local_rope"])
def test_strided_cache(name, kind):
    """A cache that is a view with only its last dimension contiguous (FlashAttention-2's requirement): the same
    result and the same in-place writes as on a contiguous copy."""
    sc = SCENARIOS[name]
    q, k_cache, v_cache, args, _ = _setup(sc, kind, torch.float32)
    big_k = torch.zeros(k_cache.shape[0], CAP + 5, *k_cache.shape[2:])
    big_v = torch.zeros_like(big_k)
    big_k[:, :CAP], big_v[:, :CAP] = k_cache, v_cache
    strided_k, strided_v = big_k[:, :CAP], big_v[:, :CAP]
    want = tot.flash_attn_with_kvcache(q, k_cache, v_cache, **args)
    got = tot.flash_attn_with_kvcache(q, strided_k, strided_v, **args)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert torch.equal(strided_k, k_cache) and torch.equal(strided_v, v_cache)
    assert not big_k[:, CAP:].any(), "wrote outside the view"


def test_under_torch_compile():
    """A compiled decode step (graph breaks at the host-side length checks): same output, same in-place writes."""
    sc = SCENARIOS["decode_rope_gqa"]
    q, k_cache, v_cache, args, _ = _setup(sc, "paged16", torch.float32)
    k2, v2 = k_cache.clone(), v_cache.clone()

    def step(q, k_cache, v_cache):
        out, lse = tot.flash_attn_with_kvcache(q, k_cache, v_cache, **args)
        return out * 2, lse

    torch._dynamo.reset()
    got = torch.compile(step, backend="aot_eager")(q, k_cache, v_cache)
    want = step(q, k2, v2)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(k_cache, k2) and torch.equal(v_cache, v2)


# ---- FlashAttention-2's forms of its arguments ----

@pytest.mark.parametrize("form", ["list", "tensor", "int32_tensor", "numpy", "0d_tensors"])
@pytest.mark.parametrize("kind", ["contiguous", "paged16"])
def test_window_size_any_pair_form(form, kind):
    """FlashAttention-2 takes window_size as any pair (its kvcache test passes torch.randint(0, seqlen_k, (2,))):
    a list, a 2-element tensor, numpy or 0-d tensor entries give exactly the tuple's result and cache writes."""
    sc = SCENARIOS["window_local_rope"]
    q, k_cache, v_cache, args, _ = _setup(sc, kind, torch.float32)
    left, right = sc.window
    forms = {"list": [left, right], "tensor": torch.tensor([left, right]),
             "int32_tensor": torch.tensor([left, right], dtype=torch.int32),
             "numpy": (np.int64(left), np.int32(right)), "0d_tensors": (torch.tensor(left), torch.tensor(right))}
    kc, vc = k_cache.clone(), v_cache.clone()
    want = tot.flash_attn_with_kvcache(q, kc, vc, **args)
    args["window_size"] = forms[form]
    got = tot.flash_attn_with_kvcache(q, k_cache, v_cache, **args)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(k_cache, kc) and torch.equal(v_cache, vc)


def test_window_size_tensor_past_the_cache_is_unbounded():
    """A window side at least the cache length is unbounded (FlashAttention-2), also when given as a tensor."""
    sc = SCENARIOS["window_past_cache_rope"]
    q, k_cache, v_cache, args, seqlist = _setup(sc, "contiguous", torch.float32)
    k0, v0 = k_cache.clone(), v_cache.clone()
    args["window_size"] = torch.tensor(sc.window)
    out, lse = tot.flash_attn_with_kvcache(q, k_cache, v_cache, **args)
    ref, ref_lse, _ = _reference(q, k0, v0, args, seqlist, sc, torch.float64)
    same, same_lse, _ = _reference(q, k0, v0, args, seqlist, sc, torch.float32)
    check_tolerance("out", out, ref, same)
    check_tolerance("lse", lse, ref_lse, same_lse)


@pytest.mark.parametrize("append", [False, True])
def test_paged_cache_seqlens_past_block_table(append):
    """FlashAttention-2's guard for its paged cache: cache_seqlens (+ the new keys) beyond block_table's columns *
    page_block_size raise a RuntimeError naming block_table, even when the pool has free blocks; exactly at capacity
    is fine."""
    gen = torch.Generator().manual_seed(0)
    block = 256
    k_cache, v_cache = (torch.randn(4, block, 1, 64, generator=gen, dtype=torch.float16) for _ in range(2))
    block_table = torch.zeros(1, 1, dtype=torch.int32)
    q = torch.randn(1, 1, 1, 64, generator=gen, dtype=torch.float16)
    new = dict(k=torch.randn(1, 1, 1, 64, dtype=torch.float16), v=torch.randn(1, 1, 1, 64, dtype=torch.float16))
    extra = new if append else {}
    seqlens = torch.tensor([block if append else block + 1], dtype=torch.int32)
    k0 = k_cache.clone()
    with pytest.raises(RuntimeError, match="block_table") as info:
        tot.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=block_table, **extra)
    assert isinstance(info.value, ValueError) and f"hold {block} tokens" in str(info.value)
    assert torch.equal(k_cache, k0), "a rejected call must not touch the cache"
    out = tot.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([block], dtype=torch.int32),
                                      block_table=block_table)
    assert out.shape == (1, 1, 1, 64) and not out.isnan().any()
