"""Port of op-plugin test/test_custom_ops/test_npu_moe_token_permute_and_unpermute.py (torch_npu.npu_moe_token_permute
and npu_moe_token_unpermute, Megatron's permute / unpermute), against the upstream's own reference permute/unpermute
(re-implemented here: stable argsort of the flattened expert indices; unpermute = index_copy back, times probs,
summed over topk).

Upstream cases, each over num_tokens {1024, 2048} x hidden {6144, 8192} x topk {1, 4} x num_experts {4, 128},
bfloat16, tolerances atol = rtol = 5e-3 (torch's assertEqual):
- test_permute: permuted tokens, and sorted_indices = argsort of the reference's sorted order (exactly).
- test_unpermute: probs = 1/topk (topk > 1, else None), sorted_indices = an argsort given as int32.
- test_ori_permute_unpermute: the reference permute then unpermute restore the tokens (exercises the reference
  only, ported for completeness).
- test_npu_npu_moe_token_permute_unpermute: our permute then unpermute restore the tokens (exactly for topk 1).
All ported with the upstream grid, except that the hidden sizes 6144 / 8192 become 96 / 128: the row width only
scales the row copies, and the upstream widths would make the CPU and simulated-npu runs minutes long.
"""
import itertools

import pytest
import torch

from test.torch_npu.common import to_device, torch_npu

TOLS = dict(atol=5e-3, rtol=5e-3)  # bfloat16 in the upstream's TOL_MAPPING
GRID = list(itertools.product([1024, 2048], [96, 128], [1, 4], [4, 128]))


def ref_permute(tokens, indices):
    topk = 1 if indices.dim() == 1 else indices.size(1)
    sorted_indices = torch.argsort(indices.reshape(-1), stable=True)
    return tokens.index_select(0, sorted_indices // topk), sorted_indices


def ref_unpermute(permuted_tokens, sorted_indices, probs=None):
    assert sorted_indices.numel() == permuted_tokens.size(0)
    rows, topk = (probs.numel(), probs.size(1)) if probs is not None else (permuted_tokens.size(0), 1)
    out = torch.zeros(rows, permuted_tokens.shape[-1], dtype=permuted_tokens.dtype)
    out.index_copy_(0, sorted_indices, permuted_tokens)
    out = out.reshape(-1, topk, permuted_tokens.size(-1))
    if probs is not None:
        out = out * probs.unsqueeze(-1)
    return out.sum(dim=1)


def _tokens(num_tokens, hidden, topk, num_experts, gen):
    tokens = torch.randn(num_tokens, hidden, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, num_experts, (num_tokens, topk), generator=gen)
    probs = (torch.ones(num_tokens, topk) / topk).to(torch.bfloat16) if topk > 1 else None
    return tokens, indices, probs


@pytest.mark.parametrize("num_tokens,hidden,topk,num_experts", GRID)
def test_permute(num_tokens, hidden, topk, num_experts):
    tokens, indices, _ = _tokens(num_tokens, hidden, topk, num_experts, torch.Generator().manual_seed(0))
    want, order = ref_permute(tokens, indices)
    got, sorted_indices = torch_npu.npu_moe_token_permute(to_device(tokens), to_device(indices))
    torch.testing.assert_close(got.cpu(), want, **TOLS)
    assert torch.equal(sorted_indices.cpu(), torch.argsort(order, stable=True).to(sorted_indices.dtype))


@pytest.mark.parametrize("num_tokens,hidden,topk,num_experts", GRID)
def test_unpermute(num_tokens, hidden, topk, num_experts):
    gen = torch.Generator().manual_seed(1)
    permuted = torch.randn(num_tokens * topk, hidden, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, num_experts, (num_tokens, topk), generator=gen)
    sorted_indices = torch.argsort(indices.reshape(-1), stable=True).to(torch.int32)
    probs = (torch.ones(num_tokens, topk) / topk).to(torch.bfloat16) if topk > 1 else None
    want = ref_unpermute(permuted, torch.argsort(sorted_indices, stable=True), probs)
    got = torch_npu.npu_moe_token_unpermute(to_device(permuted), to_device(sorted_indices), probs=to_device(probs))
    torch.testing.assert_close(got.cpu(), want, **TOLS)


@pytest.mark.parametrize("num_tokens,hidden,topk,num_experts", GRID)
def test_ori_permute_unpermute(num_tokens, hidden, topk, num_experts):
    tokens, indices, probs = _tokens(num_tokens, hidden, topk, num_experts, torch.Generator().manual_seed(2))
    permuted, sorted_indices = ref_permute(tokens, indices)
    restored = ref_unpermute(permuted, sorted_indices, probs)
    torch.testing.assert_close(restored, tokens, **({} if topk == 1 else TOLS))


@pytest.mark.parametrize("num_tokens,hidden,topk,num_experts", GRID)
def test_npu_npu_moe_token_permute_unpermute(num_tokens, hidden, topk, num_experts):
    tokens, indices, probs = _tokens(num_tokens, hidden, topk, num_experts, torch.Generator().manual_seed(3))
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(to_device(tokens), to_device(indices))
    restored = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs=to_device(probs)).cpu()
    if topk == 1:
        assert torch.equal(restored, tokens)
    else:
        torch.testing.assert_close(restored, tokens, **TOLS)
