"""Checks of the simulated NPU, run in a child process by test_sim.py (renaming PrivateUse1 is per process and
permanent, so it must not happen inside the main test session).

`python -m test.npu.sim_worker cases` (from the repository root) enables the device, runs every `case_*` and prints
one JSON line {case: "ok" | traceback}. `python -m test.npu.sim_worker <scenario>` runs one of SCENARIOS and prints
"ok".
"""
import json
import os
import sys
import traceback

import torch


def _sim():
    import torch_ops_transformer as tot

    tot.npu_sim.enable()
    return tot


def case_to_device_and_back():
    x = torch.randn(3, 4)
    y = x.to("npu")
    assert y.device.type == "npu" and y.is_npu, y.device
    assert torch.equal(y.cpu(), x)
    z = x.npu()
    assert z.device == torch.device("npu:0")
    w = torch.empty(3, 4, device="npu").copy_(x)  # cpu -> npu copy into an existing tensor
    out = torch.empty(3, 4)
    out.copy_(w)  # npu -> cpu
    assert torch.equal(out, x)
    v = y.clone()  # npu -> npu
    assert v.device.type == "npu" and torch.equal(v.cpu(), x)


def case_views_alias():
    base = torch.zeros(4, 6, device="npu")
    view = base.view(2, 12)
    view[1].fill_(1.0)  # in-place on a view changes the base
    assert base.cpu()[2:].eq(1).all() and base.cpu()[:2].eq(0).all()
    t = base.t()
    t[0, 0] = 5.0
    assert base.cpu()[0, 0].item() == 5.0
    s = base.as_strided((2, 2), (6, 1), 1)
    s.add_(2.0)
    assert base.cpu()[0, 1].item() == 2.0 and base.cpu()[1, 2].item() == 2.0
    r = base.reshape(24)
    assert r.data_ptr() == base.data_ptr()
    sl = base[:, 1:3]
    sl.mul_(0)
    assert base.cpu()[:, 1:3].eq(0).all()


def case_printing():
    text = repr(torch.arange(6, dtype=torch.float32, device="npu").view(2, 3))
    assert "device='npu:0'" in text and "5." in text, text


def case_factory_and_arith_via_fallback():
    torch.manual_seed(0)
    a = torch.randn(5, 7, device="npu")
    torch.manual_seed(0)
    a_cpu = torch.randn(5, 7)
    assert a.device.type == "npu" and torch.equal(a.cpu(), a_cpu)
    b = (a * 2 + 1).softmax(-1) @ a.T
    assert b.device.type == "npu"
    torch.testing.assert_close(b.cpu(), (a_cpu * 2 + 1).softmax(-1) @ a_cpu.T, rtol=0, atol=0)


def _fa_inputs(device):
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 13, 4, 16, generator=g) for _ in range(3))
    return [t.to(device).requires_grad_() for t in (q, k, v)]


