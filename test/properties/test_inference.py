"""The inference attention ops on random valid calls, under the tolerance rule against the float64 references of
test.inference (prefill_cases.reference for prefill, decode_cases.reference for decode):

- prompt_flash_attention and fused_infer_attention_score (with and without softmax_lse): layouts BSH, BSND, BNSD,
  BNSD_BSND, TND; GQA; ragged per-batch lengths (actual_seq_lengths / actual_seq_lengths_kv, zeros included) or TND
  cumulative ends; sparse modes 0-4 with random bands; masks of every accepted shape; pse_shift; query length 1 and
  longer;
- incre_flash_attention over a contiguous cache (lengths, kv_padding_size) or a paged one (block sizes the op
  accepts, random physical block permutations, 3-D and 4-D caches), masks and pse_shift;
- fused_infer_attention_score with block_table: the decode path (query length 1) and the softmax_lse path, which
  gathers the blocks (any positive block size, query length >= 1, sparse modes)."""
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test.common.reference import check_tolerance
from test.inference import decode_cases
from test.inference.prefill_cases import make_inputs, reference, to_layout
from test.properties.strategies import (DTYPES, MAX_TOKENS, dtype_names, examples, generator, per_batch_lengths,
                                        seeds)

OPS = torch.ops.npu_fa
PREFILL_LAYOUTS = ("BSH", "BSND", "BNSD", "BNSD_BSND", "TND")
COMPRESSED = torch.ones(2048, 2048, dtype=torch.bool).triu(1)


def _band(draw):
    if draw(st.booleans()):
        return MAX_TOKENS, MAX_TOKENS
    return draw(st.integers(-6, 25)), draw(st.integers(-6, 25))


def _heads(draw):
    n2 = draw(st.integers(1, 2))
    return n2 * draw(st.sampled_from((1, 2, 3))), n2


def _lse_rows(lse: torch.Tensor, layout: str, q_lens) -> torch.Tensor:
    """The reference's [B, N1, Sq] logsumexp in fused_infer_attention_score's layout: [B, N1, Sq, 1] or [T, N1, 1]."""
    if layout == "TND":
        return torch.cat([lse[b, :, :L].transpose(0, 1) for b, L in enumerate(q_lens)])[..., None]
    return lse[..., None]


def _check_lse(name, ours, ref64, same):
    """lse under the tolerance rule where it is finite, and -inf exactly where the reference's is (rows that see no
    key or lie beyond their sequence)."""
    assert ours.dtype == torch.float32 and ours.shape == ref64.shape, (ours.dtype, ours.shape, ref64.shape)
    assert torch.equal(torch.isneginf(ours), torch.isneginf(ref64)), f"{name}: -inf rows differ from the reference"
    check_tolerance(name, ours, ref64, same)


# ---- prefill: prompt_flash_attention / fused_infer_attention_score without block_table -------------------------
@st.composite
def prefill_calls(draw):
    layout = draw(st.sampled_from(PREFILL_LAYOUTS))
    n1, n2 = _heads(draw)
    b, sq, skv = draw(st.integers(1, 3)), draw(st.integers(1, 20)), draw(st.integers(1, 24))
    d = draw(st.sampled_from((8, 16, 32, 5, 12)))
    if layout == "TND":
        q_lens, kv_lens = draw(per_batch_lengths(b, sq)), draw(per_batch_lengths(b, skv))
    else:
        q_lens = draw(st.one_of(st.none(), per_batch_lengths(b, sq)))
        kv_lens = draw(st.one_of(st.none(), per_batch_lengths(b, skv)))
    mode = draw(st.integers(0, 4))
    pre, nxt = _band(draw)  # modes 1-3 must ignore them
    if mode in (0, 1):
        shapes = ("SS",) if layout == "TND" else ("SS", "B1SS", "BNSS", "BSS", "11SS")
        mask = draw(st.sampled_from((None,) + shapes))
    else:
        mask = draw(st.sampled_from((None, None, None, "compressed")))
    pse = None if layout == "TND" else draw(st.sampled_from((None, "BNSS", "1NSS", "BN1S")))
    return dict(layout=layout, B=b, N1=n1, N2=n2, Sq=sq, Skv=skv, D=d, q_lens=q_lens, kv_lens=kv_lens, mode=mode,
                pre=pre, nxt=nxt, mask=mask, mask_uint8=draw(st.booleans()), pse=pse, dtype=draw(dtype_names),
                scale=draw(st.sampled_from((0.3, 1.0, 1 / math.sqrt(d)))),
                op=draw(st.sampled_from(("prompt", "fused", "fused_lse"))), seed=draw(seeds))


