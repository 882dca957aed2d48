"""`python -m torch_ops_transformer.bench gdn` runs (tiny shapes) and its checks against transformers pass."""
import pytest

from torch_ops_transformer.bench.__main__ import TABLES

pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

from torch_ops_transformer.bench import gdn  # noqa: E402


def test_table_is_registered():
    assert TABLES["gdn"] == "gdn"


def test_quick_run_checks_against_transformers(capsys):
    rows = gdn.run(quick=True, reps=1, prefill=[130], training=[70])
    assert [r[0] for r in rows] == ["prefill T=130", "train fwd+bwd T=70", "decode B=4 after ctx=128",
                                    "decode B=4 after ctx=256"]
    assert "Gated DeltaNet" in capsys.readouterr().out


def test_flop_count():
    # one chunk of 64 tokens, one value head of 128 x 128: 2 * (64^2 * (3*128 + 2*128) + 3 * 64 * 128^2)
    assert gdn.chunk_flops(64, nv=1, c=64) == 2 * (64 * 64 * 640 + 3 * 64 * 128 * 128)
    assert gdn.chunk_flops(64, nv=1) == 2 * 2 * (32 * 32 * 640 + 3 * 32 * 128 * 128)  # two of the kernel's chunks
