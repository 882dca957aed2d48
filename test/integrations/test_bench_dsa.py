"""`python -m torch_ops_transformer.bench dsa --quick`: the sparse-attention decode table runs, names the CPU and
ISA, and its checks catch wrong indices or a wrong output (the command fails after printing). Timings are not
checked."""
import pytest
import torch

from torch_ops_transformer.__main__ import main as cli
from torch_ops_transformer.bench import dsa
from torch_ops_transformer.bench.__main__ import TABLES


def test_registered():
    assert TABLES["dsa"] == "dsa"


def test_quick_command_runs(capsys):
    assert cli(["bench", "dsa", "--quick"]) == 0
    out = capsys.readouterr().out
    for word in ("CPU ", "avx512f ", "indexer share", "dense/DSA"):
        assert word in out, (word, out)
    rows = [line for line in out.splitlines() if line.startswith("| B=")]
    assert len(rows) == len(dsa.default_cases(True))


def test_checks_catch_wrong_indices_and_outputs():
    c = dsa.default_cases(True)[0]
    x = dsa.make_inputs(c)
    _, indexer, sparse = dsa.contenders(c, x)
    indices = indexer()
    out = sparse(indices)
    assert dsa.check(c, x, indices, out) == []
    shifted = torch.where(indices >= 0, (indices + 1) % c.ctx, indices)
    assert any("not a top" in p for p in dsa.check(c, x, shifted, out))
    assert any("max|diff|" in p for p in dsa.check(c, x, indices, out + 0.1))


def test_failed_check_fails_the_command(monkeypatch):
    monkeypatch.setattr(dsa, "check", lambda *a: ["a wrong answer"])
    with pytest.raises(RuntimeError, match="dsa benchmark: a wrong answer"):
        dsa.run(quick=True, reps=1, cases=dsa.default_cases(True)[:1])
