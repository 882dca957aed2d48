"""npu_fusion_attention(_grad) with sink, softmax_layout, dropout_mask, seed/offset and host sequence lengths on the
simulated npu device, run by test_attention_args.py through runner.run_cases.

These arguments run the CPU kernels on aliases of the npu tensors (docs/attention.md, "On the npu device"): every
result must be on the npu and equal, bit for bit, to the same call on CPU tensors, forward and backward.
"""
import torch

import torch_ops_transformer as tot
from torch_ops_transformer.attention import _npu_dropout_gen_mask


def _tensors(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in shapes]


def _both(fn):
    """fn(device) on CPU and on npu; the npu results (tensors on npu, moved back) equal the CPU ones."""
    cpu, npu = fn("cpu"), fn("npu")
    for i, (c, n) in enumerate(zip(cpu, npu)):
        if isinstance(c, torch.Tensor):
            assert n.device.type == "npu", (i, n.device)
            assert torch.equal(c, n.cpu()), f"result {i} differs between cpu and npu"
        else:
            assert c == n, (i, c, n)
    return cpu


def _forward_backward(device, q, k, v, dy, diff, **kw):
    leaves = {name: t.to(device).requires_grad_() for name, t in diff.items()}
    res = tot.npu_fusion_attention(*(leaves.get(n, t.to(device)) for n, t in (("q", q), ("k", k), ("v", v))),
                                   **{name: leaves.get(name, value.to(device) if isinstance(value, torch.Tensor)
                                                      else value) for name, value in kw.items()})
    grads = torch.autograd.grad(res[0], list(leaves.values()), dy.to(device))
    return list(res) + list(grads)


def case_sink_forward_and_autograd():
    q, k, v, dy = _tensors((2, 9, 64), (2, 11, 32), (2, 11, 32), (2, 9, 64))
    sink = torch.tensor([0.3, -1.0, 2.0, 0.0])
    res = _both(lambda d: _forward_backward(d, q, k, v, dy, {"q": q, "k": k, "v": v, "sink": sink}, head_num=4,
                                            input_layout="BSH", scale=0.25, sink=sink, sparse_mode=3))
    assert res[-1].shape == (4,) and res[-1].abs().sum() > 0  # dsink


def case_sink_grad_wrapper_returns_on_npu():
    q, k, v, dy = _tensors((1, 2, 7, 16), (1, 2, 7, 16), (1, 2, 7, 16), (1, 2, 7, 16))
    sink = torch.tensor([0.5, -0.5])

    def run(device):
        t = [x.to(device) for x in (q, k, v, dy)]
        out, smax, ssum, _, seed, offset, numels = tot.npu_fusion_attention(*t[:3], 2, "BNSD", scale=0.25,
                                                                            sink=sink.to(device), keep_prob=0.8,
                                                                            seed=17)
        dq, dk, dv, dpse, dsink = tot.npu_fusion_attention_grad(
            *t[:3], t[3], 2, "BNSD", softmax_max=smax, softmax_sum=ssum, attention_in=out, scale_value=0.25,
            keep_prob=0.8, seed=seed, offset=offset, numels=numels, sink=sink.to(device))
        assert dpse is None
        return out, dq, dk, dv, dsink, seed, offset, numels

    res = _both(run)
    assert res[5:] == (17, 0, 2 * 7 * 7)


def case_softmax_layout_tnd_both_orders():
    q, k, v, dy = _tensors((9, 4, 16), (12, 2, 16), (12, 2, 16), (9, 4, 16))
    for layout in ("", "TND"):
        _both(lambda d: _forward_backward(d, q, k, v, dy, {"q": q, "k": k, "v": v}, head_num=4, input_layout="TND",
                                          actual_seq_qlen=[4, 9], actual_seq_kvlen=[5, 12], scale=0.25,
                                          softmax_layout=layout))


