"""Block-size tuning (torch_ops_transformer.attention.tuning, TORCH_OPS_TRANSFORMER_TUNE): the cache file is written, read back
and reused without measuring again; corrupt and other-machine files are ignored with a warning; the switch's modes;
results independent of the tiles under the tolerance rule; no measuring in torch.compile traces or fake-tensor runs.
Every test uses a temporary cache directory and tiny shapes."""
import json
import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from test.attention.attention_cases import Case, compare_with_reference
from torch_ops_transformer import attention_tiles, attention_tiles_override
from torch_ops_transformer.attention import tuning

OPS = torch.ops.npu_fa
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path):
    """A private cache dir and an empty in-process table; no explicit override."""
    monkeypatch.setenv(tuning.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.delenv(tuning.ENV, raising=False)
    assert attention_tiles() == (0, 0)
    tuning.clear_cache(file=False)
    yield tmp_path
    tuning.clear_cache(file=False)  # nothing this module tuned is left for the exit-time save


def qkv(s=256, d=64, dtype=torch.float32, heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, heads, s, d, generator=g) * 2).to(dtype) for _ in range(3)]


def forward(q, k, v, causal=True):
    return OPS.flash_attention_score(q, k, v, q.shape[1], "BNSD", scale=q.shape[-1] ** -0.5,
                                     sparse_mode=3 if causal else 0)[0]


def measured():
    return tuning.stats()[0]


def test_tune_once_save_load_reuse(monkeypatch, cache):
    monkeypatch.setenv(tuning.ENV, "1")
    q, k, v = qkv()
    before = measured()
    out = forward(q, k, v)
    assert measured() == before + 1
    key = tuning.class_key("fwd", 64, torch.float32, "causal", 256)
    tab = tuning.table()
    assert list(tab) == [key]  # the Python key is the ops' key
    entry = tab[key]
    assert 2 <= len(entry.measured) <= 8 and all(ms > 0 for _, _, ms in entry.measured)
    assert tuning.tuned_tiles("fwd", 64, torch.float32, "causal", 200) == (entry.block_q, entry.block_kv)
    # Cached: the next calls of the class measure nothing and give the winner's result (deterministic).
    assert torch.equal(forward(q, k, v), out)
    forward(*qkv(s=200, seed=1))  # same length bucket
    assert measured() == before + 1

    path = tuning.save()
    assert path == tuning.cache_path() and path.startswith(str(cache))
    data = json.load(open(path))
    assert data["machine"] == tuning.machine_info() and key in data["entries"]
    tuning.clear_cache(file=False)
    assert tuning.table() == {}
    assert tuning.load() == 1 and tuning.table()[key] == entry
    assert torch.equal(forward(q, k, v), out)
    assert measured() == before + 1
    tuning.clear_cache()
    assert not os.path.exists(path)


def test_cache_survives_processes(cache):
    """A process that tuned writes the file at exit; the next one loads it at import and measures nothing."""
    code = ("import torch, torch_ops_transformer as t\n"
            "q = torch.randn(1, 2, 128, 64)\n"
            "torch.ops.npu_fa.flash_attention_score(q, q, q, 2, 'BNSD', scale=0.125, sparse_mode=3)\n"
            "print(t.tuning.stats()[0], len(t.tuning.table()))\n")
    env = dict(os.environ, TORCH_OPS_TRANSFORMER_TUNE="1", PYTHONPATH=ROOT)
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["1", "1"]
    assert os.path.exists(tuning.cache_path())
    second = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["0", "1"]


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({"format": 1, "machine": {"cpu": "another machine"}, "entries": {}}),
    "OTHER_VERSION",
    "BAD_TILES",
    json.dumps([1, 2]),
])
def test_bad_cache_files_are_ignored_with_a_warning(content):
    path = tuning.cache_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    good = {"format": 1, "machine": tuning.machine_info(),
            "entries": {tuning.class_key(): {"block_q": 64, "block_kv": 256, "measured": []}}}
    if content == "OTHER_VERSION":
        content = json.dumps(dict(good, machine=dict(good["machine"], torch="0.0")))
    elif content == "BAD_TILES":
        content = json.dumps(dict(good, entries={tuning.class_key(): {"block_q": -5, "block_kv": 256}}))
    with open(path, "w") as f:
        f.write(content)
    with pytest.warns(UserWarning, match="ignoring the tile cache file"):
        assert tuning.load() == 0
    assert tuning.table() == {}
    # A valid file in the same place loads.
    with open(path, "w") as f:
        json.dump(good, f)
    assert tuning.load() == 1


