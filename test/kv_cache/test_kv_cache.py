"""Paged KV cache helpers: scatter/gather round trips with shuffled blocks and -1 slots, PagedKVCache bookkeeping
(append, free, block reuse, out of blocks), bad inputs, torch.compile."""
import pytest
import torch

import torch_ops_transformer as tot

OPS = torch.ops.npu_fa


def paged_from_dense(k, v, lens, block_size, num_blocks, flat=False, dtype=None):
    """Scatter dense per-sequence K/V ([B, S, N2, D]) into a cache with randomly shuffled blocks."""
    B, S, N2, D = k.shape
    Dv = v.shape[-1]
    perm = torch.randperm(num_blocks)
    max_blocks = (S + block_size - 1) // block_size
    table = torch.zeros(B, max_blocks, dtype=torch.int32)
    used = 0
    slots, keys, vals = [], [], []
    for b in range(B):
        nblk = (lens[b] + block_size - 1) // block_size
        table[b, :nblk] = perm[used:used + nblk].int()
        used += nblk
        for t in range(lens[b]):
            slots.append(int(table[b, t // block_size]) * block_size + t % block_size)
            keys.append(k[b, t])
            vals.append(v[b, t])
    kshape = (num_blocks, block_size, N2 * D) if flat else (num_blocks, block_size, N2, D)
    vshape = (num_blocks, block_size, N2 * Dv) if flat else (num_blocks, block_size, N2, Dv)
    kc = torch.full(kshape, float("nan"), dtype=k.dtype)
    vc = torch.full(vshape, float("nan"), dtype=v.dtype)
    # Interleave padding tokens (-1) with the real ones and shuffle the token order.
    keys = torch.stack(keys + [torch.randn(N2, D).to(k.dtype)] * 3)
    vals = torch.stack(vals + [torch.randn(N2, Dv).to(v.dtype)] * 3)
    slots = torch.tensor(slots + [-1] * 3)
    order = torch.randperm(len(slots))
    OPS.scatter_pa_kv_cache(keys[order], vals[order], kc, vc, slots[order])
    return kc, vc, table


@pytest.mark.asan
@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_scatter_gather_roundtrip(flat, dtype):
    B, S, N2, D, Dv, bs = 3, 40, 2, 8, 4, 16
    lens = [40, 1, 17]
    k, v = torch.randn(B, S, N2, D).to(dtype), torch.randn(B, S, N2, Dv).to(dtype)
    kc, vc, table = paged_from_dense(k, v, lens, bs, num_blocks=9, flat=flat)
    K, V = OPS.gather_pa_kv_cache(kc, vc, table, torch.tensor(lens))
    assert K.shape == ((sum(lens), N2 * D) if flat else (sum(lens), N2, D)) and K.dtype == dtype
    ref_k = torch.cat([k[b, :lens[b]] for b in range(B)])
    ref_v = torch.cat([v[b, :lens[b]] for b in range(B)])
    assert torch.equal(K.reshape(ref_k.shape), ref_k) and torch.equal(V.reshape(ref_v.shape), ref_v)


@pytest.mark.asan
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_major_cache_layout(dtype):
    """cache_layout "BNSD" stores (num_blocks, N2, block_size, D): the same slots as the token-major cache with the
    head and token axes swapped; gather packs it back to [T, N2, D] and decode attention reads it."""
    B, S, N2, N1, D, bs = 3, 40, 2, 4, 16, 16
    lens = [40, 1, 17]
    k, v = torch.randn(B, S, N2, D).to(dtype), torch.randn(B, S, N2, D).to(dtype)
    kc, vc, table = paged_from_dense(k, v, lens, bs, num_blocks=9)
    slots = torch.tensor([int(table[b, t // bs]) * bs + t % bs for b in range(B) for t in range(lens[b])])
    tokens_k = torch.cat([k[b, :lens[b]] for b in range(B)])
    tokens_v = torch.cat([v[b, :lens[b]] for b in range(B)])
    hk, hv = torch.zeros(9, N2, bs, D, dtype=dtype), torch.zeros(9, N2, bs, D, dtype=dtype)
    OPS.scatter_pa_kv_cache(tokens_k, tokens_v, hk, hv, slots, cache_layout="BNSD")
    used = table[0, :2].long()  # two full blocks of the 40-token sequence (the third is partly NaN in kc)
    assert torch.equal(hk[used], kc[used].transpose(1, 2))
    K, V = OPS.gather_pa_kv_cache(hk, hv, table, torch.tensor(lens), cache_layout="BNSD")
    assert torch.equal(K, tokens_k) and torch.equal(V, tokens_v)
    q = torch.randn(B, N1, 1, D).to(dtype)
    kw = dict(block_table=table, actual_seq_lengths=lens, block_size=bs, num_heads=N1, num_key_value_heads=N2,
              scale_value=D ** -0.5)
    head_major = tot.npu_incre_flash_attention(q, hk, hv, input_layout="BNSD", **kw)
    token_major = tot.npu_incre_flash_attention(q.transpose(1, 2), kc, vc, input_layout="BSND", **kw)
    torch.testing.assert_close(head_major.transpose(1, 2), token_major)


@pytest.mark.asan
def test_unknown_cache_layout_is_rejected():
    with pytest.raises(ValueError, match="cache_layout"):
        OPS.gather_pa_kv_cache(torch.zeros(2, 16, 2, 8), torch.zeros(2, 16, 2, 8), torch.zeros(1, 1, dtype=torch.int32),
                               torch.tensor([3]), cache_layout="NBSD")


@pytest.mark.asan
def test_scatter_skips_padding_and_touches_only_its_slots():
    kc, vc = torch.zeros(4, 16, 2, 8), torch.zeros(4, 16, 2, 8)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    ret = OPS.scatter_pa_kv_cache(key, value, kc, vc, torch.tensor([17, -1, 3]))
    assert ret is None
    assert torch.equal(kc[1, 1], key[0]) and torch.equal(kc[0, 3], key[2]) and torch.equal(vc[1, 1], value[0])
    assert int((kc != 0).any(-1).any(-1).sum()) == 2  # exactly two token rows written


@pytest.mark.asan
def test_gather_ignores_table_padding_and_int32_lens():
    kc, vc = torch.randn(4, 16, 2, 8), torch.randn(4, 16, 2, 8)
    table = torch.tensor([[3, 99, -5]], dtype=torch.int32)  # entries past the sequence's blocks are ignored
    K, V = OPS.gather_pa_kv_cache(kc, vc, table, torch.tensor([10], dtype=torch.int32))
    assert torch.equal(K, kc[3, :10]) and torch.equal(V, vc[3, :10])


@pytest.mark.asan
def test_gather_empty():
    kc, vc = torch.randn(2, 16, 2, 8), torch.randn(2, 16, 2, 8)
    K, V = OPS.gather_pa_kv_cache(kc, vc, torch.zeros(2, 1, dtype=torch.int32), torch.tensor([0, 0]))
    assert K.shape == (0, 2, 8) and V.shape == (0, 2, 8)


# ---- PagedKVCache -----------------------------------------------------------------------------------------------
@pytest.mark.asan
@pytest.mark.parametrize("layout", ["BSND", "BSH"])
def test_paged_cache_append_gather(layout):
    cache = tot.PagedKVCache(num_blocks=8, block_size=16, num_kv_heads=2, head_dim=8, layout=layout)
    ids = [cache.add_sequence() for _ in range(3)]
    dense_k = {i: [] for i in ids}
    dense_v = {i: [] for i in ids}
    # Prefill: 20 tokens for every sequence at once ([B, S, N2, D]).
    k, v = torch.randn(3, 20, 2, 8), torch.randn(3, 20, 2, 8)
    cache.append(ids, k, v)
    for b, i in enumerate(ids):
        dense_k[i] += list(k[b])
        dense_v[i] += list(v[b])
    # Decode steps: one token for a subset, with a repeated id.
    for step in range(14):
        sel = [ids[0], ids[2]] if step % 2 else [ids[1], ids[1]]
        k, v = torch.randn(2, 2, 8), torch.randn(2, 2, 8)
        cache.append(sel, k, v)
        for t, i in enumerate(sel):
            dense_k[i].append(k[t])
            dense_v[i].append(v[t])
    lens = cache.seq_lens(ids)
    assert lens.dtype == torch.int64 and lens.tolist() == [len(dense_k[i]) for i in ids]
    table = cache.block_table(ids)
    assert table.dtype == torch.int32 and table.shape == (3, max((n + 15) // 16 for n in lens.tolist()))
    K, V = cache.gather(ids)
    ref_k = torch.stack([t for i in ids for t in dense_k[i]])
    ref_v = torch.stack([t for i in ids for t in dense_v[i]])
    assert torch.equal(K.reshape(ref_k.shape), ref_k) and torch.equal(V.reshape(ref_v.shape), ref_v)


@pytest.mark.asan
def test_paged_cache_free_reuses_blocks_and_pads_with_zero():
    cache = tot.PagedKVCache(num_blocks=4, block_size=16, num_kv_heads=1, head_dim=4)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.append([a], torch.randn(1, 33, 1, 4), torch.randn(1, 33, 1, 4))  # 3 blocks
    cache.append([b], torch.randn(1, 1, 4), torch.randn(1, 1, 4))          # 1 block
    assert cache.num_free_blocks == 0
    a_blocks = cache.blocks(a)
    table = cache.block_table([b, a])
    assert table[0].tolist() == [cache.blocks(b)[0], 0, 0] and table[1].tolist() == a_blocks
    cache.free(a)
    assert cache.num_free_blocks == 3
    c = cache.add_sequence()
    k = torch.randn(1, 40, 1, 4)
    cache.append([c], k, k)
    assert sorted(cache.blocks(c)) == sorted(a_blocks)  # freed blocks are reused
    K, _ = cache.gather([c])
    assert torch.equal(K, k[0])
    with pytest.raises(KeyError, match="unknown"):
        cache.seq_lens([a])


@pytest.mark.asan
def test_paged_cache_out_of_blocks_leaves_cache_unchanged():
    cache = tot.PagedKVCache(num_blocks=2, block_size=16, num_kv_heads=1, head_dim=4)
    a = cache.add_sequence()
    cache.append([a], torch.randn(1, 20, 1, 4), torch.randn(1, 20, 1, 4))
    before = cache.key_cache.clone()
    with pytest.raises(RuntimeError, match="out of blocks"):
        cache.append([a], torch.randn(1, 13, 1, 4), torch.randn(1, 13, 1, 4))
    assert cache.seq_lens([a]).tolist() == [20] and torch.equal(cache.key_cache, before, )


# ---- bad inputs: one test per rule ------------------------------------------------------------------------------
def _caches(shape=(4, 16, 2, 8), dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


@pytest.mark.asan
def test_bad_slot_out_of_range():
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match=r"slot_mapping\[1\] = 64 is out of range"):
        OPS.scatter_pa_kv_cache(torch.randn(2, 2, 8), torch.randn(2, 2, 8), kc, vc, torch.tensor([0, 64]))
    with pytest.raises(RuntimeError, match="out of range"):
        OPS.scatter_pa_kv_cache(torch.randn(2, 2, 8), torch.randn(2, 2, 8), kc, vc, torch.tensor([0, -2]))


@pytest.mark.asan
def test_bad_scatter_dtype_mismatch():
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match="must have the same dtype"):
        OPS.scatter_pa_kv_cache(torch.randn(2, 2, 8).half(), torch.randn(2, 2, 8), kc, vc, torch.tensor([0, 1]))


@pytest.mark.asan
def test_bad_scatter_shape_mismatch():
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match="values per token"):
        OPS.scatter_pa_kv_cache(torch.randn(2, 3, 8), torch.randn(2, 2, 8), kc, vc, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="T = slot_mapping.numel"):
        OPS.scatter_pa_kv_cache(torch.randn(3, 2, 8), torch.randn(3, 2, 8), kc, vc, torch.tensor([0, 1]))


@pytest.mark.asan
def test_bad_slot_mapping_dtype():
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match="slot_mapping must be int64 or int32"):
        OPS.scatter_pa_kv_cache(torch.randn(2, 2, 8), torch.randn(2, 2, 8), kc, vc, torch.tensor([0.0, 1.0]))


@pytest.mark.asan
def test_bad_block_table_entry_out_of_range():
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match=r"block_table\[0, 1\] = 4 is out of range"):
        OPS.gather_pa_kv_cache(kc, vc, torch.tensor([[0, 4]], dtype=torch.int32), torch.tensor([20]))


@pytest.mark.asan
def test_bad_seq_lens_beyond_table():
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match=r"seq_lens\[0\] = 33 must lie in \[0, max_blocks\*block_size = 32\]"):
        OPS.gather_pa_kv_cache(kc, vc, torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([33]))


@pytest.mark.asan
def test_bad_cache_rank():
    with pytest.raises(RuntimeError, match="must be \\(num_blocks, block_size, N2, D\\)"):
        OPS.gather_pa_kv_cache(torch.zeros(4, 16), torch.zeros(4, 16), torch.zeros(1, 1, dtype=torch.int32),
                               torch.tensor([1]))


@pytest.mark.asan
def test_bad_cache_geometry_mismatch():
    with pytest.raises(RuntimeError, match="must share \\(num_blocks, block_size\\)"):
        OPS.gather_pa_kv_cache(torch.zeros(4, 16, 2, 8), torch.zeros(4, 32, 2, 8),
                               torch.zeros(1, 1, dtype=torch.int32), torch.tensor([1]))


# ---- torch.compile ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_compile_fullgraph_scatter(dynamo_reset):
    def f(k, v, kc, vc, slots):
        OPS.scatter_pa_kv_cache(k * 2, v, kc, vc, slots)
        return kc.sum()

    kc, vc = _caches()
    kc2, vc2 = _caches()
    k, v, slots = torch.randn(3, 2, 8), torch.randn(3, 2, 8), torch.tensor([5, -1, 40])
    out = torch.compile(f, fullgraph=True)(k, v, kc, vc, slots)
    ref = f(k, v, kc2, vc2, slots)
    torch.testing.assert_close(out, ref)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


@pytest.mark.slow
def test_compile_fullgraph_gather(dynamo_reset, monkeypatch):
    monkeypatch.setattr(torch._dynamo.config, "capture_dynamic_output_shape_ops", True)
    kc, vc = torch.randn(4, 16, 2, 8), torch.randn(4, 16, 2, 8)
    table, lens = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32), torch.tensor([20, 5])

    def f(kc, vc, table, lens):
        k, v = OPS.gather_pa_kv_cache(kc, vc, table, lens)
        return k * 2, v

    for a, b in zip(torch.compile(f, fullgraph=True)(kc, vc, table, lens), f(kc, vc, table, lens)):
        torch.testing.assert_close(a, b)


@pytest.mark.asan
def test_bad_duplicate_slot():
    kc, vc = _caches()
    with pytest.raises(RuntimeError, match="slot 5 appears more than once"):
        OPS.scatter_pa_kv_cache(torch.randn(3, 2, 8), torch.randn(3, 2, 8), kc, vc, torch.tensor([5, -1, 5]))
