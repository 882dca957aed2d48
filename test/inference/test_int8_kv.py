"""int8 KV caches (KV antiquant, "C8"): incre_flash_attention reading int8 key/value and dequantising in the kernel,
fused_infer_attention_score on its decode route (the cache read in place) and its prefill route (the prefill kernel
dequantising K/V tile by tile as it packs them: no floating-point copy of the cache), npu_scatter_pa_kv_cache into int8 caches, PagedKVCache(dtype=torch.int8), and bad inputs.

Numerics: float64 attention on the dequantised cache, x = (x_int8 + offset) * scale, with the project's tolerance
rule against plain PyTorch in the query's dtype (test/inference/int8_cases.py)."""
from dataclasses import replace

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.inference.int8_cases import DTYPES, OPS, Case, build, reference, run

GRID = [
    # contiguous caches: the three layouts, per-channel / per-token, offsets or not, GQA/MHA, a D tail
    Case(layout="BSH", dtype="bf16"),
    Case(layout="BSH", dtype="fp16", offset=False),
    Case(layout="BSND", dtype="fp16", q_heads=4, kv_heads=4, head_dim=40, kv_len=50, lens=(50, 1, 23),
         k_mode=1, v_mode=1),
    Case(layout="BNSD", dtype="bf16", q_heads=6, kv_heads=2, head_dim=32, k_mode=0, v_mode=1, offset=False),
    Case(layout="BNSD", dtype="fp16", q_heads=6, kv_heads=2, head_dim=32, k_mode=0, v_mode=1),
    Case(layout="BSH", dtype="bf16", k_mode=1, v_mode=1, mask=True),
    Case(layout="BSND", dtype="bf16", k_mode=2, v_mode=2, q_heads=9, kv_heads=3, head_dim=48),
    Case(layout="BNSD", dtype="fp16", k_mode=3, v_mode=3, q_heads=4, kv_heads=2, head_dim=128, kv_len=300,
         lens=(300, 257, 5)),
    Case(layout="BSH", dtype="bf16", per_tensor=True),
    Case(layout="BSH", dtype="fp16", k_mode=1, v_mode=1, padding=7, lens=(60, 0, 73)),
    # the stacked form (antiquant_scale [2, ...])
    Case(layout="BSH", dtype="fp16", form="stacked"),
    Case(layout="BSND", dtype="bf16", form="stacked", offset=False),
    Case(layout="BNSD", dtype="bf16", form="stacked", k_mode=1, v_mode=1),
    Case(layout="BNSD", dtype="fp16", form="stacked", per_tensor=True),
    # paged caches: block sizes 32 and 128, (blocks, block, H) and (blocks, N2, block, D)
    Case(layout="BSH", dtype="bf16", kv_len=96, block=32, lens=(96, 33, 0), form="stacked"),
    Case(layout="BSND", dtype="fp16", kv_len=256, block=128, lens=(256, 129, 1), k_mode=1, v_mode=1),
    Case(layout="BNSD", dtype="bf16", kv_len=96, block=32, lens=(70, 96, 31), paged_4d=True, k_mode=0, v_mode=1),
    Case(layout="BNSD", dtype="fp16", kv_len=256, block=128, lens=(200, 3, 256), paged_4d=True, form="stacked",
         k_mode=1, v_mode=1, mask=True),
    Case(layout="BNSD", dtype="bf16", kv_len=256, block=128, lens=(100, 256, 0), k_mode=3, v_mode=3,
         q_heads=8, kv_heads=1, head_dim=128),
    Case(layout="BSH", dtype="bf16", kv_len=1024, block=128, lens=(1024, 700, 129), q_heads=8, kv_heads=2,
         head_dim=128),
]


def _id(c: Case) -> str:
    bits = [c.layout, c.dtype, f"N{c.q_heads}/{c.kv_heads}", f"D{c.head_dim}", f"m{c.k_mode}{c.v_mode}", c.form,
            "off" if c.offset else "sym"]
    bits += [x for x in (c.per_tensor and "tensor", c.block and f"block{c.block}", c.paged_4d and "4d",
                         c.padding is not None and f"pad{c.padding}", c.mask and "mask") if x]
    return "-".join(bits)


