"""Port of op-plugin test/test_custom_ops/test_npu_moe_token_permute_and_unpermute_backward.py (torch_npu's
npu_moe_token_permute / npu_moe_token_unpermute forward and backward against the upstream's reference
permute / unpermute and PyTorch autograd).

Upstream cases (bfloat16, torch.allclose with rtol 2e-2, atol 1e-5):
- test_permute, test_unpermute, test_npu_npu_moe_token_permute_unpermute: num_tokens {1024, 2048, 8192} x hidden
  {6144, 8192, 12288} x topk {1, 4} x num_experts {4, 128}; outputs and the gradients of tokens (permute) and of
  permuted_tokens and probs (unpermute, probs = 1/topk when topk > 1) for an all-ones output gradient. Ported with
  the upstream grid except hidden {6144, 8192, 12288} -> {96, 128, 192} (the row width only scales the copies;
  the upstream widths need gigabytes per case on the CPU).
- test_unpermute_grad_mixed_dtype: bfloat16 tokens, float32 probs: the gradients keep those dtypes. Ported.
- test_unpermute_grad_probs_none (topk 1 and 4): a gradient reaches permuted_tokens without probs. Ported.
- test_unpermute_backward_saved_tensors_probs_none: with probs None, autograd keeps no reference to
  permuted_tokens' storage (saved-tensor hooks see other storages only). Ported.
- test_unpermute_backward_saved_tensors_with_probs: with probs, permuted_tokens' and probs' storages are saved.
  Ported.
Not applicable: the upstream's `torch_npu.contrib.transfer_to_npu` import (device redirection of torch.cuda code,
which these tests do not use).
"""
import itertools

import pytest
import torch

from test.torch_npu.common import to_device, torch_npu
from test.torch_npu.test_npu_moe_token_permute_and_unpermute import ref_permute, ref_unpermute

TOLS = dict(rtol=2e-2, atol=1e-5)  # bfloat16 in the upstream's dtype_tols
GRID = list(itertools.product([1024, 2048, 8192], [96, 128, 192], [1, 4], [4, 128]))


def _leaf(t):
    return to_device(t.detach().clone()).requires_grad_(True)


@pytest.mark.parametrize("num_tokens,hidden,topk,num_experts", GRID)
def test_permute(num_tokens, hidden, topk, num_experts):
    gen = torch.Generator().manual_seed(0)
    token_ori = torch.randn(num_tokens, hidden, generator=gen).to(torch.bfloat16).requires_grad_(True)
    indices = torch.randint(0, num_experts, (num_tokens, topk), generator=gen)
    token_fused = _leaf(token_ori)
    permuted_ori, order = ref_permute(token_ori, indices)
    permuted_fused, sorted_indices = torch_npu.npu_moe_token_permute(token_fused, to_device(indices))
    assert torch.allclose(permuted_ori, permuted_fused.detach().cpu(), **TOLS)
    assert torch.equal(torch.argsort(order, stable=True).to(sorted_indices.dtype), sorted_indices.cpu())
    grad = torch.ones_like(permuted_ori)
    permuted_ori.backward(grad)
    permuted_fused.backward(to_device(grad))
    assert torch.allclose(token_ori.grad, token_fused.grad.cpu(), **TOLS), "gradient mismatch for tokens"


@pytest.mark.parametrize("num_tokens,hidden,topk,num_experts", GRID)
def test_unpermute(num_tokens, hidden, topk, num_experts):
    gen = torch.Generator().manual_seed(1)
    permuted_ori = torch.randn(num_tokens * topk, hidden, generator=gen).to(torch.bfloat16).requires_grad_(True)
    indices = torch.randint(0, num_experts, (num_tokens, topk), generator=gen)
    sorted_indices = torch.argsort(indices.reshape(-1), stable=True).to(torch.int32)
    probs_ori = probs_fused = None
    if topk > 1:
        probs_ori = (torch.ones(num_tokens, topk) / topk).to(torch.bfloat16).requires_grad_(True)
        probs_fused = _leaf(probs_ori)
    permuted_fused = _leaf(permuted_ori)
    out_ori = ref_unpermute(permuted_ori, torch.argsort(sorted_indices, stable=True), probs_ori)
    out_fused = torch_npu.npu_moe_token_unpermute(permuted_fused, to_device(sorted_indices), probs=probs_fused)
    assert torch.allclose(out_ori, out_fused.detach().cpu(), **TOLS)
    grad = torch.ones_like(out_ori)
    out_ori.backward(grad)
    out_fused.backward(to_device(grad))
    assert torch.allclose(permuted_ori.grad, permuted_fused.grad.cpu(), **TOLS), "gradient mismatch: permuted"
    if topk > 1:
        assert torch.allclose(probs_ori.grad, probs_fused.grad.cpu(), **TOLS), "gradient mismatch: probs"