def case_host_sequence_lengths_with_npu_inputs():
    """Lengths as Python lists, CPU int tensors (host, as torch_npu accepts) or npu tensors: one result."""
    q, k, v, dy = _tensors((9, 4, 16), (12, 2, 16), (12, 2, 16), (9, 4, 16))
    qn, kn, vn, dyn = (t.to("npu") for t in (q, k, v, dy))
    outs = []
    for lens in ([4, 9], [5, 12]), (torch.tensor([4, 9]), torch.tensor([5, 12], dtype=torch.int32)), \
            (torch.tensor([4, 9]).to("npu"), torch.tensor([5, 12]).to("npu")):
        out, smax, ssum, *_ = tot.npu_fusion_attention(qn, kn, vn, 4, "TND", actual_seq_qlen=lens[0],
                                                       actual_seq_kvlen=lens[1], scale=0.25, keep_prob=0.9, seed=5)
        grads = tot.npu_fusion_attention_grad(qn, kn, vn, dyn, 4, "TND", softmax_max=smax, softmax_sum=ssum,
                                              attention_in=out, scale_value=0.25, keep_prob=0.9, seed=5,
                                              actual_seq_qlen=lens[0], actual_seq_kvlen=lens[1])
        assert all(t.device.type == "npu" for t in (out, *grads[:3], grads[4]))
        outs.append([t.cpu() for t in (out, *grads[:3])])
    for other in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], other))


def case_dropout_mask_from_npu_dropout_gen_mask():
    q, k, v, dy = _tensors((2, 4, 9, 16), (2, 4, 11, 16), (2, 4, 11, 16), (2, 4, 9, 16))

    def run(device):
        mask = _npu_dropout_gen_mask(q.to(device), [2, 4, 9, 11], 0.3, 42, 8)
        assert mask.device.type == device and mask.dtype == torch.uint8
        res = _forward_backward(device, q, k, v, dy, {"q": q, "k": k, "v": v}, head_num=4, input_layout="BNSD",
                                scale=0.25, keep_prob=0.7, dropout_mask=mask, seed=42, offset=8)
        generated = tot.npu_fusion_attention(q.to(device), k.to(device), v.to(device), 4, "BNSD", scale=0.25,
                                             keep_prob=0.7, seed=42, offset=8)[0]
        assert torch.equal(generated.cpu(), res[0].cpu())  # the explicit mask is the stream of that seed/offset
        return res + [mask]

    _both(run)


def case_grad_wrapper_with_seed_ints_on_npu():
    """npu_fusion_attention_grad on npu tensors with the ints the forward returned (seed/offset become host tensors)
    regenerates the forward's mask: the gradients equal autograd's."""
    q, k, v, dy = (t.to("npu") for t in _tensors((2, 9, 32), (2, 9, 32), (2, 9, 32), (2, 9, 32)))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, smax, ssum, _, seed, offset, numels = tot.npu_fusion_attention(*leaves, 2, "BSH", scale=0.3, keep_prob=0.6)
    assert isinstance(seed, int) and seed != 0 and numels == 2 * 2 * 9 * 9
    want = torch.autograd.grad(out, leaves, dy)
    got = tot.npu_fusion_attention_grad(q, k, v, dy, 2, "BSH", softmax_max=smax, softmax_sum=ssum,
                                        attention_in=out.detach(), scale_value=0.3, keep_prob=0.6, seed=seed,
                                        offset=offset, numels=numels)
    for g, w in zip(got[:3], want):
        assert g.device.type == "npu" and torch.equal(g.cpu(), w.cpu())


def case_device_mismatch_names_the_argument():
    q = torch.randn(1, 2, 5, 8).to("npu")
    for name, kw in (("sink", dict(sink=torch.zeros(2))),
                     ("dropout_mask", dict(keep_prob=0.5, dropout_mask=torch.zeros(16, dtype=torch.uint8)))):
        try:
            tot.npu_fusion_attention(q, q, q, 2, "BNSD", **kw)
        except (ValueError, RuntimeError) as e:
            assert f"'{name}'" in str(e), str(e)
        else:
            raise AssertionError(f"a CPU {name} with npu inputs was accepted")
