"""Adversarial index arguments: a valid call with one index argument replaced by a mutation of it — an entry out of
range, negative, huge (near 2^31, 2^32, 2^63 - 1, -2^63), duplicated, shuffled out of order, the wrong dtype or
shape, a strided view — must either raise a clean exception (RuntimeError, ValueError, IndexError, TypeError,
NotImplementedError) whose message names the argument, or return what the float64 reference computes from the
mutated argument. The reference side models each argument's documented rules (native_functions.yaml): when the
model says the argument is invalid, returning anything is a failure; when it is valid, the op may still decline it
with an error naming it (e.g. decode rejects physical blocks shared by two sequences) but must never return a
different result. In-place ops must leave their outputs untouched when they raise.

Covered: block_table, actual_seq_lengths (decode), kv_padding_size, actual_seq_lengths / actual_seq_lengths_kv
(prefill: per-batch lengths, and TND cumulative ends), actual_seq_qlen / actual_seq_kvlen, slot_mapping, seq_lens,
positions, row_idx / expert_idx (init_routing v1, v2), active_num / expert_num / expert_capacity /
active_expert_range, expanded_src_to_dst_row / export_for_source_row, expanded_row_idx, indices / sorted_indices,
sorted_expert_for_source_row / num_expert, group_list; and the Python wrappers' list and int forms of lengths,
paddings, group lists and cumulative sequence lengths."""
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

import torch_ops_transformer as tot
from test.common import moe_reference as moe_ref
from test.common.reference import attention_reference, check_tolerance
from test.inference import decode_cases
from test.inference.prefill_cases import reference as prefill_reference
from test.inference.prefill_cases import to_layout
from test.moe.test_grouped_matmul import split_m_ref
from test.properties.strategies import DTYPES, examples, generator, per_batch_lengths, permutation, randn, seeds
from test.rope.test_rope import ref_cache_rope

OPS = torch.ops.npu_fa
CLEAN = (RuntimeError, ValueError, IndexError, TypeError, NotImplementedError)
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
EDGES = (-1, -2, 0, 1, 2**31 - 1, 2**31, -2**31 - 1, 2**32 + 1, 2**62, INT64_MAX, INT64_MIN)
WRONG_DTYPES = (torch.int16, torch.uint8, torch.bool, torch.float32, torch.float64)


class Invalid(Exception):
    """The model's verdict: the mutated argument breaks a documented rule."""


def expect(call, names, model, compare, untouched=()):
    """The property. model() -> the expected result (raises Invalid for an invalid argument); call() -> ours.
    `untouched`: tensors an in-place op must leave as they were when it raises."""
    try:
        want, why = model(), None
    except Invalid as e:
        want, why = None, str(e)
    before = [t.clone() for t in untouched]
    try:
        got = call()
    except CLEAN as e:
        event("raised" if why else "raised on a valid argument")
        msg = str(e)
        assert any(n in msg for n in names), f"{type(e).__name__} names none of {names}: {msg}"
        for t, b in zip(untouched, before):
            assert torch.equal(t.view(torch.uint8), b.view(torch.uint8)), "an in-place op raised after writing"
        return
    assert why is None, f"returned a result for an invalid argument ({why})"
    event("returned")
    compare(got, want)


def ints(t: torch.Tensor, name: str) -> torch.Tensor:
    """The values of an index tensor as int64, or Invalid when its dtype is not int32/int64."""
    if t.dtype not in (torch.int32, torch.int64):
        raise Invalid(f"{name} has dtype {t.dtype}")
    return t.long()


def index_value(lo: int, hi: int):
    """An entry near the valid range [lo, hi] or an edge value."""
    return st.one_of(st.integers(lo - 3, hi + 3), st.sampled_from(EDGES))


@st.composite
def mutated(draw, valid, lo: int, hi: int):
    """`valid` (a list of ints, or nested lists) as an int64 tensor, unchanged or mutated once."""
    t = torch.tensor(valid, dtype=torch.int64)
    kind = draw(st.sampled_from(("keep", "entry", "entry", "all", "shuffle", "duplicate", "int32", "dtype", "shape",
                                 "strided")))
    flat = t.reshape(-1).clone()
    n = flat.numel()
    if kind == "entry" and n:
        flat[draw(st.integers(0, n - 1))] = draw(index_value(lo, hi))
    elif kind == "all":
        flat = torch.tensor([draw(index_value(lo, hi)) for _ in range(n)], dtype=torch.int64)
    elif kind == "shuffle" and n > 1:
        flat = flat[torch.tensor(draw(st.permutations(range(n))))]
    elif kind == "duplicate" and n > 1:
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        flat[j] = flat[i]
    t = flat.reshape(t.shape)
    if kind == "int32":
        t = t.int()
    elif kind == "dtype":
        t = t.to(draw(st.sampled_from(WRONG_DTYPES)))
    elif kind == "strided":
        t = torch.stack([t, torch.full_like(t, 12345)], -1)[..., 0]
    elif kind == "shape":
        change = draw(st.sampled_from(("unsqueeze", "drop", "append", "flatten", "empty", "scalar")))
        if change == "unsqueeze":
            t = t.unsqueeze(0)
        elif change == "drop" and t.dim() and t.shape[-1]:
            t = t[..., :-1]
        elif change == "append":
            t = torch.cat([t, torch.full(t.shape[:-1] + (1,), draw(index_value(lo, hi)), dtype=t.dtype)], -1) \
                if t.dim() else t.reshape(1)
        elif change == "flatten":
            t = t.reshape(-1)
        elif change == "empty":
            t = t.reshape(-1)[:0]
        elif n:
            t = t.reshape(-1)[0].clone()  # 0-d
    return t


def _finite_caches(inp, gen):
    """decode_cases fills unused physical blocks with NaN (to catch reads of them in the valid grids); a mutated
    block table may legitimately point at them, so give them finite values."""
    args = list(inp.args)
    for i in (1, 2):
        c = args[i]
        args[i] = torch.where(torch.isnan(c), randn(gen, c.shape, c.dtype), c)
    return args


