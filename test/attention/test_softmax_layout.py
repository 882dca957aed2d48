"""softmax_layout: the order of the TND softmax statistics. torch_npu returns a [T, N, 8] tensor either way; by
default its memory holds the rows in NTD order (the memory of [N, T, 8]), with softmax_layout="TND" in TND order. The
backward reads them in the order its own softmax_layout names. Other values, and "TND" with another input layout,
are errors naming the argument."""
import pytest
import torch

from test.attention.attention_cases import OPS, Case, compare_with_reference, make_inputs
from torch_ops_transformer import flash_attn_varlen_func, npu_fusion_attention, npu_fusion_attention_grad

TND = Case(layout="TND", q_heads=4, kv_heads=2, seqlens=((3, 0, 6, 2), (5, 4, 0, 7)), sparse_mode=3)


def _run(softmax_layout):
    args = make_inputs(TND)
    return args, OPS.flash_attention_score(**args, softmax_layout=softmax_layout)


def test_default_is_ntd_order_inside_a_tnd_shape():
    args, (out_d, smax_d, ssum_d, *_) = _run("")
    _, (out_t, smax_t, ssum_t, *_) = _run("TND")
    t, n = args["query"].shape[:2]
    assert smax_d.shape == smax_t.shape == ssum_d.shape == (t, n, 8)
    assert torch.equal(out_d, out_t)
    # the same rows, stored head-major by default
    assert torch.equal(smax_d.view(n, t, 8), smax_t.transpose(0, 1))
    assert torch.equal(ssum_d.view(n, t, 8), ssum_t.transpose(0, 1))


@pytest.mark.parametrize("layout", ["", "TND"])
def test_forward_and_backward_match_reference(layout):
    compare_with_reference(TND.replace(softmax_layout=layout))
    compare_with_reference(TND.replace(softmax_layout=layout, keep_prob=0.8, dtype="bf16"))


@pytest.mark.parametrize("layout", ["", "TND"])
def test_grad_reads_the_statistics_in_its_softmax_layout(layout):
    args, (out, smax, ssum, *_) = _run(layout)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    kw = dict(softmax_max=smax, softmax_sum=ssum, attention_in=out, actual_seq_qlen=args["actual_seq_qlen"],
              actual_seq_kvlen=args["actual_seq_kvlen"], scale=args["scale"], sparse_mode=3)
    q, k, v = args["query"], args["key"], args["value"]
    right = OPS.flash_attention_score_grad(q, k, v, dy, 4, "TND", softmax_layout=layout, **kw)
    other = OPS.flash_attention_score_grad(q, k, v, dy, 4, "TND", softmax_layout="TND" if layout == "" else "", **kw)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    fwd = OPS.flash_attention_score(*leaves, 4, "TND", actual_seq_qlen=args["actual_seq_qlen"],
                                    actual_seq_kvlen=args["actual_seq_kvlen"], scale=args["scale"], sparse_mode=3,
                                    softmax_layout=layout)[0]
    want = torch.autograd.grad(fwd, leaves, dy)
    for a, b in zip(right[:3], want):
        assert torch.equal(a, b)
    assert not torch.allclose(right[0], other[0])  # the statistics of other rows: a different (wrong) result


def test_wrapper_passes_softmax_layout_both_ways():
    args = make_inputs(TND)
    q, k, v = args["query"], args["key"], args["value"]
    lens = dict(actual_seq_qlen=args["actual_seq_qlen"].tolist(), actual_seq_kvlen=args["actual_seq_kvlen"].tolist())
    for layout in ("", "TND"):
        out, smax, ssum, *_ = npu_fusion_attention(q, k, v, 4, "TND", scale=args["scale"], sparse_mode=3,
                                                   softmax_layout=layout, **lens)
        ref = OPS.flash_attention_score(**args, softmax_layout=layout)
        assert torch.equal(smax, ref[1]) and torch.equal(out, ref[0])
        got = npu_fusion_attention_grad(q, k, v, out, 4, "TND", softmax_max=smax, softmax_sum=ssum, attention_in=out,
                                        scale_value=args["scale"], sparse_mode=3, softmax_layout=layout, **lens)
        assert len(got) == 5 and got[3] is None and got[4].shape == (0,)


def test_flash_attn_varlen_lse_is_head_major_and_contiguous():
    args = make_inputs(TND.replace(sparse_mode=0))
    q, k, v = args["query"], args["key"], args["value"]
    zero = torch.zeros(1, dtype=torch.int64)
    cu_q, cu_k = torch.cat([zero, args["actual_seq_qlen"]]), torch.cat([zero, args["actual_seq_kvlen"]])
    _, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, softmax_scale=args["scale"],
                                       return_attn_probs=True)
    smax, ssum = OPS.flash_attention_score(**dict(args, sparse_mode=0), softmax_layout="TND")[1:3]
    assert lse.shape == (4, q.shape[0]) and lse.is_contiguous()
    want = (smax[..., 0] + ssum[..., 0].log()).transpose(0, 1)
    # Rows that see no key (the sequence without keys): FlashAttention-2 returns +inf, the op's statistics -inf.
    assert (want == float("-inf")).any()
    torch.testing.assert_close(lse, torch.where(want == float("-inf"), float("inf"), want))


@pytest.mark.parametrize("layout, value, words", [
    ("TND", "NTD", ("'softmax_layout'", "'NTD'")),
    ("TND", "tnd", ("'softmax_layout'", "'tnd'")),
    ("BSND", "TND", ("'softmax_layout'", "input_layout TND", "BSND")),
])
def test_bad_softmax_layout_is_rejected(layout, value, words):
    args = make_inputs(TND if layout == "TND" else Case())
    with pytest.raises(ValueError) as e:
        OPS.flash_attention_score(**args, softmax_layout=value)
    assert all(w in str(e.value) for w in words), str(e.value)
    out, smax, ssum = OPS.flash_attention_score(**args)[:3]
    with pytest.raises(ValueError, match="softmax_layout"):
        OPS.flash_attention_score_grad(args["query"], args["key"], args["value"], out, args["head_num"], layout,
                                       softmax_max=smax, softmax_sum=ssum, attention_in=out, softmax_layout=value,
                                       actual_seq_qlen=args.get("actual_seq_qlen"),
                                       actual_seq_kvlen=args.get("actual_seq_kvlen"))
