"""fused_infer_attention_score with block_table (a paged KV cache) means what it means without one: every sparse mode,
band, mask, pse_shift, query length and the lse equal the contiguous call and the float64 reference, on both routes
(the decode op in place, or the prefill path on gathered blocks). And shared blocks: one physical block in several
block tables (prefix caching), or twice in one, is a legitimate read-only cache for every paged read path."""
import math

import pytest
import torch

from test.inference.prefill_cases import MAX, reference, to_layout

OPS = torch.ops.npu_fa
B, N1, N2, D, BS = 2, 4, 2, 16, 16
S = 48                      # padded length of the contiguous cache = 3 blocks
KV_LENS = [20, 37]
SCALE = 0.3
HAS_DECODE = hasattr(OPS, "incre_flash_attention")


def _inputs(sq, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N1, sq, D, generator=g).to(dtype)
    k = torch.randn(B, N2, S, D, generator=g).to(dtype)
    v = torch.randn(B, N2, S, D, generator=g).to(dtype)
    return q, k, v


def _paged(t, layout, table):
    """[B, N2, S, D] -> a paged cache holding block table[b, i] = logical block i of sequence b: (blocks, BS, N2*D)
    for BSH/BSND, (blocks, N2, BS, D) for BNSD. Unused blocks hold NaN: they must never be read."""
    num_blocks = int(table.max()) + 2
    cache = torch.full((num_blocks, N2, BS, D), math.nan, dtype=t.dtype)
    for b in range(B):
        for i in range(S // BS):
            cache[table[b, i]] = t[b, :, i * BS:(i + 1) * BS]
    return cache if layout == "BNSD" else cache.transpose(1, 2).reshape(num_blocks, BS, N2 * D).contiguous()


TABLE = torch.tensor([[4, 0, 6], [2, 5, 1]], dtype=torch.int32)


def _fia(q, k, v, layout, **kw):
    return OPS.fused_infer_attention_score(to_layout(q, layout), k, v, num_heads=N1, num_key_value_heads=N2,
                                           scale=SCALE, input_layout=layout, **kw)


CONFIGS = {  # name -> (sparse_mode, pre, next, mask kind, pse)
    "mode0_full": (0, MAX, MAX, None, False),
    "mode0_mask": (0, MAX, MAX, "B1", False),
    "mode0_mask_band": (0, 3, 1, "B1", False),
    "mode1_mask_per_head": (1, MAX, MAX, "BN", False),
    "mode2_top_left": (2, MAX, MAX, None, False),
    "mode3_bottom_right": (3, MAX, MAX, None, False),
    "mode3_compressed_mask": (3, MAX, MAX, "compressed", False),
    "mode4_band": (4, 5, 0, None, False),
    "mode4_band_both_sides": (4, 3, 2, None, False),
    "pse_shift": (0, MAX, MAX, None, True),
    "pse_and_mask": (1, MAX, MAX, "B1", True),
}


def _mask(kind, sq):
    g = torch.Generator().manual_seed(7)
    if kind is None:
        return None, None
    if kind == "compressed":
        return torch.ones(2048, 2048, dtype=torch.bool).triu(1), None
    m = torch.rand(B, N1 if kind == "BN" else 1, sq, S, generator=g) < 0.3
    return m, m


@pytest.mark.parametrize("lse", [False, True])
@pytest.mark.parametrize("sq", [1, 5])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_paged_equals_contiguous_and_reference(config, sq, lse):
    mode, pre, nxt, mask_kind, with_pse = CONFIGS[config]
    layout = "BNSD" if sq == 1 and config.startswith("mode0") else "BSH"
    q, k, v = _inputs(sq)
    mask, ref_mask = _mask(mask_kind, sq)
    pse = torch.randn(B, N1, sq, S, generator=torch.Generator().manual_seed(8)) if with_pse else None
    kw = dict(atten_mask=mask, pse_shift=pse, actual_seq_lengths_kv=torch.tensor(KV_LENS), sparse_mode=mode,
              pre_tokens=pre, next_tokens=nxt, softmax_lse_flag=lse)
    contiguous, c_lse = _fia(q, to_layout(k, layout), to_layout(v, layout), layout, **kw)
    paged, p_lse = _fia(q, _paged(k, layout, TABLE), _paged(v, layout, TABLE), layout, block_table=TABLE,
                        block_size=BS, **kw)
    ref, ref_lse = reference((q, k, v), ([sq] * B, KV_LENS), layout, SCALE, mask=ref_mask, pse=pse, pre=pre, nxt=nxt,
                             mode=mode)
    torch.testing.assert_close(paged.double(), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(paged, contiguous, atol=2e-5, rtol=2e-5)
    if lse:
        torch.testing.assert_close(p_lse[..., 0].double(), ref_lse, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(p_lse, c_lse, atol=2e-5, rtol=2e-5)
    else:
        assert p_lse.numel() == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_paged_band_low_precision(dtype):
    q, k, v = _inputs(1, dtype)
    kw = dict(actual_seq_lengths_kv=torch.tensor(KV_LENS), sparse_mode=4, pre_tokens=6, next_tokens=0)
    paged, _ = _fia(q, _paged(k, "BSH", TABLE), _paged(v, "BSH", TABLE), "BSH", block_table=TABLE, block_size=BS, **kw)
    ref, _ = reference((q, k, v), ([1] * B, KV_LENS), "BSH", SCALE, pre=6, nxt=0, mode=4)
    torch.testing.assert_close(paged.double(), ref, atol=1e-2, rtol=1e-2)


def test_paged_query_length_zero_gives_a_zero_row():
    q, k, v = _inputs(1)
    out, _ = _fia(q, _paged(k, "BSH", TABLE), _paged(v, "BSH", TABLE), "BSH", block_table=TABLE, block_size=BS,
                  actual_seq_lengths=torch.tensor([1, 0]), actual_seq_lengths_kv=torch.tensor(KV_LENS))
    assert (out[1] == 0).all() and (out[0] != 0).any()


def test_paged_decode_mask_form_and_width():
    """A one-token query takes the decode op's (B, S) mask (per batch) on both routes; a mask narrower than the
    longest sequence is an error naming it."""
    q, k, v = _inputs(1)
    kc, vc = _paged(k, "BSH", TABLE), _paged(v, "BSH", TABLE)
    mask = torch.rand(B, S, generator=torch.Generator().manual_seed(9)) < 0.4
    kw = dict(block_table=TABLE, block_size=BS, actual_seq_lengths_kv=torch.tensor(KV_LENS), atten_mask=mask)
    decode, _ = _fia(q, kc, vc, "BSH", **kw)
    prefill, _ = _fia(q, kc, vc, "BSH", softmax_lse_flag=True, **kw)
    ref, _ = reference((q, k, v), ([1] * B, KV_LENS), "BSH", SCALE, mask=mask[:, None, None], nxt=MAX)
    torch.testing.assert_close(decode.double(), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(prefill.double(), ref, atol=2e-5, rtol=2e-5)
    kw["atten_mask"] = mask[:, :30]
    with pytest.raises(ValueError, match="atten_mask.*longest sequence"):
        _fia(q, kc, vc, "BSH", softmax_lse_flag=True, **kw)


@pytest.mark.skipif(not HAS_DECODE, reason="decode op not in this build")
def test_one_token_full_attention_reads_the_cache_in_place():
    """The common decode call keeps the decode op (no gathered copy); a band takes the prefill route."""
    q, k, v = _inputs(1)
    kc, vc = _paged(k, "BSH", TABLE), _paged(v, "BSH", TABLE)
    kw = dict(block_table=TABLE, block_size=BS, actual_seq_lengths_kv=torch.tensor(KV_LENS))

    def ops_called(**extra):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            _fia(q, kc, vc, "BSH", **kw, **extra)
        return {e.name for e in prof.events()}

    assert "npu_fa::incre_flash_attention" in ops_called()
    assert "npu_fa::incre_flash_attention" in ops_called(sparse_mode=3)
    assert "npu_fa::incre_flash_attention" not in ops_called(sparse_mode=4, pre_tokens=4, next_tokens=0)


# ---- shared blocks ----

SHARED = torch.tensor([[3, 0, 5], [3, 1, 1]], dtype=torch.int32)  # block 3 shared; sequence 1 repeats block 1


def _shared_kv(dtype=torch.float32):
    """K/V whose logical blocks follow SHARED: sequences 0 and 1 share their first block, and sequence 1's blocks 1
    and 2 are one physical block."""
    q, k, v = _inputs(1, dtype, seed=3)
    for t in (k, v):
        t[1, :, :BS] = t[0, :, :BS]
        t[1, :, 2 * BS:] = t[1, :, BS:2 * BS]
    return q, k, v


def _shared_cache(t, layout):
    num_blocks = 6
    cache = torch.full((num_blocks, N2, BS, D), math.nan, dtype=t.dtype)
    for b in range(B):
        for i in range(S // BS):
            cache[SHARED[b, i]] = t[b, :, i * BS:(i + 1) * BS]
    return cache if layout == "BNSD" else cache.transpose(1, 2).reshape(num_blocks, BS, N2 * D).contiguous()


@pytest.mark.skipif(not HAS_DECODE, reason="decode op not in this build")
@pytest.mark.parametrize("layout", ["BSH", "BNSD"])
def test_shared_blocks_decode_equals_contiguous(layout):
    q, k, v = _shared_kv()
    lens = torch.tensor([40, 45])
    kc, vc = _shared_cache(k, layout), _shared_cache(v, layout)
    ql = q.reshape(B, 1, N1 * D) if layout == "BSH" else q
    out = OPS.incre_flash_attention(ql, kc, vc, actual_seq_lengths=lens, block_table=SHARED, num_heads=N1,
                                    scale_value=SCALE, input_layout=layout, num_key_value_heads=N2, block_size=BS)
    want = OPS.incre_flash_attention(ql, to_layout(k, layout), to_layout(v, layout), actual_seq_lengths=lens,
                                     num_heads=N1, scale_value=SCALE, input_layout=layout, num_key_value_heads=N2)
    torch.testing.assert_close(out, want, atol=2e-6, rtol=2e-6)
    ref, _ = reference((q, k, v), ([1] * B, lens.tolist()), layout, SCALE, nxt=MAX)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("lse", [False, True])
def test_shared_blocks_fused_equals_contiguous(lse):
    q, k, v = _shared_kv()
    kw = dict(actual_seq_lengths_kv=torch.tensor([40, 45]), softmax_lse_flag=lse)
    out, out_lse = _fia(q, _shared_cache(k, "BSH"), _shared_cache(v, "BSH"), "BSH", block_table=SHARED, block_size=BS,
                        **kw)
    want, want_lse = _fia(q, to_layout(k, "BSH"), to_layout(v, "BSH"), "BSH", **kw)
    torch.testing.assert_close(out, want, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(out_lse, want_lse)


def test_shared_blocks_gather_pa_kv_cache():
    q, k, v = _shared_kv()
    kc = _shared_cache(k, "BSH").view(6, BS, N2, D)
    vc = _shared_cache(v, "BSH").view(6, BS, N2, D)
    lens = torch.tensor([40, 45])
    gk, gv = OPS.gather_pa_kv_cache(kc, vc, SHARED, lens)
    for got, t in ((gk, k), (gv, v)):
        want = torch.cat([t[b, :, :n].transpose(0, 1) for b, n in enumerate(lens.tolist())])
        torch.testing.assert_close(got, want)


def test_scatter_pa_kv_cache_still_rejects_a_repeated_slot():
    """Writes are different: two tokens writing one slot would race."""
    cache = torch.zeros(4, BS, N2, D)
    kv = torch.randn(2, N2, D)
    with pytest.raises(RuntimeError, match="more than once"):
        OPS.scatter_pa_kv_cache(kv, kv, cache, cache.clone(), torch.tensor([5, 5]))
