"""opcheck cases of the lightning-indexer ops (sparse attention family)."""
import torch

from test.sparse_attention.test_lightning_indexer import make_inputs
from test.sparse_attention.test_lightning_indexer_kl_loss import make_kl_inputs

I64_MAX = 2**63 - 1


def _indexer(lq, lk, dtype=torch.float32, return_value=False, sparse_mode=3):
    def make():
        q, k, w, kw = make_inputs(lq, lk, dtype, q_lens=[5, 2], k_lens=[37, 20])
        asq, ask = kw.get("actual_seq_lengths_query"), kw.get("actual_seq_lengths_key")
        return (q, k, w, asq, ask, kw.get("block_table"), lq, lk, 8, sparse_mode, I64_MAX, I64_MAX,
                return_value), {}
    return make


def _grad(dtype=torch.float32):
    def make():
        q, k, w, kw = make_inputs("BSND", "BSND", dtype)
        idx, _ = torch.ops.npu_fa.lightning_indexer(q, k, w, sparse_count=8)
        return (q, k, torch.randn(idx.shape, dtype=dtype), idx, w), {}
    return make


def _quant(lq, lk):
    def make():
        q, k, w, kw = make_inputs(lq, lk, q_lens=[5, 2], k_lens=[37, 20])
        g = torch.Generator().manual_seed(1)
        q8 = torch.randint(-127, 128, q.shape, generator=g, dtype=torch.int8)
        k8 = torch.randint(-127, 128, k.shape, generator=g, dtype=torch.int8)
        qs, ks = torch.rand(q.shape[:-1], generator=g), torch.rand(k.shape[:-1], generator=g)
        kw = {n: v for n, v in kw.items() if n not in ("layout_query", "layout_key")}
        return (q8, k8, w.half(), qs.half(), ks.half(), 0, 0), dict(kw, layout_query=lq, layout_key=lk, sparse_count=8)
    return make


def _kl(layout, rope=0, sinks=False):
    def make():
        t, scale, kw = make_kl_inputs(layout, torch.float32, B=2, q_lens=[3, 2], k_lens=[9, 4], Dr=rope, sinks=sinks)
        args = tuple(t[n] for n in ("query", "key", "query_index", "key_index", "weights", "sparse_indices",
                                    "softmax_max", "softmax_sum")) + (scale,)
        extra = {n: t[n] for n in ("query_rope", "key_rope", "sinks") if n in t}
        if layout == "TND":
            extra["actual_seq_qlen"] = torch.tensor(kw["actual_seq_qlen"])
            extra["actual_seq_klen"] = torch.tensor(kw["actual_seq_klen"])
        return args, dict(extra, layout=layout)
    return make


OPCHECK_CASES = {
    "lightning_indexer": {
        "bsnd_values": _indexer("BSND", "BSND", return_value=True),
        "tnd_bf16_values": _indexer("TND", "TND", torch.bfloat16, return_value=True),
        "bsnd_paged": _indexer("BSND", "PA_BSND"),
        "tnd_paged_mode0": _indexer("TND", "PA_BSND", sparse_mode=0),
    },
    "lightning_indexer_grad": {"bsnd": _grad(), "bsnd_fp64": _grad(torch.float64)},
    "quant_lightning_indexer": {"bsnd": _quant("BSND", "BSND"), "tnd_paged": _quant("TND", "PA_BSND")},
    "sparse_lightning_indexer_grad_kl_loss": {"bsnd_rope": _kl("BSND", rope=4), "tnd_sinks": _kl("TND", sinks=True)},
}
