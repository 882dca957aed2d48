"""opcheck cases of the paged KV cache helpers."""
import torch


def _scatter(flat):
    def make():
        nb, bs, n2, d = 4, 16, 2, 8
        shape = (nb, bs, n2 * d) if flat else (nb, bs, n2, d)
        slots = torch.tensor([17, -1, 3, 63])
        return (torch.randn(4, n2, d), torch.randn(4, n2, d), torch.zeros(shape), torch.zeros(shape), slots), {}
    return make


def _gather(flat):
    def make():
        nb, bs, n2, d = 4, 16, 2, 8
        shape = (nb, bs, n2 * d) if flat else (nb, bs, n2, d)
        table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
        return (torch.randn(shape), torch.randn(shape), table, torch.tensor([20, 5])), {}
    return make


def _head_major(gather):
    def make():
        nb, bs, n2, d = 4, 16, 2, 8
        if gather:
            table = torch.tensor([[2, 0], [3, 1]], dtype=torch.int32)
            args = (torch.randn(nb, n2, bs, d), torch.randn(nb, n2, bs, d), table, torch.tensor([20, 5]))
        else:
            slots = torch.tensor([17, -1, 3, 63])
            args = (torch.randn(4, n2, d), torch.randn(4, n2, d), torch.zeros(nb, n2, bs, d), torch.zeros(nb, n2, bs, d),
                    slots)
        return args, {"cache_layout": "BNSD"}
    return make


def _kv_rms(mode, with_v=False, int8=False):
    """kv_rms_norm_rope_cache over a small MLA row (rms 32 + rope 8, or k 24 + v 16 with `v`)."""
    def make():
        b, s, nb, bs = 2, 3, 4, 4
        d, dr = (24, 8) if with_v else (40, 8)
        dk, dv = (24, 16) if with_v else (8, 32)
        kv = torch.randn(b, 1, s, d)
        gamma = torch.randn(d if with_v else 32)
        cos, sin = torch.randn(b, 1, s, dr), torch.randn(b, 1, s, dr)
        cdt = torch.int8 if int8 else torch.float32
        if mode == "Norm":
            index = torch.tensor([[0, 2, -1], [3, 1, 0]])
            kc, vc = torch.zeros(b, 1, 5, dk, dtype=cdt), torch.zeros(b, 1, 5, dv, dtype=cdt)
        else:
            index = torch.tensor([0, 4] if "BLK" in mode else [5, 0, -1, 9, 14, 2])
            kc, vc = torch.zeros(nb, bs, 1, dk, dtype=cdt), torch.zeros(nb, bs, 1, dv, dtype=cdt)
        kw = {"cache_mode": mode}
        if with_v:
            kw["v"] = torch.randn(b, 1, s, dv)
        if int8:
            kw.update(k_rope_scale=torch.rand(dk) + 0.5, c_kv_scale=torch.rand(1, dv) + 0.5,
                      c_kv_offset=torch.randn(dv))
        return (kv, gamma, cos, sin, index, kc, vc), kw
    return make


OPCHECK_CASES = {
    "scatter_pa_kv_cache": {"bsnd": _scatter(False), "bsh": _scatter(True), "bnsd": _head_major(False)},
    "gather_pa_kv_cache": {"bsnd": _gather(False), "bsh": _gather(True), "bnsd": _head_major(True)},
    "kv_rms_norm_rope_cache": {
        "norm": _kv_rms("Norm"), "pa": _kv_rms("PA_BNSD"), "pa_nz": _kv_rms("PA_NZ"),
        "pa_blk": _kv_rms("PA_BLK_BNSD"), "with_v_int8": _kv_rms("PA", with_v=True, int8=True),
    },
}


# torch_npu's npu_gather_pa_kv_cache (into the caller's key/value) and npu_scatter_nd_update_
def _gather_into(cumsum, offset):
    def make():
        kc, vc = torch.randn(4, 4, 2, 8), torch.randn(4, 4, 2, 4)  # K and V of different widths
        lens = torch.tensor([0, 5, 7]) if cumsum else torch.tensor([5, 2], dtype=torch.int32)
        table = torch.tensor([[2, 0, 3], [1, 3, 0]], dtype=torch.int32)
        off = torch.tensor([4, 0]) if offset else None
        return (kc, vc, table, lens, torch.zeros(7, 2, 8), torch.zeros(7, 2, 4), off, cumsum), {}
    return make


def _scatter_nd(k):
    def make():
        var = torch.randn(6, 3, 4)
        idx = torch.tensor([[5, 2], [0, 1], [3, 0]]) if k == 2 else torch.tensor([[4], [1]], dtype=torch.int32)
        upd = torch.randn(3, 4) if k == 2 else torch.randn(2, 3, 4)
        return (var, idx, upd), {}
    return make


OPCHECK_CASES.update({
    "gather_pa_kv_cache_into": {"lens": _gather_into(False, False), "cumsum_offset": _gather_into(True, True)},
    "scatter_nd_update": {"rows": _scatter_nd(1), "elements": _scatter_nd(2)},
})