@pytest.mark.parametrize("case", GRID, ids=_id)
def test_decode_reference(case):
    inp = build(case)
    out = run(inp)
    assert out.dtype == DTYPES[case.dtype] and out.shape == inp.args[0].shape
    ours = out.reshape(case.batch, case.q_heads, case.head_dim)
    check_tolerance(_id(case), ours, reference(inp, case), reference(inp, case, DTYPES[case.dtype]))
    for b, length in enumerate(inp.lens):
        if length == 0:
            assert (ours[b] == 0).all()


def test_scale_dtypes_fp16_bf16():
    # Factors may come in the query's dtype (as upstream's per-channel form): the kernel converts them to fp32.
    c = Case(layout="BSH", dtype="bf16")
    base = run(build(c))
    for sd in (torch.float16, torch.bfloat16):
        inp = build(c, scale_dtype=sd)
        # the reference uses the fp32 factors, so compare against the fp32-factor result with the rounding slack
        torch.testing.assert_close(run(inp).float(), base.float(), atol=2e-2, rtol=2e-2)


def test_stacked_equals_separate_and_separate_wins():
    c = Case(layout="BNSD", dtype="bf16", q_heads=4, kv_heads=2, head_dim=32)
    sep = build(c)
    stk = build(replace(c, form="stacked"))
    torch.testing.assert_close(run(sep), run(stk), atol=0, rtol=0)
    # both forms given: the separate one is used (as torch_npu), whatever the stacked one holds
    both = dict(sep.kwargs, antiquant_scale=stk.kwargs["antiquant_scale"] * 7,
                antiquant_offset=stk.kwargs["antiquant_offset"] + 3)
    torch.testing.assert_close(OPS.incre_flash_attention(*sep.args, **both), run(sep), atol=0, rtol=0)


def test_torch_npu_wrapper_stacked_form():
    c = Case(layout="BSND", dtype="fp16", form="stacked", kv_len=96, block=32, lens=(96, 40, 7))
    inp = build(c)
    a = inp.args
    out = tot.npu_incre_flash_attention(a[0], a[1], a[2], actual_seq_lengths=a[5].tolist(), block_table=a[6],
                                        num_heads=a[8], scale_value=a[9], input_layout="BSND",
                                        num_key_value_heads=a[11], block_size=a[12],
                                        antiquant_scale=inp.kwargs["antiquant_scale"],
                                        antiquant_offset=inp.kwargs["antiquant_offset"])
    torch.testing.assert_close(out, run(inp), atol=0, rtol=0)


def test_threads_do_not_change_the_result():
    c = Case(layout="BSH", dtype="bf16", kv_len=1024, block=128, lens=(1024, 700, 129), k_mode=1, v_mode=1)
    inp = build(c)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run(inp)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, run(inp))


# ---- fused_infer_attention_score ----

def _fia(inp, q=None, **extra):
    a = inp.args
    kw = dict(block_table=a[6], num_heads=a[8], scale=a[9], input_layout=a[10], num_key_value_heads=a[11],
              block_size=a[12], actual_seq_lengths_kv=a[5].tolist(), **inp.kwargs)
    kw.update(extra)
    return tot.npu_fused_infer_attention_score(a[0] if q is None else q, a[1], a[2], **kw)


@pytest.mark.parametrize("case", [
    Case(layout="BNSD", dtype="bf16", kv_len=256, block=128, lens=(256, 100, 1), paged_4d=True),
    Case(layout="BSH", dtype="fp16", kv_len=96, block=32, lens=(90, 33, 64), form="stacked", k_mode=1, v_mode=1),
    Case(layout="BSND", dtype="bf16", lens=(80, 33, 5), k_mode=0, v_mode=1),   # contiguous int8: decode route too
], ids=lambda c: f"{c.layout}-block{c.block}-m{c.k_mode}{c.v_mode}")
def test_fia_decode_route(case):
    inp = build(case)
    out, lse = _fia(inp)
    assert lse.numel() == 0
    # the decode route is the decode op itself, reading the int8 cache in place
    torch.testing.assert_close(out, run(inp), atol=0, rtol=0)
    ours = out.reshape(case.batch, case.q_heads, case.head_dim)
    check_tolerance(_id(case), ours, reference(inp, case), reference(inp, case, DTYPES[case.dtype]))


