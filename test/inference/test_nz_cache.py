"""Paged KV caches in the NZ layout (num_blocks, N2, D // c0, block_size, c0), c0 = 32 bytes of values: the index
formula against upstream's documented npu_scatter_pa_kv_cache example, the writes of npu_scatter_pa_kv_cache on the
4-D and 5-D forms, and decode / FIA (BNSD decode, TND and BNSD prefill, int8 with antiquant and float caches) reading
them in place — bit-identical to the same call on the ND head-major cache, and within the tolerance rule of float64
references of the dequantised cache. Bad NZ shapes: errors naming the argument.
"""
import pytest
import torch

import torch_ops_transformer as tot
from torch_ops_transformer.inference.api import optimised_causal_mask
from torch_ops_transformer.kv_cache import from_nz, nz_c0, to_nz
from test.common.reference import check_tolerance

DTYPES = {"int8": torch.int8, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def nz_index_reference(nd: torch.Tensor, c0: int) -> torch.Tensor:
    """Element by element: nz[blk, n, d // c0, s, d % c0] = nd[blk, s, n, d] (the documented formula)."""
    blocks, bs, n, d = nd.shape
    out = torch.empty(blocks, n, d // c0, bs, c0, dtype=nd.dtype)
    for blk in range(blocks):
        for s in range(bs):
            for h in range(n):
                for x in range(d):
                    out[blk, h, x // c0, s, x % c0] = nd[blk, s, h, x]
    return out


@pytest.mark.parametrize("dtype", ["int8", "bf16", "fp16", "fp32"])
def test_to_nz_is_the_index_formula_and_exact_both_ways(dtype):
    g = torch.Generator().manual_seed(0)
    nd = (torch.randn(3, 4, 2, 64, generator=g) * 50).to(DTYPES[dtype])
    c0 = nz_c0(nd.dtype)
    assert c0 * nd.element_size() == 32
    nz = to_nz(nd)
    assert nz.shape == (3, 2, 64 // c0, 4, c0)
    assert torch.equal(nz, nz_index_reference(nd, c0))
    assert torch.equal(from_nz(nz), nd)


def test_scatter_pa_kv_cache_upstream_example_4d_and_5d():
    """Upstream's documented example: T=16 tokens of 4 heads, k_head_size 32, v_head_size 64, 2 blocks of 32, last
    dim 16 (fp16). Token t's chunk c (of 16 values of its N*D row) lands at cache[block, c, offset, :]; the 5-D view
    [blocks, N, D // 16, block_size, 16] of the same memory is accepted and written identically."""
    g = torch.Generator().manual_seed(1)
    bs_tok, heads, kd, vd, blocks, last, block = 16, 4, 32, 64, 2, 16, 32
    key = torch.randn(bs_tok, heads, kd, generator=g).half()
    value = torch.randn(bs_tok, heads, vd, generator=g).half()
    key_cache = torch.randn(blocks, heads * kd // last, block, last, generator=g).half()
    value_cache = torch.zeros(blocks, heads * vd // last, block, last).half()
    slots = torch.randperm(blocks * block, generator=g)[:bs_tok].int()
    k5, v5 = key_cache.clone().view(blocks, heads, kd // last, block, last), value_cache.clone().view(
        blocks, heads, vd // last, block, last)
    want_k, want_v = key_cache.clone(), value_cache.clone()
    for t in range(bs_tok):
        blk, off = divmod(int(slots[t]), block)
        for c in range(heads * kd // last):
            want_k[blk, c, off] = key[t].reshape(-1)[c * last:(c + 1) * last]
        for c in range(heads * vd // last):
            want_v[blk, c, off] = value[t].reshape(-1)[c * last:(c + 1) * last]
    tot.npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, want_k) and torch.equal(value_cache, want_v)
    tot.npu_scatter_pa_kv_cache(key, value, k5, v5, slots, cache_mode="PA_NZ")
    assert torch.equal(k5.view_as(want_k), want_k) and torch.equal(v5.view_as(want_v), want_v)


def _paged_case(dtype: str, B=3, N1=8, N2=2, D=64, block=32, lens=(70, 33, 96), seed=0):
    """A paged ND cache [num_blocks, block, N2, D] holding the keys of B sequences, its block table, queries and (for
    int8) per-channel antiquant scales/offsets; kd/vd: the dequantised float64 keys [B, N2, S, D]."""
    g = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype]
    S = max(lens)
    nb = -(-S // block)
    num_blocks = B * nb + 2
    table = torch.randperm(num_blocks, generator=g)[:B * nb].view(B, nb).int()
    qdt = torch.bfloat16 if dtype == "int8" else dt
    if dtype == "int8":
        k = torch.randint(-127, 128, (B, N2, nb * block, D), generator=g, dtype=torch.int8)
        v = torch.randint(-127, 128, (B, N2, nb * block, D), generator=g, dtype=torch.int8)
        ks = torch.rand(N2, D, generator=g) * 0.02 + 0.004
        vs = torch.rand(N2, D, generator=g) * 0.02 + 0.004
        ko = torch.rand(N2, D, generator=g) * 8 - 4
        vo = torch.rand(N2, D, generator=g) * 8 - 4
        kd = (k.double() + ko.double()[None, :, None]) * ks.double()[None, :, None]
        vd = (v.double() + vo.double()[None, :, None]) * vs.double()[None, :, None]
        quant = dict(key_antiquant_scale=ks.view(1, N2, 1, D), value_antiquant_scale=vs.view(1, N2, 1, D),
                     key_antiquant_offset=ko.view(1, N2, 1, D), value_antiquant_offset=vo.view(1, N2, 1, D),
                     key_antiquant_mode=0, value_antiquant_mode=0)
    else:
        k = torch.randn(B, N2, nb * block, D, generator=g).to(dt)
        v = torch.randn(B, N2, nb * block, D, generator=g).to(dt)
        kd, vd, quant = k.double(), v.double(), {}
    kc = torch.zeros(num_blocks, block, N2, D, dtype=dt)
    vc = torch.zeros_like(kc)
    for b in range(B):
        for i in range(nb):
            kc[int(table[b, i])] = k[b, :, i * block:(i + 1) * block].transpose(0, 1)
            vc[int(table[b, i])] = v[b, :, i * block:(i + 1) * block].transpose(0, 1)
    return dict(kc=kc, vc=vc, table=table, k=k, v=v, kd=kd, vd=vd, quant=quant, lens=list(lens), N1=N1, N2=N2, D=D,
                block=block, qdt=qdt, g=g, B=B)


def _head_major(c):  # ND [blocks, block, N2, D] -> (blocks, N2, block, D), the BNSD cache the decode op reads
    return c.transpose(1, 2).contiguous()


def _attention64(q, kd, vd, lens, scale, causal_from=None):
    """float64 attention per sequence: q [B, N1, Sq, D] over keys [0, len) (bottom-right causal when Sq > 1)."""
    B, N1, Sq, _ = q.shape
    N2 = kd.shape[1]
    out = torch.zeros(B, N1, Sq, vd.shape[-1], dtype=torch.float64)
    for b in range(B):
        L = lens[b]
        k = kd[b, :, :L].repeat_interleave(N1 // N2, 0)
        v = vd[b, :, :L].repeat_interleave(N1 // N2, 0)
        s = q[b].double() @ k.transpose(-1, -2) * scale
        if Sq > 1:
            i = torch.arange(Sq)[:, None] + (L - Sq)
            s = s.masked_fill(torch.arange(L)[None, :] > i, float("-inf"))
        out[b] = torch.softmax(s, -1) @ v
    return out


@pytest.mark.parametrize("dtype", ["int8", "bf16", "fp16", "fp32"])
def test_fia_bnsd_decode_reads_nz_in_place(dtype):
    """vLLM-Ascend's C8 decode call (BNSD query, 5-D NZ int8 K/V, per-channel antiquant, inner_precise 1) and the
    same with float NZ caches: equal to the call on the ND head-major cache, bit for bit, and to float64."""
    c = _paged_case(dtype)
    q = torch.randn(c["B"], c["N1"], 1, c["D"], generator=c["g"]).to(c["qdt"])
    scale = c["D"] ** -0.5
    kw = dict(block_table=c["table"], actual_seq_lengths_kv=c["lens"], num_heads=c["N1"], scale=scale,
              input_layout="BNSD", num_key_value_heads=c["N2"], block_size=c["block"], inner_precise=1, **c["quant"])
    nz_k, nz_v = to_nz(c["kc"]), to_nz(c["vc"])
    out_nz, _ = tot.npu_fused_infer_attention_score(q, nz_k, nz_v, **kw)
    out_nd, _ = tot.npu_fused_infer_attention_score(q, _head_major(c["kc"]), _head_major(c["vc"]), **kw)
    assert torch.equal(out_nz, out_nd)
    ref = _attention64(q, c["kd"], c["vd"], c["lens"], scale)
    same = _attention64(q, c["kd"].to(c["qdt"]).double(), c["vd"].to(c["qdt"]).double(), c["lens"], scale)
    check_tolerance(f"nz decode {dtype}", out_nz, ref, same.to(c["qdt"]), value_scale=float(c["vd"].abs().max()))
    # torch_npu's decode op (npu_incre_flash_attention) on the same NZ cache.
    inc = tot.npu_incre_flash_attention(q, nz_k, nz_v, block_table=c["table"], actual_seq_lengths=c["lens"],
                                        num_heads=c["N1"], scale_value=scale, input_layout="BNSD",
                                        num_key_value_heads=c["N2"], block_size=c["block"],
                                        **({"antiquant_scale": torch.stack([c["quant"]["key_antiquant_scale"][0],
                                                                            c["quant"]["value_antiquant_scale"][0]]),
                                            "antiquant_offset": torch.stack([c["quant"]["key_antiquant_offset"][0],
                                                                             c["quant"]["value_antiquant_offset"][0]])}
                                           if dtype == "int8" else {}))
    assert torch.equal(inc, out_nd)


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_fia_tnd_prefill_and_decode_read_nz_in_place(dtype):
    """A serving batch in vLLM-Ascend's form: TND prefill (chunked: queries are the last tokens of each sequence,
    causal mode 3) and TND decode (one token per sequence) over the 5-D NZ caches: equal to the ND head-major call
    bit for bit and to float64 within the tolerance rule."""
    c = _paged_case(dtype, lens=(70, 33, 96))
    scale = c["D"] ** -0.5
    nz_k, nz_v = to_nz(c["kc"]), to_nz(c["vc"])
    hm_k, hm_v = _head_major(c["kc"]), _head_major(c["vc"])
    for q_lens in ((5, 1, 12), (1, 1, 1)):
        T = sum(q_lens)
        q = torch.randn(T, c["N1"], c["D"], generator=c["g"]).to(c["qdt"])
        ends = torch.tensor(q_lens).cumsum(0).tolist()
        kw = dict(block_table=c["table"], actual_seq_lengths=ends, actual_seq_lengths_kv=c["lens"],
                  num_heads=c["N1"], scale=scale, input_layout="TND", num_key_value_heads=c["N2"],
                  block_size=c["block"], sparse_mode=3, atten_mask=optimised_causal_mask(), **c["quant"])
        if q_lens == (1, 1, 1):
            kw.pop("atten_mask")
            kw["sparse_mode"] = 0
        out_nz, _ = tot.npu_fused_infer_attention_score(q, nz_k, nz_v, **kw)
        out_nd, _ = tot.npu_fused_infer_attention_score(q, hm_k, hm_v, **kw)
        assert torch.equal(out_nz, out_nd), q_lens
        start = 0
        for b, n in enumerate(q_lens):
            qb = q[start:start + n].transpose(0, 1)[None]  # [1, N1, n, D]
            one = dict(kd=c["kd"][b:b + 1], vd=c["vd"][b:b + 1], lens=[c["lens"][b]])
            ref = _attention64(qb, one["kd"], one["vd"], one["lens"], scale)[0].transpose(0, 1)
            same = _attention64(qb, one["kd"].to(c["qdt"]).double(), one["vd"].to(c["qdt"]).double(), one["lens"],
                                scale)[0].transpose(0, 1).to(c["qdt"])
            check_tolerance(f"nz tnd {dtype} {q_lens} seq {b}", out_nz[start:start + n], ref, same,
                            value_scale=float(c["vd"].abs().max()))
            start += n


def test_scatter_then_decode_on_nz_int8_caches():
    """The C8 serving step end to end: tokens written with npu_scatter_pa_kv_cache (PA_NZ) into 5-D int8 caches, then
    decoded in place — equal to writing and decoding the ND head-major cache."""
    g = torch.Generator().manual_seed(3)
    N1, N2, D, block, blocks, T = 8, 2, 128, 32, 6, 70
    k = torch.randint(-127, 128, (T, N2, D), generator=g, dtype=torch.int8)
    v = torch.randint(-127, 128, (T, N2, D), generator=g, dtype=torch.int8)
    slots = torch.randperm(blocks * block, generator=g)[:T]
    nz_k = torch.zeros(blocks, N2, D // 32, block, 32, dtype=torch.int8)
    nz_v = torch.zeros_like(nz_k)
    tot.npu_scatter_pa_kv_cache(k, v, nz_k, nz_v, slots.int())
    nd_k = torch.zeros(blocks, block, N2, D, dtype=torch.int8)
    nd_v = torch.zeros_like(nd_k)
    tot.npu_scatter_pa_kv_cache(k, v, nd_k, nd_v, slots.int(), cache_mode="Norm")
    assert torch.equal(from_nz(nz_k), nd_k) and torch.equal(from_nz(nz_v), nd_v)
    # One sequence whose tokens are the slots in order: its block table is the blocks of its slots.
    table = torch.arange(blocks, dtype=torch.int32)[None]
    scale = torch.rand(2, N2, 1, D, generator=g) * 0.02 + 0.004
    q = torch.randn(1, N1, 1, D, generator=g).bfloat16()
    kw = dict(block_table=table, actual_seq_lengths_kv=[blocks * block], num_heads=N1, scale=D ** -0.5,
              input_layout="BNSD", num_key_value_heads=N2, block_size=block, antiquant_scale=scale)
    a, _ = tot.npu_fused_infer_attention_score(q, nz_k, nz_v, **kw)
    b, _ = tot.npu_fused_infer_attention_score(q, _head_major(nd_k), _head_major(nd_v), **kw)
    assert torch.equal(a, b)


def test_int8_nz_decode_signed_and_non_finite_factors():
    """Per-token value factors of either sign (the integer P·V scales each row by max |p · factor|), then an
    infinite factor in one sequence and an infinite query row (those tiles and items leave the integer loops for the
    float ones, which take the NZ rows gathered): NZ equals ND bit for bit, NaN included; the finite call is within
    the tolerance rule of float64; the sequences without the infinity keep their values."""
    c = _paged_case("int8", D=128)
    B, N1, N2, D = c["B"], c["N1"], c["N2"], c["D"]
    S = c["k"].shape[2]
    g = c["g"]
    vs = (torch.rand(1, B, S, generator=g) * 0.02 + 0.004) * torch.where(torch.arange(S) % 3 == 0, -1.0, 1.0)
    vo = torch.rand(1, B, S, generator=g) * 8 - 4
    quant = dict(c["quant"], value_antiquant_scale=vs, value_antiquant_offset=vo, value_antiquant_mode=1)
    vd = (c["v"].double() + vo.double()[0, :, None, :, None]) * vs.double()[0, :, None, :, None]
    q = torch.randn(B, N1, 1, D, generator=g).bfloat16()
    kw = dict(block_table=c["table"], actual_seq_lengths_kv=c["lens"], num_heads=N1, scale=D ** -0.5,
              input_layout="BNSD", num_key_value_heads=N2, block_size=c["block"], inner_precise=1)
    nz_k, nz_v, nd_k, nd_v = to_nz(c["kc"]), to_nz(c["vc"]), _head_major(c["kc"]), _head_major(c["vc"])

    def both(q, quant):
        a, _ = tot.npu_fused_infer_attention_score(q, nz_k, nz_v, **kw, **quant)
        b, _ = tot.npu_fused_infer_attention_score(q, nd_k, nd_v, **kw, **quant)
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        return a

    out = both(q, quant)
    ref = _attention64(q, c["kd"], vd, c["lens"], D ** -0.5)
    same = _attention64(q, c["kd"].bfloat16().double(), vd.bfloat16().double(), c["lens"], D ** -0.5)
    check_tolerance("signed per-token value factors", out, ref, same.bfloat16(), value_scale=float(vd.abs().max()))
    vs_inf = vs.clone()
    vs_inf[0, 1, 5] = float("inf")
    q_inf = q.clone()
    q_inf[2, 3, 0, 7] = float("inf")
    out_inf = both(q_inf, dict(quant, value_antiquant_scale=vs_inf))
    assert not torch.isfinite(out_inf[1]).any() and not torch.isfinite(out_inf[2, 3]).any()
    assert torch.equal(out_inf[0], out[0]) and torch.equal(out_inf[2, 4:], out[2, 4:])
    # Heads 0-2 share KV head 0 with the infinite row: that item ran the float loops, equal up to rounding.
    torch.testing.assert_close(out_inf[2, :3], out[2, :3], rtol=0, atol=1e-2)


# ---- bad input: errors that name the argument ----

def _decode_call(k, v, layout="BNSD", D=64, block=32):
    q = torch.randn(1, 4, 1, D).bfloat16() if layout == "BNSD" else torch.randn(1, 1, 4 * D).bfloat16()
    return tot.npu_fused_infer_attention_score(
        q, k, v, block_table=torch.zeros(1, 1, dtype=torch.int32), actual_seq_lengths_kv=[8], num_heads=4,
        input_layout=layout, num_key_value_heads=2, block_size=block)


def test_nz_piece_width_must_be_32_bytes():
    k = torch.zeros(2, 2, 2, 32, 32).bfloat16()  # bf16 pieces are 16 values
    with pytest.raises(ValueError, match=r"argument 'key' is an NZ cache \(5-D\) and must have shape \(num_blocks, "
                                         r"N2=2, D/16=4, block_size=32, 16\)"):
        _decode_call(k, k)


def test_nz_head_dim_must_match_the_query():
    k = torch.zeros(2, 2, 2, 32, 16).bfloat16()  # D = 32, the query's is 64
    with pytest.raises(ValueError, match=r"argument 'key' is an NZ cache \(5-D\) and must have shape"):
        _decode_call(k, k)


def test_nz_head_count_must_match():
    k = torch.zeros(2, 3, 4, 32, 16).bfloat16()
    with pytest.raises(ValueError, match=r"N2=2"):
        _decode_call(k, k)


def test_nz_needs_bnsd_for_the_decode_op():
    k = torch.zeros(2, 2, 4, 32, 16).bfloat16()
    with pytest.raises(ValueError, match=r"an NZ \(5-D\) paged cache needs input_layout BNSD; got BSH"):
        tot.npu_incre_flash_attention(torch.randn(1, 1, 256).bfloat16(), k, k,
                                      block_table=torch.zeros(1, 1, dtype=torch.int32), actual_seq_lengths=[8],
                                      num_heads=4, input_layout="BSH", num_key_value_heads=2, block_size=32)


def test_fia_bsh_query_on_nz_cache_takes_the_prefill_route():
    """FIA with a BSH query over an NZ cache: the prefill kernel reads the cache in place (the decode op takes NZ with
    BNSD only); same result as the BNSD decode within the tolerance rule."""
    c = _paged_case("bf16", lens=(70, 33, 96))
    q = torch.randn(c["B"], c["N1"], 1, c["D"], generator=c["g"]).bfloat16()
    kw = dict(block_table=c["table"], actual_seq_lengths_kv=c["lens"], num_heads=c["N1"], scale=c["D"] ** -0.5,
              num_key_value_heads=c["N2"], block_size=c["block"])
    nz_k, nz_v = to_nz(c["kc"]), to_nz(c["vc"])
    bsh, _ = tot.npu_fused_infer_attention_score(q.reshape(c["B"], 1, -1), nz_k, nz_v, input_layout="BSH", **kw)
    ref = _attention64(q, c["kd"], c["vd"], c["lens"], c["D"] ** -0.5)
    same = _attention64(q, c["kd"].bfloat16().double(), c["vd"].bfloat16().double(), c["lens"], c["D"] ** -0.5)
    check_tolerance("nz bsh", bsh.view(q.shape), ref, same.bfloat16(), value_scale=float(c["vd"].abs().max()))


def test_nz_head_dim_not_a_multiple_of_the_piece():
    q = torch.randn(1, 4, 1, 40).bfloat16()
    k = torch.zeros(2, 2, 3, 32, 16).bfloat16()  # 48 values per row, D = 40 is no multiple of 16
    with pytest.raises(ValueError, match=r"head dim D = 40 is not a multiple of 16"):
        tot.npu_fused_infer_attention_score(q, k, k, block_table=torch.zeros(1, 1, dtype=torch.int32),
                                            actual_seq_lengths_kv=[8], num_heads=4, input_layout="BNSD",
                                            num_key_value_heads=2, block_size=32)


def test_scatter_5d_shape_must_match_the_rows():
    key = torch.zeros(4, 2, 64).half()
    bad = torch.zeros(2, 2, 8, 32, 16).half()  # 8 pieces of 16 = 128 values, rows have 64
    good = torch.zeros(2, 2, 4, 32, 16).half()
    with pytest.raises(ValueError, match=r"argument 'key_cache' \(5-D NZ\) must be \[num_blocks, 2, 64 // c0, "
                                         r"block_size, c0\]"):
        tot.npu_scatter_pa_kv_cache(key, key, bad, good, torch.arange(4).int())
    with pytest.raises(ValueError, match=r"argument 'key_cache' must be a 4-D cache \(or the 5-D NZ form"):
        tot.npu_scatter_pa_kv_cache(key, key, good, good, torch.arange(4).int(), cache_mode="Norm")


def test_to_nz_rejects_a_head_dim_off_the_piece():
    with pytest.raises(ValueError, match=r"head dim D = 24 of a torch.bfloat16 cache must be a multiple of 16"):
        to_nz(torch.zeros(1, 4, 2, 24).bfloat16())


# ---- MLA: NZ latent caches ----

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("path", ["kernel", "kernel_causal", "appended"])
def test_mla_reads_nz_latent_caches(dtype, path):
    """Absorbed MLA decode/prefill (query_rope/key_rope, one KV head, D 512 + rope 64) over NZ latent and rope
    caches: equal bit for bit to the same call on the ND caches (kernel path read in place); an explicit mask takes
    the appended-rope path on the caches' ND copy, equal to the ND call too."""
    from test.inference.test_fia_mla import make, paged, table_for

    B, Sq, S, N, bs = 2, 3, 150, 8, 64
    qn, qr, c, kr, _ = make(B, Sq, S, N, 512, 64, dtype)
    table, nb = table_for(B, S, bs)
    c_nd, kr_nd = paged(c, bs, table, nb, "bsnd"), paged(kr, bs, table, nb, "bsnd")
    c_nz, kr_nz = to_nz(c_nd), to_nz(kr_nd)
    kw = dict(query_rope=qr, num_heads=N, num_key_value_heads=1, scale=0.04, input_layout="BSND", block_table=table,
              block_size=bs, actual_seq_lengths_kv=[S, 97])
    if path == "kernel_causal":
        kw.update(sparse_mode=3, atten_mask=optimised_causal_mask())
    if path == "appended":
        mask = torch.zeros(B, 1, Sq, S, dtype=torch.bool)
        mask[..., 50:60] = True
        kw.update(sparse_mode=0, atten_mask=mask)
    nz, _ = tot.npu_fused_infer_attention_score(qn, c_nz, c_nz, key_rope=kr_nz, **kw)
    nd, _ = tot.npu_fused_infer_attention_score(qn, c_nd, c_nd, key_rope=kr_nd, **kw)
    assert torch.equal(nz, nd)


def test_mla_nz_needs_every_cache_in_nz():
    c = torch.zeros(3, 1, 32, 64, 16).bfloat16()
    kr = torch.zeros(3, 64, 1, 64).bfloat16()  # ND rope cache next to an NZ latent cache
    with pytest.raises(ValueError, match=r"an NZ \(5-D\) 'key' cache needs 'value' and 'key_rope' in the NZ form"):
        tot.npu_fused_infer_attention_score(torch.randn(1, 1, 8, 512).bfloat16(), c, c,
                                            query_rope=torch.randn(1, 1, 8, 64).bfloat16(), key_rope=kr, num_heads=8,
                                            num_key_value_heads=1, input_layout="BSND", block_size=64,
                                            block_table=torch.zeros(1, 1, dtype=torch.int32),
                                            actual_seq_lengths_kv=[10])


def test_mla_prolog_and_kv_rmsnorm_rope_cache_write_5d_nz_caches_that_fia_reads():
    """vLLM-Ascend's MLA flow with NZ caches: npu_mla_prolog_v3 (PA_NZ) writes the 5-D caches (the same memory the 4-D
    PA_NZ cache holds), npu_kv_rmsnorm_rope_cache (PA_NZ) likewise, and FIA's MLA kernel reads them in place: equal
    to the call on their ND copies."""
    from test.mla.mla_prolog_cases import make_inputs, paged_caches, positional

    inputs = make_inputs((2, 3), torch.bfloat16)
    kv, kr = paged_caches(inputs, num_blocks=4, block_size=16)
    idx = torch.tensor([[17, 3, 40], [5, 63, 22]])
    kv4, kr4 = kv.clone(), kr.clone()
    tot.npu_mla_prolog_v3(*positional(inputs, kv4, kr4), cache_index=idx, cache_mode="PA_NZ")
    kv5 = kv.clone().view(4, 1, 32 // 16, 16, 16)
    kr5 = kr.clone().view(4, 1, 16 // 16, 16, 16)
    out = tot.npu_mla_prolog_v3(*positional(inputs, kv5, kr5), cache_index=idx, cache_mode="PA_NZ")
    assert out[0].shape == (2, 3, 4, 32)
    assert torch.equal(kv5.view(kv4.shape), kv4) and torch.equal(kr5.view(kr4.shape), kr4)
    # FIA (absorbed MLA decode, 4 heads) over the written NZ caches vs their ND copies.
    g = torch.Generator().manual_seed(5)
    q, q_rope = torch.randn(2, 1, 4, 32, generator=g).bfloat16(), torch.randn(2, 1, 4, 16, generator=g).bfloat16()
    kw = dict(query_rope=q_rope, num_heads=4, num_key_value_heads=1, scale=0.1, input_layout="BSND",
              block_table=torch.tensor([[1, 0], [3, 2]], dtype=torch.int32), block_size=16,
              actual_seq_lengths_kv=[30, 17])
    a, _ = tot.npu_fused_infer_attention_score(q, kv5, kv5, key_rope=kr5, **kw)
    b, _ = tot.npu_fused_infer_attention_score(q, from_nz(kv5), from_nz(kv5), key_rope=from_nz(kr5), **kw)
    assert torch.equal(a, b)
    # npu_kv_rmsnorm_rope_cache (PA_NZ) into 5-D caches: the same bytes as into the 4-D ones.
    kvx = torch.randn(2, 1, 3, 32 + 16, generator=g).bfloat16()
    gamma = torch.rand(32, generator=g).bfloat16() + 0.5
    cos, sin = (torch.randn(2, 1, 3, 16, generator=g).bfloat16() for _ in range(2))
    slots = torch.tensor([9, 33, 50, 2, 61, 18])
    k4, c4 = torch.zeros(4, 16, 1, 16).bfloat16(), torch.zeros(4, 16, 1, 32).bfloat16()
    k5, c5 = torch.zeros(4, 1, 1, 16, 16).bfloat16(), torch.zeros(4, 1, 2, 16, 16).bfloat16()
    tot.npu_kv_rmsnorm_rope_cache(kvx, gamma, cos, sin, slots, k4, c4, cache_mode="PA_NZ")
    tot.npu_kv_rmsnorm_rope_cache(kvx, gamma, cos, sin, slots, k5, c5, cache_mode="PA_NZ")
    assert torch.equal(k5.view(k4.shape), k4) and torch.equal(c5.view(c4.shape), c4)


def test_nz_write_view_shape_errors():
    from test.mla.mla_prolog_cases import make_inputs, paged_caches, positional

    inputs = make_inputs((2, 3), torch.bfloat16)
    kv, kr = paged_caches(inputs, num_blocks=4, block_size=16)
    bad = torch.zeros(4, 1, 1, 16, 32).bfloat16()  # bf16 pieces are 16 values
    with pytest.raises(ValueError, match=r"argument 'kv_cache' \(5-D NZ\) must be \[num_blocks, 1, D // 16, "
                                         r"block_size, 16\]"):
        tot.npu_mla_prolog_v3(*positional(inputs, bad, kr), cache_index=torch.zeros(2, 3, dtype=torch.long),
                              cache_mode="PA_NZ")


def test_compile_fullgraph_decode_on_nz_cache(dynamo_reset):
    """torch.compile(fullgraph=True) of the C8 decode call: no graph break, no recompile for another sequence length,
    same result as eager."""
    c = _paged_case("int8")
    q = torch.randn(c["B"], c["N1"], 1, c["D"], generator=c["g"]).bfloat16()
    nz_k, nz_v = to_nz(c["kc"]), to_nz(c["vc"])
    kw = dict(block_table=c["table"], num_heads=c["N1"], scale=c["D"] ** -0.5, input_layout="BNSD",
              num_key_value_heads=c["N2"], block_size=c["block"], **c["quant"])

    def step(q, k, v, lens):
        return tot.npu_fused_infer_attention_score(q, k, v, actual_seq_lengths_kv=lens, **kw)[0]

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    counts = torch._dynamo.utils.counters
    counts.clear()  # process-wide: earlier compile tests of this worker counted there too
    for lens in ([70, 33, 96], [71, 34, 96]):
        lens_t = torch.tensor(lens)
        assert torch.equal(compiled(q, nz_k, nz_v, lens_t), step(q, nz_k, nz_v, lens_t))
    assert counts["stats"]["unique_graphs"] == 1
