"""Port of op-plugin test/test_custom_ops/test_npu_flash_attention.py (torch_npu.npu_fusion_attention), plus the
examples of torch_npu's npu_fusion_attention documentation.

The golden functions re-derive upstream's math (softmax of the scaled scores, the dropout mask scaling the
probabilities by 1/keep_prob, FlashAttention's backward with the softmax gradient) and the checks are torch_npu's
assertRtolEqual with upstream's precisions.

Upstream cases:
- test_npu_flash_attention (BSH fp16, 32 heads): ported.
- test_npu_flash_attention_tnd (TND, GQA 8/2, softmax_layout="TND"; output, statistics and autograd gradients):
  ported.
- test_npu_flash_attention_with_dropmask (internal dropout mask, golden from _npu_dropout_gen_mask): ported with one
  adaptation. Upstream relies on torch_npu's generator handing the op (seed = the manual seed, offset = 0) for its
  first draw after torch.npu.manual_seed(2); here a seed of 0 draws a random seed from torch's default generator, so
  the golden mask is made from the seed/offset the op returns (the same mask, the same math).
- test_npu_flash_attention_with_external_dropout_mask: ported (shapes as upstream, plus the golden of the mask's bits).
- test_npu_flash_attention_dropout_mask_reproducibility: ported.
- test_npu_flash_attention_without_dropout_mask: ported.
- test_npu_flash_attention_tnd_with_dropmask: ported, with the adaptation of test_npu_flash_attention_with_dropmask.
- test_npu_flash_attention_tensor, test_npu_flash_attention_tensor_tnd, test_npu_flash_attention_tensor_with_dropmask,
  test_npu_flash_attention_tensor_tnd_with_dropmask (defined twice upstream; the second definition replaces the
  first): not applicable, they call npu_fusion_attention_v3, an op this project does not claim.
- test_npu_flash_attention_tensor_graph, test_npu_flash_attention_tensor_tnd_graph,
  test_npu_flash_attention_tensor_with_dropmask_graph: not applicable, npu_fusion_attention_v3 captured in an
  NPUGraph (NPU graph mode, and an op not claimed).

Documentation examples: the sparse_mode example (modes 0-4 against the -10000-additive golden), the pse example (its
golden is the documented formula scale * (pse + q kᵀ); the example's own reference adds pse after scaling and only
prints the difference) and the sink example are ported; the prefix example (sparse_mode 5) is not applicable (prefix
is not implemented: a NotImplementedError, checked here); the external dropout_mask example is the external-mask case
above.
"""
import numpy as np
import torch

from test.torch_npu.common import DEVICE, on_cpu, to_device, torch_npu
from torch_ops_transformer.compat.testing import TestCase

SCALE = 0.08838


def cumulative(lengths):
    return torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int64)


def bnsd_to_bsh(t):
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)


def repeat_kv(t, heads):
    """[1, N2, S, D] -> [1, N1, S, D], each kv head serving N1 / N2 query heads (GQA)."""
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def unpack_mask(mask, count):
    """The keep bits of a uint8 dropout mask (bit e of byte e // 8, LSB first) as uint8 0/1, [count]."""
    bits = (mask.cpu().view(-1, 1) >> torch.arange(8, dtype=torch.uint8)) & 1
    return bits.view(-1)[:count]


def golden_forward(q, k, v, scale, keep=None, keep_prob=1.0):
    """out = dropout(softmax(scale * q kᵀ)) v on [B, N, S, D]; also the probabilities and the row max / sum."""
    scores = q @ k.transpose(-1, -2) * scale
    row_max = scores.amax(-1, keepdim=True)
    e = torch.exp(scores - row_max)
    row_sum = e.sum(-1, keepdim=True)
    probs = e / row_sum
    dropped = probs if keep is None else probs * keep / keep_prob
    return dropped @ v, probs, row_max, row_sum


def golden_backward(dy, q, k, v, probs, scale, keep=None, keep_prob=1.0):
    """dq, dk, dv of golden_forward: dP = dy vᵀ (dropped), dS = P * (dP - rowsum(P * dP))."""
    dp = dy @ v.transpose(-1, -2)
    dropped = probs if keep is None else probs * keep / keep_prob
    if keep is not None:
        dp = dp * keep / keep_prob
    ds = probs * (dp - (probs * dp).sum(-1, keepdim=True)) * scale
    return ds @ k, ds.transpose(-1, -2) @ q, dropped.transpose(-1, -2) @ dy


