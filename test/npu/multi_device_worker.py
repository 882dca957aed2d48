"""Several simulated npu devices (TOT_NPU_SIM_DEVICES=2), run by test_multi_device.py in one child process with that
environment: device count, the current device per thread, allocation per device, copies between devices, our ops
on npu:1, device-mismatch errors, autograd across devices.

`python -m test.npu.runner_worker test.npu.multi_device_worker` (with TOT_NPU_SIM_DEVICES=2 set) runs every case.
"""
import threading

import pytest
import torch

import torch_ops_transformer as tot



def _npu(index):
    return torch.device("npu", index)  # (only once the worker has enabled the device: "npu" is its name)


def _out_of_range(index, count=2):
    return f"device index {index} is out of range: the simulated NPU has {count} device\\(s\\)"


def case_device_count_comes_from_the_environment():
    assert torch.npu.is_available() and torch.npu.device_count() == 2
    assert torch.accelerator.device_count() == 2
    # Dynamo/Inductor's view of the device agrees (registered when Inductor first compiles for npu).
    from torch._dynamo.device_interface import get_interface_for_device

    tot.npu_sim.inductor.device_module_attr("Scheduling")
    assert get_interface_for_device("npu").device_count() == 2
    assert get_interface_for_device("npu:1") is get_interface_for_device("npu")


def case_set_device_and_current_device():
    assert torch.npu.current_device() == 0
    try:
        torch.npu.set_device(1)
        assert torch.npu.current_device() == 1 and torch.accelerator.current_device_index() == 1
        # "npu" without an index, .npu() and factories without a device use the current device
        assert torch.empty(2, device="npu").device == _npu(1)
        assert torch.ones(3).npu().device == _npu(1)
        assert torch.randn(2, 2, device="npu").device == _npu(1)
        torch.npu.set_device("npu:0")
        assert torch.npu.current_device() == 0
        torch.npu.set_device(torch.device("npu", 1))
        assert torch.npu.current_device() == 1
        torch.npu.set_device(-1)  # unchanged, as torch.cuda.set_device(-1)
        assert torch.npu.current_device() == 1
    finally:
        torch.npu.set_device(0)
    assert torch.npu.current_device() == 0


def case_device_context_manager_restores():
    with torch.npu.device(1):
        assert torch.npu.current_device() == 1 and torch.zeros(1, device="npu").device == _npu(1)
        with torch.npu.device("npu:0"):
            assert torch.npu.current_device() == 0
        assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0
    with torch.npu.device(None):
        assert torch.npu.current_device() == 0
    x1 = torch.zeros(2, device="npu:1")
    with torch.npu.device_of(x1):
        assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0
    with torch.npu.stream(torch.npu.Stream(device=1)):  # as torch.cuda.stream: the stream's device is current
        assert torch.npu.current_device() == 1
    assert torch.npu.current_device() == 0
    assert torch.npu.current_stream(1).device == _npu(1) and torch.npu.current_stream().device == _npu(0)
    assert torch.npu.current_stream(1) != torch.npu.current_stream(0)


def case_current_device_is_per_thread():
    seen = {}

    def other():
        seen["start"] = torch.npu.current_device()
        torch.npu.set_device(1)
        seen["tensor"] = torch.empty(1, device="npu").device

    torch.npu.set_device(0)
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == {"start": 0, "tensor": _npu(1)}, seen
    assert torch.npu.current_device() == 0  # the other thread's choice is its own


def case_out_of_range_device_is_refused():
    with pytest.raises(ValueError, match="torch.npu.set_device: argument 'device': " + _out_of_range(2) + r" \(npu:0 to npu:1"):
        torch.npu.set_device(2)
    with pytest.raises(ValueError, match=_out_of_range(5)):
        torch.npu.set_device("npu:5")
    with pytest.raises(ValueError, match=_out_of_range(2)):
        torch.empty(3, device="npu:2")
    with pytest.raises(ValueError, match=_out_of_range(3)):
        torch.randn(3).to("npu:3")
    with pytest.raises(ValueError, match=_out_of_range(2)):
        torch.npu.device(2)
    with pytest.raises(ValueError, match=_out_of_range(2)):
        torch.npu.get_device_properties(2)
    with pytest.raises(ValueError, match="argument 'device' must be an npu device; got cpu"):
        torch.npu.set_device("cpu")
    assert torch.npu.current_device() == 0


