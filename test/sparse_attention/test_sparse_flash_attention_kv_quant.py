"""npu_kv_quant_sparse_flash_attention: an int8 (or float8_e4m3fn) MLA cache whose rows hold the quantised latent,
the rope part (query's dtype, as bytes) and one float32 scale per tile, against the float64 reference of the
dequantised cache (sfa_reference.py); the upstream byte layout (656-byte rows for 512 + 64 and tile 128) on one
small call; the documented modes that are not implemented."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.common.tiers import pairwise
from test.sparse_attention.sfa_reference import make_inputs, sfa_reference

TILE = 16


def quant_inputs(dtype=torch.bfloat16, cache=torch.int8, tile=TILE, **shape):
    """make_inputs' call turned into a quantised one: (args, kwargs, reference tensors)."""
    inp = make_inputs(dtype=dtype, **shape)
    g = torch.Generator().manual_seed(21)
    key, key_rope = inp["key"], inp["kwargs"]["key_rope"]
    Dn = key.shape[-1]
    if cache == torch.int8:
        latent = torch.randint(-127, 128, key.shape, generator=g, dtype=torch.int8)
        latent_f = latent.double()
    else:
        latent = (torch.randn(key.shape, generator=g) * 4).to(cache)
        latent_f = latent.double()
    scales = torch.rand(key.shape[:-1] + (Dn // tile,), generator=g) * 0.05 + 0.01
    packed = torch.cat([latent.view(torch.int8), key_rope.view(torch.int8), scales.view(torch.int8)], -1)
    if cache != torch.int8:
        packed = packed.view(cache)
    query = torch.cat([inp["query"], inp["kwargs"]["query_rope"]], -1)
    kw = {k: v for k, v in inp["kwargs"].items() if k not in ("query_rope", "key_rope", "attention_mode")}
    kw.update(attention_mode=2, tile_size=tile, rope_head_dim=key_rope.shape[-1])
    dequant = latent_f * scales.double().repeat_interleave(tile, -1)
    ref = dict(query=inp["query"], query_rope=inp["kwargs"]["query_rope"], key=dequant, key_rope=key_rope,
               idx=inp["sparse_indices"], scale=inp["scale_value"], kw=inp["kwargs"])
    value = latent if cache == torch.int8 else latent.view(torch.int8).view(cache)
    return (query, packed, value, inp["sparse_indices"], inp["scale_value"], 2, 2), kw, ref


def reference(ref, dtype=torch.float64, sparse_mode=3, sinks=None, key_dtype=None):
    kw = ref["kw"]
    key = ref["key"] if key_dtype is None else ref["key"].float().to(key_dtype)  # same-dtype: dequantised, rounded
    return sfa_reference(ref["query"], key, key, ref["idx"], ref["scale"], block_table=kw["block_table"],
                         lq=kw["actual_seq_lengths_query"], lkv=kw["actual_seq_lengths_kv"],
                         query_rope=ref["query_rope"], key_rope=ref["key_rope"], sbs=kw["sparse_block_size"],
                         layout_query=kw["layout_query"], layout_kv=kw["layout_kv"], sparse_mode=sparse_mode,
                         sinks=sinks, dtype=dtype)[0]


LAYOUTS = {"bsnd": ("BSND", "BSND"), "tnd": ("TND", "TND"), "bsnd_pa": ("BSND", "PA_BSND"),
           "tnd_pa": ("TND", "PA_BSND")}


@pytest.mark.asan
@pytest.mark.parametrize("dtype,layout,sparse_mode", pairwise(
    dtype={"bf16": torch.bfloat16, "fp16": torch.float16}, layout=list(LAYOUTS), sparse_mode=[3, 0]))
def test_matches_dequantised_reference(dtype, layout, sparse_mode):
    lq, lkv = LAYOUTS[layout]
    args, kw, ref = quant_inputs(dtype, layout_query=lq, layout_kv=lkv, q_lens=[3, 2], kv_lens=[20, 11], fill=0.3,
                                 seed=sparse_mode)
    out = tot.npu_kv_quant_sparse_flash_attention(*args, sparse_mode=sparse_mode, **kw)
    r64 = reference(ref, sparse_mode=sparse_mode)
    assert out.dtype == dtype and out.shape == r64.shape
    check_tolerance("out", out, r64, reference(ref, dtype, sparse_mode, key_dtype=dtype),
                    value_scale=float(ref["key"].abs().max()))


def test_float8_cache_and_sinks():
    args, kw, ref = quant_inputs(torch.bfloat16, cache=torch.float8_e4m3fn, fill=0.3, seed=4)
    sinks = torch.tensor([0.3, -0.2, 1.0, 0.0])
    out = tot.npu_kv_quant_sparse_flash_attention(*args, sinks=sinks, **kw)
    check_tolerance("out", out, reference(ref, sinks=sinks),
                    reference(ref, torch.bfloat16, sinks=sinks, key_dtype=torch.bfloat16),
                    value_scale=float(ref["key"].abs().max()))


def test_upstream_row_layout_512_64_tile_128():
    """DeepSeek-V3.2's sizes: 576-wide query, 656-byte cache rows (512 int8 + 64 bf16 + 4 float32 scales)."""
    args, kw, ref = quant_inputs(torch.bfloat16, tile=128, B=1, S1=1, N1=2, Dn=512, Dr=64, S2=16, K=8,
                                 layout_kv="PA_BSND", block_size=16, seed=5)
    assert args[0].shape[-1] == 576 and args[1].shape[-1] == 656
    out = tot.npu_kv_quant_sparse_flash_attention(*args, **kw)
    assert out.shape == (1, 1, 2, 512)
    check_tolerance("out", out, reference(ref), reference(ref, torch.bfloat16, key_dtype=torch.bfloat16),
                    value_scale=float(ref["key"].abs().max()))


def test_matches_sparse_flash_attention_on_the_dequantised_cache():
    args, kw, ref = quant_inputs(torch.float32, fill=0.3, seed=6)
    out = tot.npu_kv_quant_sparse_flash_attention(*args, **kw)
    key = ref["key"].float()
    lk = dict(ref["kw"])
    expected = tot.npu_sparse_flash_attention(ref["query"], key, key, ref["idx"], ref["scale"], **lk)[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arg,value,error,match", [
    ("key_dequant_scale", torch.ones(1), ValueError, "'key_dequant_scale' is reserved"),
    ("value_dequant_scale", torch.ones(1), ValueError, "'value_dequant_scale' is reserved"),
    ("key_dtype", 290, NotImplementedError, "'key_dtype'"),
    ("value_dtype", 290, NotImplementedError, "'value_dtype'"),
])
def test_reserved_and_unimplemented_arguments(arg, value, error, match):
    args, kw, _ = quant_inputs(seed=1)
    with pytest.raises(error, match=match):
        tot.npu_kv_quant_sparse_flash_attention(*args, **kw, **{arg: value})


def test_key_dtype_naming_the_cache_dtype_is_accepted():
    args, kw, _ = quant_inputs(seed=1)
    a = tot.npu_kv_quant_sparse_flash_attention(*args, **kw)
    b = tot.npu_kv_quant_sparse_flash_attention(*args, **kw, key_dtype=torch.int8, value_dtype=1)
    assert torch.equal(a, b)


def _mutate(name):
    args, kw, _ = quant_inputs(seed=2)
    args = list(args)
    q, key = args[0], args[1]
    if name == "key_quant_mode":
        args[5] = 1
    elif name == "value_quant_mode":
        args[6] = 0
    elif name == "quant_scale_repo_mode":
        kw["quant_scale_repo_mode"] = 0
    elif name == "attention_mode":
        kw["attention_mode"] = 0
    elif name == "query_dtype":
        args[0] = q.double()
    elif name == "key_dtype_tensor":
        args[1] = key.float()
    elif name == "value_dtype_tensor":
        args[2] = args[2].to(torch.uint8)
    elif name == "tile_size":
        kw["tile_size"] = 0
    elif name == "tile_divides":
        kw["tile_size"] = 12
    elif name == "rope_head_dim":
        kw["rope_head_dim"] = q.shape[-1]
    elif name == "row_bytes":
        args[1] = torch.cat([key, key[..., :1]], -1)
    elif name == "value_shape":
        args[2] = args[2][..., :-1]
    elif name == "sinks_shape":
        kw["sinks"] = torch.zeros(3)
    return args, kw


@pytest.mark.parametrize("name,match", [
    ("key_quant_mode", "'key_quant_mode' and 'value_quant_mode' must be 2"),
    ("value_quant_mode", "'key_quant_mode' and 'value_quant_mode' must be 2"),
    ("quant_scale_repo_mode", "'quant_scale_repo_mode' must be 1"),
    ("attention_mode", "'attention_mode' must be 2"),
    ("query_dtype", "'query' must be float16, bfloat16 or float32"),
    ("key_dtype_tensor", "'key' must be int8 or float8_e4m3fn"),
    ("value_dtype_tensor", "'value' must have key's dtype"),
    ("tile_size", "'tile_size' must be positive"),
    ("tile_divides", "'tile_size' \\(12\\) must divide the latent dim"),
    ("rope_head_dim", "'rope_head_dim' must lie in"),
    ("row_bytes", "'key' must have rows of"),
    ("value_shape", "'value' must have key's shape"),
    ("sinks_shape", "'sinks' must be \\[N1\\]"),
])
def test_bad_input(name, match):
    args, kw = _mutate(name)
    error = TypeError if name in ("query_dtype", "key_dtype_tensor", "value_dtype_tensor") else ValueError
    with pytest.raises(error, match=match):
        tot.npu_kv_quant_sparse_flash_attention(*args, **kw)
