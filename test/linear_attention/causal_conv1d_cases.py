"""opcheck cases of the causal conv1d ops."""
import torch

I32 = torch.int32


def _fused(dtype=torch.float32, spec=False, apc=False):
    def make():
        g = torch.Generator().manual_seed(0)
        if spec:  # decode with draft tokens: 3-D x, state_len K-1+2
            x = torch.randn(2, 3, 16, generator=g).to(dtype)
            states = torch.randn(4, 4, 16, generator=g).to(dtype)
            kw = dict(cache_indices=torch.tensor([3, 1], dtype=I32),
                      num_accepted_tokens=torch.tensor([2, 3], dtype=I32), residual_connection=1)
        elif apc:  # prefix caching: one block completed by the first sequence
            x = torch.randn(9, 16, generator=g).to(dtype)
            states = torch.randn(6, 2, 16, generator=g).to(dtype)
            kw = dict(query_start_loc=torch.tensor([0, 6, 9], dtype=I32),
                      cache_indices=torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=I32),
                      num_computed_tokens=torch.tensor([0, 1], dtype=I32),
                      block_idx_first_scheduled_token=torch.tensor([0, 0], dtype=I32),
                      block_idx_last_scheduled_token=torch.tensor([1, 0], dtype=I32),
                      initial_state_idx=torch.tensor([0, 0], dtype=I32), block_size=4)
        else:  # varlen prefill, one padded entry, bias and SiLU
            x = torch.randn(7, 16, generator=g).to(dtype)
            states = torch.randn(4, 2, 16, generator=g).to(dtype)
            kw = dict(query_start_loc=torch.tensor([0, 4, 5, 7], dtype=I32),
                      cache_indices=torch.tensor([2, -1, 0], dtype=I32), bias=torch.randn(16).to(dtype),
                      activation="silu")
        weight = torch.randn(3, 16, generator=g).to(dtype)
        return (x, weight, states), kw
    return make


def _masked(dtype=torch.float32, with_mask=True, backward=False):
    def make():
        g = torch.Generator().manual_seed(1)
        x = torch.randn(6, 2, 16, generator=g).to(dtype)
        w = torch.randn(3, 16, generator=g).to(dtype)
        mask = torch.rand(2, 6, generator=g) > 0.3 if with_mask else None
        if backward:
            return (torch.randn(6, 2, 16, generator=g).to(dtype), x, w), dict(mask=mask)
        return (x, w, mask), {}
    return make


OPCHECK_CASES = {
    "fused_causal_conv1d": {"prefill_bias_silu": _fused(), "spec_decode_bf16": _fused(torch.bfloat16, spec=True),
                            "prefix_caching": _fused(apc=True)},
    "fused_causal_conv1d_v2": {"prefill": _fused(), "spec_decode": _fused(spec=True)},
    "masked_causal_conv1d": {"mask": _masked(), "no_mask_bf16": _masked(torch.bfloat16, with_mask=False),
                             "fp64": _masked(torch.float64)},
    "masked_causal_conv1d_backward": {"mask": _masked(backward=True),
                                      "fp16": _masked(torch.float16, backward=True)},
}