def _prefill_mask(c, gen):
    if c["mask"] is None:
        return None
    if c["mask"] == "compressed":
        return COMPRESSED
    B, N1, Sq, Skv = c["B"], c["N1"], c["Sq"], c["Skv"]
    if c["layout"] == "TND":  # 2-D, indexed by the position in each sequence; may be larger than the longest
        shape = (max(c["q_lens"]) + 2, max(c["kv_lens"]) + 3)
    else:
        shape = {"SS": (Sq, Skv), "B1SS": (B, 1, Sq, Skv), "BNSS": (B, N1, Sq, Skv), "BSS": (B, Sq, Skv),
                 "11SS": (1, 1, Sq, Skv)}[c["mask"]]
    m = torch.rand(shape, generator=gen) < 0.3
    if shape[-2] > 1:
        m[..., 1, :] = True  # a fully masked row: zeros and lse -inf, never NaN
    return m


@settings(max_examples=examples(120))
@given(c=prefill_calls())
def test_prefill_matches_reference(c):
    dt = DTYPES[c["dtype"]]
    gen = generator(c["seed"])
    layout = c["layout"]
    args, bnsd, lens = make_inputs(layout, B=c["B"], N1=c["N1"], N2=c["N2"], Sq=c["Sq"], Skv=c["Skv"], D=c["D"],
                                   dtype=dt, q_lens=c["q_lens"], kv_lens=c["kv_lens"], seed=c["seed"])
    mask = _prefill_mask(c, gen)
    pse = None
    if c["pse"] is not None:
        B, N1, Sq, Skv = c["B"], c["N1"], c["Sq"], c["Skv"]
        shape = {"BNSS": (B, N1, Sq, Skv), "1NSS": (1, N1, Sq, Skv), "BN1S": (B, N1, 1, Skv)}[c["pse"]]
        pse = torch.randn(shape, generator=gen).to(dt)
    q, k, v = args.pop("query"), args.pop("key"), args.pop("value")
    op_mask = mask.to(torch.uint8) if mask is not None and c["mask_uint8"] else mask
    kw = dict(args, atten_mask=op_mask, pse_shift=pse, num_heads=c["N1"], num_key_value_heads=c["N2"],
              pre_tokens=c["pre"], next_tokens=c["nxt"], input_layout=layout, sparse_mode=c["mode"])
    lse = None
    if c["op"] == "prompt":
        out = OPS.prompt_flash_attention(q, k, v, scale_value=c["scale"], **kw)
    else:
        out, lse = OPS.fused_infer_attention_score(q, k, v, scale=c["scale"], softmax_lse_flag=c["op"] == "fused_lse",
                                                   **kw)
    ref_kw = dict(mask=mask, pse=pse, pre=c["pre"], nxt=c["nxt"], mode=c["mode"])
    ref64, lse64 = reference(bnsd, lens, layout, c["scale"], **ref_kw)
    same, lse_same = reference(bnsd, lens, layout, c["scale"], dtype=dt, **ref_kw)
    assert out.dtype == dt and out.shape == ref64.shape, (out.dtype, out.shape, ref64.shape)
    check_tolerance(f"{c['op']} out", out, ref64, same)
    if c["op"] == "fused_lse":
        _check_lse("softmax_lse", lse, _lse_rows(lse64, layout, lens[0]), _lse_rows(lse_same, layout, lens[0]))
    elif lse is not None:
        assert lse.numel() == 0


# ---- decode: incre_flash_attention, contiguous or paged --------------------------------------------------------
@st.composite
def decode_calls(draw, paged=None, masks=True) -> decode_cases.Case:
    layout = draw(st.sampled_from(("BSH", "BSND", "BNSD")))
    n2 = draw(st.integers(1, 2))
    n1 = n2 * draw(st.sampled_from((1, 2, 3, 4)))
    batch = draw(st.integers(1, 3))
    kw = {}
    if paged if paged is not None else draw(st.booleans()):
        block = draw(st.sampled_from((16, 32, 48, 64)))  # incre_flash_attention: multiples of 16 up to 512
        kv_len = block * draw(st.integers(1, 4))
        kw.update(block=block, lens=draw(per_batch_lengths(batch, kv_len)),
                  paged_4d=layout == "BNSD" and draw(st.booleans()))
    else:
        kv_len = draw(st.integers(1, 48))
        lens = draw(st.one_of(st.none(), per_batch_lengths(batch, kv_len)))
        if lens is not None and draw(st.booleans()):
            kw["padding"] = draw(st.integers(0, kv_len - max(lens)))
        kw["lens"] = lens
    if masks:
        kw.update(mask=draw(st.sampled_from((None, "BS", "B1S", "B11S"))),
                  mask_dtype=draw(st.sampled_from(("bool", "uint8"))),
                  pse=draw(st.sampled_from((None, "BN1S", "1N1S"))))
    return decode_cases.Case(layout=layout, batch=batch, q_heads=n1, kv_heads=n2,
                             head_dim=draw(st.sampled_from((5, 8, 16, 24, 32))), kv_len=kv_len,
                             dtype=draw(dtype_names), scale=draw(st.sampled_from((0.25, 1.0, 0.05))), **kw)


