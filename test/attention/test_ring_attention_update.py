"""torch_npu's npu_ring_attention_update: merging two partial attention results by their softmax statistics, against
a float64 reference of the documented formula under the project's tolerance rule, and against attention itself: the
merge of the halves of a key sequence, each attended by npu_fusion_attention, is attention over the whole sequence."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.doc_examples import run_examples
from test.common.tiers import pairwise


def ref_ring(prev, pm, ps, cur, cm, cs, layout, dtype=torch.float64):
    m1, s1, m2, s2 = (t[..., 0].to(dtype) for t in (pm, ps, cm, cs))
    m = torch.maximum(m1, m2)
    a, c = s1 * torch.exp(m1 - m), s2 * torch.exp(m2 - m)
    s = a + c
    wa, wc = a / s, c / s  # [B, N, S] or [T, N]
    p, q = prev.to(dtype), cur.to(dtype)
    if layout == "SBH":
        S, B, H = p.shape
        n = wa.shape[1]
        wa, wc = wa.permute(2, 0, 1)[..., None], wc.permute(2, 0, 1)[..., None]  # [S, B, N, 1]
        out = (p.view(S, B, n, -1) * wa + q.view(S, B, n, -1) * wc).view(S, B, H)
    else:
        out = p * wa[..., None] + q * wc[..., None]
    return out, m, s


def _stats(shape, g, lo):
    return (torch.rand(shape, generator=g) * 3 + lo).unsqueeze(-1).expand(*shape, 8).contiguous()


@pytest.mark.parametrize("layout,dtype,head_dim", pairwise(layout=("SBH", "TND"), dtype={
    "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}, head_dim=(16, 72)))
def test_ring_update_matches_reference(layout, dtype, head_dim):
    g = torch.Generator().manual_seed(head_dim)
    S, B, N = 5, 2, 3
    if layout == "SBH":
        attn, stats, kw = (S, B, N * head_dim), (B, N, S), {}
    else:
        attn, stats = (S * B, N, head_dim), (S * B, N)
        kw = dict(actual_seq_qlen=[4, S * B], input_layout="TND", input_softmax_layout="TND")
    prev, cur = torch.randn(attn, generator=g).to(dtype), torch.randn(attn, generator=g).to(dtype)
    pm, ps, cm, cs = _stats(stats, g, -1), _stats(stats, g, 0.5), _stats(stats, g, -1), _stats(stats, g, 0.5)
    out, m, s = tot.npu_ring_attention_update(prev, pm, ps, cur, cm, cs, **kw)
    assert out.dtype == dtype and m.dtype == s.dtype == torch.float32 and m.shape == pm.shape
    ro, rm, rs = ref_ring(prev, pm, ps, cur, cm, cs, layout)
    same = ref_ring(prev, pm, ps, cur, cm, cs, layout, dtype=dtype)[0] if dtype != torch.float32 else \
        ref_ring(prev, pm, ps, cur, cm, cs, layout, dtype=torch.float32)[0]
    check_tolerance("attn_out", out, ro, same)
    for ours, ref in ((m, rm), (s, rs)):
        assert torch.equal(ours, ours[..., :1].expand_as(ours))  # 8 equal copies
        torch.testing.assert_close(ours[..., 0].double(), ref, rtol=1e-6, atol=1e-6)


def test_merging_two_key_halves_is_attention_over_all_keys():
    """Ring context parallelism in one process: the queries attend to each half of the keys with
    npu_fusion_attention; merging the two results gives the attention over all keys."""
    torch.manual_seed(0)
    S, B, N, D = 6, 1, 2, 16
    q, k, v = (torch.randn(S, B, N * D) for _ in range(3))
    halves = []
    for sl in (slice(0, 3), slice(3, 6)):
        out, smax, ssum = tot.npu_fusion_attention(q, k[sl], v[sl], N, "SBH", scale=D ** -0.5)[:3]
        halves.append((out, smax, ssum))
    (o1, m1, s1), (o2, m2, s2) = halves
    merged, m, s = tot.npu_ring_attention_update(o1, m1, s1, o2, m2, s2)
    full = tot.npu_fusion_attention(q, k, v, N, "SBH", scale=D ** -0.5)
    torch.testing.assert_close(merged, full[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m, full[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, full[2], rtol=1e-5, atol=1e-5)


def test_ring_update_compiles_fullgraph():
    g = torch.Generator().manual_seed(1)
    prev, cur = torch.randn(4, 2, 32, generator=g), torch.randn(4, 2, 32, generator=g)
    st = [_stats((2, 2, 4), g, 0.5) for _ in range(4)]
    f = torch.compile(tot.npu_ring_attention_update, fullgraph=True)
    for a, b in zip(f(prev, st[0], st[1], cur, st[2], st[3]), tot.npu_ring_attention_update(prev, st[0], st[1], cur,
                                                                                          st[2], st[3])):
        torch.testing.assert_close(a, b)


# ---- bad inputs: one test per rule --------------------------------------------------------------------------------
def _sbh():
    st = [torch.ones(1, 2, 3, 8) for _ in range(4)]
    return torch.randn(3, 1, 8), st[0], st[1], torch.randn(3, 1, 8), st[2], st[3]


def test_bad_ring_layout():
    with pytest.raises(ValueError, match="argument 'input_layout' must be 'SBH' or 'TND'"):
        tot.npu_ring_attention_update(*_sbh(), input_layout="BSH")


def test_bad_ring_softmax_layout():
    with pytest.raises(ValueError, match="argument 'input_softmax_layout' must be '' with input_layout 'SBH'"):
        tot.npu_ring_attention_update(*_sbh(), input_softmax_layout="TND")
    with pytest.raises(NotImplementedError, match="input_softmax_layout='SBH'"):
        tot.npu_ring_attention_update(*_sbh(), input_softmax_layout="SBH")


def test_tnd_default_statistics_are_n_major():
    """TND with input_softmax_layout "": the [T, N, 8] statistics hold row (t, n) at flat row n*T + t, as
    npu_fusion_attention writes them; the result equals the TND-ordered call on the same values."""
    g = torch.Generator().manual_seed(2)
    T, N, D = 5, 3, 16
    prev, cur = torch.randn(T, N, D, generator=g), torch.randn(T, N, D, generator=g)
    st = [_stats((T, N), g, 0.5) for _ in range(4)]
    n_major = [t.permute(1, 0, 2).contiguous().view(T, N, 8) for t in st]
    a = tot.npu_ring_attention_update(prev, *st[:2], cur, *st[2:], actual_seq_qlen=[T], input_layout="TND",
                                      input_softmax_layout="TND")
    b = tot.npu_ring_attention_update(prev, *n_major[:2], cur, *n_major[2:], actual_seq_qlen=[T], input_layout="TND")
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[1].permute(1, 0, 2).contiguous().view(T, N, 8), b[1])


def test_tnd_merge_of_fusion_attention_halves():
    """npu_fusion_attention's default TND statistics go into the merge unchanged."""
    torch.manual_seed(3)
    T, N, D = 7, 2, 16
    q, k, v = (torch.randn(T, N, D) for _ in range(3))
    lens = dict(actual_seq_qlen=[3, T])
    parts = []
    for sl, kv_lens in ((slice(0, 4), [2, 4]), (slice(4, 7), [1, 3])):
        parts.append(tot.npu_fusion_attention(q, k[sl], v[sl], N, "TND", scale=D ** -0.5, actual_seq_kvlen=kv_lens,
                                              **lens)[:3])
    out, m, s = tot.npu_ring_attention_update(*parts[0], *parts[1], input_layout="TND", **lens)
    full_k = torch.cat([k[0:2], k[4:5], k[2:4], k[5:7]])
    full_v = torch.cat([v[0:2], v[4:5], v[2:4], v[5:7]])
    full = tot.npu_fusion_attention(q, full_k, full_v, N, "TND", scale=D ** -0.5, actual_seq_kvlen=[3, 7], **lens)
    torch.testing.assert_close(out, full[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, full[2], rtol=1e-5, atol=1e-5)


def test_rows_empty_in_both_blocks_stay_empty():
    st_max, st_sum = torch.full((1, 1, 2, 8), float("-inf")), torch.zeros(1, 1, 2, 8)
    out, m, s = tot.npu_ring_attention_update(torch.zeros(2, 1, 4), st_max, st_sum, torch.zeros(2, 1, 4), st_max,
                                              st_sum)
    assert not out.isnan().any() and not out.any() and torch.isinf(m).all() and not s.any()


def test_bad_ring_stats_shape():
    a = list(_sbh())
    a[4] = torch.ones(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"argument 'cur_softmax_max' must have shape \[1, 2, 3, 8\]"):
        tot.npu_ring_attention_update(*a)


def test_bad_ring_stats_dtype():
    a = list(_sbh())
    a[2] = a[2].half()
    with pytest.raises(TypeError, match="argument 'prev_softmax_sum' must be float32"):
        tot.npu_ring_attention_update(*a)


def test_bad_ring_heads_do_not_divide_hidden():
    a = list(_sbh())
    a[0], a[3] = torch.randn(3, 1, 9), torch.randn(3, 1, 9)
    with pytest.raises(ValueError, match="hidden size H = 9 .* multiple of the head count N = 2"):
        tot.npu_ring_attention_update(*a)


def test_bad_ring_cur_shape():
    a = list(_sbh())
    a[3] = torch.randn(3, 2, 8)
    with pytest.raises(ValueError, match="argument 'cur_attn_out' of shape .* must have the shape of 'prev_attn_out'"):
        tot.npu_ring_attention_update(*a)


def test_bad_ring_tnd_needs_actual_seq_qlen():
    st = [torch.ones(4, 2, 8) for _ in range(4)]
    args = (torch.randn(4, 2, 8), st[0], st[1], torch.randn(4, 2, 8), st[2], st[3])
    with pytest.raises(ValueError, match="argument 'actual_seq_qlen' is required with input_layout 'TND'"):
        tot.npu_ring_attention_update(*args, input_layout="TND")
    with pytest.raises(ValueError, match="argument 'actual_seq_qlen' must end at T = 4"):
        tot.npu_ring_attention_update(*args, actual_seq_qlen=[2, 3], input_layout="TND")
    with pytest.raises(ValueError, match="must be non-decreasing"):
        tot.npu_ring_attention_update(*args, actual_seq_qlen=[3, 2, 4], input_layout="TND")


def test_doc_example_npu_ring_attention_update():
    run_examples("attention.md", "npu_ring_attention_update")
