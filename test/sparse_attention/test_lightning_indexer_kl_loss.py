"""npu_sparse_lightning_indexer_grad_kl_loss: the indexer's KL loss against the main attention over the selected
keys and its gradients, against a float64 reference (indexer_reference.kl_loss_ref, from the documented formula)
and autograd of that reference; BSND and TND, rope, sinks, causal skipping and -1 padding; bad inputs."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.tiers import pairwise
from test.sparse_attention.indexer_reference import gather_keys, kl_loss_ref, split_query, visible

OPS = torch.ops.npu_fa


def make_kl_inputs(layout="BSND", dtype=torch.float64, B=2, S1=4, S2=12, N1=4, D=8, Ni=3, Di=6, Dr=0, K=6,
                   q_lens=None, k_lens=None, sinks=False, seed=0):
    """Inputs of one call: random main / index queries and keys, indices selected at random among each token's
    visible keys (padded with -1), and softmax_max / softmax_sum of the main attention over those keys (as the
    sparse attention forward returns them)."""
    g = torch.Generator().manual_seed(seed)
    q_lens = q_lens or [S1] * B
    k_lens = k_lens or [S2] * B
    tnd = layout == "TND"
    qlead = (sum(q_lens),) if tnd else (B, S1)
    klead = (sum(k_lens),) if tnd else (B, S2)
    t = {
        "query": torch.randn(*qlead, N1, D, generator=g),
        "key": torch.randn(*klead, 1, D, generator=g),
        "query_index": torch.randn(*qlead, Ni, Di, generator=g),
        "key_index": torch.randn(*klead, 1, Di, generator=g),
        "weights": torch.randn(*qlead, Ni, generator=g) / Ni,
    }
    if Dr:
        t["query_rope"] = torch.randn(*qlead, N1, Dr, generator=g)
        t["key_rope"] = torch.randn(*klead, 1, Dr, generator=g)
    kw = dict(layout=layout)
    if tnd:
        kw["actual_seq_qlen"] = torch.tensor(q_lens).cumsum(0).tolist()
        kw["actual_seq_klen"] = torch.tensor(k_lens).cumsum(0).tolist()
    rows = math.prod(qlead)
    idx = torch.full((rows, 1, K), -1, dtype=torch.int32)
    _, seqs = split_query(t["query"], layout, kw.get("actual_seq_qlen"))
    for b, (start, q_len) in enumerate(seqs):
        for i, vis in enumerate(visible(q_len, k_lens[b], 3)):
            n = min(K, vis)
            idx[start + i, 0, :n] = torch.randperm(vis, generator=g)[:n].to(torch.int32)
    t["sparse_indices"] = idx.reshape(*qlead, 1, K)
    scale = 1 / math.sqrt(D + Dr)
    # the main attention's running max / sum over each token's selected keys (per head)
    qf = split_query(t["query"], layout, kw.get("actual_seq_qlen"))[0]
    qrf = split_query(t["query_rope"], layout, kw.get("actual_seq_qlen"))[0] if Dr else None
    keys = gather_keys(t["key"], layout, kw.get("actual_seq_klen"), None, B)
    krs = gather_keys(t["key_rope"], layout, kw.get("actual_seq_klen"), None, B) if Dr else None
    smax = torch.zeros(rows, N1)
    ssum = torch.ones(rows, N1)
    fi = idx.reshape(rows, K).long()
    for b, (start, q_len) in enumerate(seqs):
        for i in range(q_len):
            sel = fi[start + i][fi[start + i] >= 0]
            if sel.numel() == 0:
                continue
            lg = qf[start + i] @ keys[b][sel, 0].t()
            if Dr:
                lg = lg + qrf[start + i] @ krs[b][sel, 0].t()
            lg = lg * scale
            smax[start + i] = lg.max(1).values
            ssum[start + i] = torch.exp(lg - smax[start + i][:, None]).sum(1)
    if tnd:
        t["softmax_max"], t["softmax_sum"] = smax.reshape(1, rows, N1), ssum.reshape(1, rows, N1)
    else:
        t["softmax_max"] = smax.reshape(B, S1, N1).unsqueeze(1)
        t["softmax_sum"] = ssum.reshape(B, S1, N1).unsqueeze(1)
    if sinks:
        t["sinks"] = torch.randn(N1, generator=g)
    for name in t:
        if t[name].is_floating_point() and name not in ("softmax_max", "softmax_sum", "sinks"):
            t[name] = t[name].to(dtype)
    return t, scale, kw


def _call(t, scale, kw):
    args = [t[n] for n in ("query", "key", "query_index", "key_index", "weights", "sparse_indices", "softmax_max",
                           "softmax_sum")]
    extra = {n: t[n] for n in ("query_rope", "key_rope", "sinks") if n in t}
    return tot.npu_sparse_lightning_indexer_grad_kl_loss(*args, scale, **extra, **kw)


def _ref(t, scale, kw, dtype):
    leaves = {n: t[n].detach().to(dtype).requires_grad_() for n in ("query_index", "key_index", "weights")}
    other = {n: (t[n].to(dtype) if t[n].is_floating_point() else t[n]) for n in t if n not in leaves}
    loss = kl_loss_ref(other["query"], other["key"], leaves["query_index"], leaves["key_index"], leaves["weights"],
                       other["sparse_indices"], other["softmax_max"], other["softmax_sum"], scale,
                       query_rope=other.get("query_rope"), key_rope=other.get("key_rope"),
                       asq=kw.get("actual_seq_qlen"), ask=kw.get("actual_seq_klen"), layout=kw["layout"],
                       sinks=other.get("sinks"))
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return [loss.detach().reshape(1)] + [gr if gr is not None else torch.zeros_like(leaves[n])
                                        for gr, n in zip(grads, leaves)]


@pytest.mark.asan
@pytest.mark.parametrize("layout,dtype,rope,sinks", pairwise(
    layout=["BSND", "TND"], dtype={"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16},
    rope={"rope": 4, "norope": 0}, sinks={"sinks": True, "nosinks": False}))
def test_loss_and_gradients_match_the_reference(layout, dtype, rope, sinks):
    kw_shape = dict(B=3, q_lens=[4, 2, 3], k_lens=[12, 5, 3]) if layout == "TND" else dict(B=2, S1=4, S2=12)
    t, scale, kw = make_kl_inputs(layout, dtype, Dr=rope, sinks=sinks, **kw_shape)
    dqi, dki, dw, loss = _call(t, scale, kw)
    assert loss.shape == (1,) and loss.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert (dqi.dtype, dki.dtype, dw.dtype) == (dtype, dtype, dtype)
    ref = _ref(t, scale, kw, torch.float64)
    same = _ref(t, scale, kw, dtype)
    for name, ours, r, s in zip(("loss", "d_query_index", "d_key_index", "d_weights"), (loss, dqi, dki, dw), ref,
                                same):
        check_tolerance(name, ours, r, s)
    assert float(loss) > 0


def test_gradients_are_the_autograd_of_the_returned_loss():
    """The returned gradients are d(loss)/d(inputs): a first-order check by finite differences of the op's own
    loss (float64)."""
    t, scale, kw = make_kl_inputs(Dr=4)
    dqi, dki, dw, loss = _call(t, scale, kw)
    for name, grad in (("query_index", dqi), ("key_index", dki), ("weights", dw)):
        direction = torch.randn(t[name].shape, dtype=torch.float64)
        eps = 1e-6
        plus = dict(t, **{name: t[name] + eps * direction})
        minus = dict(t, **{name: t[name] - eps * direction})
        fd = (float(_call(plus, scale, kw)[3]) - float(_call(minus, scale, kw)[3])) / (2 * eps)
        assert abs(fd - float((grad * direction).sum())) < 1e-6 * max(1.0, abs(fd)), name


def test_padding_and_invisible_entries_are_skipped():
    t, scale, kw = make_kl_inputs(B=1, S1=3, S2=4, K=4)
    base = _call(t, scale, kw)
    # query 0 sees keys 0, 1: an entry for key 3 changes nothing
    idx = t["sparse_indices"].clone()
    row = idx[0, 0, 0]
    pad = (row < 0).nonzero()
    assert pad.numel() > 0
    row[pad[0, 0]] = 3
    again = _call(dict(t, sparse_indices=idx), scale, kw)
    for a, b in zip(base, again):
        assert torch.equal(a, b)


def test_a_row_of_padding_contributes_nothing():
    t, scale, kw = make_kl_inputs(B=1, S1=2, S2=2, K=2)  # query 0 sees key 0 only, query 1 both
    t["sparse_indices"][0, 0, 0] = -1
    dqi, dki, dw, loss = _call(t, scale, kw)
    assert (dqi[0, 0] == 0).all() and (dw[0, 0] == 0).all()


def test_compile_fullgraph(dynamo_reset):
    t, scale, kw = make_kl_inputs(dtype=torch.float32)

    def f(t):
        return _call(t, scale, kw)

    eager = f(t)
    compiled = torch.compile(f, fullgraph=True)(t)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)


# ---- bad inputs ------------------------------------------------------------------------------------------------

def test_bad_layout():
    t, scale, kw = make_kl_inputs()
    with pytest.raises(ValueError, match="'layout' must be \"BSND\" or \"TND\"; got \"BNSD\""):
        _call(t, scale, dict(kw, layout="BNSD"))


def test_bsnd_takes_no_cumulative_lengths():
    t, scale, kw = make_kl_inputs()
    with pytest.raises(ValueError, match="'actual_seq_qlen' and 'actual_seq_klen' are the TND layout's"):
        _call(t, scale, dict(kw, actual_seq_qlen=[4, 8]))


def test_tnd_needs_lengths():
    t, scale, kw = make_kl_inputs("TND", B=2, q_lens=[2, 2], k_lens=[5, 5])
    with pytest.raises(ValueError, match="'actual_seq_qlen' is required with layout TND"):
        _call(t, scale, dict(layout="TND"))


def test_key_index_has_one_head():
    t, scale, kw = make_kl_inputs()
    t["key_index"] = t["key_index"].expand(-1, -1, 3, -1).contiguous()
    t["query_index"] = torch.randn(2, 4, 3, 6, dtype=torch.float64)
    with pytest.raises(ValueError, match="'key_index' must have one head \\(N2 = 1\\)"):
        _call(t, scale, kw)


def test_main_query_and_key_shapes():
    t, scale, kw = make_kl_inputs()
    with pytest.raises(ValueError, match="'query' must be \\[B, S1, N1, D\\] with the tokens of 'query_index'"):
        _call(dict(t, query=t["query"][:, :3]), scale, kw)
    with pytest.raises(ValueError, match="'key' must be \\[B, S2, 1, D\\]"):
        _call(dict(t, key=t["key"][..., :4]), scale, kw)


def test_rope_given_together():
    t, scale, kw = make_kl_inputs(Dr=4)
    del t["key_rope"]
    with pytest.raises(ValueError, match="'query_rope' and 'key_rope' must be given together"):
        _call(t, scale, kw)


def test_softmax_stats_shape():
    t, scale, kw = make_kl_inputs()
    with pytest.raises(ValueError, match="'softmax_max' must be \\[B, N2=1, S1, G=N1\\]"):
        _call(dict(t, softmax_max=t["softmax_max"][..., :2]), scale, kw)


def test_sinks_shape():
    t, scale, kw = make_kl_inputs()
    with pytest.raises(ValueError, match="'sinks' must be 1-D \\[N1=4\\]"):
        _call(dict(t, sinks=torch.zeros(3)), scale, kw)


def test_sparse_indices_entries():
    t, scale, kw = make_kl_inputs()
    idx = t["sparse_indices"].clone()
    idx[1, 2, 0, 0] = 12
    with pytest.raises(ValueError, match="'sparse_indices' entry 12 of query token 2 of sequence 1 is neither -1"):
        _call(dict(t, sparse_indices=idx), scale, kw)


def test_dtypes_agree():
    t, scale, kw = make_kl_inputs()
    with pytest.raises(TypeError, match="'query' must have the dtype of 'query_index'"):
        _call(dict(t, query=t["query"].float()), scale, kw)