def _prefill_reference(q, kd, vd, lens, scale, dtype):
    """q [B, N1, Sq, D]; all query rows see keys [0, len_b). Returns out [B, N1, Sq, D] and lse [B, N1, Sq]."""
    B, N1, Sq, D = q.shape
    G = N1 // kd.shape[1]
    out = torch.zeros(B, N1, Sq, D, dtype=dtype)
    lse = torch.full((B, N1, Sq), float("-inf"), dtype=torch.float64)
    for b in range(B):
        L = lens[b]
        if L == 0:
            continue
        k = kd[b, :, :L].to(dtype).repeat_interleave(G, 0)
        v = vd[b, :, :L].to(dtype).repeat_interleave(G, 0)
        s = torch.einsum("nqd,nld->nql", q[b].to(dtype), k) * scale
        out[b] = torch.einsum("nql,nld->nqd", torch.softmax(s, -1), v)
        lse[b] = torch.logsumexp(s.double(), -1)
    return out, lse


@pytest.mark.parametrize("case", [
    Case(layout="BNSD", dtype="bf16", kv_len=256, block=128, lens=(256, 100, 1), paged_4d=True, q_heads=4),
    Case(layout="BNSD", dtype="fp16", kv_len=256, block=128, lens=(250, 128, 3), form="stacked", k_mode=1, v_mode=1,
         q_heads=4),
    Case(layout="BNSD", dtype="bf16", kv_len=80, lens=(80, 33, 5), k_mode=0, v_mode=1, q_heads=4),
    Case(layout="BNSD", dtype="fp16", kv_len=80, lens=(80, 33, 5), k_mode=3, v_mode=3, q_heads=4, offset=False),
], ids=lambda c: f"block{c.block}-m{c.k_mode}{c.v_mode}-{c.form}")
@pytest.mark.parametrize("sq", [1, 4])
def test_fia_prefill_route(case, sq):
    # Sq = 4 (prefill) and Sq = 1 with softmax_lse_flag (the decode op has no lse): the prefill path on the
    # dequantised keys; sparse_mode 0 without a mask = every query row sees the sequence's keys.
    inp = build(case)
    g = torch.Generator().manual_seed(5)
    dt = DTYPES[case.dtype]
    q = torch.randn(case.batch, case.q_heads, sq, case.head_dim, generator=g).to(dt)
    out, lse = _fia(inp, q=q, softmax_lse_flag=True)
    ref, ref_lse = _prefill_reference(q, inp.kd, inp.vd, inp.lens, case.scale, torch.float64)
    same, same_lse = _prefill_reference(q, inp.kd, inp.vd, inp.lens, case.scale, dt)
    assert out.dtype == dt and out.shape == q.shape
    check_tolerance(f"{_id(case)} Sq={sq}", out, ref, same)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse[..., 0]), finite)
    check_tolerance(f"{_id(case)} Sq={sq} lse", lse[..., 0][finite], ref_lse[finite], same_lse[finite])


def _tnd_reference(q, inp, c, q_lens, dtype):
    """TND query rows (q_lens[b] of them for sequence b) against each sequence's dequantised keys; sparse_mode 0
    without a mask: every row sees all of them."""
    rows, t = [], 0
    for b, n in enumerate(q_lens):
        r, _ = _prefill_reference(q[t:t + n].transpose(0, 1)[None], inp.kd[b:b + 1], inp.vd[b:b + 1],
                                  [inp.lens[b]], c.scale, dtype)
        rows.append(r[0].transpose(0, 1))
        t += n
    return torch.cat(rows)


@pytest.mark.parametrize("modes", [(0, 0), (0, 1), (1, 1), (3, 3)], ids=lambda m: f"m{m[0]}{m[1]}")
def test_fia_tnd_paged_prefill(modes):
    # TND with a paged cache and a prefill batch: the used blocks are gathered (still int8) and the prefill kernel
    # dequantises them; per-token factors are indexed by the key's position in its sequence, as in the dense layouts.
    c = Case(layout="BSH", dtype="bf16", kv_len=256, block=128, lens=(256, 100, 1), q_heads=4, kv_heads=2,
             head_dim=64, k_mode=modes[0], v_mode=modes[1])
    inp = build(c)
    g = torch.Generator().manual_seed(3)
    q_lens = [3, 1, 1]
    q = torch.randn(sum(q_lens), c.q_heads, c.head_dim, generator=g).to(torch.bfloat16)
    out, _ = tot.npu_fused_infer_attention_score(
        q, inp.args[1], inp.args[2], block_table=inp.args[6], num_heads=c.q_heads, num_key_value_heads=c.kv_heads,
        scale=c.scale, input_layout="TND", block_size=c.block, actual_seq_lengths=[3, 4, 5],
        actual_seq_lengths_kv=list(inp.lens), **inp.kwargs)
    check_tolerance(f"TND prefill m{modes}", out, _tnd_reference(q, inp, c, q_lens, torch.float64),
                    _tnd_reference(q, inp, c, q_lens, torch.bfloat16))


