"""fused_infer_attention_score on the simulated npu device decides its route as the CPU op does
(common/inference/fia_route.cpp) and takes learnable_sink itself: the npu op runs what its kernels handle and
refuses the rest by name (TOT_NPU_SIM_NO_FALLBACK=1, as a CANN build), or runs the CPU kernel on the same call.
The torch_npu wrapper has no device branch left: on npu tensors it calls the same op. Run by test_fia_route.py
through runner_worker.py (the device is already enabled here)."""
import pytest
import torch

from test.common.reference import check_tolerance
from test.inference import test_fia_routes as R
from test.npu.runner import no_fallback

NPU = "npu"


def _npu(x):
    return x.to(NPU) if isinstance(x, torch.Tensor) else x


def _on_npu(call: R.Call) -> R.Call:
    kw = {k: (v if k.startswith("actual_seq") else _npu(v)) for k, v in call.kwargs.items()}  # lengths: host
    return R.Call(tuple(_npu(t) for t in call.args), kw, call.ref, call.q_ends, call.kv_ends,
                  {k: _npu(v) for k, v in call.v2.items()})


def case_sink_is_refused_by_name_without_fallback():
    """No Ascend C kernel applies a sink: with fallbacks refused, each route's error names learnable_sink."""
    for route in ("dense_prefill", "paged_decode"):
        call = _on_npu(R.ROUTES[route]())
        with no_fallback(True), pytest.raises(RuntimeError, match="does not handle learnable_sink"):
            call.op(sink=R.SINK.to(NPU))


def case_every_route_with_sink_equals_the_cpu_op():
    """The routes the npu kernels cannot take run the CPU kernel on the same call: bit for bit the CPU op."""
    for route, build in R.ROUTES.items():
        call = build()
        for lse in (False, True):
            out, l = _on_npu(call).op(sink=R.SINK.to(NPU), lse=lse)
            cpu_out, cpu_l = call.op(sink=R.SINK, lse=lse)
            assert out.device.type == NPU, route
            assert torch.equal(out.cpu(), cpu_out) and torch.equal(l.cpu(), cpu_l), (route, lse)


def case_wrapper_on_npu_tensors_is_the_op():
    """The paged TND call the wrapper used to gather in Python on non-CPU devices: now the op's, on every device."""
    for route in ("paged_prefill", "paged_decode", "mla"):
        call = R.ROUTES[route]()
        npu = _on_npu(call)
        for lse in (False, True):
            out, l = npu.wrapper(sink=R.SINK.to(NPU), lse=lse)
            op_out, op_l = npu.op(sink=R.SINK.to(NPU), lse=lse)
            assert torch.equal(out.cpu(), op_out.cpu()) and torch.equal(l.cpu(), op_l.cpu()), (route, lse)


def case_tnd_decode_batch_runs_the_ascend_decode_kernel():
    """A TND batch of one token per sequence without a sink: the decode route, on the Ascend C decode kernel."""
    call = R.paged([1, 1, 1], [40, 5, 17])
    with no_fallback(True):
        out, lse = _on_npu(call).op()
    assert lse.numel() == 0
    ref, _ = call.reference(None)
    same, _ = call.reference(None, torch.float32)
    check_tolerance("tnd decode on npu", out.cpu(), ref, same)
