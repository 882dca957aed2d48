"""torch.autograd.gradcheck of flash_attention_score's registered backward.

The inputs are float64 leaves; the op itself accepts fp32/fp16/bf16 only (float64 is rejected, see
test_bad_inputs), so the checked function runs the op in float32 and the finite-difference step and tolerances
are sized for float32 arithmetic (eps 1e-3: rounding noise ~1e-7/1e-3 = 1e-4 per Jacobian entry)."""
import pytest
import torch

from test.attention.attention_cases import OPS, Case, make_inputs

GRADCHECK = dict(eps=1e-3, atol=2e-3, rtol=2e-2)

CASES = {
    "plain_BSND": Case(batch=1, q_heads=2, kv_heads=2, q_len=3, kv_len=5, head_dim=4),
    "gqa_causal_BNSD": Case(layout="BNSD", batch=1, q_heads=4, kv_heads=2, q_len=4, kv_len=3, head_dim=4,
                            sparse_mode=3),
    "pse_type1": Case(batch=2, q_heads=2, kv_heads=1, q_len=3, kv_len=4, head_dim=4, pse="BNSS", pse_type=1),
    "pse_type0_broadcast": Case(layout="BSH", batch=1, q_heads=2, kv_heads=2, q_len=3, kv_len=4, head_dim=4,
                                pse="BN1S", pse_type=0),
    "mask_band": Case(layout="SBH", batch=1, q_heads=2, kv_heads=1, q_len=4, kv_len=5, head_dim=4, mask="11SS",
                      pre_tokens=1, next_tokens=1),
    "band_mode4_vd": Case(batch=1, q_heads=2, kv_heads=1, q_len=4, kv_len=6, head_dim=4, v_head_dim=3,
                          sparse_mode=4, pre_tokens=2, next_tokens=0),
    "varlen_TND": Case(layout="TND", q_heads=2, kv_heads=1, head_dim=4, seqlens=((2, 0, 3), (3, 1, 2)),
                       sparse_mode=2),
    "dropout_fixed_seed": Case(batch=1, q_heads=2, kv_heads=1, q_len=3, kv_len=4, head_dim=4, keep_prob=0.7),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradcheck(name):
    args = make_inputs(CASES[name])
    diff = [n for n in ("query", "key", "value", "pse") if args.get(n) is not None]
    leaves = [args[n].double().requires_grad_() for n in diff]

    def fn(*xs):
        kw = dict(args, **{n: x.float() for n, x in zip(diff, xs)})
        return OPS.flash_attention_score(**kw)[0].double()

    assert torch.autograd.gradcheck(fn, leaves, **GRADCHECK)
