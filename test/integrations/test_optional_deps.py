"""Optional dependencies and the newcomer's path: a missing transformers / matplotlib is one line naming the package
and its pip command with exit status 2 (also when the demo's worker process is the one that misses it);
attn_implementation="npu_fa" works right after `import torch_ops_transformer` without that import loading
transformers; README's setup and test commands are the ones .ci/run runs (followed by the ASan step); no NumPy
warning at import.

Missing packages are simulated with a stub package on sys.path whose import raises ModuleNotFoundError, exactly as
an absent package does. Everything runs in subprocesses (the stubs must not leak into this process)."""
import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")


def _stub_missing(tmp_path, *packages) -> str:
    """A directory that makes `import <package>` fail as if the package were not installed."""
    stubs = tmp_path / "missing_packages"
    for package in packages:
        (stubs / package).mkdir(parents=True)
        (stubs / package / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{package}'\", name='{package}')\n")
    return str(stubs)


def _run(args, *path_first, timeout=600):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*path_first, ROOT] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _one_line_error(proc, package: str, requirement: str, prog: str) -> str:
    """Exit status 2, no traceback, and the last thing on stderr is the one line (a cleared tqdm bar may precede
    it, separated by carriage returns)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    lines = [line.strip() for line in re.split(r"[\r\n]", proc.stderr) if line.strip()]
    assert lines and sum("needs '" in line for line in lines) == 1, proc.stderr
    expected = f"{prog}: needs '{package}', which is not installed: pip install \"{requirement}\""
    assert lines[-1] == expected, (lines[-1], expected)
    return lines[-1]


# ---------------------------------------------------------------- missing optional packages
def test_demo_without_transformers_is_one_line_and_status_2(tmp_path):
    proc = _run(["-m", "torch_ops_transformer", "demo", "--quick"], _stub_missing(tmp_path, "transformers"))
    _one_line_error(proc, "transformers", "transformers==5.24.0", "torch_ops_transformer demo")
    assert proc.stderr.strip().count("\n") == 0 and proc.stdout == "", (proc.stdout, proc.stderr)


@needs_transformers
def test_demo_worker_without_transformers_is_one_line_and_status_2(tmp_path):
    """The parent has transformers; the spawned worker (which gets the parent's sys.path) does not."""
    driver = textwrap.dedent(f"""
        import sys
        import transformers  # the parent's copy stays in sys.modules
        sys.path.insert(0, {_stub_missing(tmp_path, 'transformers')!r})  # what the spawned workers will see
        from torch_ops_transformer.__main__ import main
        sys.exit(main(["demo", "--quick"]))
    """)
    proc = _run(["-c", driver])
    _one_line_error(proc, "transformers", "transformers==5.24.0", "torch_ops_transformer demo")
    assert proc.stdout.startswith("# demo:"), proc.stdout  # the parent had started: the worker found it missing


@pytest.mark.parametrize("command", [["-m", "torch_ops_transformer", "bench"], ["-m", "torch_ops_transformer.bench"]])
def test_bench_plot_without_matplotlib_is_one_line_and_status_2(tmp_path, command):
    proc = _run([*command, "prefill", "--quick", "--plot", str(tmp_path / "x.png")],
                _stub_missing(tmp_path, "matplotlib"))
    _one_line_error(proc, "matplotlib", "matplotlib", "torch_ops_transformer bench --plot")
    assert not (tmp_path / "x.png").exists()


def test_hf_api_without_transformers_raises_import_error_with_the_line(tmp_path):
    code = textwrap.dedent("""
        import torch_ops_transformer as tot
        try:
            tot.register_hf_attention()
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("no ImportError")
        x = tot.flash_attn_func(*[__import__("torch").randn(1, 4, 2, 8)] * 3)  # the ops work without it
        print(tuple(x.shape))
    """)
    proc = _run(["-c", code], _stub_missing(tmp_path, "transformers"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line, shape = proc.stdout.strip().splitlines()
    assert line.endswith("needs 'transformers', which is not installed: pip install \"transformers==5.24.0\"")
    assert shape == "(1, 4, 2, 8)" and proc.stderr == "", proc.stderr


# ---------------------------------------------------------------- attn_implementation="npu_fa" without a call
def test_import_does_not_import_transformers():
    code = ("import sys, torch_ops_transformer; "
            "print(sorted(m for m in sys.modules if m == 'transformers' or m.startswith('transformers.')))")
    proc = _run(["-X", "importtime", "-c", code])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert "torch_ops_transformer" in imported
    assert not [m for m in imported if m.split(".")[0] == "transformers"], imported


_TINY_LLAMA = """
import sys, torch
{imports}
from torch_ops_transformer.integrations import sdpa
cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                               pad_token_id=0)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="npu_fa").eval()
assert type(model).__name__ == "LlamaForCausalLM"
ids = torch.randint(1, 128, (2, 12), generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    ours = model(input_ids=ids).logits
    model.set_attn_implementation("sdpa")
    theirs = model(input_ids=ids).logits
assert model.config._attn_implementation == "sdpa"
torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
print("routes", dict(sdpa.route_counts))
"""


@needs_transformers
@pytest.mark.parametrize("imports", [
    "import torch_ops_transformer\nassert 'transformers' not in sys.modules\nimport transformers",
    "import transformers\nfrom transformers import LlamaForCausalLM\nimport torch_ops_transformer",
    "from torch_ops_transformer.integrations import hf  # its own import of transformers fires the hook\nimport transformers",
], ids=["torch_ops_transformer first", "transformers first", "hf module first"])
def test_npu_fa_is_registered_without_calling_register(imports):
    proc = _run(["-W", "error::RuntimeWarning", "-c", _TINY_LLAMA.format(imports=imports)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "routes {'prefill': 2}" in proc.stdout, proc.stdout  # both layers ran our prefill kernel


# ---------------------------------------------------------------- README <-> .ci/run, NumPy
def _readme_block(title: str) -> list:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = re.search(r"^## " + re.escape(title) + r"\n```bash\n(.*?)```", text, re.S | re.M)
    assert block, f"README has no '## {title}' bash block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_exactly_the_readme_commands():
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = [line.strip() for line in f]
    setup, test = _readme_block("Setup (one command)"), _readme_block("Test (one command)")
    assert len(setup) == 1 and len(test) == 1, (setup, test)
    assert setup[0] in ci and test[0] in ci, (setup, test)
    assert ci.index(setup[0]) < ci.index(test[0])
    assert "--no-build-isolation" in setup[0] and ".[all]" in setup[0] and "pyyaml" in setup[0]
    # Then the AddressSanitizer tests (README "Test" names them; docs/sanitizers.md); the build may start earlier.
    asan_tests = [i for i, line in enumerate(ci) if line.startswith("python -m tools.asan") and "--build-only" not in line]
    assert asan_tests and ci.index(test[0]) < asan_tests[0], ci


def test_no_numpy_warning_at_import():
    proc = _run(["-c", "import torch_ops_transformer"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Failed to initialize NumPy" not in proc.stderr, proc.stderr
    assert importlib.util.find_spec("numpy") is not None, "numpy is part of the setup (setup.py install_requires)"
