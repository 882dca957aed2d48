"""Ported: op-plugin test/test_custom_ops/test_npu_attention_update.py (torch_npu.npu_attention_update).

Upstream case (TestNpuAttentionUpdate; skipped upstream until CANN has aclnnAttentionUpdate):
- test_forward_min_case: (N, head_dim, SP) in (4, 32, 2), (8, 64, 2), (16, 128, 3), (32, 256, 2), (64, 64, 4),
  (120, 32, 2), (240, 128, 2) x local_out dtype fp32 / fp16 / bf16 with (atol, rtol) 1e-4 / 1e-3 / 4e-3,
  update_type 0; lse fp32 randn [N], local_out randn [N, head_dim]. Golden: lse_m = max_i lse_i +
  log(Σ exp(lse_i − max) + 1e-20), out = Σ out_i·exp(lse_i − lse_m) in fp32, cast to local_out's dtype; checks
  shape, dtype, allclose(atol, rtol) and no NaN/inf. -> ported, every case and dtype (plus the float64 rule).
Upstream's golden also raises ValueError for the inputs its doc excludes (empty or unequal lists, update_type not
0/1, lse not fp32 [N], local_out not fp32/fp16/bf16 [N, H]); those are ported as errors of npu_attention_update,
with the doc's SP ∈ [1, 16] and head_dim ∈ [8, 512] multiple of 8.

Not in upstream's file: update_type 1 (lse_out against the golden's lse_m), update_type 0's second output (None:
torch_npu leaves it undefined), and a part with lse −inf (an empty key range: weight 0).
"""
import pytest
import torch

from test.common.reference import check_tolerance
from test.torch_npu.common import DEVICE, on_cpu, to_device, torch_npu


def _golden(lse_list, out_list, dtype=torch.float32):
    """Upstream's golden, evaluated in `dtype` (fp32 as upstream, float64 for the reference)."""
    lse = torch.stack([t.to(dtype) for t in lse_list])
    out = torch.stack([t.to(dtype) for t in out_list])
    lse_max = lse.max(dim=0).values
    lse_m = lse_max + torch.log(torch.exp(lse - lse_max).sum(dim=0) + 1e-20)
    return (out * torch.exp(lse - lse_m).unsqueeze(-1)).sum(dim=0), lse_m


CASES = [(4, 32, 2), (8, 64, 2), (16, 128, 3), (32, 256, 2), (64, 64, 4), (120, 32, 2), (240, 128, 2)]
DTYPES = [(torch.float32, 1e-4, 1e-4), (torch.float16, 1e-3, 1e-3), (torch.bfloat16, 4e-3, 4e-3)]


def _inputs(N, H, K, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return ([torch.randn(N, generator=g) for _ in range(K)],
            [torch.randn(N, H, generator=g).to(dtype) for _ in range(K)])


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("N,H,K", CASES)
def test_forward_min_case(N, H, K, dtype, atol, rtol):
    lse, outs = _inputs(N, H, K, dtype, seed=N * 1000 + H + K)
    out, lse_out = torch_npu.npu_attention_update(to_device(*lse), to_device(*outs), 0)
    assert lse_out is None
    out = on_cpu(out)
    golden = _golden(lse, outs)[0].to(dtype)
    assert tuple(out.shape) == (N, H) and out.dtype == dtype
    assert torch.allclose(out, golden, atol=atol, rtol=rtol), f"max_abs={float((out - golden).abs().max())}"
    assert not torch.isnan(out).any() and not torch.isinf(out).any()
    check_tolerance("npu_attention_update", out, _golden(lse, outs, torch.float64)[0], golden)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_update_type_1_returns_lse_out(dtype):
    lse, outs = _inputs(24, 64, 3, dtype, seed=1)
    out, lse_out = torch_npu.npu_attention_update(to_device(*lse), to_device(*outs), 1)
    lse_out = on_cpu(lse_out)
    assert lse_out.shape == (24,) and lse_out.dtype == torch.float32
    check_tolerance("lse_out", lse_out, _golden(lse, outs, torch.float64)[1], _golden(lse, outs)[1])
    assert torch.equal(on_cpu(out), on_cpu(torch_npu.npu_attention_update(to_device(*lse), to_device(*outs), 0)[0]))


def test_a_part_with_lse_minus_inf_has_weight_zero():
    lse, outs = _inputs(8, 16, 2, torch.float32, seed=2)
    lse[1][3] = float("-inf")
    outs[1][3] = float("nan")          # skipped, not multiplied by 0 (0 * nan would be nan)
    out, lse_out = torch_npu.npu_attention_update(to_device(*lse), to_device(*outs), 1)
    out, lse_out = on_cpu(out), on_cpu(lse_out)
    torch.testing.assert_close(out[3], outs[0][3])
    assert lse_out[3] == lse[0][3]


def test_constraints_raise():
    lse, outs = _inputs(8, 16, 2, torch.float32, seed=3)
    lse, outs = list(to_device(*lse)), list(to_device(*outs))
    call = torch_npu.npu_attention_update
    with pytest.raises(RuntimeError, match="update_type"):         # torch_npu's exception type
        call(lse, outs, 2)
    with pytest.raises(ValueError, match="same length"):           # this project's
        call(lse, outs[:1], 0)
    with pytest.raises(ValueError, match="same length"):
        call([], [], 0)
    with pytest.raises(ValueError, match=r"SP in \[1, 16\]"):
        call(lse * 9, outs * 9, 0)
    with pytest.raises(ValueError, match=r"lse\[0\].*float32"):
        call([t.double() for t in lse], outs, 0)
    with pytest.raises(ValueError, match=r"local_out\[1\]"):
        call(lse, [outs[0], outs[1].half()], 0)
    with pytest.raises(ValueError, match=r"lse\[1\]"):
        call([lse[0], lse[1][:4]], outs, 0)
    with pytest.raises(ValueError, match="head_dim"):
        call(lse, [t[:, :12] for t in outs], 0)
    with pytest.raises(TypeError, match="list of tensors"):
        call(torch.stack(lse), outs, 0)


@pytest.mark.skipif(DEVICE != "cpu", reason="gradients are checked once, on the CPU")
def test_differentiable():
    lse = [torch.randn(6, dtype=torch.float32, requires_grad=True) for _ in range(2)]
    outs = [torch.randn(6, 8, dtype=torch.float32, requires_grad=True) for _ in range(2)]
    out, lse_out = torch_npu.npu_attention_update(lse, outs, 1)
    (out.sum() + lse_out.sum()).backward()
    lse64 = [t.detach().double().requires_grad_() for t in lse]
    outs64 = [t.detach().double().requires_grad_() for t in outs]
    ref_out, ref_lse = _golden(lse64, outs64, torch.float64)
    (ref_out.sum() + ref_lse.sum()).backward()
    for ours, ref in zip(lse + outs, lse64 + outs64):
        torch.testing.assert_close(ours.grad.double(), ref.grad, atol=1e-5, rtol=1e-5)