def case_allocation_per_device():
    for index in (0, 1):
        dev = torch.device("npu", index)
        tensors = [torch.empty(2, 3, device=dev), torch.empty_strided((2, 3), (1, 2), device=dev),
                   torch.zeros(4, device=dev), torch.arange(5, device=dev), torch.randn(2, 2, device=dev),
                   torch.randn(3).npu(index), torch.randn(3).to(f"npu:{index}")]
        for t in tensors:
            assert t.device == dev and t.untyped_storage().device == dev, (index, t.device)
        x = tensors[0]
        # an aten op through the CPU fallback, a view, an in-place op, resize (new memory): all stay on the device
        assert (x + 1).device == dev and x.t().device == dev and x.add_(1).device == dev
        r = torch.empty(0, device=dev)
        r.resize_(10)
        assert r.device == dev and r.untyped_storage().device == dev
    assert torch.npu.get_device_properties(1).uuid != torch.npu.get_device_properties(0).uuid
    assert torch.npu.current_device() == 0  # the factories' device guards restored it


def case_cross_device_copy_round_trip_is_exact():
    g = torch.Generator().manual_seed(11)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool):
        x = (torch.randn(5, 7, generator=g) * 100).to(dtype)
        if dtype.is_floating_point:
            x[0, 0], x[1, 1] = float("nan"), float("-inf")
        a = x.to("npu:0")
        b = a.to("npu:1")
        c = b.to("npu:0")
        assert (a.device, b.device, c.device) == (_npu(0), _npu(1), _npu(0))
        assert b.data_ptr() != a.data_ptr()  # a copy, not an alias
        assert torch.equal(c.cpu().view(torch.uint8), x.view(torch.uint8)), dtype  # bit for bit
    # non-contiguous source, and copy_ into an existing tensor of the other device with a dtype change
    a = torch.arange(24, dtype=torch.float32, device="npu:0").view(4, 6)
    b = a[:, ::2].to("npu:1")
    assert b.device == _npu(1) and torch.equal(b.cpu(), torch.arange(24.0).view(4, 6)[:, ::2])
    y = torch.zeros(6, dtype=torch.int64, device="npu:1")
    y[::2].copy_(torch.tensor([1.5, 2.5, 3.5, 4.5, 5.5, 6.5], device="npu:0")[::2])
    assert y.device == _npu(1) and y.cpu().tolist() == [1, 0, 3, 0, 5, 0]


def _fa_inputs(device, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 13, 4, 16, generator=g).to(device).requires_grad_() for _ in range(3)]


