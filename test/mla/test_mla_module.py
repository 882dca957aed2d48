"""MLAAttention and MLALatentCache (torch_ops_transformer.mla) against an independent float64 reference of MLA in
its non-absorbed form (K and V decompressed per head, rope applied to interleaved pairs as complex rotations, a
causal softmax per sequence): a ragged TND prefill followed by BSND decode steps, with and without a q LoRA, fp32
and bf16 (tolerance rule: max|ours - ref64| <= 2 * max|ref in the same dtype - ref64| + 1e-5); the latent cache's
contents; BSND prefill = TND prefill; the block allocator (interleaved sequences, free and reuse, out of blocks
leaves everything unchanged); bad inputs."""
import pytest
import torch

from torch_ops_transformer.mla import MLAAttention, MLALatentCache

from test.common.reference import check_tolerance

H, N, R, D, DR, DV = 48, 4, 64, 16, 16, 24


def make_module(q_lora=32, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    m = MLAAttention(H, N, R, D, DR, DV, q_lora, scaling=0.19, q_norm_eps=1e-6, kv_norm_eps=1e-5, o_proj_bias=True)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * (0.3 if p.dim() >= 2 else 1.0) + (1.0 if p.dim() == 1 else 0.0))
    return m.to(dtype)


def rope_tables(positions, dim=None, base=100.0):
    """cos/sin in transformers' rotate-half form: cat(cos(p f), cos(p f)) [T, dim] (dim: DR)."""
    dim = dim or DR
    f = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = positions.double()[:, None] * f[None, :]
    return torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)


