"""Inputs of mla_prolog for the tests and the opcheck cases: small random MLA weights (any sizes work; DeepSeek's
are He 7168, Hcq 1536, N 128, D 128, Dr 64, Hckv 512)."""
import torch

SIZES = dict(He=64, Hcq=48, N=4, D=16, Dr=16, Hckv=32)


def rope_tables(lead, dr, generator):
    """cos/sin of the interleaved rope: one angle per pair, laid out as [cos(a_0..a_{dr/2-1}) twice]."""
    angles = torch.rand(*lead, dr // 2, generator=generator) * 6.0
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


def make_inputs(lead=(5,), dtype=torch.float32, seed=0, He=64, Hcq=48, N=4, D=16, Dr=16, Hckv=32):
    """token_x [*lead, He] and the weights (scaled so activations stay O(1)), as a dict of the op's argument names."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    cos, sin = rope_tables(lead, Dr, g)
    return dict(token_x=r(*lead, He), weight_dq=r(He, Hcq, scale=He ** -0.5),
                weight_uq_qr=r(Hcq, N * (D + Dr), scale=Hcq ** -0.5), weight_uk=r(N, D, Hckv, scale=D ** -0.5),
                weight_dkv_kr=r(He, Hckv + Dr, scale=He ** -0.5), rmsnorm_gamma_cq=(1 + r(Hcq, scale=0.1)),
                rmsnorm_gamma_ckv=(1 + r(Hckv, scale=0.1)), rope_sin=sin.to(dtype), rope_cos=cos.to(dtype))


def positional(inputs, kv_cache, kr_cache):
    keys = ("token_x", "weight_dq", "weight_uq_qr", "weight_uk", "weight_dkv_kr", "rmsnorm_gamma_cq",
            "rmsnorm_gamma_ckv", "rope_sin", "rope_cos")
    return tuple(inputs[k] for k in keys) + (kv_cache, kr_cache)


def paged_caches(inputs, num_blocks=4, block_size=16, nkv=1, dtype=None, fill=0.5, seed=1):
    """kv/kr caches [num_blocks, block_size, nkv, Hckv|Dr] filled with random values (untouched rows are checked)."""
    g = torch.Generator().manual_seed(seed)
    dt = dtype or inputs["token_x"].dtype
    hckv, dr = inputs["weight_uk"].shape[2], inputs["rope_sin"].shape[-1]
    kv = (torch.randn(num_blocks, block_size, nkv, hckv, generator=g) * fill).to(dt)
    kr = (torch.randn(num_blocks, block_size, nkv, dr, generator=g) * fill).to(dt)
    return kv, kr


def _case(cache_mode, lead, **kw):
    def make():
        inputs = make_inputs(lead)
        t = 1
        for n in lead:
            t *= n
        if cache_mode in ("BSND", "TND"):
            kv, kr = paged_caches(inputs)
            kv = torch.zeros(*lead, 1, kv.shape[-1])
            kr = torch.zeros(*lead, 1, kr.shape[-1])
            index = None
        else:
            kv, kr = paged_caches(inputs)
            index = torch.randperm(kv.shape[0] * kv.shape[1], generator=torch.Generator().manual_seed(2))[:t]
            index = index.reshape(lead)
        return positional(inputs, kv, kr), dict(cache_index=index, cache_mode=cache_mode, **kw)
    return make


OPCHECK_CASES = {
    "mla_prolog": {
        "pa_bsnd_tnd": _case("PA_BSND", (5,), query_norm_flag=True),
        "pa_nz_bs": _case("PA_NZ", (2, 3), qc_qr_scale=0.5, kc_scale=2.0),
        "bsnd": _case("BSND", (2, 3)),
    },
}