def _check_decode(name, out, inp, c):
    assert out.shape == inp.args[0].shape and out.dtype == DTYPES[c.dtype]
    ours = out.reshape(c.batch, c.q_heads, c.head_dim)
    check_tolerance(name, ours, decode_cases.reference(inp, c), decode_cases.reference(inp, c, dtype=DTYPES[c.dtype]))
    for b, L in enumerate(inp.lens):
        if L == 0:
            assert (ours[b] == 0).all(), f"{name}: sequence {b} has no keys but a non-zero output"


@settings(max_examples=examples(120))
@given(c=decode_calls(), seed=seeds)
def test_decode_matches_reference(c, seed):
    inp = decode_cases.build(c, seed=seed % 2**16)
    _check_decode("incre_flash_attention", decode_cases.run(inp), inp, c)


# ---- fused_infer_attention_score with block_table --------------------------------------------------------------
# Without softmax_lse_flag a one-token paged call whose band hides no key runs the decode kernel on the cache in
# place: this property draws those calls (sparse_mode 0, default band); sparse modes and bands with block_table are
# drawn by the lse property below and checked case by case in test/inference/test_fia_paged.py.
@settings(max_examples=examples(45))
@given(c=decode_calls(paged=True), seed=seeds)
def test_fused_paged_decode_matches_reference(c, seed):
    inp = decode_cases.build(c, seed=seed % 2**16)
    q, key, value, mask, pse, lens, table = inp.args[:7]
    out, lse = OPS.fused_infer_attention_score(q, key, value, pse_shift=pse, atten_mask=mask,
                                               actual_seq_lengths_kv=lens, block_table=table, num_heads=c.q_heads,
                                               scale=c.scale, input_layout=c.layout, num_key_value_heads=c.kv_heads,
                                               block_size=c.block)
    assert lse.numel() == 0
    _check_decode("fused_infer_attention_score (paged)", out, inp, c)


@st.composite
def fused_paged_lse_calls(draw):
    layout = draw(st.sampled_from(("BSH", "BSND", "BNSD")))
    n1, n2 = _heads(draw)
    batch = draw(st.integers(1, 3))
    block = draw(st.sampled_from((1, 3, 8, 16, 32)))  # the lse path gathers blocks: any positive size
    kv_len = block * draw(st.integers(1, max(1, 40 // block)))
    sq = draw(st.integers(1, 6))
    c = decode_cases.Case(layout=layout, batch=batch, q_heads=n1, kv_heads=n2,
                          head_dim=draw(st.sampled_from((5, 8, 16, 32))), kv_len=kv_len,
                          lens=draw(per_batch_lengths(batch, kv_len)), dtype=draw(dtype_names), block=block,
                          paged_4d=layout == "BNSD" and draw(st.booleans()), scale=draw(st.sampled_from((0.25, 1.0))))
    mode = draw(st.integers(0, 4))
    pre, nxt = _band(draw)
    return c, sq, draw(st.one_of(st.none(), per_batch_lengths(batch, sq))), mode, pre, nxt


@settings(max_examples=examples(75))
@given(call=fused_paged_lse_calls(), seed=seeds)
def test_fused_paged_lse_matches_reference(call, seed):
    c, sq, q_lens, mode, pre, nxt = call
    inp = decode_cases.build(c, seed=seed % 2**16)  # the logical cache inp.k/v, its blocks and the block table
    dt = DTYPES[c.dtype]
    q = torch.randn(c.batch, c.q_heads, sq, c.head_dim, generator=generator(seed)).to(dt)
    out, lse = OPS.fused_infer_attention_score(
        to_layout(q, c.layout), inp.args[1], inp.args[2], actual_seq_lengths=None if q_lens is None else
        torch.tensor(q_lens), actual_seq_lengths_kv=inp.args[5], block_table=inp.args[6], num_heads=c.q_heads,
        scale=c.scale, pre_tokens=pre, next_tokens=nxt, input_layout=c.layout, num_key_value_heads=c.kv_heads,
        sparse_mode=mode, block_size=c.block, softmax_lse_flag=True)
    lens = (list(q_lens) if q_lens is not None else [sq] * c.batch, list(inp.lens))
    ref_kw = dict(pre=pre, nxt=nxt, mode=mode)
    ref64, lse64 = reference((q, inp.k, inp.v), lens, c.layout, c.scale, **ref_kw)
    same, lse_same = reference((q, inp.k, inp.v), lens, c.layout, c.scale, dtype=dt, **ref_kw)
    assert out.dtype == dt and out.shape == ref64.shape
    check_tolerance("fused_infer_attention_score (paged, lse) out", out, ref64, same)
    _check_lse("softmax_lse (paged)", lse, lse64[..., None], lse_same[..., None])
