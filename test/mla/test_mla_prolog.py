"""mla_prolog (torch.ops.npu_fa) and its torch_npu wrappers npu_mla_prolog / _v2 / _v3 / _v3_functional against the
plain-PyTorch references of prolog_reference.py: float path per dtype and cache mode with the tolerance rule,
cache rows not indexed left untouched, skipped (-1) and repeated slots, the int8 variants of upstream, zero sizes,
torch.compile, bad inputs."""
import math

import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import check_tolerance
from test.mla import prolog_reference as ref
from test.mla.mla_prolog_cases import make_inputs, paged_caches, positional

OPS = torch.ops.npu_fa
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _slots(lead, rows, seed=3, skip=()):
    t = math.prod(lead)
    idx = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))[:t]
    for i in skip:
        idx[i] = -1
    return idx.reshape(lead)


def _check_against_reference(inputs, kv, kr, out, kv_out, kr_out, **kw):
    """out = (query, query_rope, query_norm) of our op; kv_out / kr_out the caches it wrote; kv / kr the originals."""
    r64 = ref.mla_prolog(*positional(inputs, kv.double(), kr.double()), **kw)
    same = ref.mla_prolog(*positional(inputs, kv, kr), dtype=inputs["token_x"].dtype, **kw)
    for name, ours, e64, es in zip(("query", "query_rope", "query_norm", "kv_cache", "kr_cache"),
                                   (*out, kv_out, kr_out), r64, same):
        check_tolerance(name, ours, e64, es)


# ---- float path ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cache_mode", ["PA_BSND", "PA_NZ"])
@pytest.mark.parametrize("lead", [(6,), (2, 3)])
def test_paged_matches_reference(dtype, cache_mode, lead):
    inputs = make_inputs(lead, dtype)
    kv, kr = paged_caches(inputs)
    idx = _slots(lead, kv.shape[0] * kv.shape[1])
    kv_out, kr_out = kv.clone(), kr.clone()
    q, qr, dq, qn, dqn = OPS.mla_prolog(*positional(inputs, kv_out, kr_out), cache_index=idx, cache_mode=cache_mode,
                                        query_norm_flag=True, qc_qr_scale=0.7, kc_scale=1.3)
    assert q.dtype == qr.dtype == qn.dtype == dtype
    assert q.shape == (*lead, 4, 32) and qr.shape == (*lead, 4, 16) and qn.shape == (*lead, 48)
    assert dq.shape == (0,) and dqn.shape == (0,)
    _check_against_reference(inputs, kv, kr, (q, qr, qn), kv_out, kr_out, cache_index=idx, cache_mode=cache_mode,
                             qc_qr_scale=0.7, kc_scale=1.3)


