"""The torch_npu shim (torch_ops_transformer.compat). Installing it is permanent for a process (it enables the
simulated npu device), so every install runs in a child process."""
import os
import subprocess
import sys
import textwrap

import pytest

from test.common.checkout import ROOT, pythonpath
from torch_ops_transformer import compat
from torch_ops_transformer._internal import args as _args


def _run(code: str, *, shim_on_path: bool = True, extra_path=(), args=()):
    env = {k: v for k, v in os.environ.items() if k != "TOT_NPU_SIM"}
    parts = ([str(compat.PYTHONPATH_DIR)] if shim_on_path else []) + list(extra_path) + [pythonpath()]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    proc = subprocess.run([sys.executable, *args] if args else [sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_module_holds_every_implemented_function_and_stubs_for_the_rest():
    shim = compat.module()
    assert compat.is_shim(shim) and not compat.installed()
    for name, fn in _args.TORCH_NPU_API.items():
        assert getattr(shim, name) is fn
    missing = compat.upstream_functions()["not_implemented"]
    assert "npu_add_layer_norm" in missing
    for name in missing:
        with pytest.raises(NotImplementedError, match=f"torch_npu.{name} is not implemented"):
            getattr(shim, name)()
    with pytest.raises(AttributeError):
        shim.npu_no_such_function  # noqa: B018  (not an upstream name either)
    assert shim.npu.is_available() is False  # no simulated device in this process
    # torch_npu's constants of its own dtypes (integer codes), which code and tests name
    assert (shim.hifloat8, shim.float8_e8m0fnu, shim.float4_e2m1fn_x2, shim.float4_e1m2fn_x2) == (290, 293, 296, 297)


def test_argument_error_is_both_conventions():
    shim = compat.module()
    with pytest.raises(RuntimeError, match="rotary_mode"):
        shim.npu_rotary_mul(*[__import__("torch").randn(1, 2, 1, 8)] * 3, rotary_mode="bogus")
    assert issubclass(_args.ArgumentError, ValueError) and issubclass(_args.ArgumentError, RuntimeError)


def test_import_torch_npu_through_pythonpath():
    out = _run("""
        import torch, torch_npu
        from torch_ops_transformer import compat
        assert compat.installed() and torch_npu.npu is torch.npu
        assert torch.npu.is_available() and torch.npu.device_count() == 1 and torch.npu.current_device() == 0
        torch.npu.set_device(0)
        x = torch.randn(1, 8, 2, 16).npu()
        y = torch.ones(2, device="npu")
        assert x.is_npu and y.device.type == "npu"
        out = torch_npu.npu_fusion_attention(x, x, x, 2, "BSND", scale=0.25)[0]
        assert out.device.type == "npu"
        s = torch.npu.Stream()
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        with torch.npu.stream(s):
            start.record(); (x * 2).sum(); end.record()
        torch.npu.synchronize(); s.synchronize(); end.synchronize()
        assert start.elapsed_time(end) >= 0 and torch.npu.current_stream() == torch.npu.default_stream()
        import torch_npu.npu
        for name in ("NPUGraph", "graph"):
            try:
                getattr(torch.npu, name)()
                raise AssertionError(name)
            except NotImplementedError as e:
                assert "not simulated" in str(e)
        try:
            torch_npu.npu_add_layer_norm(x, x)
        except NotImplementedError as e:
            print("stub:", e)
        """)
    assert "stub: torch_npu.npu_add_layer_norm is not implemented" in out.stdout


def test_runner_runs_a_script_with_its_arguments(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys, torch, torch_npu\nprint('argv', sys.argv[1:], torch.randn(2).npu().device)\n")
    out = _run("", shim_on_path=False, args=("-m", "torch_ops_transformer.compat", str(script), "--steps", "3"))
    assert "argv ['--steps', '3'] npu:0" in out.stdout


def _fake_torch_npu(tmp_path, body: str) -> str:
    pkg = tmp_path / "site" / "torch_npu"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(body)
    return str(tmp_path / "site")


def test_a_real_torch_npu_that_imports_wins(tmp_path):
    site = _fake_torch_npu(tmp_path, "REAL = True\n")
    _run("""
        import torch_npu
        from torch_ops_transformer import compat, npu_sim
        assert getattr(torch_npu, "REAL", False) and not compat.installed() and not npu_sim.is_enabled()
        """, extra_path=[site])


def test_an_installed_torch_npu_without_cann_falls_back_to_the_shim(tmp_path):
    site = _fake_torch_npu(tmp_path, "raise ImportError('libhccl.so: cannot open shared object file')\n")
    out = _run("""
        import warnings
        warnings.simplefilter("always")
        import torch, torch_npu
        from torch_ops_transformer import compat
        assert compat.installed() and torch.randn(2).npu().is_npu
        """, extra_path=[site])
    assert "cannot be imported" in out.stderr and "libhccl" in out.stderr


def test_mixed_precision_training_loop_on_the_simulated_device():
    """torch.npu.amp.autocast / torch.autocast("npu") follow CUDA's policy; GradScaler steps the optimizer."""
    _run("""
        import torch, torch_npu
        torch.npu.set_compile_mode(jit_compile=False)
        torch.npu.config.allow_internal_format = False
        torch.manual_seed(0)
        x = torch.randn(8, 4).npu()
        with torch.autocast("npu", dtype=torch.bfloat16):
            y = x @ x.t()
            assert y.dtype == torch.bfloat16 and torch.softmax(y, -1).dtype == torch.float32 and (y + 1).dtype == y.dtype
        m = torch.nn.Linear(4, 2).npu()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        # a scale whose fp16 gradients cannot overflow (an overflow makes the scaler skip the step, by design)
        scaler = torch.npu.amp.GradScaler(init_scale=1024.0)
        before = m.weight.detach().clone()
        with torch.npu.amp.autocast():
            out = m(x)
            assert out.dtype == torch.float16
            loss = out.float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert m.weight.grad.dtype == torch.float32 and not torch.equal(before, m.weight.detach())
        """)


def test_transformers_npu_flash_attention_path_runs_on_the_shim():
    """transformers detects torch_npu and sends attn_implementation="flash_attention_2" on npu tensors to its own
    NPU integration, which calls torch_npu.npu_fusion_attention: our kernel, same logits as eager attention."""
    pytest.importorskip("transformers")
    out = _run("""
        import torch, torch_npu
        from torch.profiler import profile
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2)
        torch.manual_seed(0)
        eager = LlamaForCausalLM(cfg).eval()
        ids = torch.randint(0, 128, (2, 12))
        with torch.no_grad():
            want = eager(ids).logits
        fa = LlamaForCausalLM(cfg)
        fa.load_state_dict(eager.state_dict())
        fa.config._attn_implementation = "flash_attention_2"
        fa = fa.npu().eval()
        with torch.no_grad(), profile() as prof:
            got = fa(ids.npu()).logits.cpu()
        assert any("npu_fa::flash_attention_score" in e.key for e in prof.key_averages())
        print("maxdiff", (got - want).abs().max().item())
        """)
    assert float(out.stdout.split("maxdiff")[1]) < 1e-5
