"""npu_fused_infer_attention_score(_v2) with query_rope / key_rope (Multi-head Latent Attention).

Absorbed MLA (D = 512 latent, one KV head shared by every query head): out = softmax((q·cᵀ + q_rope·k_ropeᵀ)·scale)·v
against an independent float64 reference, for fp32 / bf16 / fp16, decode and prefill (sparse modes 0/2/3/4 with
pre/next tokens), contiguous and paged caches, every layout the wrappers take, the lse, 1 / 16 / 128 heads, value
the same tensor as key or another one. Small latent sizes (D = 64, rope 16) run the same kernel. The non-absorbed
case (D = 128 with rope parts, N2 = N1 or GQA) appends the rope parts to the heads. Bad inputs raise clear errors;
results do not depend on the thread count.

Tolerance rule: max|ours - ref64| <= 2 * max|torch_same_dtype - ref64| + 1e-5, where torch_same_dtype is the same
math in plain PyTorch in the input dtype.
"""
import math

import pytest
import torch

import torch_ops_transformer as tot

MAX = 2147483647
CAUSAL = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)


def visible(sq, skv, mode, pre, nxt):
    """[sq, skv] bool: which keys query row i sees (band aligned as the op's sparse modes)."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(skv)[None, :]
    diag = skv - sq
    if mode == 2:
        return j <= i
    if mode == 3:
        return j <= i + diag
    if mode == 4:
        return (j >= i + diag - pre) & (j <= i + diag + nxt)
    return torch.ones(sq, skv, dtype=torch.bool)


def reference(qn, qr, c, kr, v, q_lens, kv_lens, scale, mode=0, pre=MAX, nxt=MAX, dtype=torch.float64):
    """Per sequence: qn [B, Sq, N, D], qr [B, Sq, N, Dr], c [B, S, D], kr [B, S, Dr], v [B, S, Dv] ->
    out [B, Sq, N, Dv] and lse [B, N, Sq] (rows beyond q_lens and rows seeing no key: 0 and -inf)."""
    B, Sq, N, _ = qn.shape
    out = torch.zeros(B, Sq, N, v.shape[-1], dtype=dtype)
    lse = torch.full((B, N, Sq), -math.inf, dtype=torch.float64)
    for b in range(B):
        lq, lk = q_lens[b], kv_lens[b]
        if lq == 0:
            continue
        s = (torch.einsum("qnd,kd->nqk", qn[b, :lq].to(dtype), c[b, :lk].to(dtype))
             + torch.einsum("qnd,kd->nqk", qr[b, :lq].to(dtype), kr[b, :lk].to(dtype))) * scale
        vis = visible(lq, lk, mode, pre, nxt)
        s = s.masked_fill(~vis, -math.inf)
        seen = vis.any(-1)
        p = torch.where(seen[None, :, None], torch.softmax(s, -1), torch.zeros((), dtype=dtype))
        out[b, :lq] = torch.einsum("nqk,kd->qnd", p, v[b, :lk].to(dtype))
        lse[b, :, :lq] = torch.where(seen[None], torch.logsumexp(s, -1).double(),
                                     torch.tensor(-math.inf, dtype=torch.float64))
    return out, lse


def make(B, Sq, S, N, D, Dr, dtype, value_is_key=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    qn = torch.randn(B, Sq, N, D, generator=g).to(dtype)
    qr = torch.randn(B, Sq, N, Dr, generator=g).to(dtype)
    c = torch.randn(B, S, D, generator=g).to(dtype)
    kr = torch.randn(B, S, Dr, generator=g).to(dtype)
    v = c if value_is_key else torch.randn(B, S, D, generator=g).to(dtype)
    return qn, qr, c, kr, v


def paged(x, bs, table, num_blocks, form):
    """[B, S, X] -> a paged cache (NaN in blocks no key uses): form 'bsnd' (nb, bs, 1, X), 'bsh' (nb, bs, X),
    'bnsd' (nb, 1, bs, X)."""
    B, S, X = x.shape
    cache = torch.full((num_blocks, bs, X), math.nan, dtype=x.dtype)
    for b in range(B):
        for i in range(math.ceil(S / bs)):
            rows = x[b, i * bs:(i + 1) * bs]
            cache[table[b, i], :rows.shape[0]] = rows
    if form == "bsnd":
        return cache[:, :, None]
    if form == "bnsd":
        return cache[:, None]
    return cache


def table_for(B, S, bs, seed=0):
    per = math.ceil(S / bs)
    g = torch.Generator().manual_seed(seed + 1)
    perm = torch.randperm(B * per + 2, generator=g)[:B * per]
    return perm.view(B, per).to(torch.int32), B * per + 2


def call(layout, qn, qr, c, kr, v, q_lens, kv_lens, scale, *, paged_bs=0, mode=0, pre=MAX, nxt=MAX, lse=False,
         api="v1", num_kv_heads=1):
    """Lays the canonical tensors out for `layout`, calls the wrapper and returns (out [B, Sq, N, Dv], lse
    [B, N, Sq] or None) in canonical form."""
    B, Sq, N, D = qn.shape
    Dv = v.shape[-1]
    base = layout.split("_")[0]
    kw = dict(num_heads=N, num_key_value_heads=num_kv_heads, scale=scale, input_layout=layout, sparse_mode=mode,
              pre_tokens=pre, next_tokens=nxt, softmax_lse_flag=lse)
    if mode in (2, 3, 4):
        kw["atten_mask"] = CAUSAL
    if base in ("TND", "NTD"):
        q = torch.cat([qn[b, :q_lens[b]] for b in range(B)])
        q_r = torch.cat([qr[b, :q_lens[b]] for b in range(B)])
        if base == "NTD":
            q, q_r = q.transpose(0, 1), q_r.transpose(0, 1)
        kw["actual_seq_lengths"] = torch.tensor(q_lens).cumsum(0).tolist()
    elif base == "BSH":
        q, q_r = qn.flatten(2), qr.flatten(2)
    elif base == "BSND":
        q, q_r = qn, qr
    else:  # BNSD
        q, q_r = qn.transpose(1, 2), qr.transpose(1, 2)
    if paged_bs:
        table, nb = table_for(B, c.shape[1], paged_bs)
        form = {"BSH": "bsh", "BNSD": "bnsd"}.get(base, "bsnd")
        k_c = paged(c, paged_bs, table, nb, form)
        k_r = paged(kr, paged_bs, table, nb, form)
        v_c = k_c if v is c else paged(v, paged_bs, table, nb, form)
        kw.update(block_table=table, block_size=paged_bs, actual_seq_lengths_kv=list(kv_lens))
    else:
        if base in ("TND", "NTD"):
            k_c = torch.cat([c[b, :kv_lens[b]] for b in range(B)])[:, None]
            k_r = torch.cat([kr[b, :kv_lens[b]] for b in range(B)])[:, None]
            v_c = k_c if v is c else torch.cat([v[b, :kv_lens[b]] for b in range(B)])[:, None]
            if base == "NTD":
                k_c, k_r = k_c.transpose(0, 1), k_r.transpose(0, 1)
                v_c = k_c if v is c else v_c.transpose(0, 1)
            kw["actual_seq_lengths_kv"] = torch.tensor(kv_lens).cumsum(0).tolist()
        else:
            shape = {"BSH": lambda t: t, "BSND": lambda t: t[:, :, None], "BNSD": lambda t: t[:, None]}[base]
            k_c, k_r = shape(c), shape(kr)
            v_c = k_c if v is c else shape(v)
            kw["actual_seq_lengths_kv"] = list(kv_lens)
    if base not in ("TND", "NTD") and Sq > 1:
        kw["actual_seq_lengths"] = list(q_lens)
    if api == "v1":
        out, l = tot.npu_fused_infer_attention_score(q, k_c, v_c, query_rope=q_r, key_rope=k_r, **kw)
    else:
        ren = {"num_heads": "num_query_heads", "scale": "softmax_scale", "actual_seq_lengths": "actual_seq_qlen",
               "actual_seq_lengths_kv": "actual_seq_kvlen", "softmax_lse_flag": "return_softmax_lse"}
        out, l = tot.npu_fused_infer_attention_score_v2(q, k_c, v_c, query_rope=q_r, key_rope=k_r,
                                                        **{ren.get(k, k): x for k, x in kw.items()})
    # back to [B, Sq, N, Dv]
    out_form = layout.split("_")[-1] if "_" in layout else base
    if out_form in ("TND", "NTD"):
        if out_form == "NTD":
            out = out.transpose(0, 1)
        res = torch.zeros(B, Sq, N, Dv, dtype=out.dtype)
        ends = torch.tensor(q_lens).cumsum(0).tolist()
        for b in range(B):
            res[b, :q_lens[b]] = out[ends[b] - q_lens[b]:ends[b]]
        out = res
        if lse:
            lt = torch.full((B, N, Sq), -math.inf)
            for b in range(B):
                lt[b, :, :q_lens[b]] = l[ends[b] - q_lens[b]:ends[b], :, 0].T
            l = lt
    else:
        out = {"BSH": lambda o: o.view(B, Sq, N, Dv), "BSND": lambda o: o, "BNSD": lambda o: o.transpose(1, 2),
               "NBSD": lambda o: o.permute(1, 2, 0, 3)}[out_form](out)
        if lse:
            l = l[..., 0]
    return out, (l if lse else None)


def check(out, ref64, same_dtype, what=""):
    bound = 2 * (same_dtype.double() - ref64).abs().max().item() + 1e-5
    err = (out.double() - ref64).abs().max().item()
    assert err <= bound, f"{what}: max|ours - ref64| = {err:.3g} > {bound:.3g}"


def run_case(layout, dtype, B=2, Sq=1, S=300, N=16, D=512, Dr=64, q_lens=None, kv_lens=None, paged_bs=0, mode=0,
             pre=MAX, nxt=MAX, lse=False, value_is_key=True, api="v1"):
    qn, qr, c, kr, v = make(B, Sq, S, N, D, Dr, dtype, value_is_key)
    q_lens = q_lens or [Sq] * B
    kv_lens = kv_lens or [S] * B
    scale = 1 / math.sqrt(192)
    if Sq == 1 and layout.split("_")[0] not in ("TND", "NTD") and mode != 4:
        mode_ref = 0        # torch_npu: a one-token query ignores sparse modes 0-3
    else:
        mode_ref = mode
    out, l = call(layout, qn, qr, c, kr, v, q_lens, kv_lens, scale, paged_bs=paged_bs, mode=mode, pre=pre, nxt=nxt,
                  lse=lse, api=api)
    ref, ref_lse = reference(qn, qr, c, kr, v, q_lens, kv_lens, scale, mode_ref, pre, nxt)
    same, _ = reference(qn, qr, c, kr, v, q_lens, kv_lens, scale, mode_ref, pre, nxt, dtype=dtype)
    check(out, ref, same, f"{layout} {dtype}")
    assert out.dtype == dtype
    if lse:
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(l), fin)
        assert (l.double()[fin] - ref_lse[fin]).abs().max().item() <= 1e-3
    return out


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("paged_bs", [0, 128], ids=["contiguous", "paged"])
@pytest.mark.parametrize("layout", ["BSND", "BSH", "BNSD", "TND"])
def test_decode_absorbed(layout, paged_bs, dtype):
    run_case(layout, dtype, B=3, S=300, kv_lens=[300, 129, 1], q_lens=[1, 1, 1], paged_bs=paged_bs, lse=True)


@pytest.mark.parametrize("heads", [1, 16, 128])
def test_heads(heads):
    run_case("BSND", torch.bfloat16, B=2, S=260, N=heads, paged_bs=128, lse=True)


@pytest.mark.parametrize("layout", ["BSND_NBSD", "BSH_NBSD", "BNSD_NBSD", "TND_NTD", "NTD_TND", "NTD", "BNSD_BSND"])
def test_output_layouts(layout):
    paged_bs = 0 if layout.startswith("NTD") or layout == "BNSD_BSND" else 64
    run_case(layout, torch.float32, B=2, Sq=3, S=130, N=4, kv_lens=[130, 70], q_lens=[3, 2] if "T" in layout[:3]
             else None, paged_bs=paged_bs, mode=3, lse=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode,pre,nxt", [(0, MAX, MAX), (2, MAX, MAX), (3, MAX, MAX), (4, 40, 0), (4, 7, 3)])
@pytest.mark.parametrize("paged_bs", [0, 32], ids=["contiguous", "paged"])
def test_prefill_sparse_modes(mode, pre, nxt, paged_bs, dtype):
    run_case("TND", dtype, B=2, Sq=70, S=200, N=8, q_lens=[70, 33], kv_lens=[200, 33], paged_bs=paged_bs,
             mode=mode, pre=pre, nxt=nxt, lse=True)


@pytest.mark.parametrize("layout", ["BSND", "BSH", "BNSD"])
def test_prefill_dense_layouts_padded_rows(layout):
    # query rows beyond actual_seq_lengths are zeros with lse -inf
    run_case(layout, torch.float32, B=2, Sq=20, S=90, N=4, q_lens=[20, 9], kv_lens=[90, 40], paged_bs=16, mode=3,
             lse=True)


def test_value_other_tensor_and_v2():
    run_case("BSND", torch.float32, B=2, S=150, N=8, value_is_key=False, paged_bs=64, lse=True)
    run_case("TND", torch.bfloat16, B=2, Sq=5, S=150, N=8, q_lens=[5, 1], kv_lens=[150, 20], value_is_key=False,
             paged_bs=64, mode=3, api="v2", lse=True)


def test_small_latent_sizes():
    # kv_lora 64 / rope 16 (test-sized models) run the same kernel
    run_case("TND", torch.float32, B=2, Sq=6, S=100, N=4, D=64, Dr=16, q_lens=[6, 1], kv_lens=[50, 100],
             paged_bs=16, mode=3, lse=True)
    run_case("BSND", torch.bfloat16, B=2, S=100, N=4, D=64, Dr=16, paged_bs=16)


def test_long_context_split_and_thread_independence():
    # few sequences and a long context: the key axis is split (flash-decoding) and merged by LSE
    qn, qr, c, kr, v = make(1, 1, 4000, 16, 512, 64, torch.bfloat16)
    scale = 0.07
    prev = torch.get_num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(call("BSND", qn, qr, c, kr, v, [1], [4000], scale, paged_bs=128, lse=True))
    finally:
        torch.set_num_threads(prev)
    for o, l in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(l, outs[0][1])
    ref, _ = reference(qn, qr, c, kr, v, [1], [4000], scale)
    same, _ = reference(qn, qr, c, kr, v, [1], [4000], scale, dtype=torch.bfloat16)
    check(outs[0][0], ref, same)


def test_vllm_style_combined_cache_views():
    # one cache [blocks, bs, 576] holding latent | rope, passed as views (the row stride is 576)
    B, S, N, bs = 2, 100, 8, 16
    qn, qr, c, kr, v = make(B, 1, S, N, 512, 64, torch.float32)
    table, nb = table_for(B, S, bs)
    full = paged(torch.cat([c, kr], -1), bs, table, nb, "bsh")
    lat, rope = full[..., :512], full[..., 512:]
    out, _ = tot.npu_fused_infer_attention_score(qn, lat, lat, query_rope=qr, key_rope=rope, num_heads=N,
                                                 num_key_value_heads=1, scale=0.1, input_layout="BSND",
                                                 block_table=table, block_size=bs, actual_seq_lengths_kv=[S, 37])
    ref, _ = reference(qn, qr, c, kr, v, [1, 1], [S, 37], 0.1)
    same, _ = reference(qn, qr, c, kr, v, [1, 1], [S, 37], 0.1, dtype=torch.float32)
    check(out, ref, same)


# ---- the non-absorbed case: rope parts appended to each head (D = 128, N2 = N1 or GQA) ----

@pytest.mark.parametrize("n2", [4, 2])
@pytest.mark.parametrize("paged_bs", [0, 16], ids=["contiguous", "paged"])
def test_non_absorbed_rope_prefill(n2, paged_bs):
    g = torch.Generator().manual_seed(3)
    N, D, Dr, T, B = 4, 128, 64, 10, 2
    q_lens, kv_lens = [6, 4], [6, 4]
    q = torch.randn(T, N, D, generator=g)
    q_r = torch.randn(T, N, Dr, generator=g)
    k = torch.randn(T, n2, D, generator=g)
    k_r = torch.randn(T, n2, Dr, generator=g)
    v = torch.randn(T, n2, D, generator=g)
    kw = dict(num_heads=N, num_key_value_heads=n2, scale=0.08, input_layout="TND", sparse_mode=3,
              atten_mask=CAUSAL, actual_seq_lengths=[6, 10], softmax_lse_flag=True)
    if paged_bs:
        bs = paged_bs
        table = torch.tensor([[1], [0]], dtype=torch.int32)

        def pg(x):
            cache = torch.zeros(2, bs, n2, x.shape[-1])
            cache[1, :6], cache[0, :4] = x[:6], x[4 + 2:]
            return cache
        out, lse = tot.npu_fused_infer_attention_score(q, pg(k), pg(v), query_rope=q_r, key_rope=pg(k_r),
                                                       block_table=table, block_size=bs,
                                                       actual_seq_lengths_kv=kv_lens, **kw)
    else:
        out, lse = tot.npu_fused_infer_attention_score(q, k, v, query_rope=q_r, key_rope=k_r,
                                                       actual_seq_lengths_kv=[6, 10], **kw)
    ends = [0, 6, 10]
    for b in range(B):
        sl = slice(ends[b], ends[b + 1])
        rep = N // n2
        qq = torch.cat([q[sl], q_r[sl]], -1).double()
        kk = torch.cat([k[sl], k_r[sl]], -1).double().repeat_interleave(rep, 1)
        vv = v[sl].double().repeat_interleave(rep, 1)
        s = torch.einsum("qnd,knd->nqk", qq, kk) * 0.08
        L = s.shape[-1]
        s = s.masked_fill(~visible(L, L, 3, MAX, MAX), -math.inf)
        ref = torch.einsum("nqk,knd->qnd", s.softmax(-1), vv)
        assert (out[sl].double() - ref).abs().max().item() < 1e-5
        assert (lse[sl, :, 0].double() - s.logsumexp(-1).T).abs().max().item() < 1e-4


# ---- bad inputs ----

def _args(B=1, N=4, D=512, Dr=64, S=32):
    qn, qr, c, kr, _ = make(B, 1, S, N, D, Dr, torch.float32)
    return qn, qr, c[:, :, None], kr[:, :, None]


def test_rope_without_the_other():
    qn, qr, c, kr = _args()
    with pytest.raises(ValueError, match="'query_rope' and 'key_rope' must be given together"):
        tot.npu_fused_infer_attention_score(qn, c, c, query_rope=qr, num_heads=4, num_key_value_heads=1,
                                            input_layout="BSND")
    with pytest.raises(ValueError, match="got only 'key_rope'"):
        tot.npu_fused_infer_attention_score_v2(qn, c, c, key_rope=kr, num_query_heads=4, num_key_value_heads=1,
                                               input_layout="BSND")
    with pytest.raises(ValueError, match="must be given together"):
        torch.ops.npu_fa.fused_infer_attention_score(qn, c, c, num_heads=4, num_key_value_heads=1,
                                                     input_layout="BSND", query_rope=qr)


def test_wrong_rope_dims_and_shapes():
    qn, qr, c, kr = _args()
    with pytest.raises(ValueError, match="one rope head dim; got 64 and 32"):
        tot.npu_fused_infer_attention_score(qn, c, c, query_rope=qr, key_rope=kr[..., :32], num_heads=4,
                                            num_key_value_heads=1, input_layout="BSND")
    with pytest.raises(ValueError, match="rope head dim of 64; got 32"):
        tot.npu_fused_infer_attention_score(qn, c, c, query_rope=qr[..., :32], key_rope=kr[..., :32], num_heads=4,
                                            num_key_value_heads=1, input_layout="BSND")
    with pytest.raises(ValueError, match="'query_rope' must have the shape of 'query'"):
        tot.npu_fused_infer_attention_score(qn, c, c, query_rope=qr[:, :, :2], key_rope=kr, num_heads=4,
                                            num_key_value_heads=1, input_layout="BSND")
    with pytest.raises(ValueError, match="'key_rope' must have the shape of 'key'"):
        tot.npu_fused_infer_attention_score(qn, c, c, query_rope=qr, key_rope=kr[:, :5], num_heads=4,
                                            num_key_value_heads=1, input_layout="BSND")
    with pytest.raises(TypeError, match="'query_rope' must have the dtype of 'query'"):
        tot.npu_fused_infer_attention_score(qn, c, c, query_rope=qr.double(), key_rope=kr, num_heads=4,
                                            num_key_value_heads=1, input_layout="BSND")


def test_latent_needs_one_kv_head():
    qn, qr, c, kr = _args()
    c2 = c.expand(-1, -1, 2, -1)
    with pytest.raises(ValueError, match="num_key_value_heads must be 1; got 2"):
        tot.npu_fused_infer_attention_score(qn, c2, c2, query_rope=qr, key_rope=kr.expand(-1, -1, 2, -1),
                                            num_heads=4, num_key_value_heads=2, input_layout="BSND")


def test_int8_cache_with_rope_not_implemented():
    qn, qr, c, kr = _args()
    c8 = torch.zeros(c.shape, dtype=torch.int8)
    with pytest.raises(NotImplementedError, match="int8 key/value"):
        torch.ops.npu_fa.fused_infer_attention_score(qn.half(), c8, c8, query_rope=qr.half(), key_rope=kr.half(),
                                                     num_heads=4, num_key_value_heads=1, input_layout="BSND")


# ---- graph capture ----

def test_compile_paged_latent_decode(dynamo_reset):
    B, S, N, bs = 2, 64, 8, 16
    qn, qr, c, kr, v = make(B, 1, S, N, 64, 16, torch.float32)
    table, nb = table_for(B, S, bs)
    cache, rope = paged(c, bs, table, nb, "bsnd"), paged(kr, bs, table, nb, "bsnd")

    def f(q, q_r, kc, rc):
        return tot.npu_fused_infer_attention_score(q, kc, kc, query_rope=q_r, key_rope=rc, num_heads=N,
                                                   num_key_value_heads=1, scale=0.1, input_layout="BSND",
                                                   block_table=table, block_size=bs, actual_seq_lengths_kv=[S, 40],
                                                   softmax_lse_flag=True)

    eager = f(qn, qr, cache, rope)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)(qn, qr, cache, rope)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


def test_mask_and_pse_take_the_appended_path():
    # an explicit mask (sparse_mode 0) / pse_shift: rope parts appended to the heads, same answer as the reference
    B, Sq, S, N = 1, 3, 40, 4
    qn, qr, c, kr, v = make(B, Sq, S, N, 512, 64, torch.float32)
    mask = torch.zeros(B, 1, Sq, S, dtype=torch.bool)
    mask[..., 30:] = True
    out, _ = tot.npu_fused_infer_attention_score(qn, c[:, :, None], c[:, :, None], query_rope=qr,
                                                 key_rope=kr[:, :, None], atten_mask=mask, num_heads=N,
                                                 num_key_value_heads=1, scale=0.05, input_layout="BSND")
    ref, _ = reference(qn, qr, c[:, :30], kr[:, :30], v[:, :30], [Sq], [30], 0.05)
    assert (out.double() - ref).abs().max().item() < 1e-5


def test_paged_appended_path_reads_only_table_blocks():
    # a mask on a paged pool with NaN in the blocks the table does not use: the appended path copies only the
    # table's blocks, so the NaN never reaches the result
    B, Sq, S, N, bs = 2, 2, 48, 4, 16
    qn, qr, c, kr, v = make(B, Sq, S, N, 512, 64, torch.float32)
    table, nb = table_for(B, S, bs)
    cache, rope = paged(c, bs, table, nb, "bsnd"), paged(kr, bs, table, nb, "bsnd")
    mask = torch.zeros(B, 1, Sq, S, dtype=torch.bool)
    mask[0, ..., 40:] = True
    out, lse = tot.npu_fused_infer_attention_score(qn, cache, cache, query_rope=qr, key_rope=rope, atten_mask=mask,
                                                   num_heads=N, num_key_value_heads=1, scale=0.05,
                                                   input_layout="BSND", block_table=table, block_size=bs,
                                                   actual_seq_lengths_kv=[S, 30], softmax_lse_flag=True)
    for b, kv in ((0, 40), (1, 30)):
        ref, ref_lse = reference(qn[b:b + 1], qr[b:b + 1], c[b:b + 1], kr[b:b + 1], v[b:b + 1], [Sq], [kv], 0.05)
        assert (out[b:b + 1].double() - ref).abs().max().item() < 1e-5
        assert (lse[b:b + 1, ..., 0].double() - ref_lse).abs().max().item() < 1e-4