def pair_rope(x, positions, base=100.0):
    """Rope of interleaved pairs (x0, x1), (x2, x3), ..., pair i rotated in place by the angle position * f_i."""
    d = x.shape[-1]
    f = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.double()[:, None] * f[None]  # [T, d/2]
    ang = ang.reshape(ang.shape[0], *([1] * (x.dim() - 2)), d // 2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).reshape(x.shape)


def reference(m, x, positions, dtype=torch.float64):
    """Output [T, H] of one sequence's tokens x [T, H] at `positions`, each attending causally to the ones before,
    computed in `dtype` from the module's weights (decompressed K/V: no absorption)."""
    w = {k: v.detach().to(dtype) for k, v in m.state_dict().items()}
    x = x.to(dtype)

    def rms(t, g, eps):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * g

    if m.q_lora_rank is None:
        q = x @ w["weight_q"]
    else:
        q = rms(x @ w["weight_dq"], w["gamma_cq"], m.q_norm_eps) @ w["weight_uq_qr"]
    q = q.reshape(-1, N, D + DR)
    kv = x @ w["weight_dkv_kr"]
    c = rms(kv[:, :R], w["gamma_ckv"], m.kv_norm_eps)
    k_nope = torch.einsum("tr,ndr->tnd", c, w["weight_uk"])
    v = torch.einsum("tr,ndr->tnd", c, w["weight_uv"])
    k_rope = pair_rope(kv[:, R:], positions)
    q_rope = pair_rope(q[..., D:], positions)
    s = (torch.einsum("snd,tnd->nst", q[..., :D], k_nope) + torch.einsum("snd,td->nst", q_rope, k_rope)) * m.scaling
    causal = positions[None, :] > positions[:, None]
    p = s.masked_fill(causal, float("-inf")).softmax(-1)
    o = torch.einsum("nst,tnd->snd", p, v).reshape(-1, N * DV)
    return o @ w["o_proj.weight"].t() + w["o_proj.bias"]


def run_steps(m, xs, prompt_lens, decode_steps, block_size=4, num_blocks=40, dtype=torch.float32):
    """Prefill (TND, ragged) then `decode_steps` BSND steps; returns each sequence's outputs of all its tokens."""
    cache = MLALatentCache(num_blocks, block_size, R, DR, dtype=dtype)
    ids = [cache.add_sequence() for _ in xs]
    batch = cache.prepare(ids, prompt_lens)
    pos = torch.cat([torch.arange(n) for n in prompt_lens])
    cos, sin = rope_tables(pos)
    x = torch.cat([xi[:n] for xi, n in zip(xs, prompt_lens)])
    with torch.no_grad():
        y = m(x.to(dtype), cos.to(dtype), sin.to(dtype), cache, batch)
    outs = list(y.split(prompt_lens))
    for step in range(decode_steps):
        lens = [n + step for n in prompt_lens]
        batch = cache.prepare(ids, [1] * len(ids))
        cos, sin = rope_tables(torch.tensor(lens))
        x = torch.stack([xi[n:n + 1] for xi, n in zip(xs, lens)])  # [B, 1, H]
        with torch.no_grad():
            y = m(x.to(dtype), cos.to(dtype).reshape(-1, 1, DR), sin.to(dtype).reshape(-1, 1, DR), cache, batch)
        outs = [torch.cat([o, y[b]]) for b, o in enumerate(outs)]
    return outs, cache, ids


@pytest.mark.parametrize("q_lora", [32, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_and_decode_match_float64_reference(q_lora, dtype):
    m = make_module(q_lora, dtype)
    prompt_lens, steps = [5, 9, 2], 4
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(n + steps, H, generator=g).to(dtype) for n in prompt_lens]
    outs, _, _ = run_steps(m, xs, prompt_lens, steps, dtype=dtype)
    for x, out, n in zip(xs, outs, prompt_lens):
        pos = torch.arange(n + steps)
        ref64 = reference(m, x, pos)
        ref_lo = reference(m, x, pos, dtype)
        assert out.shape == ref64.shape
        check_tolerance(f"MLAAttention {dtype} q_lora={q_lora} seq of {n}", out, ref64, ref_lo)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepseek_head_sizes(dtype, monkeypatch):
    """DeepSeek-V3's per-head sizes (kv_lora_rank 512, rope 64, nope 128, v 128; upstream's absorbed-FIA sizes),
    2 heads, block size 16."""
    for name, value in dict(H=64, N=2, R=512, D=128, DR=64, DV=128).items():
        monkeypatch.setitem(globals(), name, value)
    m = make_module(48, dtype)
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(n + 3, H, generator=g).to(dtype) for n in (5, 19)]
    outs, _, _ = run_steps(m, xs, [5, 19], 3, block_size=16, dtype=dtype)
    for x, out, n in zip(xs, outs, (5, 19)):
        pos = torch.arange(n + 3)
        check_tolerance(f"MLAAttention DeepSeek sizes {dtype}", out, reference(m, x, pos), reference(m, x, pos, dtype))


def test_latent_cache_holds_normalised_latent_and_roped_key():
    m = make_module()
    prompt_lens = [6, 3]
    xs = [torch.randn(n, H) for n in prompt_lens]
    _, cache, ids = run_steps(m, xs, prompt_lens, 0)
    w = {k: v.detach().double() for k, v in m.state_dict().items()}
    table = cache.block_table(ids)
    for b, (x, n) in enumerate(zip(xs, prompt_lens)):
        kv = x.double() @ w["weight_dkv_kr"]
        c = kv[:, :R] * torch.rsqrt(kv[:, :R].pow(2).mean(-1, keepdim=True) + m.kv_norm_eps) * w["gamma_ckv"]
        p = torch.arange(n)
        slots = table[b, p // cache.block_size].long() * cache.block_size + p % cache.block_size
        got_c = cache.kv_cache().reshape(-1, R)[slots].double()
        got_r = cache.kr_cache().reshape(-1, DR)[slots].double()
        assert (got_c - c).abs().max() < 1e-4
        # The cached rope part is in de-interleaved order: [even rotated | odd rotated] of the pair rotation.
        kr = pair_rope(kv[:, R:], p)
        assert (got_r - torch.cat([kr[:, 0::2], kr[:, 1::2]], -1)).abs().max() < 1e-4


def test_bsnd_prefill_equals_tnd_prefill():
    m = make_module()
    x = torch.randn(2, 6, H)
    cos, sin = rope_tables(torch.arange(6).repeat(2))
    outs = []
    for tnd in (True, False):
        cache = MLALatentCache(8, 4, R, DR)
        ids = [cache.add_sequence() for _ in range(2)]
        batch = cache.prepare(ids, [6, 6])
        with torch.no_grad():
            if tnd:
                outs.append(m(x.reshape(12, H), cos, sin, cache, batch).reshape(2, 6, H))
            else:
                outs.append(m(x, cos.reshape(2, 6, DR), sin.reshape(2, 6, DR), cache, batch))
    assert torch.allclose(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_block_allocation_free_and_reuse():
    cache = MLALatentCache(num_blocks=4, block_size=2, kv_lora_rank=R, qk_rope_head_dim=DR, num_layers=3)
    a, b = cache.add_sequence(), cache.add_sequence()
    batch = cache.prepare([a, b], [3, 1])
    assert batch.slot_mapping.tolist() == [0, 1, 2, 4]  # a: blocks 0, 1; b: block 2 (low ids first)
    assert batch.block_table.tolist() == [[0, 1], [2, 0]] and batch.kv_lens == [3, 1]
    assert len(cache.kv_caches) == 3 and cache.kv_cache(2).shape == (4, 2, 1, R)
    assert cache.kr_cache(1).shape == (4, 2, 1, DR) and cache.num_free_blocks == 1
    with pytest.raises(RuntimeError, match="out of blocks"):
        cache.prepare([a, b], [2, 3])  # needs 3 blocks, 1 is free
    assert cache.seq_lens([a, b]).tolist() == [3, 1] and cache.num_free_blocks == 1
    cache.free(a)
    assert cache.num_free_blocks == 3
    c = cache.add_sequence()
    assert cache.prepare([c], [4]).block_table.tolist() == [[0, 1]]
    with pytest.raises(KeyError, match="unknown"):
        cache.prepare([a], [1])


def test_bad_inputs():
    m = make_module()
    cache = MLALatentCache(8, 4, R, DR)
    ids = [cache.add_sequence() for _ in range(2)]
    with pytest.raises(ValueError, match="q_lens"):
        cache.prepare(ids, [1])
    with pytest.raises(ValueError, match="seq_ids"):
        cache.prepare([ids[0], ids[0]], [1, 1])
    with pytest.raises(ValueError, match="q_lens"):
        cache.prepare(ids, [0, 1])
    with pytest.raises(ValueError, match="kv_lora_rank"):
        MLALatentCache(8, 4, 0, DR)
    with pytest.raises(NotImplementedError, match="dtype"):
        MLALatentCache(8, 4, R, DR, dtype=torch.int8)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        MLAAttention(H, N, R, D, 15, DV)
    batch = cache.prepare(ids, [3, 2])
    cos, sin = rope_tables(torch.arange(3))
    with pytest.raises(ValueError, match="TND"):  # a ragged batch laid out BSND
        m(torch.randn(2, 3, H), cos.repeat(2, 1), sin.repeat(2, 1), cache, batch)
    with pytest.raises(ValueError, match="sum\\(q_lens\\)"):
        m(torch.randn(4, H), cos, sin, cache, batch)
    with pytest.raises(ValueError, match="hidden_states"):
        m(torch.randn(5, 1, 1, H), cos, sin, cache, batch)


@pytest.mark.parametrize("q_lora", [32, None])
def test_runs_on_the_mla_ops(q_lora, monkeypatch):
    """Each step goes through the package's MLA ops: the prolog (or, without a q LoRA, interleave_rope and
    kv_rmsnorm_rope_cache) and the fused attention with the rope parts over the paged latent cache."""
    from torch_ops_transformer.mla import attention as mla

    calls = []

    def spy(name):
        fn = getattr(mla, name)

        def wrapped(*args, **kwargs):
            calls.append((name, kwargs))
            return fn(*args, **kwargs)
        monkeypatch.setattr(mla, name, wrapped)

    for name in ("npu_mla_prolog_v3", "npu_interleave_rope", "npu_kv_rmsnorm_rope_cache",
                 "npu_fused_infer_attention_score"):
        spy(name)
    m = make_module(q_lora)
    run_steps(m, [torch.randn(4, H), torch.randn(3, H)], [3, 2], 1)
    names = [c[0] for c in calls]
    expected = (["npu_mla_prolog_v3"] if q_lora else ["npu_interleave_rope", "npu_kv_rmsnorm_rope_cache"])
    assert names == (expected + ["npu_fused_infer_attention_score"]) * 2
    fia = [kw for n, kw in calls if n == "npu_fused_infer_attention_score"]
    assert [kw["input_layout"] for kw in fia] == ["TND", "BSND"] and [kw["sparse_mode"] for kw in fia] == [3, 0]
    assert all(kw["query_rope"] is not None and kw["key_rope"] is not None and kw["block_table"] is not None
               for kw in fia)
