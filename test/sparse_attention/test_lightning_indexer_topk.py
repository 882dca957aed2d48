"""The top-k selection of npu_lightning_indexer on rows whose scores the test chooses exactly: ties at the k-th
value, all-equal rows, -inf / NaN scores, k = 1, k at and past the visible keys, decode rows spread over many key
chunks, paged keys, causal rows, and results independent of the thread count; against a float64 reference in plain
PyTorch (a stable descending sort, NaN ranked as -inf).

The scores are made exact: one key dim, three query heads q = (1, 2, -1) with weights w = (-1, 1, -1), so for a key
value k the op's score sum_h w_h ReLU(q_h k) is -k + 2k = k for k > 0 and -(-k) = k for k < 0 (every step exact in
float32), -inf for k = -inf, and inf - inf = NaN for k = +inf."""
import pytest
import torch

import torch_ops_transformer as tot
from test.sparse_attention.indexer_reference import visible

Q = torch.tensor([1.0, 2.0, -1.0]).view(3, 1)
W = torch.tensor([-1.0, 1.0, -1.0])


def reference(key_values, sparse_count, q_len=1, sparse_mode=3):
    """(indices [q_len, K], values [q_len, K]) of one sequence whose scores are key_values: per query row the top
    sparse_count by a stable descending sort of the float64 scores with NaN as -inf; -1 / -inf past the visible keys."""
    s = key_values.double().clone()
    s[s == float("inf")] = float("nan")  # the op's score of a +inf key (see the module doc)
    s = torch.where(torch.isnan(s), torch.full_like(s, float("-inf")), s)
    idx = torch.full((q_len, sparse_count), -1, dtype=torch.int64)
    val = torch.full((q_len, sparse_count), float("-inf"), dtype=torch.float64)
    for i, vis in enumerate(visible(q_len, s.numel(), sparse_mode)):
        order = torch.sort(-s[:vis], stable=True).indices[:sparse_count]
        idx[i, :order.numel()] = order
        val[i, :order.numel()] = s[order]
    return idx, val