def case_flash_attention_on_npu1_equals_cpu():
    mask = torch.ones(2048, 2048, dtype=torch.bool).triu(1)
    results = {}
    for device in ("cpu", "npu:1"):
        q, k, v = _fa_inputs(device)
        outs = tot.npu_fusion_attention(q, k, v, 4, "BSND", scale=0.25, sparse_mode=2, atten_mask=mask.to(device))
        assert all(t.device == torch.device(device) for t in outs if isinstance(t, torch.Tensor)), outs
        outs[0].square().sum().backward()
        assert all(t.grad.device == torch.device(device) for t in (q, k, v))
        results[device] = [outs[0].detach().cpu()] + [t.grad.cpu() for t in (q, k, v)]
    # the Ascend C forward and backward kernels on the npu side: equal up to fp32 rounding (test_sim.py's bound)
    for name, a, b in zip(("out", "dq", "dk", "dv"), results["npu:1"], results["cpu"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: npu:1 vs cpu: {m}")
    assert torch.npu.current_device() == 0  # the op's device guard restored the caller's device


def case_cpu_kernel_op_on_npu1_is_bitwise_cpu():
    """rms_norm runs its CPU kernel on CPU aliases (no Ascend C kernel): results on the inputs' device, bit for bit;
    also while the current device is the other one."""
    g = torch.Generator().manual_seed(3)
    x, gamma = torch.randn(4, 32, generator=g), torch.randn(32, generator=g)
    ref = tot.npu_rms_norm(x, gamma)
    for current, device in ((0, "npu:1"), (1, "npu:0"), (1, "npu:1")):
        with torch.npu.device(current):
            got = tot.npu_rms_norm(x.to(device), gamma.to(device))
            assert torch.npu.current_device() == current
        for a, b in zip(got, ref):
            assert a.device == torch.device(device) and torch.equal(a.cpu(), b), (current, device)


def case_mixed_devices_in_our_ops_are_refused():
    q, k, v = (t.detach() for t in _fa_inputs("npu:0"))
    # an op with an npu kernel: its generated wrapper's device rule
    with pytest.raises(ValueError, match="argument 'key' must be on device npu:0 like .*got a tensor on device npu:1"):
        torch.ops.npu_fa.flash_attention_score(q, k.to("npu:1"), v, 4, "BSND")
    # an op served by its CPU kernel on the simulated device: the same rule
    x, gamma = torch.randn(4, 32, device="npu:1"), torch.randn(32, device="npu:0")
    with pytest.raises(ValueError, match="argument 'gamma' must be on device npu:1 .*got a tensor on device npu:0"):
        torch.ops.npu_fa.rms_norm(x, gamma)
    # the public wrapper says the same before the op runs
    with pytest.raises(ValueError, match="gamma.*must be on device npu:1"):
        tot.npu_rms_norm(x, gamma)


def case_mixed_devices_in_aten_ops_are_refused():
    """Aten ops go through the CPU fallback, which would copy both to the host silently; like a real device they
    raise PyTorch's message (the one torch_npu's multi-NPU device-check tests expect)."""
    a, b = torch.randn(3, device="npu:0"), torch.randn(3, device="npu:1")
    msg = "Expected all tensors to be on the same device, but found at least two devices, npu:0 and npu:1"
    with pytest.raises(RuntimeError, match=msg):
        torch.add(a, b)
    with pytest.raises(RuntimeError, match=msg):
        torch.acosh(a, out=b)
    with pytest.raises(RuntimeError, match="found at least two devices, npu:0 and npu:1"):
        torch.nn.functional.embedding(torch.tensor([1, 2], device="npu:1"), torch.randn(5, 3, device="npu:0"))
    assert torch.equal((a + b.to("npu:0")).cpu(), a.cpu() + b.cpu())  # after an explicit copy it runs
    assert torch.equal((a + torch.tensor(2.0)).cpu(), a.cpu() + 2)  # a 0-dim CPU tensor is a scalar, as on CUDA


def case_autograd_across_devices():
    """torch_npu's multi-NPU broadcast test, small: a product on npu:1, summed on npu:0; gradients on npu:1 (the
    autograd engine's worker for npu:1 runs with that device current)."""
    a = torch.full((64,), 2.0, device="npu:1", dtype=torch.float64, requires_grad=True)
    b = torch.full((64,), 3.0, device="npu:1", dtype=torch.float64, requires_grad=True)
    s = (a * b).to("npu:0").sum()
    torch.npu.synchronize(_npu(0))
    torch.npu.synchronize(_npu(1))
    s.backward()
    assert s.device == _npu(0) and a.grad.device == _npu(1) and b.grad.device == _npu(1)
    assert a.grad.cpu().eq(3.0).all() and b.grad.cpu().eq(2.0).all()


def case_multi_npu_test_helper_runs_with_two_devices():
    """torch_npu.testing's skipIfUnsupportMultiNPU (the shim's): runs a test asking for 2 NPUs, skips one asking
    for 8."""
    import unittest

    from torch_ops_transformer.compat import testing

    assert testing.skipIfUnsupportMultiNPU(2)(lambda: "ran")() == "ran"
    with pytest.raises(unittest.SkipTest, match="needs 8 NPUs; the simulated npu device has 2"):
        testing.skipIfUnsupportMultiNPU(8)(lambda: "ran")()
    with torch.npu.device(1):
        assert testing.get_npu_device() == "npu:1"


def _send_and_exit(queue):
    tot.npu_sim.enable()  # what `import torch_npu` does in a rank process of torch_npu's tests
    queue.put(torch.arange(6.0).npu().cpu())  # the host tensor a rank hands back, then the process ends at once


def case_a_tensor_sent_by_an_exited_process_can_still_be_read():
    """torch_npu's multi-NPU tests read their ranks' results after the rank processes may have exited."""
    import time

    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_send_and_exit, args=(queue,))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    time.sleep(0.2)
    assert torch.equal(queue.get(timeout=60), torch.arange(6.0))
