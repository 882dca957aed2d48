"""Bad input of sparse_flash_attention and its grad: one test per rule, each a clear error naming the argument (the
shared rules of aten_ops/common/sparse_attention also guard kv_quant_sparse_flash_attention), and the zero-size
calls."""
import pytest
import torch

import torch_ops_transformer as tot
from test.sparse_attention.sfa_reference import make_inputs

OPS = torch.ops.npu_fa
I32 = torch.int32


def _base(layout=("BSND", "BSND")):
    inp = make_inputs(layout_query=layout[0], layout_kv=layout[1], q_lens=[3, 2], kv_lens=[20, 9], seed=0)
    kw = dict(inp["kwargs"])
    args = [inp["query"], inp["key"], inp["value"], inp["sparse_indices"], inp["scale_value"]]
    return args, kw


def _set(i, value):
    def f(args, kw):
        args[i] = value(args, kw) if callable(value) else value
    return f


def _kw(name, value):
    def f(args, kw):
        kw[name] = value(args, kw) if callable(value) else value
    return f


PA = ("BSND", "PA_BSND")
TND = ("TND", "TND")

# rule -> (base layout, mutation, exception, message pattern)
RULES = {
    "layout_query": (None, _kw("layout_query", "BNSD"), ValueError, "'layout_query' must be BSND or TND"),
    "layout_kv": (None, _kw("layout_kv", "BSH"), ValueError, "'layout_kv' must be BSND, TND or PA_BSND"),
    "layouts_differ": (None, _kw("layout_kv", "TND"), ValueError, "'layout_kv' \\('TND'\\) must equal"),
    "sparse_mode": (None, _kw("sparse_mode", 1), ValueError, "'sparse_mode' must be 0 .* or 3"),
    "pre_tokens": (None, _kw("pre_tokens", 100), ValueError, "'pre_tokens' and 'next_tokens' support only"),
    "next_tokens": (None, _kw("next_tokens", 0), ValueError, "'pre_tokens' and 'next_tokens' support only"),
    "scale_value": (None, _set(4, float("nan")), ValueError, "'scale_value' must be finite"),
    "sparse_block_size": (None, _kw("sparse_block_size", 3), ValueError, "'sparse_block_size' must be a power of two"),
    "sparse_block_size_large": (None, _kw("sparse_block_size", 256), ValueError, "in \\[1, 128\\]"),
    "query_rank": (None, _set(0, lambda a, k: a[0][0]), ValueError, "'query' must be 4-D"),
    "key_rank": (None, _set(1, lambda a, k: a[1][0]), ValueError, "'key' must be 4-D \\[B, S2, N2, D\\]"),
    "heads": (None, lambda a, k: a.__setitem__(slice(0, 2), [a[0][:, :, :3], torch.cat([a[1], a[1]], 2)]),
              ValueError, "query heads \\(3\\) must be a multiple of the key heads \\(2\\)"),
    "tnd_needs_query_lengths": (TND, _kw("actual_seq_lengths_query", None), ValueError,
                                "'actual_seq_lengths_query' is required with layout_query TND"),
    "cumulative_query_lengths": (TND, _kw("actual_seq_lengths_query", torch.tensor([3, 2])), ValueError,
                                 "non-decreasing cumulative"),
    "query_lengths_beyond_rows": (TND, _kw("actual_seq_lengths_query", torch.tensor([3, 9])), ValueError,
                                  "ends at 9, beyond the 5 rows of query"),
    "query_length_range": (None, _kw("actual_seq_lengths_query", torch.tensor([4, 1])), ValueError,
                           "'actual_seq_lengths_query' must lie in \\[0, S1=3\\]"),
    "query_length_count": (None, _kw("actual_seq_lengths_query", torch.tensor([3])), ValueError,
                           "one entry per sequence \\(2\\)"),
    "length_dtype": (None, _kw("actual_seq_lengths_query", torch.tensor([3.0, 2.0])), TypeError,
                     "'actual_seq_lengths_query' must be int32 or int64"),
    "length_rank": (None, _kw("actual_seq_lengths_query", torch.tensor([[3, 2]])), ValueError,
                    "'actual_seq_lengths_query' must be 1-D"),
    "block_table_without_paging": (None, _kw("block_table", torch.zeros(2, 3, dtype=I32)), ValueError,
                                   "'block_table' is only for layout_kv PA_BSND"),
    "tnd_needs_kv_lengths": (TND, _kw("actual_seq_lengths_kv", None), ValueError,
                             "'actual_seq_lengths_kv' is required with layout_kv TND"),
    "kv_length_count": (TND, _kw("actual_seq_lengths_kv", torch.tensor([20])), ValueError,
                        "'actual_seq_lengths_kv' must have one entry per sequence"),
    "key_batch": (None, _set(1, lambda a, k: a[1][:1]), ValueError, "'key' must hold the 2 sequences"),
    "kv_length_range": (None, _kw("actual_seq_lengths_kv", torch.tensor([21, 3])), ValueError,
                        "'actual_seq_lengths_kv' must lie in \\[0, S2=20\\]"),
    "kv_cumulative_beyond_rows": (TND, _kw("actual_seq_lengths_kv", torch.tensor([20, 40])), ValueError,
                                  "beyond the 29 rows of key"),
    "paged_needs_block_table": (PA, _kw("block_table", None), ValueError, "'block_table' is required"),
    "block_table_dtype": (PA, _kw("block_table", lambda a, k: k["block_table"].float()), TypeError,
                          "'block_table' must be int32 or int64"),
    "block_table_shape": (PA, _kw("block_table", lambda a, k: k["block_table"][:1]), ValueError,
                          "'block_table' must be 2-D \\[B=2"),
    "sparse_block_divides_block_size": (PA, _kw("sparse_block_size", 16), ValueError,
                                        "must divide the cache's block_size"),
    "paged_length_beyond_table": (PA, _kw("actual_seq_lengths_kv", torch.tensor([20, 100])), ValueError,
                                  "block_table's capacity"),
    "block_id_range": (PA, _kw("block_table", lambda a, k: k["block_table"].fill_(99)), ValueError,
                       "block ids in \\[0, "),
    "indices_dtype": (None, _set(3, lambda a, k: a[3].long()), TypeError, "'sparse_indices' must be int32"),
    "indices_shape": (None, _set(3, lambda a, k: a[3][:, :2]), ValueError,
                      "'sparse_indices' must be \\[B, S1, N2, K\\] = \\[2, 3, 1, K\\]"),
    "indices_values": (None, _set(3, lambda a, k: a[3].fill_(-2)), ValueError, "block indices >= 0 or -1"),
    "query_dtype": (None, _set(0, lambda a, k: a[0].int()), TypeError, "'query' must be float16, bfloat16"),
    "key_dtype": (None, _set(1, lambda a, k: a[1].double()), TypeError, "'key' must have query's dtype"),
    "value_dtype": (None, _set(2, lambda a, k: a[2].half()), TypeError, "'value' must have query's dtype"),
    "attention_mode": (None, _kw("attention_mode", 1), ValueError, "'attention_mode' must be 0 .* or 2"),
    "head_dims": (None, _set(0, lambda a, k: a[0][..., :-1]), ValueError, "'query' must have key's head dim"),
    "mla_needs_ropes": (None, _kw("key_rope", None), ValueError, "attention_mode 2 .* needs both"),
    "mla_value_shape": (None, _set(2, lambda a, k: a[2][..., :-1]), ValueError, "needs value of key's shape"),
    "rope_dtype": (None, _kw("query_rope", lambda a, k: k["query_rope"].double()), TypeError,
                   "'query_rope' must have query's dtype"),
    "rope_shape": (None, _kw("key_rope", lambda a, k: k["key_rope"][:, :3]), ValueError,
                   "'key_rope' must have the shape of key"),
    "rope_dims": (None, _kw("key_rope", lambda a, k: k["key_rope"][..., :-1]), ValueError,
                  "must have one rope dim"),
    "ropes_need_mla": (None, _kw("attention_mode", 0), ValueError, "need attention_mode 2"),
    "sinks_dtype": (None, _kw("sinks", torch.zeros(4, dtype=torch.float64)), TypeError, "'sinks' must be float32"),
    "sinks_shape": (None, _kw("sinks", torch.zeros(3)), ValueError, "'sinks' must be \\[N1\\] = \\[4\\]"),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_bad_input(rule):
    layout, mutate, error, match = RULES[rule]
    args, kw = _base(layout or ("BSND", "BSND"))
    mutate(args, kw)
    with pytest.raises(error, match=match):
        tot.npu_sparse_flash_attention(*args, **kw)


def test_plain_attention_value_shape():
    inp = make_inputs(rope=False, seed=1)
    with pytest.raises(ValueError, match="'value' must have key's shape"):
        tot.npu_sparse_flash_attention(inp["query"], inp["key"], inp["value"][:, :3], inp["sparse_indices"], 0.5)


def _grad_args():
    args, kw = _base()
    out, smax, ssum = tot.npu_sparse_flash_attention(*args, **kw, return_softmax_lse=True)
    q, k, v, idx, scale = args
    pos = [q, k, v, idx, torch.randn_like(out), out, smax, ssum, scale, 1]
    named = dict(query_rope=kw["query_rope"], key_rope=kw["key_rope"], actual_seq_qlen=kw["actual_seq_lengths_query"],
                 actual_seq_kvlen=kw["actual_seq_lengths_kv"], attention_mode=2)
    return pos, named


@pytest.mark.parametrize("index,value,error,match", [
    (4, lambda t: t.double(), TypeError, "'d_out' must have query's dtype"),
    (5, lambda t: t[..., :-1], ValueError, "'out' must have the forward output's shape"),
    (6, lambda t: t.double(), TypeError, "'softmax_max' must be Float"),
    (7, lambda t: t[:1], ValueError, "'softmax_sum' must be \\[2, 1, 3, 4\\]"),
])
def test_grad_bad_input(index, value, error, match):
    pos, named = _grad_args()
    pos[index] = value(pos[index])
    with pytest.raises(error, match=match):
        tot.npu_sparse_flash_attention_grad(*pos, **named)


def test_grad_layout_type():
    pos, named = _grad_args()
    with pytest.raises(TypeError, match="'layout' must be a str or None"):
        tot.npu_sparse_flash_attention_grad(*pos, **named, layout=3)


def test_grad_optional_arguments_accept_none():
    pos, named = _grad_args()
    a = tot.npu_sparse_flash_attention_grad(*pos, **named)
    b = tot.npu_sparse_flash_attention_grad(*pos, **named, layout=None, sparse_mode=None, pre_tokens=None,
                                            next_tokens=None)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.asan
@pytest.mark.parametrize("what", ["no_tokens", "no_slots", "no_heads"])
def test_zero_size(what):
    if what == "no_tokens":
        inp = make_inputs(layout_query="TND", layout_kv="TND", q_lens=[0, 0], kv_lens=[4, 0], seed=0)
    elif what == "no_slots":
        inp = make_inputs(K=0, seed=0)
    else:
        inp = make_inputs(N1=0, seed=0)
    out, smax, ssum = tot.npu_sparse_flash_attention(inp["query"], inp["key"], inp["value"], inp["sparse_indices"],
                                                     inp["scale_value"], **inp["kwargs"], return_softmax_lse=True)
    assert out.shape == inp["query"].shape
    assert not out.any() and not torch.isnan(out).any()
    if what == "no_slots":
        assert torch.isneginf(smax).all() and not ssum.any()
