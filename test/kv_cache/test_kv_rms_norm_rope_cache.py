"""kv_rms_norm_rope_cache (torch_npu's npu_kv_rmsnorm_rope_cache, _v2, _v2_functional): a float64 reference in plain
PyTorch (RMSNorm, the interleaved rope of upstream's doc, and the cache placement of every cache_mode written out
token by token), every cache mode x dtype x with/without v, int8 caches (per channel, per head, per tensor, with
offsets), index semantics (negative = skip, per-block start slots, Norm positions per batch), is_output_kv, the
torch_npu wrappers and the way serving engines call them (vLLM-Ascend's decode, token-major rows), torch.compile and
bad inputs."""
import pytest
import torch

import torch_ops_transformer as tot
from test.common.reference import DTYPES, check_tolerance

OPS = torch.ops.npu_fa
MODES = ["Norm", "PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ"]


# ---- reference ---------------------------------------------------------------------------------------------------
def ref_interleave_rope(x, cos, sin):
    d = x.shape[-1]
    q = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    return q * cos + torch.cat((-q[..., d // 2:], q[..., :d // 2]), dim=-1) * sin


def ref_rows(kv, gamma, cos, sin, v=None, eps=1e-5, dtype=torch.float64):
    """(k row [B, N, S, Dk], ckv row [B, N, S, Dv]) computed in `dtype`."""
    kv, gamma, cos, sin = (t.to(dtype) for t in (kv, gamma, cos, sin))

    def rms(x):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma

    dr = cos.shape[-1]
    if v is None:
        dn = gamma.shape[0]
        return ref_interleave_rope(kv[..., dn:], cos, sin), rms(kv[..., :dn])
    y = rms(kv)
    return torch.cat((ref_interleave_rope(y[..., :dr], cos, sin), y[..., dr:]), dim=-1), v.to(dtype)


def token_slots(mode, index, b, s, block_size):
    """{(batch, token): slot (Norm: position)} of the tokens written."""
    out = {}
    idx = index.flatten().tolist()
    nb = -(-s // block_size) if block_size else 0
    for bi in range(b):
        for si in range(s):
            if mode == "Norm":
                v = index[bi, si].item()
            elif "BLK" in mode:
                start = idx[bi * nb + si // block_size]
                v = -1 if start < 0 else (start // block_size) * block_size + si % block_size
            else:
                v = idx[bi * s + si]
            if v >= 0:
                out[(bi, si)] = v
    return out


def nz_chunk(dtype):
    return 32 // torch.empty((), dtype=dtype).element_size()


def place(cache, rows, mode, index, out_dtype, quant=None):
    """cache (a copy, in out_dtype) with rows [B, N, S, D] written where `mode` / `index` say. quant: (scale,
    offset) fp32 tensors broadcastable to [N, D] -> round(x * scale + offset) clamped to int8's range."""
    b, n, s, d = rows.shape
    exp = cache.clone().to(out_dtype)
    if quant is not None:
        scale, offset = quant
        scale = scale.to(rows.dtype).reshape(-1, scale.shape[-1]) if scale.dim() == 2 else scale.to(rows.dtype)
        y = rows * (scale if scale.dim() == 1 else scale[None, :, None, :])
        if offset is not None:
            off = offset.to(rows.dtype)
            y = y + (off if off.dim() == 1 else off[None, :, None, :])
        rows = torch.round(y).clamp(-128, 127)
    rows = rows.to(out_dtype)
    bs = cache.shape[1]
    for (bi, si), slot in token_slots(mode, index, b, s, bs).items():
        for ni in range(n):
            r = rows[bi, ni, si]
            if mode == "Norm":
                exp[bi, ni, slot] = r
            elif mode.endswith("NZ"):
                d0 = nz_chunk(cache.dtype)
                exp.view(cache.shape[0], d // d0, bs, d0)[slot // bs, :, slot % bs, :] = r.view(d // d0, d0)
            else:
                exp.view(-1, n, d)[slot, ni] = r
    return exp


# ---- inputs ------------------------------------------------------------------------------------------------------
def make_inputs(mode, dtype, b=2, n=1, s=3, dn=32, dr=16, dv=None, block_size=4, blocks=None, cache_len=6,
                cache_dtype=None, cos_s=None, seed=0, skip=True):
    """kv [B, N, S, dn + dr] (or kv [B, N, S, dn] and v [B, N, S, dv] with dv), caches filled with 9 (upstream's
    test does the same) and an index with one skipped entry."""
    g = torch.Generator().manual_seed(seed)
    with_v = dv is not None
    d = dn if with_v else dn + dr
    kv = (torch.randn(b, n, s, d, generator=g) * 4).to(dtype)
    gamma = (torch.rand(dn, generator=g) + 0.5).to(dtype)
    cs = cos_s if cos_s is not None else s
    ang = torch.rand(b, 1, cs, dr, generator=g, dtype=torch.float64) * 6
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    v = (torch.randn(b, n, s, dv, generator=g) * 2).to(dtype) if with_v else None
    dk, dvv = (d, dv) if with_v else (dr, dn)
    cdt = cache_dtype or dtype
    if mode == "Norm":
        kc = torch.full((b, n, cache_len, dk), 9, dtype=cdt)
        vc = torch.full((b, n, cache_len, dvv), 9, dtype=cdt)
        index = torch.stack([torch.randperm(cache_len, generator=g)[:s] for _ in range(b)])
        if skip:
            index[0, -1] = -1
    else:
        nb = -(-s // block_size)
        blocks = blocks or b * nb + 2
        kc = torch.full((blocks, block_size, n, dk), 9, dtype=cdt)
        vc = torch.full((blocks, block_size, n, dvv), 9, dtype=cdt)
        perm = torch.randperm(blocks, generator=g)
        if "BLK" in mode:
            index = (perm[:b * nb] * block_size).clone()
        else:
            slots = torch.randperm(blocks * block_size, generator=g)[:b * s]
            index = slots.clone()
        if skip:
            index[-1] = -1
    return dict(kv=kv, gamma=gamma, cos=cos, sin=sin, index=index, k_cache=kc, ckv_cache=vc, v=v)


def expected(inp, mode, dtype, quant_k=None, quant_v=None, eps=1e-5):
    """(k_cache, ckv_cache, k_rope, c_kv) of the float64 reference and of plain PyTorch in `dtype`."""
    k64, c64 = ref_rows(inp["kv"], inp["gamma"], inp["cos"], inp["sin"], inp["v"], eps)
    kd, cd = ref_rows(inp["kv"], inp["gamma"], inp["cos"], inp["sin"], inp["v"], eps, dtype)
    kcd, vcd = inp["k_cache"].dtype, inp["ckv_cache"].dtype
    ref = (place(inp["k_cache"], k64, mode, inp["index"], torch.float64, quant_k),
           place(inp["ckv_cache"], c64, mode, inp["index"], torch.float64, quant_v), k64, c64)
    same = (place(inp["k_cache"], kd, mode, inp["index"], kcd if quant_k is None else torch.float64, quant_k),
            place(inp["ckv_cache"], cd, mode, inp["index"], vcd if quant_v is None else torch.float64, quant_v),
            kd, cd)
    return ref, same


def run_op(inp, mode, **kw):
    k_cache, ckv_cache = inp["k_cache"].clone(), inp["ckv_cache"].clone()
    k_rope, c_kv = OPS.kv_rms_norm_rope_cache(inp["kv"], inp["gamma"], inp["cos"], inp["sin"], inp["index"],
                                              k_cache, ckv_cache, v=inp["v"], cache_mode=mode, **kw)
    return k_cache, ckv_cache, k_rope, c_kv


def check_all(name, ours, ref, same):
    for what, o, r, m in zip(("k_cache", "ckv_cache", "k_rope", "c_kv"), ours, ref, same):
        check_tolerance(f"{name} {what}", o, r, m)


# ---- every cache mode x dtype ------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_v", [False, True], ids=["latent", "with_v"])
@pytest.mark.parametrize("dname", list(DTYPES))
@pytest.mark.parametrize("mode", MODES)
def test_cache_modes_match_float64_reference(mode, dname, with_v):
    dtype = DTYPES[dname]
    inp = make_inputs(mode, dtype, dn=32 if not with_v else 48, dv=16 if with_v else None,
                      s=6 if "BLK" in mode else 3, seed=MODES.index(mode))
    ours = run_op(inp, mode, is_output_kv=True)
    ref, same = expected(inp, mode, dtype)
    assert ours[0].dtype == dtype and ours[2].dtype == dtype and ours[2].shape == ref[2].shape
    check_all(f"{mode} {dname} {'v' if with_v else 'latent'}", ours, ref, same)


@pytest.mark.parametrize("dname", list(DTYPES))
def test_deepseek_sizes_pa_decode(dname):
    """DeepSeek-V3's latent row: kv 512 + 64, block 128, decode (S = 1) of 4 sequences, fp32 epsilon 1e-6."""
    dtype = DTYPES[dname]
    inp = make_inputs("PA_BNSD", dtype, b=4, s=1, dn=512, dr=64, block_size=128, blocks=6, seed=7)
    ours = run_op(inp, "PA_BNSD", epsilon=1e-6)
    ref, same = expected(inp, "PA_BNSD", dtype, eps=1e-6)
    check_all(f"deepseek {dname}", ours, ref, same)


@pytest.mark.parametrize("mode", ["Norm", "PA", "PA_BLK_BNSD"])
def test_multi_head_and_cos_broadcast(mode):
    inp = make_inputs(mode, torch.float32, b=2, n=3, s=5, cos_s=1, seed=11)
    inp["cos"], inp["sin"] = inp["cos"][:, :, :1], inp["sin"][:, :, :1]  # [B, 1, 1, Dr]: one position per batch
    ours = run_op(inp, mode)
    ref, same = expected(inp, mode, torch.float32)
    check_all(f"N=3 {mode}", ours, ref, same)


def test_fp64_rows_are_exact():
    inp = make_inputs("PA", torch.float64, seed=3)
    ours = run_op(inp, "PA")
    ref, _ = expected(inp, "PA", torch.float64)
    for o, r in zip(ours, ref):
        torch.testing.assert_close(o, r, rtol=0, atol=1e-12)


# ---- index semantics ---------------------------------------------------------------------------------------------
def test_negative_index_skips_and_untouched_rows_stay():
    inp = make_inputs("PA", torch.float32, b=2, s=2, seed=4, skip=False)
    inp["index"] = torch.tensor([3, -1, -5, 8])
    k_cache, ckv_cache, _, _ = run_op(inp, "PA")
    written = {3, 8}
    flat_k, flat_v = k_cache.view(-1, k_cache.shape[-1]), ckv_cache.view(-1, ckv_cache.shape[-1])
    for slot in range(flat_k.shape[0]):
        assert (flat_k[slot] == 9).all().item() == (slot not in written)
        assert (flat_v[slot] == 9).all().item() == (slot not in written)


def test_blk_mode_spans_blocks_and_uses_each_block_start():
    # S = 7 tokens with block_size 4: two index entries per sequence; sequence 1's second block skipped
    inp = make_inputs("PA_BLK_BNSD", torch.float32, b=2, s=7, block_size=4, blocks=6, seed=5, skip=False)
    inp["index"] = torch.tensor([8, 0, 20, -1])
    k_cache, _, k_rope, _ = run_op(inp, "PA_BLK_BNSD")
    for s in range(7):
        blk = (2, 0)[s // 4]
        torch.testing.assert_close(k_cache[blk, s % 4, 0], k_rope[0, 0, s])
    for s in range(4):
        torch.testing.assert_close(k_cache[5, s, 0], k_rope[1, 0, s])
    assert (k_cache[1] == 9).all() and (k_cache[3] == 9).all() and (k_cache[4] == 9).all()


def test_norm_positions_are_per_batch():
    inp = make_inputs("Norm", torch.float32, b=2, s=2, cache_len=4, seed=6, skip=False)
    inp["index"] = torch.tensor([[1, 3], [1, 0]])  # position 1 in both batches: allowed
    k_cache, ckv_cache, k_rope, c_kv = run_op(inp, "Norm")
    torch.testing.assert_close(k_cache[0, 0, 1], k_rope[0, 0, 0])
    torch.testing.assert_close(k_cache[1, 0, 1], k_rope[1, 0, 0])
    torch.testing.assert_close(ckv_cache[1, 0, 0], c_kv[1, 0, 1])
    assert (k_cache[0, 0, 0] == 9).all() and (k_cache[1, 0, 2] == 9).all()


def test_nz_layout_is_the_documented_index_layout():
    # fp16 cache: d0 = 16; the row of slot s is at [s // bs, c, s % bs, :] of the [blocks, D/16, bs, 16] memory
    inp = make_inputs("PA_NZ", torch.float16, b=1, s=2, dn=32, dr=16, block_size=4, blocks=2, seed=8, skip=False)
    inp["index"] = torch.tensor([5, 2])
    k_cache, ckv_cache, k_rope, c_kv = run_op(inp, "PA_NZ")
    nzv = ckv_cache.view(2, 2, 4, 16)
    torch.testing.assert_close(nzv[1, :, 1, :].reshape(32), c_kv[0, 0, 0])
    torch.testing.assert_close(nzv[0, :, 2, :].reshape(32), c_kv[0, 0, 1])
    torch.testing.assert_close(k_cache.view(2, 1, 4, 16)[1, 0, 1], k_rope[0, 0, 0])


# ---- int8 caches -------------------------------------------------------------------------------------------------
def check_int8(name, ours, ref_q):
    """ours == the float64 quantisation, but for at most 0.1% of the values off by one (a scaled value next to a
    rounding boundary, where fp32 accumulation and float64 may round differently)."""
    assert ours.dtype == torch.int8
    diff = (ours.double() - ref_q).abs()
    assert diff.max() <= 1, f"{name}: int8 off by {diff.max().item()}"
    if (diff > 0).any():
        assert diff.count_nonzero() <= max(1, diff.numel() // 1000), f"{name}: {diff.count_nonzero()} mismatches"


@pytest.mark.parametrize("scale_shape", ["channel", "head", "tensor", "offset"])
@pytest.mark.parametrize("mode", ["PA_BNSD", "PA_NZ", "Norm", "PA_BLK_NZ"])
def test_int8_caches(mode, scale_shape):
    n = 2 if scale_shape == "head" and "NZ" not in mode else 1
    inp = make_inputs(mode, torch.bfloat16, n=n, s=6 if "BLK" in mode else 3, dn=64, dr=32, cache_dtype=torch.int8,
                      block_size=32 if "NZ" in mode else 4, seed=9)
    g = torch.Generator().manual_seed(10)
    dk, dv = 32, 64
    if scale_shape == "channel":
        ks, vs = torch.rand(dk, generator=g) * 20 + 1, torch.rand(1, dv, generator=g) * 20 + 1
    elif scale_shape == "head":
        ks, vs = torch.rand(n, dk, generator=g) * 20 + 1, torch.rand(n, dv, generator=g) * 20 + 1
    else:
        ks, vs = torch.tensor([12.5]), torch.tensor([30.0])
    ko = vo = None
    if scale_shape == "offset":
        ko, vo = torch.randn(dk, generator=g) * 3, torch.randn(dv, generator=g) * 3
    ours = run_op(inp, mode, k_rope_scale=ks, c_kv_scale=vs, k_rope_offset=ko, c_kv_offset=vo)
    ref, same = expected(inp, mode, torch.bfloat16, quant_k=(ks, ko), quant_v=(vs, vo))
    check_int8(f"{mode} k_cache", ours[0], ref[0])
    check_int8(f"{mode} ckv_cache", ours[1], ref[1])
    check_tolerance(f"{mode} int8 k_rope", ours[2], ref[2], same[2])
    check_tolerance(f"{mode} int8 c_kv", ours[3], ref[3], same[3])


def test_int8_saturates_and_rounds_half_to_even():
    inp = make_inputs("PA", torch.float32, b=1, s=1, dn=16, dr=16, cache_dtype=torch.int8, seed=12, skip=False)
    inp["index"] = torch.tensor([0])
    ks = torch.full((16,), 1000.0)
    ours = run_op(inp, "PA", k_rope_scale=ks, c_kv_scale=torch.tensor([1e4]))
    k = ours[2][0, 0, 0]
    want = torch.round(k.double() * 1000).clamp(-128, 127)
    assert torch.equal(ours[0].view(-1, 16)[0].double(), want)
    assert set(ours[1].view(-1, 16)[0].tolist()) <= {127, -128, 0}  # saturated
    # exact halves: a row whose rope part is [0.5, 1.5, 2.5, ...] * (1/scale) with cos = 1, sin = 0
    inp["kv"][..., 16:] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 4.5] * 2)
    inp["cos"].fill_(1.0)
    inp["sin"].fill_(0.0)
    ours = run_op(inp, "PA", k_rope_scale=torch.ones(16), c_kv_scale=torch.tensor([1.0]))
    q = torch.cat((inp["kv"][0, 0, 0, 16:][0::2], inp["kv"][0, 0, 0, 16:][1::2]))
    assert ours[0].view(-1, 16)[0].tolist() == torch.round(q).to(torch.int8).tolist()


def test_only_one_cache_quantised():
    inp = make_inputs("PA", torch.float16, seed=13, dn=32, dr=16)
    inp["k_cache"] = inp["k_cache"].to(torch.int8)
    ks = torch.rand(16) * 10 + 1
    ours = run_op(inp, "PA", k_rope_scale=ks)
    ref, same = expected(inp, "PA", torch.float16, quant_k=(ks, None))
    check_int8("k_cache", ours[0], ref[0])
    check_tolerance("fp16 ckv_cache", ours[1], ref[1], same[1])


# ---- the torch_npu wrappers --------------------------------------------------------------------------------------
def test_wrappers_v1_v2_functional():
    inp = make_inputs("PA_BNSD", torch.bfloat16, seed=14)
    args = [inp[k] for k in ("kv", "gamma", "cos", "sin", "index")]
    k1, c1 = inp["k_cache"].clone(), inp["ckv_cache"].clone()
    out1 = tot.npu_kv_rmsnorm_rope_cache(*args, k1, c1, cache_mode="PA_BNSD", is_output_kv=True)
    assert len(out1) == 4 and out1[0] is k1 and out1[1] is c1
    k2, c2 = inp["k_cache"].clone(), inp["ckv_cache"].clone()
    out2 = tot.npu_kv_rmsnorm_rope_cache_v2(*args, k2, c2, cache_mode="PA_BNSD", is_output_kv=True)
    assert len(out2) == 2
    k3, c3 = inp["k_cache"].clone(), inp["ckv_cache"].clone()
    out3 = tot.npu_kv_rmsnorm_rope_cache_v2_functional(*args, k3, c3, cache_mode="PA_BNSD", is_output_kv=True)
    assert len(out3) == 4
    assert torch.equal(k3, inp["k_cache"]) and torch.equal(c3, inp["ckv_cache"])  # inputs untouched
    for a, b in ((k1, k2), (k1, out3[2]), (c1, c2), (c1, out3[3]), (out1[2], out2[0]), (out1[3], out3[1])):
        assert torch.equal(a, b)
    ref, same = expected(inp, "PA_BNSD", torch.bfloat16)
    check_all("wrapper", out1, ref, same)


def test_wrapper_errors_name_the_function_and_are_runtime_errors():
    inp = make_inputs("PA", torch.float32, seed=15)
    args = [inp[k] for k in ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")]
    with pytest.raises(RuntimeError, match=r"npu_kv_rmsnorm_rope_cache: argument 'cache_mode' must be 'Norm'"):
        tot.npu_kv_rmsnorm_rope_cache(*args, cache_mode="BSND")
    with pytest.raises(ValueError, match=r"npu_kv_rmsnorm_rope_cache_v2: argument 'cache_mode'"):
        tot.npu_kv_rmsnorm_rope_cache_v2(*args, cache_mode="NZ")
    with pytest.raises(NotImplementedError, match=r"npu_kv_rmsnorm_rope_cache_v2: .*'k_cache_dtype' must be None"):
        tot.npu_kv_rmsnorm_rope_cache_v2(*args, cache_mode="PA", k_cache_dtype=34)
    with pytest.raises(NotImplementedError, match=r"_v2_functional: .*'ckv_cache_dtype' must be None"):
        tot.npu_kv_rmsnorm_rope_cache_v2_functional(*args, cache_mode="PA", ckv_cache_dtype=34)


# ---- torch.compile -----------------------------------------------------------------------------------------------
def test_torch_compile_fullgraph_mutates_caches():
    inp = make_inputs("PA_BNSD", torch.float32, seed=16)
    args = [inp[k] for k in ("kv", "gamma", "cos", "sin", "index")]

    def f(kv, gamma, cos, sin, index, k_cache, ckv_cache):
        _, _, k_rope, c_kv = tot.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                                           cache_mode="PA_BNSD", is_output_kv=True)
        return k_rope + 1, c_kv * 2

    torch._dynamo.reset()
    kc, vc = inp["k_cache"].clone(), inp["ckv_cache"].clone()
    out = torch.compile(f, fullgraph=True)(*args, kc, vc)
    ke, ve = inp["k_cache"].clone(), inp["ckv_cache"].clone()
    want = f(*args, ke, ve)
    assert torch.equal(kc, ke) and torch.equal(vc, ve) and not torch.equal(kc, inp["k_cache"])
    for a, b in zip(out, want):
        torch.testing.assert_close(a, b)


def test_torch_compile_fullgraph_v2_and_functional():
    inp = make_inputs("PA_NZ", torch.bfloat16, seed=18)
    args = [inp[k] for k in ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")]

    def functional(*a):
        return tot.npu_kv_rmsnorm_rope_cache_v2_functional(*a, cache_mode="PA_NZ")

    def in_place(*a):
        return tot.npu_kv_rmsnorm_rope_cache_v2(*a, cache_mode="PA_NZ")

    torch._dynamo.reset()
    got = torch.compile(functional, fullgraph=True)(*args)
    want = functional(*args)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(args[5], inp["k_cache"])  # the functional form leaves its inputs alone
    kc, vc = inp["k_cache"].clone(), inp["ckv_cache"].clone()
    torch.compile(in_place, fullgraph=True)(*args[:5], kc, vc)
    assert torch.equal(kc, want[2]) and torch.equal(vc, want[3])


# ---- bad inputs --------------------------------------------------------------------------------------------------
def _bad(mode="PA", **over):
    inp = make_inputs(mode, torch.float32, seed=17)
    kw = {k: over.pop(k) for k in list(over) if k in ("k_rope_scale", "c_kv_scale", "k_rope_offset", "c_kv_offset",
                                                       "epsilon", "v")}
    inp.update(over)
    args = [inp[k] for k in ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")]
    kw.setdefault("v", inp["v"])
    return lambda: OPS.kv_rms_norm_rope_cache(*args, cache_mode=mode, **kw)


BAD = {
    "kv_3d": (dict(kv=torch.randn(2, 3, 48)), ValueError, r"argument 'kv' must be 4-D \[B, N, S, D\]; got shape \[2, 3, 48\]"),
    "kv_int": (dict(kv=torch.ones(2, 1, 3, 48, dtype=torch.int32)), TypeError, r"argument 'kv' must be float32"),
    "d_split": (dict(gamma=torch.ones(40)), ValueError, r"kv's last dim D = 48 must be gamma's rms_size 40 \+ cos's rope_size 16"),
    "cos_dtype": (dict(cos=torch.ones(2, 1, 3, 16, dtype=torch.float16)), TypeError, r"argument 'cos' must have kv's dtype \(Float\); got Half"),
    "cos_odd": (dict(cos=torch.ones(2, 1, 3, 15), sin=torch.ones(2, 1, 3, 15), gamma=torch.ones(33)), ValueError, r"rope width cos.size\(-1\) must be even and positive; got 15"),
    "sin_shape": (dict(sin=torch.ones(2, 1, 1, 16)), ValueError, r"arguments 'sin' \[2, 1, 1, 16\] and 'cos' \[2, 1, 3, 16\] must have the same shape"),
    "cos_batch": (dict(cos=torch.ones(3, 1, 3, 16), sin=torch.ones(3, 1, 3, 16)), ValueError, r"argument 'cos' of shape \[3, 1, 3, 16\] must be \[B, N, S, rope_size\]"),
    "index_len": (dict(index=torch.arange(5)), ValueError, r"argument 'index' must hold B\*S = 6 entries \(shape \[6\]\) for cache_mode 'PA'; got shape \[5\]"),
    "index_float": (dict(index=torch.zeros(6)), TypeError, r"argument 'index' must be int64 \(or int32\); got Float"),
    "index_range": (dict(index=torch.tensor([0, 1, 2, 3, 4, 1000])), ValueError, r"index\[5\] = 1000 outside the cache slots \[0, blocks\*block_size = 16\)"),
    "index_dup": (dict(index=torch.tensor([0, 1, 2, 3, 4, 1])), ValueError, r"argument 'index' writes one cache slot twice \(slot 1\)"),
    "cache_shape": (dict(k_cache=torch.zeros(4, 4, 1, 8)), ValueError, r"argument 'k_cache' must be \[blocks, block_size, N, 16\]"),
    "cache_dtype": (dict(ckv_cache=torch.zeros(4, 4, 1, 32, dtype=torch.float16)), TypeError, r"argument 'ckv_cache' must have kv's dtype \(Float\), or be int8 with 'c_kv_scale' given; got Half"),
    "int8_no_scale": (dict(ckv_cache=torch.zeros(4, 4, 1, 32, dtype=torch.int8)), ValueError, r"argument 'ckv_cache' is int8, which needs the quantisation scale 'c_kv_scale'; got None"),
    "scale_not_int8": (dict(k_rope_scale=torch.ones(16)), TypeError, r"argument 'k_cache' must be int8 when 'k_rope_scale' is given"),
    "scale_shape": (dict(k_rope_scale=torch.ones(8), k_cache=torch.zeros(4, 4, 1, 16, dtype=torch.int8)), ValueError, r"argument 'k_rope_scale' must have shape \[16\], \[1, 16\], \[1, 16\] or \[1\]"),
    "scale_dtype": (dict(k_rope_scale=torch.ones(16, dtype=torch.float64), k_cache=torch.zeros(4, 4, 1, 16, dtype=torch.int8)), TypeError, r"argument 'k_rope_scale' must be float32; got Double"),
    "offset_alone": (dict(c_kv_offset=torch.ones(32)), ValueError, r"argument 'c_kv_offset' needs 'c_kv_scale'"),
    "epsilon": (dict(epsilon=-1.0), ValueError, r"argument 'epsilon' must be finite and >= 0; got -1"),
    "noncontig": (dict(k_cache=torch.zeros(4, 4, 2, 16)[:, :, :1]), ValueError, r"argument 'k_cache' is written in place and must be contiguous"),
    "v_shape": (dict(v=torch.ones(2, 1, 2, 8), gamma=torch.ones(48)), ValueError, r"argument 'v' must be 4-D \[B, N, S, Dv\] with kv's \[B, N, S\] = \[2, 1, 3\]; got shape \[2, 1, 2, 8\]"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_inputs(case):
    over, exc, msg = BAD[case]
    with pytest.raises(exc, match=r"kv_rms_norm_rope_cache: .*" + msg):
        _bad(**dict(over))()


def test_bad_mode_and_nz_rules():
    with pytest.raises(ValueError, match=r"argument 'cache_mode' must be 'Norm', 'PA', 'PA_BNSD', 'PA_NZ', "
                                         r"'PA_BLK_BNSD' or 'PA_BLK_NZ' \('PA_BSND' is an alias of 'PA'\); got 'BNSD'"):
        inp = make_inputs("PA", torch.float32)
        OPS.kv_rms_norm_rope_cache(*[inp[k] for k in ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")],
                                   cache_mode="BNSD")
    inp = make_inputs("PA_NZ", torch.float32, n=2)
    args = [inp[k] for k in ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")]
    with pytest.raises(NotImplementedError, match=r"cache_mode 'PA_NZ' with N = 2 heads: upstream defines the NZ "
                                                  r"layout for N = 1 only"):
        OPS.kv_rms_norm_rope_cache(*args, cache_mode="PA_NZ")
    inp = make_inputs("PA_NZ", torch.float16, dn=24, dr=16)  # fp16 chunk 16: 24 is not a multiple
    args = [inp[k] for k in ("kv", "gamma", "cos", "sin", "index", "k_cache", "ckv_cache")]
    with pytest.raises(ValueError, match=r"argument 'ckv_cache' row of 24 values must be a multiple of the NZ chunk "
                                         r"of 16 \(32 bytes of Half\)"):
        OPS.kv_rms_norm_rope_cache(*args, cache_mode="PA_NZ")
    inp = make_inputs("Norm", torch.float32)
    args = [inp[k] for k in ("kv", "gamma", "cos", "sin")] + [inp["index"].flatten(), inp["k_cache"],
                                                              inp["ckv_cache"]]
    with pytest.raises(ValueError, match=r"argument 'index' must be \[B, S\] = \[2, 3\] for cache_mode 'Norm'; got "
                                         r"shape \[6\]"):
        OPS.kv_rms_norm_rope_cache(*args, cache_mode="Norm")


# ---- how serving engines call it ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cache_mode", ["PA", "PA_NZ"])
def test_vllm_ascend_decode_call(cache_mode):
    """vLLM-Ascend's MLA decode: kv [B, 1, 1, 576] from kv_a_proj_with_mqa, cos/sin [B, 1, 1, 64], int64 slots with
    -1 padding, the (k_nope, k_pe) cache pair passed as kv_cache[1] (rope) and kv_cache[0] (latent); it reads the
    first two results (the caches)."""
    g = torch.Generator().manual_seed(20)
    b, blocks, bs = 3, 4, 128
    kv = torch.randn(b, 1, 1, 576, generator=g).to(torch.bfloat16)
    gamma = torch.rand(512, generator=g).to(torch.bfloat16) + 0.5
    ang = torch.rand(b, 1, 1, 64, generator=g, dtype=torch.float64) * 6
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
    kv_cache = (torch.zeros(blocks, bs, 1, 512, dtype=torch.bfloat16), torch.zeros(blocks, bs, 1, 64,
                                                                                     dtype=torch.bfloat16))
    slots = torch.tensor([130, -1, 7], dtype=torch.int32)
    k_pe, k_nope, _, _ = tot.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, slots.to(torch.int64), kv_cache[1],
                                                       kv_cache[0], epsilon=1e-6, cache_mode=cache_mode)
    assert k_pe is kv_cache[1] and k_nope is kv_cache[0]
    inp = dict(kv=kv, gamma=gamma, cos=cos, sin=sin, index=slots.to(torch.int64),
               k_cache=torch.zeros(blocks, bs, 1, 64, dtype=torch.bfloat16),
               ckv_cache=torch.zeros(blocks, bs, 1, 512, dtype=torch.bfloat16), v=None)
    ref, same = expected(inp, cache_mode, torch.bfloat16, eps=1e-6)
    check_tolerance("vllm-ascend k_pe cache", k_pe, ref[0], same[0])
    check_tolerance("vllm-ascend latent cache", k_nope, ref[1], same[1])


def test_token_major_call():
    """SGLang-style: the latent rows of T tokens viewed as [T, 1, 1, 576], cos/sin [T, 1, 1, 64], one slot per token,
    is_output_kv=True for the prefill's k_pe / kv_a."""
    g = torch.Generator().manual_seed(21)
    t = 5
    kv = torch.randn(t, 576, generator=g).to(torch.float16)
    ang = torch.rand(t, 1, 1, 64, generator=g, dtype=torch.float64)
    cos, sin = ang.cos().to(torch.float16), ang.sin().to(torch.float16)
    gamma = torch.rand(512, generator=g).to(torch.float16)
    k_cache, ckv_cache = torch.zeros(2, 16, 1, 64, dtype=torch.float16), torch.zeros(2, 16, 1, 512, dtype=torch.float16)
    slots = torch.tensor([3, 4, 5, 16, 17])
    _, _, k_pe, kv_a = tot.npu_kv_rmsnorm_rope_cache(kv.view(-1, 1, 1, 576), gamma, cos, sin, slots, k_cache,
                                                     ckv_cache, cache_mode="PA_BNSD", is_output_kv=True)
    k64, c64 = ref_rows(kv.view(-1, 1, 1, 576), gamma, cos, sin)
    kd, cd = ref_rows(kv.view(-1, 1, 1, 576), gamma, cos, sin, dtype=torch.float16)
    check_tolerance("k_pe", k_pe, k64, kd)
    check_tolerance("kv_a", kv_a, c64, cd)
    assert torch.equal(k_cache.view(-1, 64)[slots], k_pe.view(t, 64))
    assert torch.equal(ckv_cache.view(-1, 512)[slots], kv_a.view(t, 512))
