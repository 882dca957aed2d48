"""opcheck cases of the MC2 ops, run in-process inside a one-rank gloo group (the ops need a registered process
group; a one-rank group runs the real chunked pipeline with real functional collectives). The two-rank opcheck
(schema, autograd registration, fake tensors) runs in test/mc2/ops_worker.py."""
import torch
import torch.distributed as dist


def single_rank_group() -> str:
    """The name of this process's default group, creating a one-rank gloo group if none exists."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD.group_name


def _ag(bias, gather_output, chunks):
    def make():
        g = single_rank_group()
        b = torch.randn(5, requires_grad=True) if bias else None
        return (torch.randn(7, 6, requires_grad=True), torch.randn(6, 5, requires_grad=True), g, 1, b, 0,
                gather_output, chunks), {}
    return make


def _ag_grad(bias, gathered):
    def make():
        g = single_rank_group()
        x1 = torch.randn(7, 6)
        return (torch.randn(7, 5), x1, torch.randn(6, 5), x1.clone() if gathered else torch.empty(0, 6), g, 1,
                torch.randn(5) if bias else None, 2), {}
    return make


def _rs(bias, chunks):
    def make():
        b = torch.randn(5, requires_grad=True) if bias else None
        return (torch.randn(8, 6, requires_grad=True), torch.randn(6, 5, requires_grad=True), single_rank_group(), 1,
                b, chunks), {}
    return make


def _rs_grad(bias):
    def make():
        return (torch.randn(8, 5), torch.randn(8, 6), torch.randn(6, 5), single_rank_group(), 1,
                torch.randn(5) if bias else None, 3), {}
    return make


def _ar(shape, bias, chunks, x3=False):
    def make():
        b = torch.randn(5, requires_grad=True) if bias else None
        kwargs = {"x3": torch.randn(*shape, 5, requires_grad=True)} if x3 else {}
        return (torch.randn(*shape, 6, requires_grad=True), torch.randn(6, 5, requires_grad=True),
                single_rank_group(), b, chunks), kwargs
    return make


def _ar_grad(bias, x3=False):
    def make():
        kwargs = {"x3": torch.randn(2, 3, 5)} if x3 else {}
        return (torch.randn(2, 3, 5), torch.randn(2, 3, 6), torch.randn(6, 5), torch.randn(5) if bias else None), kwargs
    return make


def _rms(bias, x3=False):
    def make():
        kwargs = {"x3": torch.randn(2, 4, 5)} if x3 else {}
        return (torch.randn(2, 4, 6), torch.randn(6, 5), torch.randn(2, 4, 5), torch.randn(5), single_rank_group(),
                torch.randn(5) if bias else None, 1e-6, 3), kwargs
    return make


OPCHECK_CASES = {
    "all_gather_matmul": {"bias_gathered_3chunks": _ag(True, True, 3), "no_bias_auto": _ag(False, False, 0)},
    "all_gather_matmul_grad": {"bias_gathered": _ag_grad(True, True), "regather": _ag_grad(False, False)},
    "matmul_reduce_scatter": {"bias_2chunks": _rs(True, 2), "no_bias_auto": _rs(False, 0)},
    "matmul_reduce_scatter_grad": {"bias": _rs_grad(True), "no_bias": _rs_grad(False)},
    "matmul_all_reduce": {"bias_3d_2chunks": _ar((2, 3), True, 2), "no_bias_2d": _ar((7,), False, 0),
                          "x3_bias_3d_2chunks": _ar((2, 3), True, 2, x3=True)},
    "matmul_all_reduce_grad": {"bias": _ar_grad(True), "no_bias": _ar_grad(False), "x3": _ar_grad(True, x3=True)},
    "matmul_all_reduce_add_rms_norm": {"bias_3chunks": _rms(True), "no_bias": _rms(False),
                                       "x3_3chunks": _rms(True, x3=True)},
}
