"""torch_npu's npu_gather_pa_kv_cache (+ _functional) and npu_scatter_nd_update(_) against plain-PyTorch references
written from upstream's definitions: the gather reads block_tables[b, seq_offset[b] // block_size + j // block_size]
row j % block_size for token j of sequence b (rows of zeros for block ids outside the cache or past the table),
into the caller's key/value; the scatter replaces the slices its index rows address (the last of repeated ones)."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.doc_examples import run_examples
from test.common.tiers import pairwise

OPS = torch.ops.npu_fa


def ref_gather(key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset=None, cumsum=False):
    key, value = key.clone(), value.clone()
    nb, bs = key_cache.shape[:2]
    lens = seq_lens.tolist()
    if cumsum:
        lens = [b - a for a, b in zip(lens[:-1], lens[1:])]
    row = 0
    for b, n in enumerate(lens):
        start = 0 if seq_offset is None else int(seq_offset[b]) // bs
        for j in range(n):
            if row >= key.shape[0]:
                return key, value
            idx = start + j // bs
            blk = int(block_tables[b, idx]) if idx < block_tables.shape[1] else -1
            if 0 <= blk < nb:
                key[row] = key_cache[blk, j % bs].reshape(key[row].shape)
                value[row] = value_cache[blk, j % bs].reshape(value[row].shape)
            else:
                key[row], value[row] = 0, 0
            row += 1
    return key, value


AXES = {"cumsum": (False, True), "offset": (False, True), "dtype": {"bf16": torch.bfloat16, "fp32": torch.float32,
                                                                  "int8": torch.int8},
        "flat": (False, True), "bad_blocks": (False, True)}


def _inputs(cumsum, offset, dtype, flat, bad_blocks, g, total_extra=0):
    nb, bs, n, dk, dv = 6, 4, 2, 16, 8  # MLA-like: K and V of different widths
    lens = [5, 0, 9, 3]
    table = torch.randint(0, nb, (4, 5), generator=g, dtype=torch.int32)
    if bad_blocks:
        table[0, 1], table[2, 0] = nb, -1
    off = torch.tensor([4, 0, 0, 8]) if offset else None
    kc = (torch.randn(nb, bs, n, dk, generator=g) * 20).to(dtype)
    vc = (torch.randn(nb, bs, n, dv, generator=g) * 20).to(dtype)
    t = sum(lens) + total_extra
    key = torch.full((t, n * dk) if flat else (t, n, dk), 7).to(dtype)
    value = torch.full((t, n * dv) if flat else (t, n, dv), 7).to(dtype)
    seq = torch.tensor([0] + list(torch.tensor(lens).cumsum(0))) if cumsum else torch.tensor(lens, dtype=torch.int32)
    return kc, vc, table, seq, key, value, off


@pytest.mark.asan
@pytest.mark.parametrize("cumsum,offset,dtype,flat,bad_blocks", pairwise(**AXES))
def test_gather_matches_reference(cumsum, offset, dtype, flat, bad_blocks):
    g = torch.Generator().manual_seed(3)
    kc, vc, table, seq, key, value, off = _inputs(cumsum, offset, dtype, flat, bad_blocks, g, total_extra=2)
    rk, rv = ref_gather(kc, vc, table, seq, key, value, off, cumsum)
    k2, v2 = key.clone(), value.clone()
    fk, fv = tot.npu_gather_pa_kv_cache_functional(kc, vc, table, seq, key, value, seq_offset=off,
                                                   is_seq_lens_cumsum=cumsum)
    assert torch.equal(key, k2) and torch.equal(value, v2)  # the functional form leaves them
    assert tot.npu_gather_pa_kv_cache(kc, vc, table, seq, key, value, seq_offset=off,
                                      is_seq_lens_cumsum=cumsum) is None
    for ours in ((key, value), (fk, fv)):
        assert torch.equal(ours[0], rk) and torch.equal(ours[1], rv)


def test_gather_stops_at_the_end_of_key():
    g = torch.Generator().manual_seed(4)
    kc, vc, table, seq, key, value, off = _inputs(False, False, torch.float32, False, False, g)
    key, value = key[:10].clone(), value[:10].clone()
    rk, rv = ref_gather(kc, vc, table, seq, key, value)
    tot.npu_gather_pa_kv_cache(kc, vc, table, seq, key, value)
    assert torch.equal(key, rk) and torch.equal(value, rv)


def test_gather_into_non_contiguous_views():
    g = torch.Generator().manual_seed(5)
    kc, vc, table, seq, key, value, off = _inputs(False, True, torch.float32, False, False, g)
    kbuf, vbuf = torch.zeros(2, *key.shape), torch.zeros(2, *value.shape)
    k, v = kbuf[1].transpose(0, 1).contiguous().transpose(0, 1), vbuf[1]
    rk, rv = ref_gather(kc, vc, table, seq, k, v, off)
    tot.npu_gather_pa_kv_cache(kc, vc, table, seq, k, v, seq_offset=off)
    assert torch.equal(k, rk) and torch.equal(vbuf[1], rv) and not vbuf[0].any()


def test_gather_compiles_fullgraph_functional_and_in_place():
    g = torch.Generator().manual_seed(6)
    kc, vc, table, seq, key, value, off = _inputs(True, True, torch.float32, False, False, g)

    def step(key, value):
        tot.npu_gather_pa_kv_cache(kc, vc, table, seq, key, value, seq_offset=off, is_seq_lens_cumsum=True)
        return key * 2, tot.npu_gather_pa_kv_cache_functional(kc, vc, table, seq, torch.zeros_like(key), value,
                                                               seq_offset=off, is_seq_lens_cumsum=True)[1]

    k1, v1 = key.clone(), value.clone()
    out = torch.compile(step, fullgraph=True)(k1, v1)
    k2, v2 = key.clone(), value.clone()
    ref = step(k2, v2)
    assert torch.equal(k1, k2) and torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


# ---- bad inputs: one test per rule --------------------------------------------------------------------------------
def _ok(g=None):
    return _inputs(False, False, torch.float32, False, False, g or torch.Generator().manual_seed(0))


def test_bad_gather_dtype():
    kc, vc, table, seq, key, value, _ = _ok()
    with pytest.raises(TypeError, match="argument 'key' .* must have the dtype of its cache"):
        tot.npu_gather_pa_kv_cache(kc, vc, table, seq, key.half(), value)


def test_bad_gather_width():
    kc, vc, table, seq, key, value, _ = _ok()
    with pytest.raises(ValueError, match="argument 'value' of shape .* values per token but its cache"):
        tot.npu_gather_pa_kv_cache(kc, vc, table, seq, key, value[..., :4])


def test_bad_gather_token_counts():
    kc, vc, table, seq, key, value, _ = _ok()
    with pytest.raises(ValueError, match="argument 'value' of shape .* num_tokens = key.size\\(0\\)"):
        tot.npu_gather_pa_kv_cache(kc, vc, table, seq, key, value[:3])


def test_bad_gather_negative_length():
    kc, vc, table, _, key, value, _ = _ok()
    with pytest.raises(ValueError, match="argument 'seq_lens' must give non-negative lengths"):
        tot.npu_gather_pa_kv_cache(kc, vc, table, torch.tensor([3, -1]), key, value)


def test_bad_gather_decreasing_cumsum():
    kc, vc, table, _, key, value, _ = _ok()
    with pytest.raises(ValueError, match="non-decreasing cumulative sum"):
        tot.npu_gather_pa_kv_cache(kc, vc, table, torch.tensor([0, 4, 2]), key, value, is_seq_lens_cumsum=True)


def test_bad_gather_table_rows():
    kc, vc, table, _, key, value, _ = _ok()
    with pytest.raises(ValueError, match="argument 'block_tables' of shape .* needs a row per sequence \\(5\\)"):
        tot.npu_gather_pa_kv_cache(kc, vc, table, torch.tensor([1, 1, 1, 1, 1]), key, value)


def test_bad_gather_seq_offset():
    kc, vc, table, seq, key, value, _ = _ok()
    with pytest.raises(ValueError, match="argument 'seq_offset' must be non-negative"):
        tot.npu_gather_pa_kv_cache(kc, vc, table, seq, key, value, seq_offset=torch.tensor([0, -4, 0, 0]))
    with pytest.raises(ValueError, match=r"argument 'seq_offset' must be 1-D \[batch\] = \[4\]"):
        tot.npu_gather_pa_kv_cache(kc, vc, table, seq, key, value, seq_offset=torch.tensor([0, 4]))


def test_bad_gather_index_dtype():
    kc, vc, table, seq, key, value, _ = _ok()
    with pytest.raises(RuntimeError, match="block_tables must be int64 or int32"):
        tot.npu_gather_pa_kv_cache(kc, vc, table.float(), seq, key, value)


# ---- npu_scatter_nd_update(_) ---------------------------------------------------------------------------------------
def ref_scatter_nd(var, indices, updates):
    out = var.clone()
    k = indices.shape[-1]
    flat_idx = indices.reshape(-1, k)
    flat_upd = updates.reshape(flat_idx.shape[0], *var.shape[k:])
    for r in range(flat_idx.shape[0]):
        out[tuple(flat_idx[r].tolist())] = flat_upd[r]
    return out


@pytest.mark.asan
@pytest.mark.parametrize("k,dtype,batched", pairwise(k=(1, 2, 3), dtype={"fp16": torch.float16, "bool": torch.bool,
                                                                          "int64": torch.int64}, batched=(False, True)))
def test_scatter_nd_update_matches_reference(k, dtype, batched):
    g = torch.Generator().manual_seed(k)
    var = (torch.randn(5, 4, 3, generator=g) * 10).to(dtype)
    rows = (2, 3) if batched else (4,)
    idx = torch.stack([torch.randint(0, var.shape[d], rows, generator=g) for d in range(k)], -1)
    upd = (torch.randn(*rows, *var.shape[k:], generator=g) * 10).to(dtype)
    ref = ref_scatter_nd(var, idx, upd)
    var0 = var.clone()
    out = tot.npu_scatter_nd_update(var, idx.int(), upd)
    assert torch.equal(out, ref) and torch.equal(var, var0)  # the out-of-place form leaves var
    v2 = var.clone()
    assert tot.npu_scatter_nd_update_(v2, idx, upd) is v2 and torch.equal(v2, ref)


def test_scatter_nd_update_repeated_index_last_wins():
    var = torch.zeros(3, 2)
    out = tot.npu_scatter_nd_update(var, torch.tensor([[1], [0], [1]]), torch.tensor([[1., 1.], [2., 2.], [3., 3.]]))
    assert out.tolist() == [[2., 2.], [3., 3.], [0., 0.]]


def test_scatter_nd_update_non_contiguous_var():
    base = torch.zeros(4, 6)
    var = base[:, ::2]
    tot.npu_scatter_nd_update_(var, torch.tensor([[3, 1], [0, 2]]), torch.tensor([5., 6.]))
    assert base[3, 2] == 5 and base[0, 4] == 6 and base.sum() == 11


def test_scatter_nd_update_compiles_fullgraph():
    def f(cache, idx, upd):
        tot.npu_scatter_nd_update_(cache, idx, upd)
        return cache.sum(-1)

    c1, c2 = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
    idx, upd = torch.tensor([[5], [1]]), torch.randn(2, 2, 4)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(c1, idx, upd), f(c2, idx, upd))
    assert torch.equal(c1, c2)


def test_bad_scatter_nd_index_out_of_range():
    with pytest.raises(ValueError, match=r"argument 'indices' row 1 has 3 for dimension 0 of var \(size 3\)"):
        tot.npu_scatter_nd_update(torch.zeros(3, 2), torch.tensor([[0], [3]]), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="has -1 for dimension 1"):
        tot.npu_scatter_nd_update(torch.zeros(3, 2), torch.tensor([[0, -1]]), torch.zeros(1))


def test_bad_scatter_nd_index_depth():
    with pytest.raises(ValueError, match="expected 1 <= K <= var.dim\\(\\) = 2"):
        tot.npu_scatter_nd_update(torch.zeros(3, 2), torch.zeros(1, 3, dtype=torch.long), torch.zeros(1))


def test_bad_scatter_nd_updates_shape():
    with pytest.raises(ValueError, match=r"argument 'updates' must have shape .* = \[2, 2\]"):
        tot.npu_scatter_nd_update(torch.zeros(3, 2), torch.tensor([[0], [1]]), torch.zeros(2, 3))


def test_bad_scatter_nd_updates_dtype():
    with pytest.raises(TypeError, match="argument 'updates' .* must have the dtype of 'var'"):
        tot.npu_scatter_nd_update(torch.zeros(3, 2), torch.tensor([[0]]), torch.zeros(1, 2, dtype=torch.float16))


def test_bad_scatter_nd_indices_dtype():
    with pytest.raises(RuntimeError, match="indices must be int64 or int32"):
        tot.npu_scatter_nd_update(torch.zeros(3, 2), torch.tensor([[0.0]]), torch.zeros(1, 2))


def test_doc_example_npu_gather_pa_kv_cache():
    run_examples("kv_cache.md", "npu_gather_pa_kv_cache")


def test_doc_example_npu_scatter_nd_update_():
    run_examples("kv_cache.md", "npu_scatter_nd_update_")