def _logical_kv(cache: torch.Tensor, table, lens, block: int, n2: int, d: int, four_d: bool):
    """[B, N2, S, D] keys (zeros past each length) read through a block table: key j of sequence b is row j % block
    of physical block table[b][j // block]."""
    b = len(lens)
    s = max([1] + list(lens))
    out = torch.zeros(b, n2, s, d, dtype=cache.dtype)
    for bi, length in enumerate(lens):
        for j in range(length):
            blk = int(table[bi][j // block])
            row = cache[blk, :, j % block] if four_d else cache[blk, j % block].view(n2, d)
            out[bi, :, j] = row
    return out


def _lengths(t, name, batch: int, capacity: int, one_d: bool):
    """Per-batch lengths: int32/int64, 1-D (or 0-d when not one_d) with B or 1 entries, each in [0, capacity]."""
    v = ints(t, name)
    if (t.dim() != 1 if one_d else t.dim() > 1) or t.numel() not in (batch, 1):
        raise Invalid(f"{name} of shape {list(t.shape)} for B={batch}")
    v = v.reshape(-1).tolist()
    lens = v * batch if len(v) == 1 else v
    if any(x < 0 or x > capacity for x in lens):
        raise Invalid(f"{name} = {lens} outside [0, {capacity}]")
    return lens


def _decode_compare(c):
    def compare(got, want):
        ref64, same = want
        check_tolerance("decode", got.reshape(c.batch, c.q_heads, c.head_dim), ref64, same)
    return compare


def _decode_reference(inp, c, k, v, starts, lens):
    x = decode_cases.Inputs(inp.q, k, v, None, None, tuple(starts), tuple(lens), ())
    return decode_cases.reference(x, c), decode_cases.reference(x, c, dtype=DTYPES[c.dtype])


# ---- decode over a contiguous cache: actual_seq_lengths, kv_padding_size ---------------------------------------
@settings(max_examples=examples(75))
@given(data=st.data(), seed=seeds)
def test_decode_lengths_and_padding(data, seed):
    draw = data.draw
    batch, s = draw(st.integers(1, 3)), draw(st.integers(1, 24))
    c = decode_cases.Case(layout=draw(st.sampled_from(("BSH", "BSND", "BNSD"))), batch=batch, q_heads=4, kv_heads=2,
                          head_dim=8, kv_len=s, lens=draw(per_batch_lengths(batch, s)), padding=None)
    inp = decode_cases.build(c, seed=seed % 2**16)
    args = list(inp.args)
    which = draw(st.sampled_from(("actual_seq_lengths", "kv_padding_size")))
    if which == "actual_seq_lengths":
        args[5] = draw(mutated(list(c.lens), 0, s))
    else:
        pad = draw(st.integers(0, s - max(c.lens)))
        args[7] = draw(mutated([pad] if draw(st.booleans()) else pad, 0, s))

    def model():
        lens = [s] * batch if args[5] is None else _lengths(args[5], "actual_seq_lengths", batch, s, one_d=False)
        starts = [0] * batch
        if args[7] is not None:
            p = ints(args[7], "kv_padding_size")
            if p.numel() != 1:
                raise Invalid("kv_padding_size is not one value")
            pad = int(p.reshape(-1)[0])
            if pad < 0 or any(pad + L > s for L in lens):
                raise Invalid(f"kv_padding_size {pad} with lengths {lens} in a cache of {s}")
            starts = [s - pad - L for L in lens]
        return _decode_reference(inp, c, inp.k, inp.v, starts, lens)

    expect(lambda: OPS.incre_flash_attention(*args), [which], model, _decode_compare(c))


# ---- paged KV: block_table and lengths, through incre_flash_attention and fused_infer_attention_score ----------
@settings(max_examples=examples(90))
@given(data=st.data(), seed=seeds)
def test_paged_block_table_and_lengths(data, seed):
    draw = data.draw
    gen = generator(seed)
    op = draw(st.sampled_from(("incre", "fused", "fused_lse")))
    batch = draw(st.integers(1, 3))
    block = draw(st.sampled_from((16, 32))) if op != "fused_lse" else draw(st.sampled_from((2, 5, 16)))
    max_blocks = draw(st.integers(1, 3))
    layout = draw(st.sampled_from(("BSH", "BSND", "BNSD")))
    c = decode_cases.Case(layout=layout, batch=batch, q_heads=4, kv_heads=2, head_dim=8, kv_len=block * max_blocks,
                          lens=draw(per_batch_lengths(batch, block * max_blocks)), block=block,
                          paged_4d=layout == "BNSD" and draw(st.booleans()))
    inp = decode_cases.build(c, seed=seed % 2**16)
    args = _finite_caches(inp, gen)
    key, value = args[1], args[2]
    num_blocks = key.shape[0]
    table, lens = args[6], args[5]
    lens_name = "actual_seq_lengths" if op == "incre" else "actual_seq_lengths_kv"
    which = draw(st.sampled_from(("block_table", lens_name)))
    if which == "block_table":
        table = draw(mutated(table.tolist(), -1, num_blocks))
    else:
        lens = draw(mutated(list(c.lens), 0, block * max_blocks))
    sq = draw(st.integers(1, 3)) if op == "fused_lse" else 1
    q = randn(gen, (batch, c.q_heads, sq, c.head_dim), DTYPES[c.dtype])

    def model():
        bt = ints(table, "block_table")
        if bt.dim() != 2 or bt.shape[0] != batch:
            raise Invalid(f"block_table of shape {list(bt.shape)}")
        cap = bt.shape[1] * block
        seq = _lengths(lens, lens_name, batch, cap, one_d=op == "fused_lse")
        for b, L in enumerate(seq):
            for j in range(-(-L // block)):
                if not 0 <= int(bt[b, j]) < num_blocks:
                    raise Invalid(f"block_table[{b}][{j}] = {int(bt[b, j])}")
        k, v = (_logical_kv(x, bt.tolist(), seq, block, c.kv_heads, c.head_dim, c.paged_4d) for x in (key, value))
        if op != "fused_lse":
            return _decode_reference(inp, c, k, v, [0] * batch, seq)
        lens2 = ([sq] * batch, seq)
        return (prefill_reference((q, k, v), lens2, layout, c.scale, mode=0),
                prefill_reference((q, k, v), lens2, layout, c.scale, mode=0, dtype=DTYPES[c.dtype]))

    if op == "incre":
        call = lambda: OPS.incre_flash_attention(args[0], key, value, None, None, lens, table, None, c.q_heads,  # noqa
                                                 c.scale, layout, c.kv_heads, block)
        compare = _decode_compare(c)
    else:
        qa = args[0] if op == "fused" else to_layout(q, layout)
        call = lambda: OPS.fused_infer_attention_score(  # noqa: E731
            qa, key, value, actual_seq_lengths_kv=lens, block_table=table, num_heads=c.q_heads, scale=c.scale,
            input_layout=layout, num_key_value_heads=c.kv_heads, block_size=block,
            softmax_lse_flag=op == "fused_lse")

        def compare(got, want):
            if op == "fused":
                _decode_compare(c)(got[0], want)
                return
            (ref64, lse64), (same, lse_same) = want
            check_tolerance("paged lse out", got[0], ref64, same)
            assert torch.equal(torch.isneginf(got[1]), torch.isneginf(lse64[..., None]))
            check_tolerance("paged lse", got[1], lse64[..., None], lse_same[..., None])
    # longer lengths reach block-table entries that were unused (-1): the error then names block_table.
    # fused_infer_attention_score's paged decode path reports bad lengths with incre_flash_attention's name for them
    # ('actual_seq_lengths', of which 'actual_seq_lengths_kv' is an extension): that spelling is accepted here.
    names = ["block_table", lens_name] + (["actual_seq_lengths"] if op == "fused" else [])
    expect(call, names, model, compare)


# ---- prefill: per-batch lengths (dense layouts) and cumulative ends (TND) ----------------------------------------
@settings(max_examples=examples(75))
@given(data=st.data(), seed=seeds)
def test_prefill_lengths(data, seed):
    draw = data.draw
    gen = generator(seed)
    layout = draw(st.sampled_from(("BSH", "BSND", "BNSD", "TND")))
    b, sq, skv = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(st.integers(1, 8))
    n1, n2, d, scale = 2, 1, 8, 0.3
    q_lens, kv_lens = draw(per_batch_lengths(b, sq)), draw(per_batch_lengths(b, skv))
    q = randn(gen, (b, n1, sq, d))
    k, v = randn(gen, (b, n2, skv, d)), randn(gen, (b, n2, skv, d))
    use_fused = draw(st.booleans())
    names = ("actual_seq_lengths", "actual_seq_lengths_kv")
    which = draw(st.sampled_from(names))
    if layout == "TND":
        qp, kp, vp = (torch.cat([x[i, :, :L].transpose(0, 1) for i, L in enumerate(lens)])
                      for x, lens in ((q, q_lens), (k, kv_lens), (v, kv_lens)))
        ends = {names[0]: torch.tensor(q_lens).cumsum(0).tolist(), names[1]: torch.tensor(kv_lens).cumsum(0).tolist()}
        lens_args = {n: torch.tensor(e) for n, e in ends.items()}
        total = {names[0]: qp.shape[0], names[1]: kp.shape[0]}
        lens_args[which] = draw(mutated(ends[which], 0, total[which]))
    else:
        qp, kp, vp = (to_layout(x, layout) for x in (q, k, v))
        lens_args = {names[0]: torch.tensor(q_lens), names[1]: torch.tensor(kv_lens)}
        lens_args[which] = draw(mutated([q_lens, kv_lens][names.index(which)], 0, [sq, skv][names.index(which)]))

    def model():
        if layout != "TND":
            ql = _lengths(lens_args[names[0]], names[0], b, sq, one_d=True)
            kl = _lengths(lens_args[names[1]], names[1], b, skv, one_d=True)
            return prefill_reference((q, k, v), (ql, kl), layout, scale, mode=0)
        ends_q = _cumulative(lens_args[names[0]], names[0], qp.shape[0])
        ends_k = _cumulative(lens_args[names[1]], names[1], kp.shape[0])
        if len(ends_q) != len(ends_k):
            raise Invalid("different numbers of sequences")
        out, lse = attention_reference(qp, kp, vp, n1, "TND", actual_seq_qlen=ends_q, actual_seq_kvlen=ends_k,
                                       scale=scale)
        return out, lse[..., None]

    kw = dict(lens_args, num_heads=n1, input_layout=layout)
    if use_fused:
        call = lambda: OPS.fused_infer_attention_score(qp, kp, vp, scale=scale, softmax_lse_flag=True, **kw)  # noqa
    else:
        call = lambda: OPS.prompt_flash_attention(qp, kp, vp, scale_value=scale, **kw)  # noqa: E731

    def compare(got, want):
        out = got[0] if use_fused else got
        torch.testing.assert_close(out.double(), want[0], atol=2e-5, rtol=2e-5)  # fp32 inputs

    expect(call, list(names), model, compare)


def _cumulative(t, name, total: int):
    """TND cumulative ends: int32/int64, 1-D, non-empty, non-decreasing from >= 0, ending at the token count."""
    e = ints(t, name)
    if t.dim() != 1 or t.numel() == 0:
        raise Invalid(f"{name} of shape {list(t.shape)}")
    e = e.tolist()
    if any(x < p for x, p in zip(e, [0] + e[:-1])) or e[-1] != total:
        raise Invalid(f"{name} = {e} for {total} tokens")
    return e


@settings(max_examples=examples(60))
@given(data=st.data(), seed=seeds)
def test_flash_attention_score_cumulative_ends(data, seed):
    draw = data.draw
    gen = generator(seed)
    b = draw(st.integers(1, 3))
    q_lens, kv_lens = draw(per_batch_lengths(b, 6)), draw(per_batch_lengths(b, 6))
    q, k, v = randn(gen, (sum(q_lens), 2, 8)), randn(gen, (sum(kv_lens), 1, 8)), randn(gen, (sum(kv_lens), 1, 8))
    ends = {"actual_seq_qlen": torch.tensor(q_lens).cumsum(0).tolist(),
            "actual_seq_kvlen": torch.tensor(kv_lens).cumsum(0).tolist()}
    args = {n: torch.tensor(e) for n, e in ends.items()}
    which = draw(st.sampled_from(sorted(ends)))
    args[which] = draw(mutated(ends[which], 0, max(1, sum(q_lens if which == "actual_seq_qlen" else kv_lens))))
    mode = draw(st.sampled_from((0, 2, 3)))

    def model():
        eq = _cumulative(args["actual_seq_qlen"], "actual_seq_qlen", q.shape[0])
        ek = _cumulative(args["actual_seq_kvlen"], "actual_seq_kvlen", k.shape[0])
        if len(eq) != len(ek):
            raise Invalid("different numbers of sequences")
        return attention_reference(q, k, v, 2, "TND", actual_seq_qlen=eq, actual_seq_kvlen=ek, scale=0.3,
                                   sparse_mode=mode)

    def compare(got, want):
        torch.testing.assert_close(got[0].double(), want[0], atol=2e-5, rtol=2e-5)

    expect(lambda: OPS.flash_attention_score(q, k, v, 2, "TND", scale=0.3, sparse_mode=mode, **args),
           sorted(ends), model, compare)


# ---- paged cache helpers: slot_mapping, block_table, seq_lens ----------------------------------------------------
@settings(max_examples=examples(75))
@given(data=st.data(), seed=seeds)
def test_scatter_slot_mapping(data, seed):
    draw = data.draw
    gen = generator(seed)
    # block_size >= 1 (a cache with block_size 0 is an error: test/ops/test_extreme_arguments.py)
    nb, bs, t = draw(st.integers(1, 4)), draw(st.integers(1, 8)), draw(st.integers(0, 6))
    head_major = draw(st.booleans())
    n_slots = nb * bs
    valid = permutation(gen, n_slots)[:t].tolist() + [-1] * max(0, t - n_slots)
    slots = draw(mutated(valid[:t], -1, n_slots))
    keys, values = randn(gen, (t, 2, 4)), randn(gen, (t, 2, 3))
    shape_k = (nb, 2, bs, 4) if head_major else (nb, bs, 2, 4)
    shape_v = (nb, 2, bs, 3) if head_major else (nb, bs, 2, 3)
    kc, vc = randn(gen, shape_k), randn(gen, shape_v)
    k0, v0 = kc.clone(), vc.clone()

    def model():
        s = ints(slots, "slot_mapping")
        if slots.dim() != 1 or slots.numel() != t:
            raise Invalid(f"slot_mapping of shape {list(slots.shape)}")
        s = s.tolist()
        real = [x for x in s if x != -1]
        if any(not 0 <= x < n_slots for x in real) or len(set(real)) != len(real):
            raise Invalid(f"slot_mapping = {s}")
        wk, wv = k0.clone(), v0.clone()
        for i, x in enumerate(s):
            if x >= 0:
                for want, new in ((wk, keys), (wv, values)):
                    if head_major:
                        want[x // bs, :, x % bs] = new[i]
                    else:
                        want[x // bs, x % bs] = new[i]
        return wk, wv

    def compare(got, want):
        assert got is None and torch.equal(kc, want[0]) and torch.equal(vc, want[1])

    expect(lambda: OPS.scatter_pa_kv_cache(keys, values, kc, vc, slots, cache_layout="BNSD" if head_major else "BSND"),
           ["slot_mapping"], model, compare, untouched=(kc, vc))


@settings(max_examples=examples(75))
@given(data=st.data(), seed=seeds)
def test_gather_block_table_and_seq_lens(data, seed):
    draw = data.draw
    gen = generator(seed)
    b, bs, m = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(st.integers(1, 3))
    nb = draw(st.integers(1, b * m + 1))
    lens = draw(per_batch_lengths(b, m * bs))
    table = torch.randint(0, nb, (b, m), generator=gen).tolist()
    kc, vc = randn(gen, (nb, bs, 2, 4)), randn(gen, (nb, bs, 6))
    which = draw(st.sampled_from(("block_table", "seq_lens")))
    bt = draw(mutated(table, -1, nb)) if which == "block_table" else torch.tensor(table)
    sl = draw(mutated(lens, 0, m * bs)) if which == "seq_lens" else torch.tensor(lens)

    def model():
        t = ints(bt, "block_table")
        s = ints(sl, "seq_lens")
        if bt.dim() != 2 or sl.dim() != 1 or sl.shape[0] != bt.shape[0]:
            raise Invalid("shapes")
        cap = bt.shape[1] * bs
        ks, vs = [], []
        for i, L in enumerate(s.tolist()):
            if not 0 <= L <= cap:
                raise Invalid(f"seq_lens[{i}] = {L}")
            for j in range(L):
                blk = int(t[i, j // bs])
                if not 0 <= blk < nb:
                    raise Invalid(f"block_table[{i}][{j // bs}] = {blk}")
                ks.append(kc[blk, j % bs])
                vs.append(vc[blk, j % bs])
        return (torch.stack(ks) if ks else kc.new_zeros(0, 2, 4)), (torch.stack(vs) if vs else vc.new_zeros(0, 6))

    def compare(got, want):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    expect(lambda: OPS.gather_pa_kv_cache(kc, vc, bt, sl), ["block_table", "seq_lens"], model, compare)


# ---- rope_with_sin_cos_cache: positions -------------------------------------------------------------------------
@settings(max_examples=examples(60))
@given(data=st.data(), seed=seeds)
def test_rope_positions(data, seed):
    draw = data.draw
    gen = generator(seed)
    t, max_pos, hs = draw(st.integers(1, 5)), draw(st.integers(1, 9)), 8
    positions = draw(mutated(torch.randint(0, max_pos, (t,), generator=gen).tolist(), 0, max_pos - 1))
    q, k = randn(gen, (t, 2 * hs)), randn(gen, (t, hs))
    ang = randn(gen, (max_pos, 2), torch.float64)
    cache = torch.cat((ang.cos(), ang.sin()), -1).float()

    def model():
        # positions' shape P must begin query's and key's shapes; each of the P tokens holds a multiple of hs values
        p = ints(positions, "positions")
        for x in (q, k):
            if x.dim() <= p.dim() or tuple(x.shape[:p.dim()]) != tuple(p.shape) or x[0].numel() % hs:
                raise Invalid(f"positions of shape {list(p.shape)} for {list(x.shape)}")
        if p.numel() and not (0 <= int(p.min()) and int(p.max()) < max_pos):
            raise Invalid(f"positions {p.tolist()}")
        n = p.numel()
        return [ref_cache_rope(p.reshape(-1), x.reshape(n, -1), cache, hs, True) for x in (q, k)]

    def compare(got, want):
        for g, w in zip(got, want):
            torch.testing.assert_close(g.double().reshape(w.shape), w, atol=1e-5, rtol=1e-5)

    expect(lambda: tot.rope_with_sin_cos_cache(positions, q, k, cache, hs, True), ["positions"], model, compare)


# ---- MoE routing ------------------------------------------------------------------------------------------------
def _routing_inputs(draw, gen, distinct_ok=True):
    n, k, e, h = draw(st.integers(0, 6)), draw(st.integers(1, 3)), draw(st.integers(1, 5)), 4
    x = randn(gen, (n, h))
    experts = torch.randint(0, e, (n, k), generator=gen).tolist()
    return n, k, e, h, x, experts


@settings(max_examples=examples(75))
@given(data=st.data(), seed=seeds)
def test_init_routing_v1_row_idx_and_expert_idx(data, seed):
    draw = data.draw
    gen = generator(seed)
    n, k, e, h, x, experts = _routing_inputs(draw, gen)
    row_idx = (torch.arange(k)[None] * n + torch.arange(n)[:, None]).tolist()
    which = draw(st.sampled_from(("row_idx", "expert_idx")))
    ri = draw(mutated(row_idx, 0, n * k)) if which == "row_idx" else torch.tensor(row_idx, dtype=torch.int32)
    ei = draw(mutated(experts, 0, e)) if which == "expert_idx" else torch.tensor(experts, dtype=torch.int32)
    active = draw(st.one_of(st.integers(0, n + 2), st.sampled_from((INT64_MAX, -1))))

    def model():
        r, x_e = ints(ri, "row_idx"), ints(ei, "expert_idx")
        if ei.dim() != 2 or ei.shape[0] != n:
            raise Invalid("expert_idx shape")
        if ri.shape != ei.shape:
            raise Invalid("row_idx shape")
        if sorted(r.reshape(-1).tolist()) != list(range(r.numel())):
            raise Invalid("row_idx is not a permutation of [0, N*k)")
        if x_e.numel() and not (0 <= int(x_e.min()) and int(x_e.max()) < 2**24):
            raise Invalid("expert_idx outside [0, 2^24)")  # the documented bound of the counting sort
        if active < 0:
            raise Invalid("active_num < 0")
        return moe_ref.init_routing_v1(x, r, x_e, active)

    def compare(got, want):
        for g, w in zip(got, want):
            assert torch.equal(g, w)

    expect(lambda: OPS.moe_init_routing(x, ri, ei, active), ["row_idx", "expert_idx", "active_num"], model, compare)


# expert_num, the active_expert_range span and expert_capacity size allocations that are only bounded by half the
# machine's physical memory: values between 2^24 and 2^36 would make the op allocate (and clear) gigabytes, so the
# strategy skips that band (beyond it the op rejects them, below it they are cheap).
def _size_arg(valid_lo: int, valid_hi: int):
    return st.one_of(st.integers(valid_lo - 2, valid_hi + 2), st.sampled_from((0, -1, -2**31, 2**40, 2**62, INT64_MAX,
                                                                              INT64_MIN)))


@settings(max_examples=examples(90))
@given(data=st.data(), seed=seeds)
def test_init_routing_v2_index_and_size_arguments(data, seed):
    draw = data.draw
    gen = generator(seed)
    n, k, e, h, x, experts = _routing_inputs(draw, gen)
    capacity = draw(st.booleans())
    kw = dict(active_num=-1, expert_capacity=-1, expert_num=e, drop_pad_mode=int(capacity), expert_tokens_num_type=1,
              expert_tokens_num_flag=draw(st.booleans()), active_expert_range=[])
    if capacity:
        kw["expert_capacity"] = draw(st.integers(1, max(1, n * k)))
    elif draw(st.booleans()):
        lo = draw(st.integers(0, e - 1))
        kw["active_expert_range"] = [lo, draw(st.integers(lo + 1, e))]
    which = draw(st.sampled_from(("expert_idx", "active_num", "expert_num", "expert_capacity",
                                  "active_expert_range")))
    ei = torch.tensor(experts, dtype=torch.int32).reshape(n, k)
    if which == "expert_idx":
        ei = draw(mutated(experts if n else [[0] * k][:0], 0, e))
    elif which == "active_expert_range":
        kw[which] = draw(st.lists(_size_arg(0, e), max_size=3))
    else:
        kw[which] = draw(_size_arg(0, max(e, n * k)))

    def model():
        v = ints(ei, "expert_idx")
        if ei.dim() not in (1, 2) or ei.shape[0] != n:
            raise Invalid("expert_idx shape")
        rng, en, cap = kw["active_expert_range"], kw["expert_num"], kw["expert_capacity"]
        if any(not INT64_MIN <= a <= INT64_MAX for a in rng + [kw["active_num"], en, cap]):
            raise Invalid("an int argument beyond int64")
        if capacity and rng == [0, en]:
            rng = []  # every expert: the one range capacity mode takes (torch_npu's documentation), as no range
        if rng and (len(rng) != 2 or not 0 <= rng[0] < rng[1] or capacity):
            raise Invalid(f"active_expert_range {rng}")
        if capacity and (en <= 0 or cap <= 0):
            raise Invalid("capacity mode needs expert_num > 0 and expert_capacity > 0")
        lo, hi = (rng[0], rng[1]) if rng else (0, en if en > 0 else None)
        if hi is not None and (hi - lo + 1) * 8 > 2**36:
            raise Invalid("a counter per expert beyond memory")
        if capacity and en * cap * (h + 1) * 8 > 2**36:
            raise Invalid("a capacity output beyond memory")
        flat = v.reshape(-1).tolist()
        for f in flat:
            if not ((hi is None and 0 <= f < 2**24) or (hi is not None and (lo <= f < hi or (rng and f >= 0)))):
                raise Invalid(f"expert_idx entry {f}")
        if kw["expert_tokens_num_flag"] and hi is None:
            raise Invalid("expert_tokens_num_flag needs expert_num or active_expert_range")
        return moe_ref.init_routing_v2(x, v, **dict(kw, active_expert_range=rng))

    def compare(got, want):
        for name, g, w in zip(("expanded_x", "expanded_row_idx", "tokens", "expanded_scale"), got, want):
            assert g.shape == w.shape and torch.equal(g, w.to(g.dtype)), name

    call = lambda: tot.npu_moe_init_routing_v2(x, ei, **kw)  # noqa: E731
    expect(call, ["expert_idx", "active_num", "expert_num", "expert_capacity", "active_expert_range"], model, compare)


@settings(max_examples=examples(75))
@given(data=st.data(), seed=seeds)
def test_finalize_routing_destinations_and_experts(data, seed):
    draw = data.draw
    gen = generator(seed)
    n, k, e, h, x, experts = _routing_inputs(draw, gen)
    rows = draw(st.integers(1, n * k + 2))  # moe_reference.finalize indexes the rows, so at least one
    dst = (permutation(gen, max(rows, n * k))[:n * k] - (max(rows, n * k) - rows)).clamp(min=-1).tolist()
    expanded = randn(gen, (rows, h))
    scales, bias, skip = randn(gen, (n, k)), randn(gen, (e, h)), randn(gen, (n, h))
    mode = draw(st.sampled_from((0, 2)))
    which = draw(st.sampled_from(("expanded_src_to_dst_row", "export_for_source_row")))
    d = draw(mutated(dst, -1, rows)) if which == "expanded_src_to_dst_row" else torch.tensor(dst)
    ex = draw(mutated(experts, 0, e)) if which == "export_for_source_row" else torch.tensor(experts).reshape(n, k)

    def model():
        r, xe = ints(d, "expanded_src_to_dst_row"), ints(ex, "export_for_source_row")
        if d.dim() != 1 or d.numel() != n * k:
            raise Invalid("expanded_src_to_dst_row shape")  # scales fix N and k
        # every drop_pad_mode only reads rows through it: repeated rows are valid, each pair adds its row; these
        # dropless modes also take sorted positions past the rows (nothing added)
        if any(not 0 <= v < max(rows, n * k) for v in r.tolist() if v != -1):
            raise Invalid("expanded_src_to_dst_row entries")
        if ex.shape != (n, k) or (xe.numel() and not (0 <= int(xe.min()) and int(xe.max()) < e)):
            raise Invalid("export_for_source_row")
        return (moe_ref.finalize(expanded, skip, None, bias, scales, r, xe, mode),
                moe_ref.finalize(expanded, skip, None, bias, scales, r, xe, mode, dtype=torch.float32))

    expect(lambda: OPS.moe_finalize_routing(expanded, skip, None, bias, scales, d, ex, mode),
           # a length that does not fit the [N, k] of scales is reported as a bad 'scales' shape
           ["expanded_src_to_dst_row", "export_for_source_row", "scales"], model,
           lambda got, want: check_tolerance("finalize", got, *want))


@settings(max_examples=examples(75))
@given(data=st.data(), seed=seeds)
def test_token_permute_indices_and_unpermute_sorted_indices(data, seed):
    draw = data.draw
    gen = generator(seed)
    n, k, e, h, x, experts = _routing_inputs(draw, gen)
    if draw(st.booleans()):
        idx = draw(mutated(experts if n else [[0] * k][:0], 0, e))

        def model():
            v = ints(idx, "indices")
            if idx.dim() not in (1, 2) or idx.shape[0] != n or (idx.dim() == 2 and idx.shape[1] > 1024):
                raise Invalid("indices shape")
            if v.numel() and not (0 <= int(v.min()) and int(v.max()) < 2**24):
                raise Invalid("indices entries")
            return moe_ref.token_permute(x, v)

        def compare(got, want):
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

        expect(lambda: OPS.moe_token_permute(x, idx, None, False), ["indices"], model, compare)
        return
    permuted = randn(gen, (draw(st.integers(0, n * k)), h))
    probs = randn(gen, (n, k)).abs()
    si = draw(mutated(permutation(gen, n * k).tolist(), 0, n * k))

    def model():
        v = ints(si, "sorted_indices")
        if si.dim() != 1 or si.numel() != n * k:
            raise Invalid("sorted_indices shape")
        rows = [r for r in v.tolist() if r != -1]  # -1: a pair routed nowhere (docs/moe.md), it adds nothing
        if any(not 0 <= r < n * k for r in rows) or len(set(rows)) != len(rows):
            raise Invalid("sorted_indices entries: -1 or distinct rows in [0, N*topk)")
        if n == 0 or permuted.shape[0] == 0:  # no pairs, or every pair dropped (moe_reference needs rows)
            return torch.zeros(n, h, dtype=torch.float64), torch.zeros(n, h)
        return (moe_ref.token_unpermute(permuted, v, probs),
                moe_ref.token_unpermute(permuted, v, probs, dtype=torch.float32))

    expect(lambda: OPS.moe_token_unpermute(permuted, si, probs, False, None), ["sorted_indices"], model,
           lambda got, want: check_tolerance("unpermute", got, *want))


@settings(max_examples=examples(60))
@given(data=st.data(), seed=seeds)
def test_init_routing_v2_grad_expanded_row_idx(data, seed):
    draw = data.draw
    gen = generator(seed)
    n, k, e, h, x, experts = _routing_inputs(draw, gen)
    ei = torch.tensor(experts, dtype=torch.int32).reshape(n, k)
    row_idx_type = draw(st.integers(0, 1))
    rows = draw(st.integers(0, n * k + (1 if row_idx_type == 0 else 0)))
    grad = randn(gen, (rows, h))
    valid = (permutation(gen, max(rows, n * k))[:n * k] - (max(rows, n * k) - rows)).clamp(min=-1)
    if row_idx_type == 1:  # scatter form: per gradient row, the pair copied there (-1 = none)
        scatter = torch.full((n * k,), -1, dtype=torch.long)
        for f, r in enumerate(valid.tolist()):
            if r >= 0:
                scatter[r] = f
        valid = scatter
    idx = draw(mutated(valid.tolist(), -1, max(rows, n * k)))

    def model():
        v = ints(idx, "expanded_row_idx").reshape(-1).tolist()
        if idx.numel() != n * k:
            raise Invalid("expanded_row_idx size")
        if row_idx_type == 1:  # a partial permutation of the pairs; positions past the rows carry no gradient
            dest, seen = [-1] * (n * k), set()
            for p, f in enumerate(v):
                if f == -1:
                    continue
                if not 0 <= f < n * k or f in seen:
                    raise Invalid("scatter entries")
                seen.add(f)
                dest[f] = p if p < rows else -1
        else:  # a row, a sorted position past the rows (no gradient) or -1; distinct
            real = [r for r in v if r != -1]
            if any(not 0 <= r < max(rows, n * k) for r in real) or len(set(real)) != len(real):
                raise Invalid("destinations")
            dest = [r if r < rows else -1 for r in v]
        out = torch.zeros(n, h, dtype=torch.float64)
        for f, r in enumerate(dest):
            if r >= 0:
                out[f // k] += grad[r].double()
        return out

    expect(lambda: OPS.moe_init_routing_v2_grad(grad, idx, x, ei, row_idx_type=row_idx_type), ["expanded_row_idx"],
           model, lambda got, want: torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5))


# num_expert sizes the output and a histogram: num_expert >= 2^40 raises MemoryError (std::bad_alloc) and 2^62 a
# ValueError without the argument's name, so the strategy keeps it small.
@settings(max_examples=examples(45))
@given(data=st.data(), seed=seeds)
def test_compute_expert_tokens(data, seed):
    draw = data.draw
    num_expert = draw(st.integers(-1, 6))
    values = sorted(draw(st.lists(st.integers(0, max(num_expert - 1, 0)), max_size=8)))
    t = draw(mutated(values, 0, max(num_expert, 1)))

    def model():
        v = ints(t, "sorted_expert_for_source_row")
        if t.dim() != 1 or num_expert <= 0:
            raise Invalid("shape or num_expert")
        if v.numel() and int(v.min()) < 0:
            raise Invalid("entries")  # indices >= num_expert (finished rows) are counted by no expert
        return torch.tensor([sum(1 for x in v.tolist() if x <= e) for e in range(num_expert)], dtype=torch.int32)

    def compare(got, want):
        assert torch.equal(got, want), (got, want)

    expect(lambda: OPS.moe_compute_expert_tokens(t, num_expert), ["sorted_expert_for_source_row", "num_expert"],
           model, compare)


# ---- grouped_matmul: group_list -----------------------------------------------------------------------------------
# group_list_type 1 sums the counts overflow-checked: counts such as [2^63-1, 2^63-1, 4], whose int64 sum would wrap
# back to the row count, are an error naming group_list.
@settings(max_examples=examples(75))
@given(data=st.data(), seed=seeds)
def test_grouped_matmul_group_list(data, seed):
    draw = data.draw
    gen = generator(seed)
    groups, k, n = draw(st.integers(1, 4)), 4, 3
    counts = draw(st.lists(st.integers(0, 4), min_size=groups, max_size=groups))
    list_type, group_type = draw(st.integers(0, 1)), draw(st.sampled_from((0, 2)))
    valid = counts if list_type == 1 else torch.tensor(counts).cumsum(0).tolist()
    total = sum(counts)
    gl = draw(mutated(valid, 0, total))
    if group_type == 0:
        x, w = randn(gen, (total, k)), randn(gen, (groups, k, n))
    else:
        x, w = randn(gen, (5, total)), randn(gen, (total, n))

    def model():
        v = ints(gl, "group_list")
        # split-M takes one entry per weight; split-K (group type 2) has as many groups as group_list has entries
        if gl.dim() != 1 or (group_type == 0 and gl.numel() != groups):
            raise Invalid("group_list shape")
        v = v.tolist()
        if not v:
            if total:
                raise Invalid("no groups for a non-empty K")
            return torch.zeros(0, 5, n, dtype=torch.float64), torch.zeros(0, 5, n)
        if list_type == 0:
            if any(a < b for a, b in zip(v, [0] + v[:-1])) or v[-1] != total:
                raise Invalid("cumulative ends")
            c = [a - b for a, b in zip(v, [0] + v[:-1])]
        else:
            if any(a < 0 for a in v) or sum(v) != total:
                raise Invalid("counts")
            c = v
        if group_type == 0:
            return split_m_ref(x, w, None, c, 0, torch.float64), split_m_ref(x, w, None, c, 0, torch.float32)
        outs, k0 = [], 0
        for cnt in c:
            outs.append(x[:, k0:k0 + cnt].double() @ w[k0:k0 + cnt].double())
            k0 += cnt
        return torch.stack(outs), torch.stack(outs).float()

    def compare(got, want):
        check_tolerance("grouped_matmul", got[0][0], *want)

    expect(lambda: OPS.grouped_matmul([x], [w], [], gl, group_type, list_type, 0), ["group_list"], model, compare)


# ---- the Python wrappers: lengths, paddings, group lists and cumulative lengths as Python values ----------------
PY_EDGES = EDGES + (2**63, 2**64 + 5, -2**63 - 1, True, False, 1.0, "2", None)


@st.composite
def python_ints(draw, valid, lo: int, hi: int):
    """A list of ints as a caller might pass it: unchanged, one int, a tuple, or with an entry replaced by an edge
    value (beyond int64, a bool, a float, a string), shortened or lengthened."""
    v = list(valid)
    kind = draw(st.sampled_from(("keep", "int", "tuple", "entry", "entry", "drop", "append")))
    if kind == "int" and len(v) == 1:
        return v[0]
    if kind == "tuple":
        return tuple(v)
    if kind == "entry" and v:
        v[draw(st.integers(0, len(v) - 1))] = draw(st.one_of(st.integers(lo - 2, hi + 2), st.sampled_from(PY_EDGES)))
    elif kind == "drop" and v:
        v.pop()
    elif kind == "append":
        v.append(draw(st.integers(lo, hi)))
    return v


def _py_list(value, name):
    """The model of the wrappers' conversion: an int or a list/tuple of ints (not bools) within int64."""
    values = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(values, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool)
                                                        for x in values):
        raise Invalid(f"{name} = {value!r} is not a list of ints")
    if any(not INT64_MIN <= x <= INT64_MAX for x in values):
        raise Invalid(f"{name} = {value!r} beyond int64")
    return torch.tensor(values, dtype=torch.int64)


@settings(max_examples=examples(90))
@given(data=st.data(), seed=seeds)
def test_wrappers_take_python_ints(data, seed):
    draw = data.draw
    gen = generator(seed)
    target = draw(st.sampled_from(("decode_lengths", "decode_padding", "group_list", "cu_seqlens")))
    if target.startswith("decode"):
        batch, s = draw(st.integers(1, 3)), draw(st.integers(1, 12))
        c = decode_cases.Case(layout="BSH", batch=batch, q_heads=2, kv_heads=1, head_dim=8, kv_len=s,
                              lens=draw(per_batch_lengths(batch, s)))
        inp = decode_cases.build(c, seed=seed % 2**16)
        q, key, value = inp.args[:3]
        lens, pad = list(c.lens), None
        if target == "decode_lengths":
            lens = draw(python_ints(lens, 0, s))
        else:
            pad = draw(st.one_of(st.integers(-2, s + 2), st.sampled_from(PY_EDGES)))
        name = "actual_seq_lengths" if target == "decode_lengths" else "kv_padding_size"

        def model():
            seq = _lengths(_py_list(lens, "actual_seq_lengths"), "actual_seq_lengths", batch, s, one_d=True)
            starts = [0] * batch
            if pad is not None:
                p = int(_py_list(pad, "kv_padding_size")[0])
                if isinstance(pad, (list, tuple)) or p < 0 or any(p + L > s for L in seq):
                    raise Invalid(f"kv_padding_size {pad!r}")
                starts = [s - p - L for L in seq]
            return _decode_reference(inp, c, inp.k, inp.v, starts, seq)

        call = lambda: tot.npu_incre_flash_attention(q, key, value, actual_seq_lengths=lens,  # noqa: E731
                                                     kv_padding_size=pad, num_heads=2, num_key_value_heads=1,
                                                     scale_value=c.scale, input_layout="BSH")
        expect(call, [name], model, _decode_compare(c))
    elif target == "group_list":
        counts = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
        x, w = randn(gen, (sum(counts), 4)), randn(gen, (len(counts), 4, 3))
        gl = draw(python_ints(torch.tensor(counts).cumsum(0).tolist(), 0, sum(counts)))

        def model():
            ends = _cumulative(_py_list(gl, "group_list"), "group_list", x.shape[0])
            if len(ends) != len(counts):
                raise Invalid("one entry per group")
            c = [a - b for a, b in zip(ends, [0] + ends[:-1])]
            return split_m_ref(x, w, None, c, 0, torch.float64), split_m_ref(x, w, None, c, 0, torch.float32)

        expect(lambda: tot.grouped_matmul(x, w, gl), ["group_list"], model,
               lambda got, want: check_tolerance("grouped_matmul", got, *want))
    else:
        b = draw(st.integers(1, 3))
        q_lens, kv_lens = draw(per_batch_lengths(b, 5)), draw(per_batch_lengths(b, 5))
        q, k, v = randn(gen, (sum(q_lens), 2, 8)), randn(gen, (sum(kv_lens), 2, 8)), randn(gen, (sum(kv_lens), 2, 8))
        which = draw(st.sampled_from(("cu_seqlens_q", "cu_seqlens_k")))
        cu = {"cu_seqlens_q": [0] + torch.tensor(q_lens).cumsum(0).tolist(),
              "cu_seqlens_k": [0] + torch.tensor(kv_lens).cumsum(0).tolist()}
        args = {n: torch.tensor(e) for n, e in cu.items()}
        args[which] = draw(mutated(cu[which], 0, q.shape[0] if which == "cu_seqlens_q" else k.shape[0]))

        def model():
            ends = {}
            for n, packed in (("cu_seqlens_q", q), ("cu_seqlens_k", k)):
                t = args[n]
                if t.dim() != 1 or t.numel() < 2:
                    raise Invalid(f"{n} shape")
                e = ints(t, n).tolist()
                if e[0] != 0:
                    raise Invalid(f"{n} does not start at 0")
                ends[n] = _cumulative(torch.tensor(e[1:]), n, packed.shape[0])
            if len(ends["cu_seqlens_q"]) != len(ends["cu_seqlens_k"]):
                raise Invalid("different numbers of sequences")
            return attention_reference(q, k, v, 2, "TND", actual_seq_qlen=ends["cu_seqlens_q"],
                                       actual_seq_kvlen=ends["cu_seqlens_k"], scale=8 ** -0.5)[0]

        expect(lambda: tot.flash_attn_varlen_func(q, k, v, args["cu_seqlens_q"], args["cu_seqlens_k"], 5, 5),
               [which], model, lambda got, want: torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=2e-5))
