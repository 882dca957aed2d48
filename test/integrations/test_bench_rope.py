"""`python -m torch_ops_transformer.bench rope --quick`: the rotary-embedding table runs, names the CPU and ISA, has a
row per op and dtype, and a wrong result fails the command after the table is printed. Timings are not checked."""
import pytest

from torch_ops_transformer.__main__ import main as cli
from torch_ops_transformer.bench import rope
from torch_ops_transformer.bench.__main__ import TABLES

OPS = ("rotary_mul half", "rotary_mul interleave", "sin_cos_cache neox", "sin_cos_cache gptj", "mrope qwen2vl")


def test_registered():
    assert TABLES["rope"] == "rope"


def test_quick_command_runs(capsys):
    assert cli(["bench", "rope", "--quick"]) == 0
    out = capsys.readouterr().out
    for word in ("CPU ", "avx512_bf16 ", "peer/ours", "GB/s") + OPS:
        assert word in out, (word, out)
    rows = [line for line in out.splitlines() if line.startswith(("| rotary", "| sin", "| mrope"))]
    assert len(rows) == 2 * len(OPS)  # bfloat16 and float32


def test_wrong_result_fails_the_command(monkeypatch):
    monkeypatch.setattr(rope, "npu_mrope", lambda positions, q, k, cache, hs, **kw: (q * 0, k * 0))
    with pytest.raises(RuntimeError, match="rope benchmark: mrope qwen2vl torch.bfloat16: max\\|ours - float64\\|"):
        rope.run(quick=True, reps=1)
