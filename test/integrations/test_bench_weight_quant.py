"""`python -m torch_ops_transformer.bench weight_quant --quick`: the weight-only quantised linear table runs, names the
CPU and ISA, says when PyTorch's bf16 GEMM is emulated, and a wrong result fails the command after the table is
printed. Timings are not checked."""
import pytest

from torch_ops_transformer.__main__ import main as cli
from torch_ops_transformer.bench import weight_quant
from torch_ops_transformer.bench.__main__ import TABLES


def test_registered():
    assert TABLES["weight_quant"] == "weight_quant"


def test_quick_command_runs(capsys):
    assert cli(["bench", "weight_quant", "--quick"]) == 0
    out = capsys.readouterr().out
    for word in ("CPU ", "avx512_bf16 ", "fp32/ours", "dequant/ours", "W8A16 per-channel", "W4A16 g128"):
        assert word in out, (word, out)
    rows = [line for line in out.splitlines() if line.startswith("| W")]
    assert len(rows) == len(weight_quant.default_cases(True))
    native = weight_quant.isa_flags()["avx512_bf16"] or weight_quant.isa_flags()["amx_bf16"]
    assert ("emulated" in out) != native


def test_wrong_result_fails_the_command(monkeypatch):
    monkeypatch.setattr(weight_quant, "npu_weight_quant_batchmatmul", lambda x, w, s, **kw: x.new_zeros(x.shape[0],
                                                                                                      w.shape[-1]))
    with pytest.raises(RuntimeError, match="weight_quant benchmark: W8A16 per-channel M=1: max\\|ours - float64\\|"):
        weight_quant.run(quick=True, reps=1, cases=weight_quant.default_cases(True)[:1])
