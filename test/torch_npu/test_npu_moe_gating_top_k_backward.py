"""Port of op-plugin test/test_custom_ops/test_npu_moe_gating_top_k_backward.py
(torch_npu.npu_moe_gating_top_k_backward, the x-gradient of npu_moe_gating_top_k with norm_type 1).

Upstream case (skipped upstream, "temporarily"; ported and run here):
- test_npu_moe_gating_top_k_backward_bf16_2048_192_10: 2048 tokens, 192 experts, k 10, bfloat16, sigmoid scores
  with a 0.1-scaled bias for the selection, weights renormalised over the k, routed_scaling_factor 1. Three results
  for one output gradient: the device's own autograd through a PyTorch routing function in bfloat16 ("gpu"
  golden), float64 autograd on the CPU (golden), and npu_moe_gating_top_k_backward(sigmoid(x) in float32, grad,
  the experts the bfloat16 routing chose). The precision check is upstream's: on |golden| >= 2^-8 the max / mean
  relative error and the RMSE of ours may be at most 2 / 1.2 / 1.2 times those of the bfloat16 autograd; below it
  ours may have at most twice as many errors > 2^-16.
Added: the same check through autograd of npu_moe_gating_top_k itself (its registered backward).
"""
import torch

from test.torch_npu.common import to_device, torch_npu

LIMITS = {"MARE": 2.0, "MERE": 1.2, "RMSE": 1.2}  # upstream's precision level L2
SMALL = {torch.bfloat16: (2 ** -8, 2 ** -16), torch.float16: (2 ** -11, 2 ** -16), torch.float32: (2 ** -14, 2 ** -30)}


def _metrics(actual, golden):
    rel = (actual - golden).abs() / (golden.abs() + 1e-7)
    return {"MARE": rel.max().item(), "MERE": rel.mean().item(),
            "RMSE": (actual - golden).pow(2).mean().sqrt().item()}


def precision_check(ours, reference, golden, dtype):
    """Upstream's criterion: our errors against the float64 golden, relative to those of the reference."""
    threshold, small_err = SMALL[dtype]
    normal = golden.abs() >= threshold
    ok = True
    if normal.any():
        mine, theirs = _metrics(ours[normal], golden[normal]), _metrics(reference[normal], golden[normal])
        ok = all(mine[m] / (theirs[m] + 1e-7) <= limit for m, limit in LIMITS.items())
    if (~normal).any():
        def errors(t):
            return int(((t - golden).abs() > small_err)[~normal].sum())
        ok = ok and errors(ours) / max(errors(reference), 1) <= 2.0
    return ok


def sigmoid_routing(logits, k, expert_bias, scaling_factor):
    """The routing function of the upstream test (sigmoid scores, bias for the selection, renormalised top-k)."""
    scores = torch.sigmoid(logits.float())
    _, idx = torch.topk(scores + expert_bias, k=k, dim=1)
    probs = torch.gather(scores, 1, idx)
    if k > 1:
        probs = probs / (probs.sum(dim=-1, keepdim=True) + 1e-20)
    if scaling_factor:
        probs = probs * scaling_factor
    return probs.type_as(logits), idx


def _run(m, n, k, dtype, scale=1.0, eps=1e-20, seed=44, through_autograd=False):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(m, n, generator=gen)
    bias = torch.randn(n, generator=gen) * 0.1
    grad = torch.randn(m, k, generator=gen)
    # the device's own autograd in the low precision
    logits_dev = to_device(logits.to(dtype)).requires_grad_(True)
    y_dev, idx_dev = sigmoid_routing(logits_dev, k, to_device(bias.to(dtype)), scale)
    y_dev.backward(to_device(grad.to(dtype)))
    reference = logits_dev.grad.detach().cpu().double()
    # float64 golden
    logits64 = logits.double().requires_grad_(True)
    y64, _ = sigmoid_routing(logits64, k, bias.double(), scale)
    y64.backward(grad.double())
    golden = logits64.grad
    if through_autograd:
        x = to_device(logits.to(dtype)).requires_grad_(True)
        y, _, _ = torch_npu.npu_moe_gating_top_k(x, k, bias=to_device(bias.to(dtype)), norm_type=1,
                                                 routed_scaling_factor=scale, eps=eps)
        y.backward(to_device(grad.to(dtype)))
        ours = x.grad.cpu().double()
    else:
        x_norm = to_device(torch.sigmoid(logits))
        ours = torch_npu.npu_moe_gating_top_k_backward(x_norm, to_device(grad.to(dtype)), idx_dev.int(), renorm=0,
                                                       norm_type=1, routed_scaling_factor=scale, eps=eps)
        assert ours.shape == (m, n) and ours.dtype == dtype
        ours = ours.cpu().double()
    assert precision_check(ours, reference, golden, dtype), "precision check failed"


def test_npu_moe_gating_top_k_backward_bf16_2048_192_10():
    _run(2048, 192, 10, torch.bfloat16)


def test_npu_moe_gating_top_k_autograd_bf16():
    _run(256, 192, 10, torch.bfloat16, scale=2.5, through_autograd=True)