@pytest.mark.parametrize("cache_mode", ["PA_BSND", "PA_NZ"])
def test_rows_not_indexed_are_untouched(cache_mode):
    inputs = make_inputs((5,))
    kv, kr = paged_caches(inputs)
    idx = torch.tensor([7, 33, -1, 12, 60])
    kv_out, kr_out = kv.clone(), kr.clone()
    OPS.mla_prolog(*positional(inputs, kv_out, kr_out), cache_index=idx, cache_mode=cache_mode)
    changed_kv = (kv_out != kv).flatten(0, 1).any(-1).any(-1) if cache_mode == "PA_BSND" else None
    if cache_mode == "PA_BSND":
        assert sorted(changed_kv.nonzero().flatten().tolist()) == [7, 12, 33, 60]
    # In NZ, a slot's values are spread over its block: compare with the reference element by element.
    e = ref.mla_prolog(*positional(inputs, kv, kr), cache_index=idx, cache_mode=cache_mode, dtype=torch.float32)
    torch.testing.assert_close(kv_out, e[3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kr_out, e[4], atol=1e-5, rtol=1e-5)
    written = {7, 33, 12, 60}
    untouched = [s for s in range(kv.shape[0] * kv.shape[1]) if s not in written]
    flat_kv, flat_out = kv.view(-1, kv.shape[-1] * kv.shape[-2]), kv_out.view(-1, kv.shape[-1] * kv.shape[-2])
    if cache_mode == "PA_BSND":
        assert torch.equal(flat_kv[untouched], flat_out[untouched])


def test_repeated_slot_keeps_the_last_token():
    inputs = make_inputs((4,))
    kv, kr = paged_caches(inputs)
    idx = torch.tensor([9, 9, 2, 9])
    OPS.mla_prolog(*positional(inputs, kv, kr), cache_index=idx)
    e = ref.mla_prolog(*positional(inputs, torch.zeros_like(kv), torch.zeros_like(kr)),
                       cache_index=torch.tensor([-1, -1, 2, 9]), dtype=torch.float32)
    torch.testing.assert_close(kv.view(-1, 32)[9], e[3].view(-1, 32)[9], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_nz_with_two_kv_heads(dtype):
    """Nkv = 2: the token row is both heads' copies (Nkv * Hckv values), cut into 32-byte NZ chunks."""
    inputs = make_inputs((2, 3), dtype)
    kv, kr = paged_caches(inputs, nkv=2)
    idx = _slots((2, 3), kv.shape[0] * kv.shape[1], skip=(4,))
    kv_out, kr_out = kv.clone(), kr.clone()
    q, qr, _, qn, _ = OPS.mla_prolog(*positional(inputs, kv_out, kr_out), cache_index=idx, cache_mode="PA_NZ",
                                     query_norm_flag=True)
    _check_against_reference(inputs, kv, kr, (q, qr, qn), kv_out, kr_out, cache_index=idx, cache_mode="PA_NZ")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cache_mode,lead", [("BSND", (2, 3)), ("TND", (5,))])
def test_contiguous_cache_modes(dtype, cache_mode, lead):
    inputs = make_inputs(lead, dtype)
    kv = torch.zeros(*lead, 2, 32, dtype=dtype)  # Nkv = 2: every head gets the row
    kr = torch.zeros(*lead, 2, 16, dtype=dtype)
    kv_out, kr_out = kv.clone(), kr.clone()
    q, qr, _, qn, _ = OPS.mla_prolog(*positional(inputs, kv_out, kr_out), cache_mode=cache_mode, query_norm_flag=True)
    _check_against_reference(inputs, kv, kr, (q, qr, qn), kv_out, kr_out, cache_mode=cache_mode)
    assert torch.equal(kv_out[..., 0, :], kv_out[..., 1, :])


@pytest.mark.parametrize("cache_mode", ["PA_BLK_BSND", "PA_BLK_NZ"])
def test_per_block_index_bs(cache_mode):
    inputs = make_inputs((2, 20))
    kv, kr = paged_caches(inputs, num_blocks=6, block_size=16)
    idx = torch.tensor([[4, 1], [0, 5]])  # block of tokens 0-15 and 16-19 of each sequence
    kv_out, kr_out = kv.clone(), kr.clone()
    q, qr, _, qn, _ = OPS.mla_prolog(*positional(inputs, kv_out, kr_out), cache_index=idx, cache_mode=cache_mode,
                                     query_norm_flag=True)
    _check_against_reference(inputs, kv, kr, (q, qr, qn), kv_out, kr_out, cache_index=idx, cache_mode=cache_mode)
    if cache_mode == "PA_BLK_BSND":  # token 17 of sequence 1 -> block 5, offset 1
        e = ref.mla_prolog(*positional(inputs, kv, kr), cache_index=idx, cache_mode=cache_mode, dtype=torch.float32)
        torch.testing.assert_close(kv_out[5, 1], e[3][5, 1])
        assert torch.equal(kv_out[2], kv[2]) and torch.equal(kv_out[3], kv[3])


def test_per_block_index_merged_with_actual_seq_len():
    inputs = make_inputs((23,))
    kv, kr = paged_caches(inputs, num_blocks=5, block_size=8)
    ends = torch.tensor([3, 14, 23], dtype=torch.int32)  # lengths 3, 11, 9 -> 1 + 2 + 2 blocks
    idx = torch.tensor([2, 0, 4, 1, 3])
    kv_out, kr_out = kv.clone(), kr.clone()
    q, qr, _, qn, _ = OPS.mla_prolog(*positional(inputs, kv_out, kr_out), cache_index=idx, actual_seq_len=ends,
                                     cache_mode="PA_BLK_BSND", query_norm_flag=True)
    _check_against_reference(inputs, kv, kr, (q, qr, qn), kv_out, kr_out, cache_index=idx, actual_seq_len=ends,
                             cache_mode="PA_BLK_BSND")


def test_query_is_absorbed_per_head():
    """query[t, n] = q_nope[t, n] @ weight_uk[n]: changing head 1's weight_uk changes only head 1."""
    inputs = make_inputs((3,))
    kv, kr = paged_caches(inputs)
    idx = torch.tensor([0, 1, 2])
    q1 = OPS.mla_prolog(*positional(inputs, kv.clone(), kr.clone()), cache_index=idx)[0]
    inputs["weight_uk"] = inputs["weight_uk"].clone()
    inputs["weight_uk"][1] *= 2
    q2 = OPS.mla_prolog(*positional(inputs, kv.clone(), kr.clone()), cache_index=idx)[0]
    torch.testing.assert_close(q2[:, 1], 2 * q1[:, 1])
    assert torch.equal(q2[:, [0, 2, 3]], q1[:, [0, 2, 3]])


# ---- wrappers --------------------------------------------------------------------------------------------------

def _wrapper_inputs(lead=(2, 3)):
    inputs = make_inputs(lead, torch.bfloat16)
    kv, kr = paged_caches(inputs)
    return inputs, kv, kr, _slots(lead, kv.shape[0] * kv.shape[1])


def test_v1_v2_write_in_place_and_return_the_caches():
    inputs, kv, kr, idx = _wrapper_inputs()
    args = positional(inputs, kv, kr)
    k2, r2 = kv.clone(), kr.clone()
    q, qr, kv_out, kr_out = tot.npu_mla_prolog(*args[:9], idx, k2, r2, cache_mode="PA_NZ")
    assert kv_out is k2 and kr_out is r2
    k3, r3 = kv.clone(), kr.clone()
    q3, qr3, kv3, kr3, scale = tot.npu_mla_prolog_v2(*args[:9], idx, k3, r3, cache_mode="PA_NZ")
    assert kv3 is k3 and scale.shape == (1,) and scale.dtype == torch.float32
    e = OPS.mla_prolog(*positional(inputs, kv.clone(), kr.clone()), cache_index=idx, cache_mode="PA_NZ")
    for a, b in ((q, e[0]), (qr, e[1]), (q3, e[0]), (qr3, e[1]), (k2, k3), (r2, r3)):
        assert torch.equal(a, b)


def test_v3_and_functional():
    inputs, kv, kr, idx = _wrapper_inputs((5,))
    k1, r1 = kv.clone(), kr.clone()
    out = tot.npu_mla_prolog_v3(*positional(inputs, k1, r1), cache_index=idx, query_norm_flag=True,
                                qc_qr_scale=2.0, kc_scale=0.5)
    assert len(out) == 5 and out[2].shape == (0,) and out[3].shape == (5, 48) and out[4].shape == (0,)
    fout = tot.npu_mla_prolog_v3_functional(*positional(inputs, kv, kr), cache_index=idx, query_norm_flag=True,
                                            qc_qr_scale=2.0, kc_scale=0.5)
    assert len(fout) == 7
    assert torch.equal(fout[5], k1) and torch.equal(fout[6], r1)
    assert not torch.equal(fout[5], kv)  # the argument is not modified
    for a, b in zip(out, fout[:5]):
        assert torch.equal(a, b)


def test_v3_defaults_match_the_op():
    inputs, kv, kr, idx = _wrapper_inputs((5,))
    out = tot.npu_mla_prolog_v3(*positional(inputs, kv.clone(), kr.clone()), cache_index=idx)
    e = OPS.mla_prolog(*positional(inputs, kv.clone(), kr.clone()), cache_index=idx)
    assert all(torch.equal(a, b) for a, b in zip(out, e))


# ---- quantised variants (upstream's int8 formulas) --------------------------------------------------------------

def _int8(*shape, seed):
    return torch.randint(-100, 100, shape, generator=torch.Generator().manual_seed(seed), dtype=torch.int8)


def _quant_inputs(lead, weight_quant_mode):
    inputs = make_inputs(lead, torch.bfloat16)
    he, hcq = inputs["weight_dq"].shape
    nq = inputs["weight_uq_qr"].shape[1]
    hkr = inputs["weight_dkv_kr"].shape[1]
    g = torch.Generator().manual_seed(7)
    scales = dict(dequant_scale_w_uq_qr=torch.rand(1, nq, generator=g) * 1e-3 + 1e-4,
                  smooth_scales_cq=torch.rand(1, hcq, generator=g) + 0.5)
    inputs["weight_uq_qr"] = _int8(hcq, nq, seed=1)
    if weight_quant_mode == 2:
        t = math.prod(lead)
        inputs["token_x"] = _int8(*lead, he, seed=2)
        inputs["weight_dq"] = _int8(he, hcq, seed=3)
        inputs["weight_dkv_kr"] = _int8(he, hkr, seed=4)
        scales.update(dequant_scale_x=torch.rand(t, 1, generator=g) * 1e-2 + 1e-3,
                      dequant_scale_w_dq=torch.rand(1, hcq, generator=g) * 1e-2 + 1e-3,
                      dequant_scale_w_dkv_kr=torch.rand(1, hkr, generator=g) * 1e-2 + 1e-3)
    return inputs, scales


def _close_int8(name, ours, expected):
    """int8 results may differ by one step where a value sits at a rounding boundary (upstream allows 1 too)."""
    diff = (ours.double() - expected.double()).abs()
    assert diff.max() <= 1, f"{name}: max int8 difference {diff.max()}"
    assert (diff > 0).double().mean() < 0.02, f"{name}: {(diff > 0).double().mean():.3f} of the values differ"


def _close_float(name, ours, expected, rtol=2e-2):
    scale = expected.abs().max().clamp_min(1e-6)
    err = (ours.double() - expected).abs().max() / scale
    assert err < rtol, f"{name}: max relative error {err:.3e}"


@pytest.mark.parametrize("kv_cache_quant_mode", [0, 2])
def test_weight_quant_mode_1(kv_cache_quant_mode):
    lead = (2, 3)
    inputs, scales = _quant_inputs(lead, 1)
    kv, kr = paged_caches(inputs, dtype=torch.int8 if kv_cache_quant_mode == 2 else torch.bfloat16)
    if kv_cache_quant_mode == 2:
        kv, kr = _int8(*kv.shape, seed=5), _int8(*kr.shape, seed=6)
        scales.update(quant_scale_ckv=torch.rand(1, 32) * 40 + 20, quant_scale_ckr=torch.rand(1, 16) * 40 + 20)
    idx = _slots(lead, kv.shape[0] * kv.shape[1])
    kv_out, kr_out = kv.clone(), kr.clone()
    q, qr, dq, qn, dqn = OPS.mla_prolog(*positional(inputs, kv_out, kr_out), cache_index=idx, weight_quant_mode=1,
                                        kv_cache_quant_mode=kv_cache_quant_mode, query_norm_flag=True, **scales)
    e = ref.mla_prolog_quant(*positional(inputs, kv, kr), idx, 1, kv_cache_quant_mode, **scales)
    assert q.dtype == torch.bfloat16 and qn.dtype == torch.int8 and dqn.shape == (6, 1) and dq.shape == (0,)
    _close_float("query", q, e[0])
    _close_float("query_rope", qr, e[1])
    _close_int8("query_norm", qn, e[3])
    torch.testing.assert_close(dqn.double(), e[4], rtol=1e-5, atol=0)
    if kv_cache_quant_mode == 2:
        _close_int8("kv_cache", kv_out, e[5])
        _close_int8("kr_cache", kr_out, e[6])
    else:
        _close_float("kv_cache", kv_out, e[5])
        _close_float("kr_cache", kr_out, e[6])


@pytest.mark.parametrize("kv_cache_quant_mode", [0, 1])
@pytest.mark.parametrize("lead,cache_mode", [((6,), "PA_BSND"), ((2, 3), "PA_BSND"), ((2, 3), "PA_NZ")])
def test_weight_quant_mode_2(kv_cache_quant_mode, lead, cache_mode):
    inputs, scales = _quant_inputs(lead, 2)
    kv, kr = paged_caches(inputs, dtype=torch.bfloat16)
    if kv_cache_quant_mode == 1:
        kv = _int8(*kv.shape, seed=5)
        scales.update(quant_scale_ckv=torch.tensor([40.0]))
    idx = _slots(lead, kv.shape[0] * kv.shape[1])
    kv_out, kr_out = kv.clone(), kr.clone()
    qq = 1 if kv_cache_quant_mode == 1 else 0
    q, qr, dq, qn, dqn = OPS.mla_prolog(*positional(inputs, kv_out, kr_out), cache_index=idx, weight_quant_mode=2,
                                        kv_cache_quant_mode=kv_cache_quant_mode, query_quant_mode=qq,
                                        qc_qr_scale=3.0, kc_scale=0.5, cache_mode=cache_mode, **scales)
    e = ref.mla_prolog_quant(*positional(inputs, kv, kr), idx, 2, kv_cache_quant_mode, qc_qr_scale=3.0, kc_scale=0.5,
                             cache_mode=cache_mode, **scales)
    if kv_cache_quant_mode == 1:
        assert q.dtype == torch.int8 and dq.shape == (6, 4, 1)
        _close_int8("query", q, e[0])
        torch.testing.assert_close(dq.double(), e[2].reshape(6, 4, 1), rtol=2e-2, atol=0)
        _close_int8("kv_cache", kv_out, e[5])
    else:
        _close_float("query", q, e[0])
        _close_float("kv_cache", kv_out, e[5])
    _close_float("query_rope", qr, e[1])
    _close_float("kr_cache", kr_out, e[6])


def test_v2_full_quant_reads_the_scenario_from_dtypes():
    """v2 with int8 token_x and kv_cache: per-tensor cache scale (quant_scale_ckv [1, Hckv], first value, as
    upstream's reference), int8 query and its [B*S, N, 1] scale."""
    lead = (2, 3)
    inputs, scales = _quant_inputs(lead, 2)
    kv, kr = paged_caches(inputs, dtype=torch.bfloat16)
    kv = _int8(*kv.shape, seed=5)
    qs = torch.full((1, 32), 40.0)
    idx = _slots(lead, kv.shape[0] * kv.shape[1])
    args = positional(inputs, kv, kr)
    q, qr, kv_out, kr_out, dq = tot.npu_mla_prolog_v2(*args[:9], idx, kv, kr, quant_scale_ckv=qs, **scales)
    assert q.dtype == torch.int8 and dq.shape == (6, 4, 1) and kv_out is kv
    e = ref.mla_prolog_quant(*positional(inputs, _int8(*kv.shape, seed=5), kr.clone()), idx, 2, 1,
                             quant_scale_ckv=torch.tensor([40.0]), **scales)
    _close_int8("query", q, e[0])


# ---- zero sizes, compile -----------------------------------------------------------------------------------------

def test_zero_tokens_leave_the_caches_untouched():
    inputs = make_inputs((0,))
    kv, kr = paged_caches(inputs)
    kv0, kr0 = kv.clone(), kr.clone()
    q, qr, dq, qn, dqn = OPS.mla_prolog(*positional(inputs, kv, kr), cache_index=torch.zeros(0, dtype=torch.long),
                                        query_norm_flag=True)
    assert q.shape == (0, 4, 32) and qr.shape == (0, 4, 16) and qn.shape == (0, 48)
    assert torch.equal(kv, kv0) and torch.equal(kr, kr0)


def test_zero_blocks_compute_the_query():
    inputs = make_inputs((1, 2))
    kv, kr = torch.zeros(0, 16, 1, 32), torch.zeros(0, 16, 1, 16)
    q = OPS.mla_prolog(*positional(inputs, kv, kr), cache_index=torch.full((1, 2), -1))[0]
    assert q.shape == (1, 2, 4, 32) and torch.isfinite(q).all()


def test_compile_fullgraph(dynamo_reset):
    inputs, kv, kr, idx = _wrapper_inputs((5,))

    def f(kv_cache, kr_cache):
        return tot.npu_mla_prolog_v3(*positional(inputs, kv_cache, kr_cache), cache_index=idx, query_norm_flag=True,
                                     cache_mode="PA_NZ")

    k1, r1, k2, r2 = kv.clone(), kr.clone(), kv.clone(), kr.clone()
    compiled = torch.compile(f, fullgraph=True)(k1, r1)
    eager = f(k2, r2)
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)
    assert torch.equal(k1, k2) and torch.equal(r1, r2)


# ---- bad inputs --------------------------------------------------------------------------------------------------

def _call(**overrides):
    inputs, kv, kr, idx = _wrapper_inputs((5,))
    kw = dict(cache_index=idx)
    for k, v in overrides.items():
        if k in inputs:
            inputs[k] = v
        else:
            kw[k] = v
    kv_cache, kr_cache = kw.pop("kv_cache", kv), kw.pop("kr_cache", kr)
    return tot.npu_mla_prolog_v3(*positional(inputs, kv_cache, kr_cache), **kw)


@pytest.mark.parametrize("overrides,words", [
    (dict(cache_mode="PA"), ["cache_mode", "PA_BSND", "'PA'"]),
    (dict(weight_uq_qr=torch.zeros(48, 90, dtype=torch.bfloat16)), ["weight_uq_qr", "[48, 128]", "[48, 90]"]),
    (dict(cache_index=torch.tensor([0, 1, 2, 3, 64])), ["cache_index[4] = 64", "[0, BlockNum*BlockSize = 64)"]),
    (dict(cache_index=torch.tensor([0, 1, 2])), ["cache_index", "[5]", "[3]"]),
    (dict(cache_index=None), ["cache_index", "required", "None"]),
    (dict(cache_mode="BSND"), ["BSND", "3-D token_x", "[5, 64]"]),
    (dict(rope_cos=torch.zeros(5, 6, dtype=torch.bfloat16)), ["rope_cos", "[5, 16]", "[5, 6]"]),
    (dict(kr_cache=torch.zeros(4, 16, 1, 6, dtype=torch.bfloat16)), ["kr_cache", "[4, 16, 1, 16]", "[4, 16, 1, 6]"]),
    (dict(dequant_scale_x=torch.ones(5, 1)), ["dequant_scale_x", "weight_quant_mode 2"]),
    (dict(actual_seq_len=torch.tensor([5], dtype=torch.int32)), ["actual_seq_len", "PA_BLK_"]),
    (dict(tile_size=0), ["tile_size", "> 0", "0"]),
])
def test_bad_values(overrides, words):
    with pytest.raises(ValueError) as info:
        _call(**overrides)
    assert isinstance(info.value, RuntimeError)  # torch_npu's exception type too
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("overrides,words", [
    (dict(weight_quant_mode=3), ["weight_quant_mode", "mxfp8"]),
    (dict(weight_quant_mode=5), ["weight_quant_mode", "hifloat8"]),
    (dict(kv_cache_quant_mode=3), ["kv_cache_quant_mode"]),
    (dict(k_nope_clip_alpha=torch.ones(1)), ["k_nope_clip_alpha"]),
    (dict(ckvkr_repo_mode=1), ["ckvkr_repo_mode"]),
    (dict(quant_scale_repo_mode=1), ["quant_scale_repo_mode"]),
    (dict(token_x_dtype=290), ["token_x_dtype", "hifloat8"]),
])
def test_not_implemented(overrides, words):
    with pytest.raises(NotImplementedError) as info:
        _call(**overrides)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_bad_dtypes():
    with pytest.raises(TypeError, match="weight_uq_qr.*int8 needs weight_quant_mode"):
        _call(weight_uq_qr=torch.zeros(48, 128, dtype=torch.int8))
    with pytest.raises(TypeError, match="token_x.*int8 token_x needs weight_quant_mode 2"):
        _call(token_x=torch.zeros(5, 64, dtype=torch.int8))
    with pytest.raises(TypeError, match="cache_index.*int64"):
        _call(cache_index=torch.zeros(5))


def test_token_x_dtype_naming_the_tensors_dtype_is_accepted():
    _call(token_x_dtype=torch.bfloat16, kv_cache_dtype=15)


@pytest.mark.parametrize("overrides", [dict(cache_index=torch.tensor([0, 1, 2, 3, 64])),
                                       dict(cache_index=torch.tensor([0, 1, 2, 3, -2])),
                                       dict(quant_scale_ckv=torch.ones(1))])
def test_a_failed_call_leaves_the_caches_untouched(overrides):
    inputs, kv, kr, idx = _wrapper_inputs((5,))
    kv0, kr0 = kv.clone(), kr.clone()
    with pytest.raises(ValueError):
        tot.npu_mla_prolog_v3(*positional(inputs, kv, kr), **{"cache_index": idx, **overrides})
    assert torch.equal(kv, kv0) and torch.equal(kr, kr0)