def test_switch_modes(monkeypatch):
    q, k, v = qkv(seed=3)
    monkeypatch.setenv(tuning.ENV, "0")
    builtin = forward(q, k, v)
    with attention_tiles_override(16, 32):
        explicit = forward(q, k, v)
    assert not torch.equal(builtin, explicit)  # the tiles change the rounding: the outputs tell which ran

    monkeypatch.setenv(tuning.ENV, "16x32")
    assert tuning.tune_mode() == ("forced", (16, 32))
    assert torch.equal(forward(q, k, v), explicit)
    monkeypatch.setenv(tuning.ENV, "16X32")
    assert torch.equal(forward(q, k, v), explicit)

    # A cached entry is used by default and ignored with "0".
    key = tuning.class_key("fwd", 64, torch.float32, "causal", 256)
    OPS.attention_tuning_table(f"{key} 16 32\n", False)
    monkeypatch.delenv(tuning.ENV)
    assert tuning.tune_mode() == "cache"
    assert torch.equal(forward(q, k, v), explicit)
    monkeypatch.setenv(tuning.ENV, "0")
    assert torch.equal(forward(q, k, v), builtin)

    # Neither unset nor "0" measures a new class.
    for value in ("0", None):
        if value is None:
            monkeypatch.delenv(tuning.ENV)
        else:
            monkeypatch.setenv(tuning.ENV, value)
        before = measured()
        forward(*qkv(s=64))
        assert measured() == before and tuning.tuned_tiles("fwd", 64, torch.float32, "causal", 64) is None


def test_explicit_override_wins_and_disables_tuning(monkeypatch):
    monkeypatch.setenv(tuning.ENV, "128x512")
    q, k, v = qkv(seed=4)
    with attention_tiles_override(16, 32):
        explicit = forward(q, k, v)
        monkeypatch.setenv(tuning.ENV, "1")
        before = measured()
        assert torch.equal(forward(q, k, v), explicit)
        assert measured() == before and tuning.table() == {}


@pytest.mark.parametrize("value", ["2", "x", "12x", "0x128", "128x0", "128x99999", "64*64", " 1", "yes"])
def test_bad_switch_value(monkeypatch, value):
    monkeypatch.setenv(tuning.ENV, value)
    with pytest.raises(ValueError, match="TORCH_OPS_TRANSFORMER_TUNE.*BQxBKV"):
        tuning.tune_mode()
    with pytest.raises(ValueError, match="environment variable TORCH_OPS_TRANSFORMER_TUNE must be"):
        forward(*qkv(s=32))


TILES = ["16x32", "32x128", "128x512", "256x1024", "48x96"]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("tiles", TILES)
def test_results_independent_of_tiles(monkeypatch, tiles, dtype):
    monkeypatch.setenv(tuning.ENV, tiles)
    compare_with_reference(Case(layout="BNSD", dtype=dtype, q_len=300, kv_len=300, head_dim=64, sparse_mode=3))
    compare_with_reference(Case(layout="BSND", dtype=dtype, q_len=150, kv_len=260, head_dim=32, sink="random",
                                sparse_mode=0, pre_tokens=70, next_tokens=5))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_tuned_call_returns_the_winners_results(monkeypatch, dtype):
    """The first call of a class runs every candidate; its outputs (and the backward's, with the accumulated dsink)
    still satisfy the tolerance rule."""
    monkeypatch.setenv(tuning.ENV, "1")
    before = measured()
    compare_with_reference(Case(layout="BNSD", dtype=dtype, q_len=260, kv_len=260, head_dim=64, sparse_mode=3,
                                sink="random"))
    assert measured() == before + 2  # forward and backward classes
    keys = set(tuning.table())
    assert {k.split("|")[0] for k in keys} == {"fwd", "bwd"} and all("|causal|sq512|skv512|" in k for k in keys)


def test_prefill_family(monkeypatch):
    monkeypatch.setenv(tuning.ENV, "1")
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=g) for _ in range(3))
    out = torch.ops.npu_fa.prompt_flash_attention(q, k, v, num_heads=2, scale_value=0.125, input_layout="BNSD",
                                                  sparse_mode=0, next_tokens=2147483647)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.125)
    assert (out.double() - ref).abs().max() < 1e-5
    assert tuning.class_key("prefill", 64, torch.float32, "none", 200) in tuning.table()


def test_no_tuning_in_fake_or_compile_traces(monkeypatch):
    monkeypatch.setenv(tuning.ENV, "1")
    q, k, v = qkv(s=192, seed=6)
    before = measured()
    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        assert forward(fq, fk, fv).shape == q.shape
    assert measured() == before and tuning.table() == {}

    at_compile = []

    def backend(gm, example_inputs):
        at_compile.append(measured())
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(forward, backend=backend, fullgraph=True)
    out = compiled(q, k, v)
    assert at_compile == [before]  # nothing measured while tracing
    # At run time the compiled graph calls the real op, which tunes its class once like an eager call.
    assert measured() == before + 1
    assert torch.equal(compiled(q, k, v), out) and torch.equal(forward(q, k, v), out)
    assert measured() == before + 1


def test_cli_quick(capsys, cache):
    assert tuning.main(["--quick", "--dtype", "fp32", "--seq", "128", "--family", "fwd", "--mask", "causal"]) == 0
    text = capsys.readouterr().out
    key = tuning.class_key("fwd", 64, torch.float32, "causal", 128)
    assert key in text and "winner" in text and "(built-in)" in text
    assert key in json.load(open(tuning.cache_path()))["entries"]
    # Cached: a second run measures nothing.
    before = measured()
    assert tuning.main(["--quick", "--dtype", "fp32", "--seq", "128", "--family", "fwd", "--mask", "causal"]) == 0
    assert measured() == before