@pytest.mark.parametrize("num_tokens,hidden,topk,num_experts", GRID)
def test_npu_npu_moe_token_permute_unpermute(num_tokens, hidden, topk, num_experts):
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randn(num_tokens, hidden, generator=gen).to(torch.bfloat16)
    indices = torch.randint(0, num_experts, (num_tokens, topk), generator=gen)
    probs = (torch.ones(num_tokens, topk) / topk).to(torch.bfloat16) if topk > 1 else None
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(to_device(tokens), to_device(indices))
    restored = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs=to_device(probs)).cpu()
    if topk == 1:
        assert torch.equal(restored, tokens)
    else:
        assert torch.allclose(restored, tokens, **TOLS)


def _unpermute_inputs(num_tokens, hidden, topk, num_experts, probs_dtype):
    gen = torch.Generator().manual_seed(3)
    permuted = _leaf(torch.randn(num_tokens * topk, hidden, generator=gen).to(torch.bfloat16))
    indices = torch.randint(0, num_experts, (num_tokens, topk), generator=gen)
    sorted_indices = to_device(torch.argsort(indices.reshape(-1), stable=True).to(torch.int32))
    probs = _leaf((torch.ones(num_tokens, topk) / topk).to(probs_dtype)) if probs_dtype is not None else None
    return permuted, sorted_indices, probs


def test_unpermute_grad_mixed_dtype():
    permuted, sorted_indices, probs = _unpermute_inputs(1024, 96, 4, 8, torch.float32)
    out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs=probs)
    out.backward(torch.ones_like(out))
    assert permuted.grad is not None and permuted.grad.dtype == torch.bfloat16
    assert probs.grad is not None and probs.grad.dtype == torch.float32


@pytest.mark.parametrize("topk", [1, 4])
def test_unpermute_grad_probs_none(topk):
    permuted, sorted_indices, _ = _unpermute_inputs(1024, 96, topk, 8, None)
    out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs=None)
    out.backward(torch.ones_like(out))
    assert permuted.grad is not None and permuted.grad.dtype == torch.bfloat16


def _storage(t):
    return t.untyped_storage().data_ptr()


def _saved_storages(num_tokens, hidden, topk, num_experts, use_probs):
    """Storages autograd saves for npu_moe_token_unpermute after npu_moe_token_permute (saved-tensor hooks)."""
    gen = torch.Generator().manual_seed(4)
    tokens = _leaf(torch.randn(num_tokens, hidden, generator=gen).to(torch.bfloat16))
    indices = to_device(torch.randint(0, num_experts, (num_tokens, topk), generator=gen))
    probs = _leaf(torch.ones(num_tokens, topk) / topk) if use_probs else None
    permuted, sorted_indices = torch_npu.npu_moe_token_permute(tokens, indices)
    permuted.retain_grad()
    saved = []

    def pack(t):
        saved.append(_storage(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = torch_npu.npu_moe_token_unpermute(permuted, sorted_indices, probs=probs)
    out.backward(torch.ones_like(out))
    assert tokens.grad is not None and permuted.grad is not None
    if use_probs:
        assert probs.grad is not None
    return saved, _storage(permuted), None if probs is None else _storage(probs)


def test_unpermute_backward_saved_tensors_probs_none():
    saved, permuted_ptr, _ = _saved_storages(64, 128, 1, 8, use_probs=False)
    assert permuted_ptr not in saved, "permuted_tokens should not be saved for backward when probs is None"


def test_unpermute_backward_saved_tensors_with_probs():
    saved, permuted_ptr, probs_ptr = _saved_storages(32, 64, 4, 8, use_probs=True)
    assert permuted_ptr in saved, "permuted_tokens should still be saved for backward when probs is provided"
    assert probs_ptr in saved, "probs should still be saved for backward when probs is provided"
