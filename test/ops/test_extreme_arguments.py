"""Integer and float arguments at their extremes (±2^31, ±2^63, NaN, inf): a clear error naming the argument, or the
right answer — never an allocation that kills the process, an overflowed window, or NaN weights without an error.
Sizes derived from user integers go through aten_ops/common/checked_math.h (overflow-checked, bounded by half the
physical memory before anything is allocated)."""
import math

import pytest
import torch
import torch.distributed as dist

from test.mc2.mc2_cases import single_rank_group

OPS = torch.ops.npu_fa
I64_MAX, I64_MIN = 2**63 - 1, -2**63


def test_dropout_gen_mask_of_a_huge_matrix_is_rejected_before_allocation():
    seed, offset = torch.tensor(1), torch.tensor(0)
    with pytest.raises(ValueError, match="rows \\* cols"):
        OPS.dropout_gen_mask(seed, offset, 2**31, 2**31, 0.9)
    with pytest.raises(ValueError, match="overflows int64"):
        OPS.dropout_gen_mask(seed, offset, 2**62, 16, 0.9)


def test_moe_compute_expert_tokens_with_a_huge_expert_count_is_rejected():
    with pytest.raises(ValueError, match="'num_expert'"):
        OPS.moe_compute_expert_tokens(torch.tensor([0, 1, 1], dtype=torch.int32), 2**40)


def test_moe_init_routing_v2_with_a_huge_expert_num_is_rejected():
    experts = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32)
    with pytest.raises(ValueError, match="'expert_num'"):
        OPS.moe_init_routing_v2(torch.randn(2, 4), experts, expert_num=2**40)


def test_moe_init_routing_v2_grad_rejects_an_unknown_row_idx_type():
    x, experts = torch.randn(3, 4), torch.tensor([[0, 1], [1, 2], [2, 0]], dtype=torch.int32)
    rows, dst = OPS.moe_init_routing_v2(x, experts)[:2]
    with pytest.raises(ValueError, match="'row_idx_type' must be 0 .* or 1 .*; got 5"):
        OPS.moe_init_routing_v2_grad(torch.randn(rows.shape), dst, x, experts, 5)


@pytest.mark.parametrize("arg,value", [("routed_scaling_factor", math.inf), ("routed_scaling_factor", math.nan),
                                       ("eps", math.nan), ("eps", -1.0)])
def test_moe_gating_top_k_rejects_non_finite_factors(arg, value):
    with pytest.raises(ValueError, match=f"'{arg}' must be finite"):
        OPS.moe_gating_top_k(torch.randn(5, 16), 4, **{arg: value})


@pytest.mark.parametrize("epsilon", [math.inf, math.nan])
def test_matmul_all_reduce_add_rms_norm_rejects_a_non_finite_epsilon(epsilon):
    had_group = dist.is_initialized()
    group = single_rank_group()
    try:
        with pytest.raises(ValueError, match="'epsilon' must be finite and > 0"):
            OPS.matmul_all_reduce_add_rms_norm(torch.randn(4, 6), torch.randn(6, 5), torch.randn(4, 5), torch.randn(5),
                                               group, epsilon=epsilon)
    finally:
        if not had_group:
            dist.destroy_process_group()


def _attention64(q, k, v, allowed):
    s = (q.double() @ k.double().transpose(-1, -2)).masked_fill(~allowed, -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ v.double()).float()


@pytest.mark.parametrize("pre,nxt", [(I64_MAX, I64_MAX), (2**62, 2**62), (2**31, 2**31)])
def test_band_windows_beyond_the_sequence_are_full_attention(pre, nxt):
    q, k, v = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)
    want = _attention64(q, k, v, torch.ones(5, 7, dtype=torch.bool))
    got = OPS.flash_attention_score(q, k, v, 2, "BNSD", sparse_mode=4, pre_tokens=pre, next_tokens=nxt)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pre,nxt", [(I64_MIN, I64_MAX), (I64_MAX, I64_MIN)])
def test_band_windows_below_minus_the_sequence_mask_everything(pre, nxt):
    """pre_tokens = -2^63 negated overflowed int64 and let every key through; the window is empty: zeros."""
    q, k, v = torch.randn(1, 2, 5, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)
    mask = torch.zeros(5, 7, dtype=torch.bool)  # sparse_mode 0 applies pre/next_tokens when a mask is given
    got = OPS.flash_attention_score(q, k, v, 2, "BNSD", atten_mask=mask, pre_tokens=pre, next_tokens=nxt)[0]
    assert torch.equal(got, torch.zeros_like(got))


def test_gather_pa_kv_cache_with_block_size_zero_is_an_error_not_a_division_by_zero():
    cache = torch.zeros(2, 0, 2, 8)
    with pytest.raises(ValueError, match="block_size 0"):
        OPS.gather_pa_kv_cache(cache, cache, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([0]))


def test_grouped_matmul_counts_that_wrap_int64_are_rejected():
    """Counts [2^63-1, 2^63-1, 4] summed to 2 after wrapping and passed the coverage check for an x of 2 rows."""
    with pytest.raises(ValueError, match="group_list.*overflows int64"):
        OPS.grouped_matmul([torch.randn(2, 4)], [torch.randn(3, 4, 5)], [], torch.tensor([I64_MAX, I64_MAX, 4]), 0, 1, 0)


def test_moe_init_routing_v2_capacity_overflow_names_the_arguments():
    with pytest.raises(ValueError, match="'expert_num'.*'expert_capacity'"):
        OPS.moe_init_routing_v2(torch.randn(0, 4), torch.zeros(0, 1, dtype=torch.int32), drop_pad_mode=1, expert_num=1,
                                expert_capacity=2**62)
