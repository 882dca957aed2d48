"""The opt-in `flash_attn` shim (torch_ops_transformer.compat.flash_attn): FlashAttention-2 imports work on the CPU,
a real flash_attn wins, and it is independent of the torch_npu shim. Each case runs in a child process (installing
changes sys.modules for good)."""
import os
import subprocess
import sys
import textwrap

from test.common.checkout import ROOT, pythonpath
from torch_ops_transformer import compat
from torch_ops_transformer.compat import flash_attn as fa_shim

USES_FA2 = textwrap.dedent("""
    import torch
    import flash_attn
    from flash_attn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                            flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                            flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
    from flash_attn.flash_attn_interface import flash_attn_func as f2, flash_attn_with_kvcache as kv2
    from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input
    import torch_ops_transformer as tot
    assert f2 is flash_attn_func is tot.flash_attn_func and kv2 is flash_attn_with_kvcache
    from flash_attn.flash_attn_interface import _get_block_size_n, USE_TRITON_ROCM
    from torch_ops_transformer.attention import fa2 as fa2_dmask
    assert _get_block_size_n is fa2_dmask.get_block_size_n and USE_TRITON_ROCM is False
    q = torch.randn(1, 4, 2, 8)
    out = flash_attn_qkvpacked_func(torch.stack([q, q, q], dim=2), causal=True)
    assert out.shape == (1, 4, 2, 8)
    kc, vc = torch.zeros(1, 8, 2, 8), torch.zeros(1, 8, 2, 8)
    out = flash_attn_with_kvcache(q[:, :1], kc, vc, q[:, :1], q[:, :1], cache_seqlens=3)
    assert torch.equal(kc[0, 3], q[0, 0])
    packed, indices, cu, max_len, used = unpad_input(q, torch.tensor([[1, 1, 0, 0]]))
    assert cu.tolist() == [0, 2] and torch.equal(pad_input(packed, indices, 1, 4)[0, :2], q[0, :2])
    print("version", flash_attn.__version__)
""")


def _run(code: str, paths=(), args=None, expect_ok=True):
    env = {k: v for k, v in os.environ.items() if k != "TOT_NPU_SIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(p) for p in paths] + [pythonpath()])
    cmd = [sys.executable, *args] if args else [sys.executable, "-c", textwrap.dedent(code)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    if expect_ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_pythonpath_dir_gives_the_shim():
    proc = _run(USES_FA2 + "\nimport sys; assert 'torch_npu' not in sys.modules\n", paths=[fa_shim.PYTHONPATH_DIR])
    assert "version 2.7.4+torch_ops_transformer" in proc.stdout


def test_install_in_process():
    code = ("from torch_ops_transformer.compat import flash_attn as shim\nm = shim.install()\n"
            "assert shim.installed() and shim.is_shim(m)\n" + USES_FA2)
    _run(code)


def test_module_main_runs_a_script(tmp_path):
    script = tmp_path / "infer.py"
    script.write_text(USES_FA2)
    proc = _run("", args=["-m", "torch_ops_transformer.compat.flash_attn", str(script)])
    assert "version" in proc.stdout
    assert _run("", args=["-m", "torch_ops_transformer.compat.flash_attn", "--pythonpath"]).stdout.strip() == \
        str(fa_shim.PYTHONPATH_DIR)


def test_not_installed_by_default_nor_by_the_torch_npu_shim():
    code = """
        import importlib.util
        import torch_ops_transformer
        assert importlib.util.find_spec("flash_attn") is None, "flash_attn must stay opt-in"
    """
    _run(code)
    _run(code, paths=[compat.PYTHONPATH_DIR])  # the torch_npu shim's directory holds no flash_attn
    # and the flash_attn shim's directory holds no torch_npu
    _run("import importlib.util; assert importlib.util.find_spec('torch_npu') is None", paths=[fa_shim.PYTHONPATH_DIR])


def _fake_real(tmp_path, body: str):
    pkg = tmp_path / "site" / "flash_attn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    (pkg / "flash_attn_interface.py").write_text("def flash_attn_func(*a, **k):\n    return 'real'\n")
    return tmp_path / "site"


def test_a_real_flash_attn_wins(tmp_path):
    site = _fake_real(tmp_path, """
        REAL = True
        from .flash_attn_interface import flash_attn_func
    """)
    code = """
        import flash_attn
        from flash_attn.flash_attn_interface import flash_attn_func
        assert getattr(flash_attn, "REAL", False) and flash_attn_func() == "real"
        from torch_ops_transformer.compat import flash_attn as shim
        assert shim.install() is flash_attn and not shim.installed()
    """
    _run(code, paths=[fa_shim.PYTHONPATH_DIR, site])  # the shim's directory first: the real one still wins
    _run("from torch_ops_transformer.compat import flash_attn as shim\nm = shim.install()\n"
         "assert getattr(m, 'REAL', False)", paths=[site])


def test_a_real_flash_attn_that_cannot_import_falls_back_with_a_warning(tmp_path):
    site = _fake_real(tmp_path, "import flash_attn_2_cuda_missing_extension\n")
    code = """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import flash_attn
        assert flash_attn.__version__.startswith("2.7.4+torch_ops_transformer")
        assert any("cannot be imported" in str(w.message) for w in caught), [str(w.message) for w in caught]
        from flash_attn.flash_attn_interface import flash_attn_with_kvcache
    """
    _run(code, paths=[fa_shim.PYTHONPATH_DIR, site])


def test_both_shims_together():
    code = USES_FA2 + textwrap.dedent("""
        import torch_npu
        from torch_ops_transformer import compat
        from torch_ops_transformer.compat import flash_attn as shim
        assert compat.installed() and shim.installed()
        assert torch_npu.npu_fusion_attention is not None and flash_attn.flash_attn_func is not None
    """)
    _run(code, paths=[compat.PYTHONPATH_DIR, fa_shim.PYTHONPATH_DIR])
