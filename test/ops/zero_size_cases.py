"""Zero-size calls of every op with tensor arguments, for test_zero_size.py: CASES maps an op to named cases, each a
function returning (args, kwargs) and the shapes the op documents for that call (None for an op returning nothing);
NO_CASE lists the ops without a meaningful zero-size call and why. `python -m test.ops.zero_size_cases <op> <case>`
runs one case and prints its result shapes as JSON (`--all`: every case), so a crash ends that process only."""
import json
import sys

import torch

OPS = torch.ops.npu_fa
F = torch.float32
I32 = torch.int32
I64 = torch.int64


_BF16_CODE = 15  # torch.bfloat16's ScalarType code (the ops' output_dtype)


def _z(*shape, dtype=F):
    return torch.zeros(*shape, dtype=dtype)


def _r(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


def _fa_grad():
    q, k = _r(1, 2, 0, 16), _r(1, 2, 4, 16)
    out, smax, ssum, *_ = OPS.flash_attention_score(q, k, k, 2, "BNSD")
    return (q, k, k, torch.zeros_like(out), 2, "BNSD"), dict(softmax_max=smax, softmax_sum=ssum, attention_in=out)


def _fa_grad_sink():
    args, kw = _fa_grad()
    return args, dict(kw, sink=torch.zeros(2))


def _gmm_grad():
    x, w = [_r(0, 8)], [_r(8, 4)]
    out, act = OPS.grouped_matmul(x, w, [], torch.tensor([0]))
    return ([torch.zeros_like(out[0])], x, w, [], torch.tensor([0]), act), {}


def _mla_prolog(lead, cache):
    """mla_prolog with He 32, Hcq 24, N 2, D 4, Dr 16, Hckv 8: no tokens (T or B = 0) or a cache of 0 blocks."""
    he, hcq, n, d, dr, hckv = 32, 24, 2, 4, 16, 8
    t = 1
    for x in lead:
        t *= x
    args = (_r(*lead, he), _r(he, hcq), _r(hcq, n * (d + dr)), _r(n, d, hckv), _r(he, hckv + dr), _r(hcq), _r(hckv),
            _r(*lead, dr), _r(*lead, dr), _z(*cache, hckv), _z(*cache, dr))
    return args, dict(cache_index=torch.full(lead, -1, dtype=I64), query_norm_flag=True)


CASES = {
    "flash_attention_score": {
        "bnsd_sq0": (lambda: ((_r(1, 2, 0, 16), _r(1, 2, 4, 16), _r(1, 2, 4, 16), 2, "BNSD"), {}),
                     [(1, 2, 0, 16), (1, 2, 0, 8), (1, 2, 0, 8), (0,), (), ()]),
        "bnsd_b0": (lambda: ((_r(0, 2, 4, 16), _r(0, 2, 4, 16), _r(0, 2, 4, 16), 2, "BNSD"), {}),
                    [(0, 2, 4, 16), (0, 2, 4, 8), (0, 2, 4, 8), (0,), (), ()]),
        "tnd_all_zero": (lambda: ((_r(0, 2, 16), _r(0, 2, 16), _r(0, 2, 16), 2, "TND"),
                                  dict(actual_seq_qlen=torch.tensor([0, 0]), actual_seq_kvlen=torch.tensor([0, 0]))),
                         [(0, 2, 16), (0, 2, 8), (0, 2, 8), (0,), (), ()]),
    },
    "flash_attention_score_grad": {"bnsd_sq0": (_fa_grad, [(1, 2, 0, 16), (1, 2, 4, 16), (1, 2, 4, 16), (0,), (0,)]),
                                   "bnsd_sq0_sink": (_fa_grad_sink, [(1, 2, 0, 16), (1, 2, 4, 16), (1, 2, 4, 16), (0,),
                                                                     (2,)])},
    "dropout_gen_mask": {"rows0": (lambda: ((torch.tensor(1, dtype=I64), torch.tensor(0, dtype=I64), 0, 16, 0.9),
                                            {}), [(0, 16)])},
    "rotary_position_embedding": {"s0": (lambda: ((_r(1, 0, 2, 16), _r(1, 0, 1, 16), _r(1, 0, 1, 16)), {}),
                                         [(1, 0, 2, 16)])},
    "rotary_position_embedding_grad": {
        "s0": (lambda: ((_r(1, 0, 2, 16), _r(1, 0, 1, 16), _r(1, 0, 1, 16), _r(1, 0, 2, 16)), {}),
               [(1, 0, 2, 16), (1, 0, 1, 16), (1, 0, 1, 16)])},
    "apply_rotary_pos_emb": {"s0": (lambda: ((_r(1, 0, 2, 16), _r(1, 0, 2, 16), _r(1, 0, 1, 16), _r(1, 0, 1, 16)),
                                             {}), None)},
    "rope_with_sin_cos_cache": {"t0": (lambda: ((_z(0, dtype=I64), _r(0, 32), _r(0, 32), _r(8, 16), 16), {}),
                                       [(0, 32), (0, 32)])},
    "interleave_rope": {"s0": (lambda: ((_r(2, 4, 0, 16), _r(2, 1, 0, 16), _r(2, 1, 0, 16)), {}), [(2, 4, 0, 16)])},
    "interleave_rope_grad": {
        "s0": (lambda: ((_r(2, 4, 0, 16), _r(2, 4, 0, 16), _r(2, 1, 0, 16), _r(2, 1, 0, 16)), {}),
               [(2, 4, 0, 16), (2, 1, 0, 16), (2, 1, 0, 16)])},
    "kv_rms_norm_rope_cache": {
        "b0_pa": (lambda: ((_r(0, 1, 1, 40), _r(32), _r(0, 1, 1, 8), _r(0, 1, 1, 8), _z(0, dtype=I64),
                            _z(4, 16, 1, 8), _z(4, 16, 1, 32)), dict(cache_mode="PA")), [(0, 1, 1, 8), (0, 1, 1, 32)]),
        "s0_norm": (lambda: ((_r(2, 1, 0, 40), _r(32), _r(2, 1, 0, 8), _r(2, 1, 0, 8), _z(2, 0, dtype=I64),
                              _z(2, 1, 4, 8), _z(2, 1, 4, 32)), {}), [(2, 1, 0, 8), (2, 1, 0, 32)])},
    "scatter_pa_kv_cache": {"t0": (lambda: ((_r(0, 2, 16), _r(0, 2, 16), _z(4, 8, 2, 16), _z(4, 8, 2, 16),
                                             _z(0, dtype=I32)), {}), None)},
    "gather_pa_kv_cache": {"len0": (lambda: ((_r(4, 8, 2, 16), _r(4, 8, 2, 16), _z(1, 2, dtype=I32),
                                              _z(1, dtype=I32)), {}), [(0, 2, 16), (0, 2, 16)])},
    "mla_prolog": {
        "t0": (lambda: _mla_prolog((0,), (4, 16, 1)), [(0, 2, 8), (0, 2, 16), (0,), (0, 24), (0,)]),
        "b0": (lambda: _mla_prolog((0, 3), (4, 16, 1)), [(0, 3, 2, 8), (0, 3, 2, 16), (0,), (0, 3, 24), (0,)]),
        "blocks0": (lambda: _mla_prolog((2,), (0, 16, 1)), [(2, 2, 8), (2, 2, 16), (0,), (2, 24), (0,)]),
    },
    "prompt_flash_attention": {
        "bnsd_sq0": (lambda: ((_r(2, 2, 0, 16), _r(2, 2, 4, 16), _r(2, 2, 4, 16)),
                              dict(num_heads=2, input_layout="BNSD")), [(2, 2, 0, 16)]),
        "lengths0": (lambda: ((_r(2, 8, 32), _r(2, 4, 32), _r(2, 4, 32)),
                              dict(num_heads=2, input_layout="BSH", actual_seq_lengths=torch.tensor([0, 0]))),
                     [(2, 8, 32)]),
        "tnd_t0": (lambda: ((_r(0, 2, 16), _r(0, 2, 16), _r(0, 2, 16)),
                            dict(num_heads=2, input_layout="TND", actual_seq_lengths=torch.tensor([0, 0]),
                                 actual_seq_lengths_kv=torch.tensor([0, 0]))), [(0, 2, 16)]),
    },
    "fused_infer_attention_score": {
        "lengths0": (lambda: ((_r(2, 8, 32), _r(2, 4, 32), _r(2, 4, 32)),
                              dict(num_heads=2, input_layout="BSH", actual_seq_lengths=torch.tensor([0, 0]))),
                     [(2, 8, 32), (0,)]),
        "bnsd_sq0": (lambda: ((_r(2, 2, 0, 16), _r(2, 2, 4, 16), _r(2, 2, 4, 16)),
                              dict(num_heads=2, input_layout="BNSD")), [(2, 2, 0, 16), (0,)]),
        "mla_tnd_t0": (lambda: ((_r(0, 2, 16), _r(0, 1, 16), _r(0, 1, 16)),
                                dict(num_heads=2, num_key_value_heads=1, input_layout="TND", query_rope=_r(0, 2, 4),
                                     key_rope=_r(0, 1, 4), actual_seq_lengths=torch.tensor([0, 0]),
                                     actual_seq_lengths_kv=torch.tensor([0, 0]))), [(0, 2, 16), (0,)]),
        "mla_lengths0": (lambda: ((_r(2, 3, 2, 16), _r(2, 4, 1, 16), _r(2, 4, 1, 16)),
                                  dict(num_heads=2, num_key_value_heads=1, input_layout="BSND",
                                       query_rope=_r(2, 3, 2, 4), key_rope=_r(2, 4, 1, 4),
                                       actual_seq_lengths=torch.tensor([0, 0]))), [(2, 3, 2, 16), (0,)]),
    },
    "fused_infer_attention_score_grad": {
        "tnd_t0": (lambda: ((_r(0, 2, 16), _r(0, 1, 16), _r(0, 1, 16)),
                            dict(num_heads=2, num_key_value_heads=1, input_layout="TND",
                                 actual_seq_lengths=torch.tensor([0, 0]), actual_seq_lengths_kv=torch.tensor([0, 0]),
                                 learnable_sink=_r(2), attention_out=_r(0, 2, 16), softmax_lse=_r(0),
                                 grad_attention_out=_r(0, 2, 16))), [(2,)])},
    "attention_update": {"rows0": (lambda: ((_r(2, 0), _r(2, 0, 16)), {}), [(0, 16), (0,)])},
    "attention_update_grad": {"rows0": (lambda: ((_r(2, 0), _r(2, 0, 16), _r(0), _r(0, 16), _r(0, 16), _r(0)), {}),
                                        [(2, 0), (2, 0, 16)])},
    "incre_flash_attention": {"b0": (lambda: ((_r(0, 1, 32), _r(0, 4, 32), _r(0, 4, 32)), dict(num_heads=2)),
                                     [(0, 1, 32)])},
    "matmul_all_reduce_grad": {"m0": (lambda: ((_r(0, 4), _r(0, 8), _r(8, 4)), {}), [(0, 8), (8, 4), (0,), (0,)]),
                               "m0_x3": (lambda: ((_r(0, 4), _r(0, 8), _r(8, 4)), dict(x3=_r(0, 4))),
                                         [(0, 8), (8, 4), (0,), (0, 4)])},
    "grouped_matmul": {"m0": (lambda: (([_r(0, 8)], [_r(8, 4)], [], torch.tensor([0])), {}), [[(0, 4)], [(0,)]])},
    "grouped_matmul_grad": {"m0": (_gmm_grad, [[(0, 8)], [(8, 4)], []])},
    "grouped_matmul_quant": {"m0": (lambda: (([_z(0, 8, dtype=torch.int8)], [_z(2, 8, 4, dtype=torch.int8)], [],
                                              [torch.ones(2, 4)], [_z(0)], [], [], torch.tensor([0, 0])),
                                             dict(output_dtype=_BF16_CODE)), [(0, 4)])},
    "grouped_matmul_swiglu_quant": {"m0": (lambda: ((_z(0, 8, dtype=torch.int8), _z(2, 8, 4, dtype=torch.int8),
                                                     torch.tensor([0, 0]), torch.ones(2, 4), _z(0)), {}),
                                           [(0, 2), (0,), ()])},
    "moe_ffn": {"t0": (lambda: ((_r(0, 16), _r(4, 48, 16), _r(4, 16, 24), _r(0, 2), _z(0, 2, dtype=I32)), {}),
                       [(0, 16)])},
    "moe_ffn_prepack": {"e0": (lambda: ((_r(0, 48, 16),), dict(gated=True)), [(0, 1, 16, 2, 32)])},
    "moe_gating_top_k_softmax": {"n0": (lambda: ((_r(0, 8),), dict(k=2)), [(0, 2), (0, 2), (0, 2)])},
    "moe_gating_top_k_softmax_v2": {"n0": (lambda: ((_r(0, 8),), dict(k=2)), [(0, 2), (0, 2), (0,)])},
    "moe_gating_top_k_softmax_grad": {"n0": (lambda: ((_r(0, 2), _r(0, 8), 2), {}), [(0, 8)])},
    "moe_gating_top_k": {"n0": (lambda: ((_r(0, 8), 2), {}), [(0, 2), (0, 2), (0,)])},
    "moe_gating_top_k_grad": {"n0": (lambda: ((_r(0, 8), _r(0, 2), _z(0, 2, dtype=I32)), {}), [(0, 8)])},
    "moe_init_routing": {"n0": (lambda: ((_r(0, 8), _z(0, 2, dtype=I32), _z(0, 2, dtype=I32), 0), {}),
                                [(0, 8), (0,), (0,)])},
    "moe_init_routing_v2": {"n0": (lambda: ((_r(0, 8), _z(0, 2, dtype=I32)), dict(expert_num=4)),
                                   [(0, 8), (0,), (0,), (0,)])},
    "moe_init_routing_v2_grad": {"n0": (lambda: ((_r(0, 8), _z(0, dtype=I32), _r(0, 8), _z(0, 2, dtype=I32)), {}),
                                        [(0, 8)])},
    "moe_compute_expert_tokens": {"n0": (lambda: ((_z(0, dtype=I32), 4), {}), [(4,)])},
    "moe_finalize_routing": {"n0": (lambda: ((_r(0, 8), None, None, None, _r(0, 2), _z(0, dtype=I32),
                                              _z(0, 2, dtype=I32)), {}), [(0, 8)])},
    "moe_finalize_routing_grad": {"n0": (lambda: ((_r(0, 8), _r(0, 8), None, None, _r(0, 2), _z(0, dtype=I32),
                                                   _z(0, 2, dtype=I32)), {}), [(0, 8), (0, 8), (0, 2), (0,)])},
    "moe_token_permute": {"n0": (lambda: ((_r(0, 8), _z(0, 2, dtype=I64)), {}), [(0, 8), (0,)])},
    "moe_token_permute_grad": {"n0": (lambda: ((_r(0, 8), _z(0, dtype=I64), _z(0, 2, dtype=I64)), {}), [(0, 8)])},
    "moe_token_unpermute": {"n0": (lambda: ((_r(0, 8), _z(0, dtype=I64), _r(0, 2)), {}), [(0, 8)])},
    "moe_token_unpermute_grad": {"n0": (lambda: ((_r(0, 8), _r(0, 8), _z(0, dtype=I64), _r(0, 2)), {}),
                                        [(0, 8), (0, 2)])},
    "dynamic_quant": {"n0": (lambda: ((_r(0, 3, 16),), {}), [(0, 3, 16), (0, 3), (0,)]),
                      "int4_asymmetric": (lambda: ((_r(2, 0, 16), None, None, True, 4), {}), [(2, 0, 2), (2, 0), (2, 0)])},
    "dynamic_block_quant": {"m0": (lambda: ((_r(0, 200),), {}), [(0, 200), (0, 2)]),
                            "b0_3d": (lambda: ((_r(0, 3, 8),), {"row_block_size": 2}), [(0, 3, 8), (0, 2, 1)])},
    "swiglu": {"n0": (lambda: ((_r(0, 8),), {}), [(0, 4)])},
    "swiglu_grad": {"n0": (lambda: ((_r(0, 4), _r(0, 8)), {}), [(0, 8)])},
    "quantize": {"n0": (lambda: ((_r(0, 8), torch.ones(8), None, 12, 1, True), {}), [(0, 8)]),
                 "int4_n0": (lambda: ((_r(0, 8), torch.ones(8), None, 16, -1, False), {}), [(0, 1)])},
    "quant_matmul": {"m0": (lambda: ((_z(0, 8, dtype=torch.int8), _z(8, 4, dtype=torch.int8), torch.ones(1), None,
                                      None, None, _BF16_CODE), {}), [(0, 4)]),
                     "k0_batch0": (lambda: ((_z(0, 3, 0, dtype=torch.int8), _z(0, 4, dtype=torch.int8), torch.ones(1),
                                             None, None, None, 3), {}), [(0, 3, 4)]),
                     "a8w4_group_m0": (lambda: ((_z(0, 32, dtype=torch.int8), _z(32, 2, dtype=I32), _z(2, 16),
                                                 _z(16), _z(0, 1), None, 5, [0, 0, 16]), {}), [(0, 16)])},
    "weight_quant_batchmatmul": {"m0": (lambda: ((_r(0, 64).half(), _z(64, 8, dtype=torch.int8),
                                                  torch.ones(8).half()), {}), [(0, 8)])},
    "convert_weight_to_int4pack": {"k0": (lambda: ((_z(0, 16, dtype=I32),), {}), [(0, 2)])},
    "clipped_swiglu": {"n0": (lambda: ((_r(0, 8),), {}), [(0, 4)]),
                       "groups_sum0": (lambda: ((_r(3, 8), torch.zeros(2, dtype=I64)), {}), [(3, 4)])},
    "transpose_batchmatmul": {"m0": (lambda: ((_r(0, 2, 8), _r(2, 8, 4), None, [1, 0, 2]), {}), [(0, 2, 4)])},
    "dequant_swiglu_quant": {"n0": (lambda: ((_z(0, 8, dtype=I32), torch.ones(8), _r(0, 1)), {}), [(0, 4), (0,)]),
                             "groups_sum0": (lambda: ((_z(3, 8, dtype=I32),), {"group_index": torch.zeros(2,
                                                                                                   dtype=I64)}),
                                             [(3, 4), (3,)])},
    "rms_norm": {"n0": (lambda: ((_r(0, 8), _r(8)), {}), [(0, 8), (0, 1)]),
                 "row0": (lambda: ((_r(3, 0), _r(0)), {}), [(3, 0), (3, 1)])},
    "rms_norm_grad": {"n0": (lambda: ((_r(0, 8), _r(0, 8), _r(8), _r(0, 1)), {}), [(0, 8), (8,)])},
    "add_rms_norm": {"n0": (lambda: ((_r(0, 8), _r(0, 8), _r(8)), {}), [(0, 8), (0, 1), (0, 8)])},
    "add_rms_norm_cast": {"n0": (lambda: ((_r(2, 0, 8), _r(2, 0, 8), _r(8)), {}),
                                 [(2, 0, 8), (2, 0, 8), (2, 0, 1), (2, 0, 8)])},
    "add_rms_norm_quant": {"n0": (lambda: ((_r(0, 8), _r(0, 8), _r(8), _r(8).abs() + 1), {}),
                                  [(0, 8), (0, 8), (0, 8)])},
    "add_rms_norm_dynamic_quant": {"n0": (lambda: ((_r(0, 8), _r(0, 8), _r(8)), {}),
                                          [(0, 8), (), (0, 8), (0,), ()])},
    "rms_norm_quant": {"n0": (lambda: ((_r(0, 8), _r(8), _r(8), torch.ones(1), torch.zeros(1, dtype=torch.int8)), {}),
                              [(0, 8)])},
}

# decoder-layer and serving-loop ops
CASES.update({
    "rope_with_sin_cos_cache": dict(CASES["rope_with_sin_cos_cache"], mrope_t0=(
        lambda: ((_z(3, 0, dtype=I64), _r(0, 32), _r(0, 32), _r(8, 16), 16, True, [4, 2, 2]), {}), [(0, 32), (0, 32)])),
    "top_k_top_p": {"b0": (lambda: ((_r(0, 16), _r(0), _z(0, dtype=I32)), {}), [(0, 16)]),
                    "v0": (lambda: ((_r(2, 0),), {}), [(2, 0)])},
    "gather_pa_kv_cache_into": {"len0": (lambda: ((_r(4, 8, 2, 16), _r(4, 8, 2, 8), _z(1, 2, dtype=I32),
                                                   _z(1, dtype=I32), _z(0, 2, 16), _z(0, 2, 8)), {}), None)},
    "scatter_nd_update": {"rows0": (lambda: ((_r(4, 3), _z(0, 1, dtype=I64), _r(0, 3)), {}), None)},
    "ring_attention_update": {"s0": (lambda: ((_r(0, 2, 16), _r(2, 2, 0, 8), _r(2, 2, 0, 8), _r(0, 2, 16),
                                               _r(2, 2, 0, 8), _r(2, 2, 0, 8)), {}),
                                     [(0, 2, 16), (2, 2, 0, 8), (2, 2, 0, 8)])},
    "lightning_indexer": {
        "b0": (lambda: ((_r(0, 3, 2, 8), _r(0, 5, 1, 8), _r(0, 3, 2)), dict(sparse_count=4, return_value=True)),
               [(0, 3, 1, 4), (0, 3, 1, 4)]),
        "keys0": (lambda: ((_r(2, 3, 2, 8), _r(2, 0, 1, 8), _r(2, 3, 2)), dict(sparse_count=4)),
                  [(2, 3, 1, 4), (0,)]),
        "tnd_t0": (lambda: ((_r(0, 2, 8), _r(0, 1, 8), _r(0, 2)),
                            dict(actual_seq_lengths_query=torch.tensor([0, 0]),
                                 actual_seq_lengths_key=torch.tensor([0, 0]), layout_query="TND", layout_key="TND",
                                 sparse_count=4)),
                   [(0, 1, 4), (0,)])},
    "lightning_indexer_grad": {
        "s0": (lambda: ((_r(1, 0, 2, 8), _r(1, 5, 1, 8), _r(1, 0, 1, 4), _z(1, 0, 1, 4, dtype=I32), _r(1, 0, 2)), {}),
               [(1, 0, 2, 8), (1, 5, 1, 8), (1, 0, 2)])},
    "quant_lightning_indexer": {
        "b0": (lambda: ((_z(0, 3, 2, 8, dtype=torch.int8), _z(0, 5, 1, 8, dtype=torch.int8), _r(0, 3, 2),
                         _r(0, 3, 2), _r(0, 5, 1), 0, 0), dict(sparse_count=4)), [(0, 3, 1, 4)])},
    "sparse_lightning_indexer_grad_kl_loss": {
        "s0": (lambda: ((_r(1, 0, 2, 8), _r(1, 4, 1, 8), _r(1, 0, 3, 8), _r(1, 4, 1, 8), _r(1, 0, 3),
                         _z(1, 0, 1, 2, dtype=I32), _r(1, 1, 0, 2), _r(1, 1, 0, 2), 0.5), {}),
               [(1, 0, 3, 8), (1, 4, 1, 8), (1, 0, 3), (1,)])},
    "grouped_matmul_add": {"m0": (lambda: ((_z(2, 4, 3), _r(0, 4), _r(0, 3), torch.tensor([0, 0])), {}), None)},
})

# sparse attention (DeepSeek-V3.2 DSA): sparse flash attention
def _sfa_zero(tokens=0, slots=4):
    q = _r(tokens, 2, 8)
    k = _r(1, 6, 1, 8)
    idx = _z(tokens, 1, slots, dtype=I32)
    lq = torch.tensor([tokens], dtype=I64)
    return (q, k, k, idx, 0.5), dict(actual_seq_lengths_query=lq, layout_query="TND", layout_kv="PA_BSND",
                                     block_table=_z(1, 1, dtype=I32), actual_seq_lengths_kv=torch.tensor([6]))


def _sfa_grad_zero():
    args, kw = _sfa_zero()
    out = torch.zeros(0, 2, 8)
    e = torch.zeros(0)
    return (*args[:4], out, out, e, e, 0.5, 1), dict(actual_seq_qlen=kw["actual_seq_lengths_query"],
                                                     actual_seq_kvlen=kw["actual_seq_lengths_kv"], layout="TND",
                                                     layout_kv="PA_BSND", block_table=kw["block_table"])


def _kv_quant_zero():
    q = _r(1, 0, 2, 24)
    key = _z(1, 6, 1, 16 + 8 * 4 + 8, dtype=torch.int8)
    return (q, key, key, _z(1, 0, 1, 4, dtype=I32), 0.5, 2, 2), dict(attention_mode=2, tile_size=8, rope_head_dim=8)


CASES.update({
    "sparse_flash_attention": {"t0": (_sfa_zero, [(0, 2, 8), (0,), (0,)]),
                               "k0": (lambda: _sfa_zero(tokens=2, slots=0), [(2, 2, 8), (0,), (0,)])},
    "sparse_flash_attention_grad": {"t0": (_sfa_grad_zero, [(0, 2, 8), (1, 6, 1, 8), (1, 6, 1, 8), (0,), (0,), (0,)])},
    "kv_quant_sparse_flash_attention": {"s0": (_kv_quant_zero, [(1, 0, 2, 16)])},
})


# linear attention (gdnrec): the recurrent gated delta rule and the gated RMSNorm
def _gdr_zero(tokens=0, dv=4):
    q = _r(tokens, 1, 8)
    return (q, q, _r(tokens, 2, dv), _r(3, 2, dv, 8)), dict(actual_seq_lengths=_z(0, dtype=I32) if tokens == 0
                                                              else None)


CASES.update({
    "recurrent_gated_delta_rule": {"t0": (_gdr_zero, [(0, 2, 4)]),
                                   "dv0": (lambda: _gdr_zero(tokens=2, dv=0), [(2, 2, 0)])},
    "recurrent_gated_delta_rule_functional": {"t0": (_gdr_zero, [(0, 2, 4), (3, 2, 4, 8)])},
    "rms_norm_gated": {"rows0": (lambda: ((_r(0, 8), _r(8), _r(0, 8)), {}), [(0, 8), (0, 1)])},
    "rms_norm_gated_grad": {"rows0": (lambda: ((_r(0, 8), _r(0, 8), _r(8), _r(0, 1), _r(0, 8)), {}),
                                      [(0, 8), (8,), (0, 8)])},
})

def _gdn_chunk_zero(lens=(0, 0)):
    """chunk_gated_delta_rule with Nk 1, Nv 2, Dk 4, Dv 3 over sequences of the given lengths (T = their sum)."""
    T = sum(lens)
    return (_r(T, 1, 4), _r(T, 1, 4), _r(T, 2, 3), _r(T, 2), _r(len(lens), 2, 3, 4),
            torch.tensor(lens, dtype=I32), 0.5, -_r(T, 2).abs()), {}


def _gdn_chunk_grad_zero():
    args, _ = _gdn_chunk_zero()
    return (_r(0, 2, 3), _r(2, 2, 3, 4), *args), {}


CASES.update({
    "chunk_gated_delta_rule": {"t0": (_gdn_chunk_zero, [(0, 2, 3), (2, 2, 3, 4)]),
                               "b0": (lambda: _gdn_chunk_zero(()), [(0, 2, 3), (0, 2, 3, 4)])},
    "chunk_gated_delta_rule_backward": {"t0": (_gdn_chunk_grad_zero,
                                               [(0, 1, 4), (0, 1, 4), (0, 2, 3), (0, 2), (2, 2, 3, 4), (0, 2)])},
})


# the causal conv1d ops (linear_attention): no tokens, empty sequences, zero channels
CASES.update({
    "fused_causal_conv1d": {
        "t0": (lambda: ((_z(0, 8), _r(3, 8), _r(2, 2, 8)), dict(query_start_loc=_z(3, dtype=I32))), [(0, 8)]),
        "b0": (lambda: ((_z(0, 8), _r(3, 8), _r(2, 2, 8)), dict(query_start_loc=_z(1, dtype=I32))), [(0, 8)]),
        "d0": (lambda: ((_z(0, 2, 8), _r(3, 8), _r(2, 2, 8)), {}), [(0, 2, 8)])},
    "fused_causal_conv1d_v2": {
        "t0": (lambda: ((_z(0, 8), _r(3, 8), _r(2, 2, 8)), dict(query_start_loc=_z(3, dtype=I32))), None)},
    "masked_causal_conv1d": {"s0": (lambda: ((_r(0, 2, 8), _r(3, 8)), {}), [(0, 2, 8)]),
                             "b0": (lambda: ((_r(4, 0, 8), _r(3, 8), _z(0, 4, dtype=torch.bool)), {}), [(4, 0, 8)])},
    "masked_causal_conv1d_backward": {"s0": (lambda: ((_r(0, 2, 8), _r(0, 2, 8), _r(3, 8)), {}),
                                             [(0, 2, 8), (3, 8)])},
})

_PROCESS_GROUP = "needs an initialised torch.distributed process group (group_name); test/mc2 covers it"
NO_CASE = {
    "trans_quant_param": "upstream rejects an empty scale (its documented rule, tested in test/quant)",
    "all_gather_matmul": _PROCESS_GROUP,
    "all_gather_matmul_grad": _PROCESS_GROUP,
    "matmul_reduce_scatter": _PROCESS_GROUP,
    "matmul_reduce_scatter_grad": _PROCESS_GROUP,
    "matmul_all_reduce": _PROCESS_GROUP,
    "matmul_all_reduce_add_rms_norm": _PROCESS_GROUP,
    # zero-token ranks (a batch of 0 on some ranks) are tested in test/moe/test_distribute.py
    "moe_distribute_dispatch_v2": _PROCESS_GROUP,
    "moe_distribute_dispatch_v2_grad": _PROCESS_GROUP,
    "moe_distribute_combine_v2": _PROCESS_GROUP,
    "moe_distribute_combine_v2_grad": _PROCESS_GROUP,
}


def _shapes(result):
    if result is None:
        return None
    if isinstance(result, torch.Tensor):
        return [list(result.shape)]
    return [[list(t.shape) for t in r] if isinstance(r, (list, tuple)) else list(r.shape) for r in result]


def to_device(value, device):
    """Tensors (also inside lists, tuples and dicts) moved to `device`; other values as they are."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def run(op: str, case: str, device: str = "cpu"):
    """Calls one case with its tensors on `device` ("npu": the simulated npu, where ops with an npu kernel run their
    Ascend C kernel); returns the result's shapes (lists)."""
    import torch_ops_transformer  # noqa: F401  (registers the ops)

    if device == "npu":
        torch_ops_transformer.npu_sim.enable()
    build, _ = CASES[op][case]
    args, kwargs = build()
    result = getattr(OPS, op)(*to_device(args, device), **to_device(kwargs, device))
    return _shapes(result)


def expected(op: str, case: str):
    shapes = CASES[op][case][1]
    if shapes is None:
        return None
    return [[list(s) for s in e] if isinstance(e, list) else list(e) for e in shapes]


def main(argv):
    """`<op> <case>` runs one case; `--all` runs every case, one JSON line {op, case, shapes | error} each, flushed
    as it goes so the lines before a crash survive it. `--device npu` first: the same on the simulated npu."""
    device = "cpu"
    if argv[0] == "--device":
        device, argv = argv[1], argv[2:]
    if argv[0] != "--all":
        print(json.dumps(run(argv[0], argv[1], device)))
        return
    for op, cases in CASES.items():
        for case in cases:
            try:
                line = {"op": op, "case": case, "shapes": run(op, case, device)}
            except Exception as e:  # reported per case by the test
                line = {"op": op, "case": case, "error": f"{type(e).__name__}: {e}"}
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
