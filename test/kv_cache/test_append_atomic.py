"""PagedKVCache.append is atomic: a call that fails validation leaves seq_lens, block tables and the free list
unchanged (and a later valid append works as if the failed call never happened)."""
import pytest
import torch

from torch_ops_transformer.kv_cache import PagedKVCache

pytestmark = pytest.mark.asan  # the whole module runs in the AddressSanitizer subset


def _state(cache, ids):
    return (cache.seq_lens(ids).tolist(), cache.block_table(ids).tolist(), list(cache._free),
            cache.num_free_blocks, cache.key_cache.clone(), cache.value_cache.clone())


def _assert_same(a, b):
    assert a[:4] == b[:4]
    assert torch.equal(a[4], b[4]) and torch.equal(a[5], b[5])


# (key shape, value shape, dtype, exception) with num_kv_heads=2, head_dim=4, v_head_dim=3, two sequences
BAD = [
    ((2, 2, 4), (2, 2, 4), torch.float32, ValueError),        # value row of head_dim instead of v_head_dim
    ((2, 2, 4), (2, 3, 3), torch.float32, ValueError),        # value with the wrong head count
    ((2, 3, 4), (2, 2, 3), torch.float32, ValueError),        # key with the wrong head count
    ((2, 5, 2, 4), (2, 4, 2, 3), torch.float32, ValueError),  # [B, S, ...] with mismatched S
    ((2, 5, 2, 4), (2, 5, 2, 4), torch.float32, ValueError),  # [B, S, ...] with a bad value row
    ((2, 2, 4), (3, 2, 3), torch.float32, ValueError),        # token count mismatch
    ((2, 2, 4), (2, 2, 3), torch.int32, TypeError),           # integer key/value
    ((2, 2, 4), (2, 2, 3), torch.bool, TypeError),
]


@pytest.mark.parametrize("layout", ["BSND", "BSH"])
@pytest.mark.parametrize("kshape,vshape,dtype,exc", BAD)
def test_failed_append_leaves_cache_unchanged(layout, kshape, vshape, dtype, exc):
    cache = PagedKVCache(num_blocks=6, block_size=4, num_kv_heads=2, head_dim=4, v_head_dim=3, layout=layout)
    ids = [cache.add_sequence(), cache.add_sequence()]
    # a first valid append: each sequence holds 4 tokens, i.e. a full block, so the next token needs a new block
    cache.append(ids, torch.randn(2, 4, 2, 4), torch.randn(2, 4, 2, 3))
    before = _state(cache, ids)
    with pytest.raises(exc, match=r"^PagedKVCache\.append"):
        cache.append(ids, torch.randn(kshape).to(dtype), torch.randn(vshape).to(dtype))
    _assert_same(_state(cache, ids), before)
    # the cache is still usable and behaves as if the failed call never happened
    k, v = torch.randn(2, 2, 4), torch.randn(2, 2, 3)
    slots = cache.append(ids, k, v)
    assert cache.seq_lens(ids).tolist() == [5, 5]
    assert [len(cache.blocks(i)) for i in ids] == [2, 2]
    assert slots.tolist() == [cache.blocks(ids[0])[1] * 4, cache.blocks(ids[1])[1] * 4]
    gk, gv = cache.gather(ids)
    assert torch.equal(gk[4].reshape(-1), k[0].reshape(-1)) and torch.equal(gv[9].reshape(-1), v[1].reshape(-1))


def test_failed_append_with_a_non_tensor_leaves_cache_unchanged():
    cache = PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=2)
    ids = [cache.add_sequence()]
    before = _state(cache, ids)
    with pytest.raises(TypeError, match=r"^PagedKVCache\.append: value"):
        cache.append(ids, torch.randn(1, 1, 2), [[1.0, 2.0]])
    _assert_same(_state(cache, ids), before)


def test_out_of_blocks_leaves_cache_unchanged():
    cache = PagedKVCache(num_blocks=2, block_size=2, num_kv_heads=1, head_dim=2)
    ids = [cache.add_sequence(), cache.add_sequence()]
    cache.append(ids, torch.randn(2, 2, 1, 2), torch.randn(2, 2, 1, 2))
    before = _state(cache, ids)
    with pytest.raises(RuntimeError, match="out of blocks"):
        cache.append(ids, torch.randn(2, 1, 2), torch.randn(2, 1, 2))
    _assert_same(_state(cache, ids), before)
