"""`python -m torch_ops_transformer.bench quant --quick`: the quantised-serving table (int8 NZ decode vs the bf16
cache, W8A8 GEMM vs bf16 / fp32 mm) runs and names the CPU, and a wrong result fails the command. Timings are not
checked."""
import pytest

from torch_ops_transformer.__main__ import main as cli
from torch_ops_transformer.bench import quant
from torch_ops_transformer.bench.__main__ import TABLES


def test_registered():
    assert TABLES["quant"] == "quant"


def test_quick_command_runs(capsys):
    assert cli(["bench", "quant", "--quick"]) == 0
    out = capsys.readouterr().out
    for word in ("CPU ", "int8 NZ", "int8 ND", "bf16", "W8A8 GEMM", "fp32 time / int8"):
        assert word in out, (word, out)


def test_wrong_gemm_fails_the_command(monkeypatch):
    monkeypatch.setattr(quant, "npu_quant_matmul", lambda x1, x2, *a, **kw: x1.new_zeros(x1.shape[0], x2.shape[1],
                                                                                          dtype=quant.torch.bfloat16))
    with pytest.raises(RuntimeError, match="W8A8 M=64 K=256 N=256 is off"):
        quant.gemm_rows(quick=True, reps=1)