def run_op(key_values, sparse_count, q_len=1, sparse_mode=3, paged_block=None, dtype=torch.float32):
    """The op on one sequence whose key values are key_values (its scores, see the module doc): (indices, values)
    [q_len, K]. paged_block: the keys in a paged cache of that block size, blocks in reversed order (the op returns
    no values there: values None)."""
    n = key_values.numel()
    q = Q.expand(1, q_len, 3, 1).to(dtype)
    w = W.expand(1, q_len, 3).to(dtype)
    kw = dict(sparse_count=sparse_count, sparse_mode=sparse_mode, return_value=paged_block is None)
    if paged_block is None:
        k = key_values.to(dtype).view(1, n, 1, 1)
    else:
        blocks = -(-n // paged_block)
        padded = torch.zeros(blocks * paged_block, dtype=dtype)
        padded[:n] = key_values.to(dtype)
        k = padded.view(blocks, paged_block, 1, 1).flip(0).contiguous()
        kw.update(layout_key="PA_BSND", block_table=torch.arange(blocks - 1, -1, -1, dtype=torch.int32).view(1, -1),
                  actual_seq_lengths_key=torch.tensor([n], dtype=torch.int32))
    idx, val = tot.npu_lightning_indexer(q, k, w, **kw)
    return idx[0, :, 0].long(), val[0, :, 0].double() if paged_block is None else None


def check(key_values, sparse_count, **kw):
    idx, val = run_op(key_values, sparse_count, **kw)
    ref_idx, ref_val = reference(key_values, sparse_count, kw.get("q_len", 1), kw.get("sparse_mode", 3))
    assert torch.equal(idx, ref_idx), (idx, ref_idx)
    assert val is None or torch.equal(val, ref_val)
    return idx, val


def tied_values(n, levels, seed):
    """n key values drawn from `levels` distinct integers (heavy ties everywhere, at the k-th value too)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-levels // 2, levels - levels // 2, (n,), generator=g).float()


def spread_values(n, seed):
    """n distinct-ish float32 values of both signs over many binades: the selection's digits all matter."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.randn(n, generator=g) * torch.pow(10.0, torch.randint(-20, 20, (n,), generator=g).float())
    return mag.float()


@pytest.mark.parametrize("n,levels", [(7, 3), (300, 5), (5000, 40)])
@pytest.mark.parametrize("sparse_count", [1, 5, 64, 2048])
def test_ties_at_the_kth_value_go_to_the_lower_positions(n, levels, sparse_count):
    check(tied_values(n, levels, seed=n + sparse_count), sparse_count)


@pytest.mark.parametrize("n", [1, 9, 3000])
def test_an_all_equal_row_takes_the_first_positions(n):
    idx, val = check(torch.full((n,), 0.75), 64)
    k = min(n, 64)
    assert idx[0, :k].tolist() == list(range(k)) and (idx[0, k:] == -1).all() and (val[0, :k] == 0.75).all()


def test_nan_ranks_last_level_with_minus_inf_and_returns_minus_inf():
    # +inf keys score NaN, -inf keys -inf: both after every finite score, tied with each other by position
    kv = torch.tensor([float("inf"), -3.0, float("-inf"), 2.0, float("inf"), -0.0, 0.0, float("-inf"), 5.0])
    idx, val = check(kv, 8)
    assert idx[0].tolist() == [8, 3, 5, 6, 1, 0, 2, 4]
    assert torch.isneginf(val[0, 5:]).all() and not torch.isnan(val).any()


def test_a_row_of_only_nan_and_minus_inf():
    kv = torch.tensor([float("inf"), float("-inf")] * 50)
    idx, _ = check(kv, 16)
    assert idx[0].tolist() == list(range(16))


@pytest.mark.parametrize("n,sparse_count", [(10, 10), (10, 11), (10, 2048), (300, 299)])
def test_sparse_count_at_and_past_the_visible_keys(n, sparse_count):
    check(spread_values(n, seed=n), sparse_count)


@pytest.mark.parametrize("n", [777, 20000])
@pytest.mark.parametrize("sparse_count", [1, 2048])
def test_spread_scores_over_many_chunks(n, sparse_count):
    check(spread_values(n, seed=sparse_count), sparse_count)


@pytest.mark.parametrize("paged_block", [None, 64])
def test_causal_rows_each_select_among_their_visible_keys(paged_block):
    # sparse_mode 3 with 6 query rows: the rows see 995 .. 1000 keys, the k-th value tied in each
    check(tied_values(1000, 9, seed=3), 128, q_len=6, paged_block=paged_block)


def test_paged_decode_matches_the_reference():
    check(tied_values(9000, 200, seed=4), 2048, paged_block=128)


def test_float64_scores_select_the_same_way():
    check(spread_values(3000, seed=5), 256, dtype=torch.float64)
    check(tied_values(3000, 30, seed=6), 256, dtype=torch.float64)


@pytest.mark.parametrize("q_len", [1, 5])
def test_results_do_not_depend_on_the_thread_count(q_len):
    kv = torch.cat([spread_values(15000, seed=7), tied_values(15000, 50, seed=8)])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run_op(kv, 2048, q_len=q_len)
        torch.set_num_threads(2)
        two = run_op(kv, 2048, q_len=q_len)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


@pytest.mark.parametrize("n", [100, 40000])
@pytest.mark.parametrize("q_len", [1, 3])
def test_decode_rows_split_over_any_thread_count(n, q_len):
    # fewer work units than threads (decode): the threads split a row's key chunks, and each takes the images of its
    # own scores and counts their first digits for the selection; 3 threads leave some idle at n = 100 (one chunk)
    kv = torch.cat([spread_values(n // 2, seed=9), tied_values(n - n // 2, 40, seed=10)])
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            check(kv, 2048, q_len=q_len, paged_block=128)
            check(kv, 64, q_len=q_len)
    finally:
        torch.set_num_threads(before)
