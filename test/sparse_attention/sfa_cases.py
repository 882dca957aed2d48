"""opcheck cases of the sparse flash attention ops: sparse_flash_attention, its grad and
kv_quant_sparse_flash_attention."""
import torch

from test.sparse_attention.sfa_reference import make_inputs


def _sfa(layout_query="BSND", layout_kv="BSND", rope=True, grad=False, lse=True, **shape):
    def make():
        inp = make_inputs(layout_query=layout_query, layout_kv=layout_kv, rope=rope, B=2, S1=2, N1=2, Dn=8, Dr=4,
                          S2=8, K=3, block_size=4, fill=0.3, seed=1, **shape)
        kw = dict(inp["kwargs"])
        if grad:
            for name in ("query_rope", "key_rope"):
                if kw[name] is not None:
                    kw[name] = kw[name].requires_grad_()
        q = inp["query"].requires_grad_(grad)
        k = inp["key"].requires_grad_(grad)
        v = k if rope else inp["value"].requires_grad_(grad)
        kw["return_softmax_lse"] = lse
        return (q, k, v, inp["sparse_indices"], inp["scale_value"]), kw
    return make


def _grad(lse=True):
    def make():
        (q, k, v, idx, scale), kw = _sfa(lse=lse, q_lens=[2, 1], kv_lens=[8, 5])()
        out, smax, ssum = torch.ops.npu_fa.sparse_flash_attention(q, k, v, idx, scale, **kw)
        return (q, k, v, idx, torch.randn_like(out), out, smax, ssum, scale, 1), dict(
            query_rope=kw["query_rope"], key_rope=kw["key_rope"], actual_seq_qlen=kw["actual_seq_lengths_query"],
            actual_seq_kvlen=kw["actual_seq_lengths_kv"], attention_mode=2)
    return make


def _quant(layout_kv="BSND"):
    def make():
        inp = make_inputs(layout_kv=layout_kv, dtype=torch.bfloat16, B=1, S1=2, N1=2, Dn=16, Dr=4, S2=8, K=3,
                          block_size=4, seed=2)
        g = torch.Generator().manual_seed(3)
        key = inp["key"]
        latent = torch.randint(-127, 128, key.shape, generator=g, dtype=torch.int8)
        scales = torch.rand(key.shape[:-1] + (2,), generator=g)
        packed = torch.cat([latent, inp["kwargs"]["key_rope"].view(torch.int8), scales.view(torch.int8)], -1)
        query = torch.cat([inp["query"], inp["kwargs"]["query_rope"]], -1)
        kw = dict(block_table=inp["kwargs"]["block_table"],
                  actual_seq_lengths_kv=inp["kwargs"]["actual_seq_lengths_kv"], layout_kv=layout_kv,
                  attention_mode=2, tile_size=8, rope_head_dim=4)
        return (query, packed, latent, inp["sparse_indices"], 0.3, 2, 2), kw
    return make


OPCHECK_CASES = {
    "sparse_flash_attention": {
        "bsnd_mla_lse": _sfa(),
        "bsnd_mla_grad": _sfa(grad=True, lse=False, q_lens=[2, 1], kv_lens=[8, 6]),
        "tnd_paged": _sfa("TND", "PA_BSND", q_lens=[2, 1], kv_lens=[7, 4]),
        "plain_value_grad": _sfa(rope=False, grad=True, N2=2),
    },
    "sparse_flash_attention_grad": {
        "with_statistics": _grad(),
        "recomputed_statistics": _grad(lse=False),
    },
    "kv_quant_sparse_flash_attention": {
        "bsnd": _quant(),
        "paged": _quant("PA_BSND"),
    },
}
