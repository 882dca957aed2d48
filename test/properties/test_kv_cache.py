"""scatter_pa_kv_cache / gather_pa_kv_cache round trips on random paged caches: the three cache layouts
((num_blocks, block_size, N2, D), (num_blocks, block_size, N2*D), head-major (num_blocks, N2, block_size, D)), any
block size, a value head dim of its own, sequences (lengths 0 included) on randomly permuted physical blocks with
spare blocks, block-table entries past a sequence's blocks holding junk, int32/int64 indices, float and integer
dtypes, tokens written in random order with -1 padding slots. Scatter writes exactly the mapped slots (every other
byte of the cache is untouched); gather returns exactly the tokens, sequence after sequence."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test.properties.strategies import examples, generator, per_batch_lengths, permutation, randint, seeds

OPS = torch.ops.npu_fa
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int8)


@st.composite
def paged_caches(draw):
    batch, block = draw(st.integers(1, 3)), draw(st.integers(1, 20))
    max_blocks = draw(st.integers(1, 4))
    return dict(layout=draw(st.sampled_from(("BSND", "BSH", "BNSD"))), batch=batch, block=block,
                max_blocks=max_blocks, lens=draw(per_batch_lengths(batch, max_blocks * block)),
                spare=draw(st.integers(0, 3)), heads=draw(st.integers(1, 3)), dk=draw(st.integers(1, 8)),
                dv=draw(st.integers(1, 8)), dtype=draw(st.sampled_from(DTYPES)), padding=draw(st.integers(0, 3)),
                flat_tokens=draw(st.booleans()), index_dtype=draw(st.sampled_from((torch.int32, torch.int64))),
                seed=draw(seeds))


def _cache_shape(layout, num_blocks, block, heads, d):
    return {"BSND": (num_blocks, block, heads, d), "BSH": (num_blocks, block, heads * d),
            "BNSD": (num_blocks, heads, block, d)}[layout]


def _slot_rows(cache: torch.Tensor, layout: str, block: int) -> torch.Tensor:
    """A copy of the cache as [num_slots, N2, D]-like rows (slot = block_id * block_size + offset)."""
    row = cache.shape[1] * cache.shape[3] if layout == "BNSD" else cache.shape[2:].numel()
    if layout == "BNSD":
        cache = cache.transpose(1, 2)
    return cache.reshape(cache.shape[0] * block, row)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)  # bit-exact comparisons, NaN sentinels included


def _random(gen, shape, dtype):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-100, 100, shape, generator=gen).to(dtype)


@settings(max_examples=examples(150))
@given(c=paged_caches())
def test_scatter_then_gather_round_trip(c):
    gen = generator(c["seed"])
    B, bs, M, lens, layout = c["batch"], c["block"], c["max_blocks"], c["lens"], c["layout"]
    used = [(L + bs - 1) // bs for L in lens]
    num_blocks = sum(used) + c["spare"]
    phys = permutation(gen, num_blocks) if num_blocks else torch.zeros(0, dtype=torch.long)
    table = randint(gen, -7, num_blocks + 9, (B, M))  # junk past each sequence's blocks: never read
    start = 0
    for b in range(B):
        table[b, :used[b]] = phys[start:start + used[b]]
        start += used[b]
    table = table.to(c["index_dtype"])
    slots = torch.tensor([int(table[b, t // bs]) * bs + t % bs for b in range(B) for t in range(lens[b])] +
                         [-1] * c["padding"], dtype=torch.long)
    T = slots.numel()
    h, dk, dv, dt = c["heads"], c["dk"], c["dv"], c["dtype"]
    keys, values = _random(gen, (T, h, dk), dt), _random(gen, (T, h, dv), dt)
    order = permutation(gen, T)
    k_in, v_in, s_in = keys[order], values[order], slots[order].to(c["index_dtype"])
    if c["flat_tokens"]:
        k_in, v_in = k_in.flatten(1), v_in.flatten(1)
    sentinel = float("nan") if dt.is_floating_point else 77
    kc = torch.full(_cache_shape(layout, num_blocks, bs, h, dk), sentinel, dtype=dt)
    vc = torch.full(_cache_shape(layout, num_blocks, bs, h, dv), sentinel, dtype=dt)
    want_k, want_v = _slot_rows(kc, layout, bs).clone(), _slot_rows(vc, layout, bs).clone()
    real = slots >= 0
    want_k[slots[real]] = keys[real].flatten(1)
    want_v[slots[real]] = values[real].flatten(1)
    cache_layout = "BNSD" if layout == "BNSD" else "BSND"
    assert OPS.scatter_pa_kv_cache(k_in, v_in, kc, vc, s_in, cache_layout=cache_layout) is None
    assert torch.equal(_bits(_slot_rows(kc, layout, bs)), _bits(want_k)), "key cache: wrong or extra slots written"
    assert torch.equal(_bits(_slot_rows(vc, layout, bs)), _bits(want_v)), "value cache: wrong or extra slots written"
    seq_lens = torch.tensor(lens, dtype=c["index_dtype"])
    K, V = OPS.gather_pa_kv_cache(kc, vc, table, seq_lens, cache_layout=cache_layout)
    n = sum(lens)
    tail_k = (h, dk) if layout != "BSH" else (h * dk,)
    tail_v = (h, dv) if layout != "BSH" else (h * dv,)
    assert K.shape == (n,) + tail_k and V.shape == (n,) + tail_v and K.dtype == dt
    assert torch.equal(_bits(K), _bits(keys[:n].reshape(K.shape))), "gathered keys differ from the tokens written"
    assert torch.equal(_bits(V), _bits(values[:n].reshape(V.shape))), "gathered values differ from the tokens written"
