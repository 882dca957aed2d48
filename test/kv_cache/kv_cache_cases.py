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


OPCHECK_CASES = {
    "scatter_pa_kv_cache": {"bsnd": _scatter(False), "bsh": _scatter(True), "bnsd": _head_major(False)},
    "gather_pa_kv_cache": {"bsnd": _gather(False), "bsh": _gather(True), "bnsd": _head_major(True)},
}