def case_flash_attention_autograd_equals_cpu():
    tot = _sim()
    results = {}
    for device in ("cpu", "npu"):
        q, k, v = _fa_inputs(device)
        out = tot.npu_fusion_attention(q, k, v, 4, "BSND", scale=0.25, sparse_mode=2,
                                       atten_mask=torch.ones(2048, 2048, dtype=torch.bool, device=device).triu(1))[0]
        assert out.device.type == device, (device, out.device)
        out.square().sum().backward()
        assert q.grad.device.type == device
        results[device] = [out.detach().cpu()] + [t.grad.cpu() for t in (q, k, v)]
    # Forward and backward are Ascend C kernels (their own summation orders): equal up to fp32 rounding.
    for name, a, b in zip(("out", "dq", "dk", "dv"), results["npu"], results["cpu"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: npu vs cpu: {m}")


def case_flash_attention_outputs_on_npu():
    q, k, v = (t.detach() for t in _fa_inputs("npu"))
    outs = torch.ops.npu_fa.flash_attention_score(q, k, v, 4, "BSND", scale=0.25)
    assert all(t.device.type == "npu" for t in outs), [t.device for t in outs]


def case_rotary_position_embedding():
    tot = _sim()
    g = torch.Generator().manual_seed(2)
    x, cos, sin = torch.randn(2, 5, 3, 8, generator=g), torch.randn(1, 5, 1, 8, generator=g), torch.randn(1, 5, 1, 8, generator=g)
    ref = tot.npu_rotary_position_embedding(x, cos, sin, 0)
    got = tot.npu_rotary_position_embedding(x.npu(), cos.npu(), sin.npu(), 0)
    # The Ascend C kernel rounds each product as the NPU's vector unit does; the CPU kernel's vector code may fuse
    # x * cos - x' * sin into one multiply-add: the two agree to fp32 rounding, not bit for bit.
    assert got.device.type == "npu" and torch.allclose(got.cpu(), ref, rtol=1e-6, atol=1e-6)


def case_incre_flash_attention():
    tot = _sim()
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(2, 1, 32, generator=g), torch.randn(2, 9, 16, generator=g), torch.randn(2, 9, 16, generator=g)
    kw = dict(num_heads=4, num_key_value_heads=2, scale_value=0.3, input_layout="BSH")
    ref = tot.npu_incre_flash_attention(q, k, v, **kw)
    got = tot.npu_incre_flash_attention(q.npu(), k.npu(), v.npu(), **kw)
    # The npu path runs the Ascend C decode kernel (docs/ascendc_inference.md): fp32 rounding differs.
    assert got.device.type == "npu" and torch.allclose(got.cpu(), ref, rtol=1e-5, atol=1e-5)


def case_dropout_with_host_seed():
    tot = _sim()
    outs = {}
    for device in ("cpu", "npu"):
        q, k, v = (t.detach() for t in _fa_inputs(device))
        torch.manual_seed(7)  # the seed/offset scalars are drawn on the host (0-dim CPU tensors next to npu ones)
        outs[device] = tot.npu_fusion_attention(q, k, v, 4, "BSND", keep_prob=0.8)[0].cpu()
    assert torch.equal(outs["npu"], outs["cpu"])


def case_in_place_op_mutates_npu_tensors():
    tot = _sim()
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 5, 3, 8, generator=g), torch.randn(2, 5, 3, 8, generator=g)
    cos, sin = torch.randn(1, 5, 1, 8, generator=g), torch.randn(1, 5, 1, 8, generator=g)
    q_cpu, k_cpu = q.clone(), k.clone()
    tot.npu_apply_rotary_pos_emb(q_cpu, k_cpu, cos, sin)
    q_npu, k_npu = q.npu(), k.npu()
    tot.npu_apply_rotary_pos_emb(q_npu, k_npu, cos.npu(), sin.npu())
    assert torch.equal(q_npu.cpu(), q_cpu) and torch.equal(k_npu.cpu(), k_cpu)


def case_tensor_list_op():
    tot = _sim()
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(3, 4, generator=g), torch.randn(5, 4, generator=g)]
    ws = [torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)]
    ref = tot.npu_grouped_matmul(xs, ws, group_type=-1)
    got = tot.npu_grouped_matmul([x.npu() for x in xs], [w.npu() for w in ws], group_type=-1)
    assert all(t.device.type == "npu" for t in got)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, ref))


def case_module_npu_and_rng_state():
    lin = torch.nn.Linear(4, 3).npu()
    assert lin.weight.device.type == "npu"
    lin(torch.randn(2, 4, device="npu")).sum().backward()
    assert lin.weight.grad.device.type == "npu"
    state = torch.npu.get_rng_state()
    first = torch.randn(3, device="npu").cpu()
    torch.npu.set_rng_state(state)
    assert torch.equal(torch.randn(3, device="npu").cpu(), first)


def case_paged_kv_cache_scatter_in_place():
    tot = _sim()
    caches = {}
    for device in ("cpu", "npu"):
        g = torch.Generator().manual_seed(6)
        cache = tot.PagedKVCache(8, 4, 2, 16, device=device)
        seqs = [cache.add_sequence(), cache.add_sequence()]
        for _ in range(6):  # crosses block boundaries; scatter_pa_kv_cache writes the npu cache in place
            cache.append(seqs, torch.randn(2, 2, 16, generator=g).to(device), torch.randn(2, 2, 16, generator=g).to(device))
        caches[device] = [t for t in vars(cache).values() if isinstance(t, torch.Tensor)]
    assert caches["npu"] and all(t.device.type == "npu" for t in caches["npu"])
    assert all(torch.equal(a.cpu(), b) for a, b in zip(caches["npu"], caches["cpu"]))


def case_mixed_devices_rejected():
    q, k, v = (t.detach() for t in _fa_inputs("npu"))
    try:
        torch.ops.npu_fa.flash_attention_score(q, k.cpu(), v, 4, "BSND")
    except ValueError as e:
        assert "argument 'key' must be on device npu:0" in str(e), str(e)
    else:
        raise AssertionError("a cpu key with an npu query was accepted")