def test_fia_prefill_makes_no_float_copy_of_the_cache():
    # The prefill route reads the int8 cache itself: no op converts it (the earlier route made an fp32 copy).
    c = Case(layout="BNSD", dtype="bf16", kv_len=512, lens=(512, 300, 17), q_heads=4, kv_heads=2, head_dim=64)
    inp = build(c)
    q = torch.randn(c.batch, c.q_heads, 8, c.head_dim).to(torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        _fia(inp, q=q, softmax_lse_flag=True)
    cache_shape = list(inp.args[1].shape)
    converted = [e.name for e in prof.events() if e.name in ("aten::to", "aten::_to_copy", "aten::copy_")
                 and any(list(s) == cache_shape for s in e.input_shapes)]
    assert converted == []
    names = {e.name for e in prof.events()}
    assert "npu_fa::fused_infer_attention_score" in names, sorted(names)


# ---- writing int8 caches ----

def test_npu_scatter_pa_kv_cache_int8_is_a_copy():
    g = torch.Generator().manual_seed(0)
    nb, bs, N2, D = 4, 32, 2, 16
    kc = torch.zeros(nb, bs, N2, D, dtype=torch.int8)
    vc = torch.zeros_like(kc)
    k = torch.randint(-128, 128, (5, N2, D), generator=g, dtype=torch.int8)
    v = torch.randint(-128, 128, (5, N2, D), generator=g, dtype=torch.int8)
    slots = torch.tensor([0, 33, 70, 127, 5], dtype=torch.int32)
    tot.npu_scatter_pa_kv_cache(k, v, kc, vc, slots, cache_mode="Norm")
    for i, s in enumerate(slots.tolist()):
        assert torch.equal(kc[s // bs, s % bs], k[i]) and torch.equal(vc[s // bs, s % bs], v[i])
    with pytest.raises(TypeError, match="dtype"):  # no quantisation on the way in, as upstream
        tot.npu_scatter_pa_kv_cache(k.float(), v.float(), kc, vc, slots, cache_mode="Norm")


@pytest.mark.parametrize("layout", ["BSND", "BSH"])
@pytest.mark.parametrize("given", [False, True])
def test_paged_kv_cache_int8(layout, given):
    g = torch.Generator().manual_seed(1)
    N1, N2, D, bs = 8, 2, 64, 32
    steps, prompt = 5, 40
    scales = dict(key_scale=torch.rand(N2, D, generator=g) * 0.02 + 0.01, value_scale=0.02) if given else {}
    cache = tot.PagedKVCache(num_blocks=16, block_size=bs, num_kv_heads=N2, head_dim=D, dtype=torch.int8,
                             layout=layout, **scales)
    ref_cache = tot.PagedKVCache(num_blocks=16, block_size=bs, num_kv_heads=N2, head_dim=D, dtype=torch.float32)
    ids = [cache.add_sequence() for _ in range(2)]
    rids = [ref_cache.add_sequence() for _ in range(2)]
    k0 = torch.randn(2, prompt, N2, D, generator=g)
    v0 = torch.randn(2, prompt, N2, D, generator=g)
    cache.append(ids, k0, v0)
    assert cache.key_scale.shape == (N2, D) and cache.antiquant_scale.shape == (2, N2, D)
    for _ in range(steps):
        k, v = torch.randn(2, N2, D, generator=g) * 0.5, torch.randn(2, N2, D, generator=g) * 0.5
        cache.append(ids, k, v)
        q = torch.randn(2, 1, N1, D, generator=g).to(torch.bfloat16)
        out = cache.attention(q, ids, num_heads=N1, scale_value=D ** -0.5)
        # reference: the dequantised int8 cache in float64, through the float cache and the float64 math
        kd = cache.key_cache.double().reshape(16, bs, N2, D) * cache.key_scale.double()
        vd = cache.value_cache.double().reshape(16, bs, N2, D) * cache.value_scale.double()
        ref_cache.key_cache.copy_(kd.float())
        ref_cache.value_cache.copy_(vd.float())
        # the float cache's allocator gets the int8 cache's block lists (its bookkeeping, set directly)
        ref_cache._alloc._blocks, ref_cache._alloc._lens = {r: cache.blocks(i) for r, i in zip(rids, ids)}, dict(
            zip(rids, cache.seq_lens(ids).tolist()))
        ref = ref_cache.attention(q.float(), rids, num_heads=N1, scale_value=D ** -0.5)
        assert (out.float() - ref).abs().max() < 2e-2
    # the int8 cache holds half the bytes of a bf16 one
    assert cache.key_cache.element_size() == 1


def test_paged_kv_cache_int8_rules():
    with pytest.raises(ValueError, match="block_size % 32"):
        tot.PagedKVCache(num_blocks=4, block_size=16, num_kv_heads=2, head_dim=8, dtype=torch.int8)
    with pytest.raises(ValueError, match="key_scale"):
        tot.PagedKVCache(num_blocks=4, block_size=32, num_kv_heads=2, head_dim=8, dtype=torch.int8,
                         key_scale=torch.ones(3), value_scale=1.0)
    with pytest.raises(ValueError, match="int8 cache"):
        tot.PagedKVCache(num_blocks=4, block_size=32, num_kv_heads=2, head_dim=8, key_scale=1.0)
    cache = tot.PagedKVCache(num_blocks=4, block_size=32, num_kv_heads=2, head_dim=8, dtype=torch.int8)
    ids = [cache.add_sequence()]
    with pytest.raises(RuntimeError, match="no scales"):
        cache.attention(torch.randn(1, 1, 2, 8).half(), ids, num_heads=2, scale_value=1.0)
    with pytest.raises(TypeError, match="quantises on append"):
        cache.append(ids, torch.zeros(1, 2, 8, dtype=torch.int8), torch.zeros(1, 2, 8, dtype=torch.int8))


# ---- bad inputs: one per rule ----

def _bad(c: Case = Case(), **kw):
    inp = build(c)
    kwargs = dict(inp.kwargs)
    for k, v in kw.items():
        if v is None:
            kwargs.pop(k, None)
        else:
            kwargs[k] = v
    return OPS.incre_flash_attention(*inp.args, **kwargs)


def test_bad_wrong_per_channel_scale_shape():
    with pytest.raises(ValueError, match=r"key_antiquant_scale.*per-channel.*N2\*D"):
        _bad(key_antiquant_scale=torch.ones(1, 2, 1, 63))


def test_bad_per_token_scale_too_short():
    c = Case(k_mode=1, v_mode=1)
    with pytest.raises(ValueError, match=r"value_antiquant_scale.*per-token.*S >= 80"):
        _bad(c, value_antiquant_scale=torch.ones(1, 3, 79), value_antiquant_offset=torch.ones(1, 3, 79))


def test_bad_stacked_scale_needs_leading_two():
    with pytest.raises(ValueError, match="antiquant_scale.*leading dim of 2"):
        _bad(Case(form="stacked"), antiquant_scale=torch.ones(3, 128), antiquant_offset=None)


def test_bad_offset_shape():
    with pytest.raises(ValueError, match="key_antiquant_offset.*shape of 'key_antiquant_scale'"):
        _bad(key_antiquant_offset=torch.ones(2, 64))


def test_bad_fp32_query_with_int8_cache():
    inp = build(Case())
    args = (inp.args[0].float(),) + inp.args[1:]
    with pytest.raises(TypeError, match="float16 or bfloat16 'query'"):
        OPS.incre_flash_attention(*args, **inp.kwargs)


def test_bad_int8_key_with_float_value():
    inp = build(Case())
    args = inp.args[:2] + (inp.args[2].to(torch.bfloat16),) + inp.args[3:]
    with pytest.raises(TypeError, match="both be int8"):
        OPS.incre_flash_attention(*args, **inp.kwargs)


def test_bad_modes_out_of_range():
    with pytest.raises(ValueError, match="key_antiquant_mode.*\\[0, 5\\]"):
        _bad(key_antiquant_mode=6)
    with pytest.raises(ValueError, match="antiquant_mode.*0 .per-channel. or 1"):
        _bad(Case(form="stacked"), antiquant_mode=2)


def test_bad_mode_pair():
    with pytest.raises(ValueError, match="must be equal, or 0 and 1"):
        _bad(Case(k_mode=1, v_mode=0))


def test_paged_scale_modes_not_implemented():
    with pytest.raises(NotImplementedError, match="key_antiquant_mode.*4"):
        _bad(key_antiquant_mode=4, value_antiquant_mode=4)


def test_bad_offset_without_scale():
    with pytest.raises(ValueError, match="'antiquant_offset' needs 'antiquant_scale'"):
        _bad(Case(form="stacked"), antiquant_scale=None, key_antiquant_scale=torch.ones(1), antiquant_offset=torch.ones(2))
    with pytest.raises(ValueError, match="key_antiquant_offset.*need"):
        _bad(Case(form="stacked"), key_antiquant_offset=torch.ones(2, 128), value_antiquant_offset=torch.ones(2, 128))


def test_bad_only_key_scale():
    with pytest.raises(ValueError, match="given together"):
        _bad(value_antiquant_scale=None, value_antiquant_offset=None, key_antiquant_offset=None)


def test_bad_int8_without_scales():
    with pytest.raises(ValueError, match="need their dequantisation scales"):
        _bad(key_antiquant_scale=None, value_antiquant_scale=None, key_antiquant_offset=None,
             value_antiquant_offset=None)


def test_bad_scales_with_float_cache():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 16, generator=g).half()
    k = torch.randn(1, 8, 16, generator=g).half()
    with pytest.raises(ValueError, match="int8 key/value cache"):
        OPS.incre_flash_attention(q, k, k, num_heads=1, antiquant_scale=torch.ones(2, 16))
    with pytest.raises(ValueError, match="int8 key/value cache"):
        tot.npu_fused_infer_attention_score(q, k, k, num_heads=1, key_antiquant_scale=torch.ones(16),
                                            value_antiquant_scale=torch.ones(16))


def test_bad_int8_paged_block_size_16():
    # upstream: an int8 paged cache needs block_size % 32 == 0
    c = Case(kv_len=64, block=32, lens=(64, 10, 3))
    inp = build(c)
    key = inp.args[1].reshape(-1, 16, inp.args[1].shape[-1])
    table = torch.stack([torch.stack([2 * t, 2 * t + 1], -1) for t in inp.args[6].long()]).reshape(3, -1).int()
    args = (inp.args[0], key, key, None, None, inp.args[5], table, None, 8, c.scale, "BSH", 2, 16, 1)
    with pytest.raises(ValueError, match="multiple of 32 with an int8 paged cache"):
        OPS.incre_flash_attention(*args, **inp.kwargs)


def test_bad_scale_dtype():
    with pytest.raises(TypeError, match="key_antiquant_scale.*float32, float16 or bfloat16"):
        _bad(key_antiquant_scale=torch.ones(2, 64, dtype=torch.int32))


def test_fia_tnd_per_token():
    # TND with per-token factors: a decode-only batch (one query token per sequence) runs the decode op on the cache
    # in place; a prefill TND batch runs the prefill kernel, the factors indexed by the key's position in its sequence.
    c = Case(layout="BSH", kv_len=256, block=128, lens=(256, 100, 1), q_heads=4, k_mode=1, v_mode=1)
    inp = build(c)
    q = torch.randn(3, 4, 64).to(torch.bfloat16)
    kw = dict(block_table=inp.args[6], num_heads=4, num_key_value_heads=2, scale=c.scale, input_layout="TND",
              block_size=128, actual_seq_lengths_kv=list(inp.lens), **inp.kwargs)
    out, _ = tot.npu_fused_infer_attention_score(q, inp.args[1], inp.args[2], actual_seq_lengths=[1, 2, 3], **kw)
    ref = reference(replace(inp, q=q), c)
    check_tolerance("TND decode per-token", out, ref, reference(replace(inp, q=q), c, torch.bfloat16))
    q4 = torch.randn(4, 4, 64).to(torch.bfloat16)
    out4, _ = tot.npu_fused_infer_attention_score(q4, inp.args[1], inp.args[2], actual_seq_lengths=[2, 3, 4], **kw)
    check_tolerance("TND prefill per-token", out4, _tnd_reference(q4, inp, c, [2, 1, 1], torch.float64),
                    _tnd_reference(q4, inp, c, [2, 1, 1], torch.bfloat16))