def golden_tnd(q, k, v, dy, q_lens, kv_lens, keep=None, keep_prob=1.0):
    """Upstream's per-sequence TND golden in float32: out, softmax max/sum [T, N1, 8] (TND order), dq, dk, dv."""
    t1, n1, d = q.shape
    n2 = k.shape[1]
    scale = 1 / d ** 0.5
    cq, ck = cumulative(q_lens), cumulative(kv_lens)
    out, dq, dk, dv = (torch.zeros_like(x) for x in (q, q, k, v))
    smax, ssum = torch.zeros(t1, n1, 8), torch.zeros(t1, n1, 8)
    start = 0
    for i, (sq, skv) in enumerate(zip(q_lens, kv_lens)):
        if sq == 0 or skv == 0:
            continue
        qi, dyi = (x[cq[i]:cq[i + 1]].float().transpose(0, 1)[None] for x in (q, dy))
        ki, vi = (repeat_kv(x[ck[i]:ck[i + 1]].float().transpose(0, 1)[None], n1) for x in (k, v))
        keep_i = None
        if keep is not None:
            keep_i = keep[start:start + n1 * sq * skv].view(n1, sq, skv).float()
        start += n1 * sq * skv
        o, p, mx, sm = golden_forward(qi, ki, vi, scale, keep_i, keep_prob)
        gq, gk, gv = golden_backward(dyi, qi, ki, vi, p, scale, keep_i, keep_prob)
        gk, gv = (g.view(1, n2, n1 // n2, skv, d).sum(2) for g in (gk, gv))
        out[cq[i]:cq[i + 1]] = o[0].transpose(0, 1).to(q.dtype)
        smax[cq[i]:cq[i + 1]] = mx[0, :, :, 0].transpose(0, 1)[..., None].expand(sq, n1, 8)
        ssum[cq[i]:cq[i + 1]] = sm[0, :, :, 0].transpose(0, 1)[..., None].expand(sq, n1, 8)
        dq[cq[i]:cq[i + 1]] = gq[0].transpose(0, 1).to(q.dtype)
        dk[ck[i]:ck[i + 1]] = gk[0].transpose(0, 1).to(k.dtype)
        dv[ck[i]:ck[i + 1]] = gv[0].transpose(0, 1).to(v.dtype)
    return out, smax, ssum, dq, dk, dv


def tnd_inputs(seed=0):
    n1, n2, d = 8, 2, 128
    q_lens, kv_lens = [1, 2, 3], [3, 4, 5]
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: (2 * (torch.rand(s, generator=g) - 0.5)).half()  # noqa: E731
    return (rand(sum(q_lens), n1, d), rand(sum(kv_lens), n2, d), rand(sum(kv_lens), n2, d), rand(sum(q_lens), n1, d),
            q_lens, kv_lens)


class TestNPUFlashAttention(TestCase):
    def run_fa(self, q, k, v, head_num, input_layout, **kw):
        return torch_npu.npu_fusion_attention(*to_device(q, k, v), head_num, input_layout, **kw)

    def test_npu_flash_attention(self):
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(1, 32, 128, 128, generator=g).half() for _ in range(3))
        golden = golden_forward(q.float(), k.float(), v.float(), SCALE)[0]
        result = self.run_fa(bnsd_to_bsh(q), bnsd_to_bsh(k), bnsd_to_bsh(v), 32, "BSH", scale=SCALE)
        self.assertRtolEqual(bnsd_to_bsh(golden).half(), on_cpu(result[0]))

    def check_tnd(self, keep_prob):
        q, k, v, dy, q_lens, kv_lens = tnd_inputs()
        q_d, k_d, v_d = (t.requires_grad_() for t in to_device(q, k, v))
        result = torch_npu.npu_fusion_attention(
            q_d, k_d, v_d, 8, scale=1 / 128 ** 0.5, input_layout="TND",
            actual_seq_qlen=tuple(cumulative(q_lens)[1:].tolist()),
            actual_seq_kvlen=tuple(cumulative(kv_lens)[1:].tolist()), softmax_layout="TND", keep_prob=keep_prob)
        keep = None
        if keep_prob < 1.0:
            numel = 8 * sum(a * b for a, b in zip(q_lens, kv_lens))
            self.assertEqual(result[6], numel)
            keep = unpack_mask(torch_npu._npu_dropout_gen_mask(q_d, [numel], p=1 - keep_prob, seed=result[4],
                                                               offset=result[5], parallel=True, sync=False), numel)
        out, smax, ssum, dq, dk, dv = golden_tnd(q, k, v, dy, q_lens, kv_lens, keep, keep_prob)
        self.assertRtolEqual(out, on_cpu(result[0]))
        self.assertRtolEqual(smax, on_cpu(result[1]))
        self.assertRtolEqual(ssum, on_cpu(result[2]))
        result[0].backward(to_device(dy))
        self.assertRtolEqual(dq, on_cpu(q_d.grad))
        self.assertRtolEqual(dk, on_cpu(k_d.grad))
        self.assertRtolEqual(dv, on_cpu(v_d.grad))

    def test_npu_flash_attention_tnd(self):
        self.check_tnd(1.0)

    def test_npu_flash_attention_tnd_with_dropmask(self):
        self.check_tnd(0.9)

    def test_npu_flash_attention_with_dropmask(self):
        g = torch.Generator().manual_seed(2)
        q, k, v = (torch.randn(1, 32, 256, 128, generator=g).half() for _ in range(3))
        keep_prob = 0.9
        result = self.run_fa(bnsd_to_bsh(q), bnsd_to_bsh(k), bnsd_to_bsh(v), 32, "BSH", scale=SCALE,
                             keep_prob=keep_prob)
        numel = 32 * 256 * 256
        self.assertEqual(result[6], numel)
        mask = torch_npu._npu_dropout_gen_mask(to_device(q), [numel], p=1 - keep_prob, seed=result[4],
                                               offset=result[5], parallel=True, sync=False)
        keep = unpack_mask(mask, numel).view(1, 32, 256, 256).float()
        golden = golden_forward(q.float(), k.float(), v.float(), SCALE, keep, keep_prob)[0]
        self.assertRtolEqual(bnsd_to_bsh(golden).half(), on_cpu(result[0]))

    def test_npu_flash_attention_with_external_dropout_mask(self):
        b, n, s, d = 1, 32, 128, 128
        g = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(b, n, s, d, generator=g).half() for _ in range(3))
        keep_prob, seed, offset = 0.8, 123, 0
        mask = torch_npu._npu_dropout_gen_mask(torch.randn(1, device=DEVICE), [b, n, s, s], p=1 - keep_prob,
                                               seed=seed, offset=offset, parallel=True, sync=False)
        out, smax, ssum, _, out_seed, out_offset, numels = self.run_fa(
            bnsd_to_bsh(q), bnsd_to_bsh(k), bnsd_to_bsh(v), n, "BSH", scale=SCALE, keep_prob=keep_prob,
            dropout_mask=mask, seed=seed, offset=offset)
        self.assertEqual(out.shape, (b, s, n * d))
        self.assertEqual(smax.shape[:2], (b, n))
        self.assertEqual(ssum.shape[:2], (b, n))
        self.assertEqual((out_seed, out_offset, numels), (seed, offset, b * n * s * s))
        keep = unpack_mask(mask, numels).view(b, n, s, s).float()
        golden = golden_forward(q.float(), k.float(), v.float(), SCALE, keep, keep_prob)[0]
        self.assertRtolEqual(bnsd_to_bsh(golden).half(), on_cpu(out))

    def test_npu_flash_attention_dropout_mask_reproducibility(self):
        b, n, s, d = 1, 32, 128, 128
        g = torch.Generator().manual_seed(4)
        q, k, v = (bnsd_to_bsh(torch.randn(b, n, s, d, generator=g).half()) for _ in range(3))
        mask = torch_npu._npu_dropout_gen_mask(torch.randn(1, device=DEVICE), [b, n, s, s], p=0.1, seed=456,
                                               offset=0, parallel=True, sync=False)
        kw = dict(scale=0.125, keep_prob=0.9, dropout_mask=mask, seed=456, offset=0)
        first = self.run_fa(q, k, v, n, "BSH", **kw)[0]
        second = self.run_fa(q, k, v, n, "BSH", **kw)[0]
        self.assertRtolEqual(on_cpu(first), on_cpu(second))

    def test_npu_flash_attention_without_dropout_mask(self):
        b, n, s, d = 1, 32, 128, 128
        g = torch.Generator().manual_seed(5)
        q, k, v = (bnsd_to_bsh(torch.randn(b, n, s, d, generator=g).half()) for _ in range(3))
        out = self.run_fa(q, k, v, n, "BSH", scale=0.125, keep_prob=1.0, dropout_mask=None, seed=0, offset=0)[0]
        self.assertEqual(out.shape, q.shape)

    # ---- the documentation's examples ----

    def test_doc_example_sparse_modes(self):
        """Modes 0-4 with their masks (band for 0 and 4, the compressed 2048x2048 causal mask for 2-4) against the
        golden that adds -10000 where the mask is set."""
        g = torch.Generator().manual_seed(6)
        q, k, v = (torch.randn(1, 8, 256, 256, generator=g).half() for _ in range(3))
        shape = (1, 8, 256, 256)
        for mode, pre, nxt in ([0, 128, 128], [1, 65536, 65536], [2, 65536, 0], [3, 65536, 0], [4, 128, 128]):
            ones = torch.ones(shape)
            if mode in (0, 4):
                golden_mask = torch.triu(ones, diagonal=nxt + 1) + torch.tril(ones, diagonal=-pre - 1)
            elif mode == 1:
                golden_mask = torch.zeros(shape)
            else:
                golden_mask = torch.triu(ones, diagonal=1)
            atten_mask = None
            if mode == 0:
                ones_b = torch.ones(shape, dtype=torch.bool)
                atten_mask = torch.triu(ones_b, diagonal=pre + 1) | torch.tril(ones_b, diagonal=-nxt - 1)
            elif mode in (2, 3, 4):
                atten_mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
            scores = (q.float() @ k.float().transpose(2, 3)) * SCALE + golden_mask * -10000.0
            golden = torch.softmax(scores, dim=-1) @ v.float()
            out = self.run_fa(q, k, v, 8, "BNSD", scale=SCALE, sparse_mode=mode, atten_mask=to_device(atten_mask),
                              pre_tockens=pre, next_tockens=nxt)[0]
            self.assertRtolEqual(golden.half(), on_cpu(out), prec=0.01, prec16=0.01)

    def test_doc_example_pse(self):
        """The example's shapes; its reference adds pse after scaling and only prints the difference, so the golden
        here is the documented formula, softmax(scale * (pse + q kᵀ)) v."""
        b, n, s, d = 1, 4, 16, 64
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(b, n, s, d, generator=g).half() for _ in range(3))
        pse = (torch.randn(b, n, s, s, generator=g) * 0.01).half()
        out = self.run_fa(q, k, v, n, "BNSD", pse=to_device(pse), scale=1 / d ** 0.5, keep_prob=1.0)[0]
        scores = (q.float() @ k.float().transpose(2, 3) + pse.float()) / d ** 0.5
        golden = torch.softmax(scores, dim=-1) @ v.float()
        self.assertLess((on_cpu(out).float() - golden).abs().max().item(), 2e-3)

    def test_doc_example_sink(self):
        b, n, s, d = 1, 4, 16, 64
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(b, n, s, d, generator=g).half() for _ in range(3))
        sink = torch.linspace(-0.2, 0.2, steps=n, dtype=torch.float32)
        out = self.run_fa(q, k, v, n, "BNSD", sink=to_device(sink), scale=1 / d ** 0.5, keep_prob=1.0)[0]
        scores = q.float() @ k.float().transpose(2, 3) / d ** 0.5
        probs = torch.softmax(torch.cat([scores, sink.view(1, n, 1, 1).expand(b, n, s, 1)], dim=-1), dim=-1)
        golden = probs[..., :-1] @ v.float()
        self.assertLess((on_cpu(out).float() - golden).abs().max().item(), 2e-3)

    def test_doc_example_prefix(self):
        # Batch b's first prefix[b] keys are visible to every query, the rest bottom-right causally.
        q = torch.randn(2, 4, 32, 64).half()
        out = self.run_fa(q, q, q, 4, "BNSD", prefix=[4, 8], sparse_mode=5, scale=0.125)[0]
        i, j = torch.arange(32)[:, None], torch.arange(32)[None, :]
        masked = (j > i) & (j >= torch.tensor([4, 8]).view(2, 1, 1, 1))
        scores = (q.float() @ q.float().transpose(2, 3) * 0.125).masked_fill(masked, float("-inf"))
        golden = torch.softmax(scores, dim=-1) @ q.float()
        self.assertLess((on_cpu(out).float() - golden).abs().max().item(), 2e-3)