def case_host_lengths_may_stay_on_the_cpu():
    """actual_seq_lengths is a host tensor of prompt_flash_attention (native_functions.yaml host_tensors): a CPU
    tensor next to npu inputs is accepted; a CPU mask (not a host tensor) is not."""
    _sim()
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 6, 32, generator=g) for _ in range(3))
    lens = torch.tensor([3, 6])
    kw = dict(actual_seq_lengths=lens, num_heads=2, scale_value=0.25, input_layout="BSH")
    ref = torch.ops.npu_fa.prompt_flash_attention(q, k, v, **kw)
    got = torch.ops.npu_fa.prompt_flash_attention(q.npu(), k.npu(), v.npu(), **kw)
    assert got.device.type == "npu"  # (the Ascend C kernel, per sequence: equal up to rounding)
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
    try:
        torch.ops.npu_fa.prompt_flash_attention(q.npu(), k.npu(), v.npu(), atten_mask=torch.ones(6, 6, dtype=torch.bool),
                                                sparse_mode=1, num_heads=2, input_layout="BSH")
    except ValueError as e:
        assert "argument 'atten_mask' must be on device npu:0" in str(e), str(e)
    else:
        raise AssertionError("a cpu atten_mask with npu inputs was accepted")


def case_sparse_flash_attention_trains_on_npu():
    """The forward runs the Ascend C kernel and the backward (no PrivateUse1 kernel) the CPU kernel through the
    simulated device, on a paged cache with host lengths: results on the npu and within fp32 rounding of the CPU's
    (the kernel sums in another order)."""
    tot = _sim()
    from test.sparse_attention.sfa_reference import make_inputs

    inp = make_inputs(layout_query="TND", layout_kv="PA_BSND", q_lens=[3, 2], kv_lens=[20, 9], seed=3)
    kw = inp["kwargs"]
    res = {}
    for device in ("cpu", "npu"):
        leaves = [t.detach().to(device).requires_grad_() for t in (inp["query"], inp["key"], kw["query_rope"],
                                                                   kw["key_rope"])]
        q, k, qr, kr = leaves
        out = tot.npu_sparse_flash_attention(q, k, k, inp["sparse_indices"].to(device), inp["scale_value"],
                                             **dict(kw, query_rope=qr, key_rope=kr,
                                                    block_table=kw["block_table"].to(device)))[0]
        out.square().sum().backward()
        res[device] = [out.detach()] + [t.grad for t in leaves]
    assert all(t.device.type == "npu" for t in res["npu"])
    for a, b in zip(res["npu"], res["cpu"]):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)


def case_enable_is_idempotent():
    tot = _sim()
    tot.npu_sim.enable()
    assert tot.npu_sim.is_enabled() and torch.npu.is_available() and torch.npu.device_count() == 1
    assert torch._C._dispatch_has_kernel_for_dispatch_key("npu_fa::flash_attention_score", "PrivateUse1")


def run_cases():
    _sim()
    results = {}
    for name, fn in sorted(globals().items()):
        if name.startswith("case_"):
            try:
                fn()
                results[name] = "ok"
            except Exception:  # reported to the parent test, which fails with the traceback
                results[name] = traceback.format_exc()
    print(json.dumps(results))


def scenario_refused_after_rename():
    torch.utils.rename_privateuse1_backend("other_accel")
    import torch_ops_transformer as tot

    try:
        tot.npu_sim.enable()
    except RuntimeError as e:
        assert "already renamed to 'other_accel'" in str(e), str(e)
        assert not tot.npu_sim.is_enabled()
    else:
        raise AssertionError("enable() did not refuse")


def scenario_refused_with_torch_npu():
    sys.modules["torch_npu"] = type(sys)("torch_npu")  # stands in for an imported real torch_npu
    import torch_ops_transformer as tot

    try:
        tot.npu_sim.enable()
    except RuntimeError as e:
        assert "torch_npu is installed" in str(e), str(e)
    else:
        raise AssertionError("enable() did not refuse")
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"


def scenario_environment_variable():
    assert os.environ.get("TOT_NPU_SIM") == "1"
    import torch_ops_transformer as tot

    assert tot.npu_sim.is_enabled()
    assert torch.ones(2, device="npu").add(1).cpu().tolist() == [2.0, 2.0]


def scenario_not_enabled():
    import torch_ops_transformer as tot

    assert not tot.npu_sim.is_enabled()
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"
    assert not hasattr(torch, "npu")
    # The extension is loaded, yet it registered nothing for PrivateUse1 beyond the YAML's own PrivateUse1 entries.
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert not has("npu_fa::dropout_gen_mask", "PrivateUse1")
    assert not has("aten::empty_strided", "PrivateUse1")
    assert has("npu_fa::all_gather_matmul", "PrivateUse1")  # MC2: declared PrivateUse1 in native_functions.yaml
    assert has("npu_fa::flash_attention_score", "PrivateUse1")  # the Ascend C kernel's glue


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}

if __name__ == "__main__":
    if sys.argv[1] == "cases":
        run_cases()
    else:
        SCENARIOS[sys.argv[1]]()
        print("ok")
