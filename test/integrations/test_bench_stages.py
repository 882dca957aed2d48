"""`python -m torch_ops_transformer.bench stages --quick`: the per-stage table of the attention kernels runs, its rows
are consistent (stages >= 0, their sum within the instrumented call time) and the AMX projection's arithmetic is
right. Timings themselves are never checked."""
import pytest
import torch

import torch_ops_transformer  # noqa: F401  (registers torch.ops.npu_fa)
from torch_ops_transformer.__main__ import main as cli
from torch_ops_transformer.bench import stages
from torch_ops_transformer.bench.__main__ import TABLES

OPS = torch.ops.npu_fa


def test_registered():
    assert TABLES["stages"] == "stages"


def test_op_reports_every_stage_and_rejects_a_bad_enable():
    rate, ticks = stages.stage_ticks()
    assert rate > 0 and len(ticks) == len(stages.STAGES)
    with pytest.raises(ValueError, match="'enable'"):
        OPS.attention_stage_ticks(2)


def test_timing_off_counts_nothing():
    stages.stage_ticks(0, True)
    q = torch.randn(1, 2, 64, 32)
    OPS.flash_attention_score(q, q, q, 2, "BNSD", scale=0.2)
    assert stages.stage_ticks(-1, True)[1] == [0] * len(stages.STAGES)


def test_quick_command_runs(capsys):
    assert cli(["bench", "stages", "--quick", "--amx-ratio", "4"]) == 0
    out = capsys.readouterr().out
    for word in ("CPU ", "avx512_bf16 ", "brgemm", "residual", "projected vector share", "/ 4 for bf16"):
        assert word in out, (word, out)
    for kernel in ("fwd", "prefill", "bwd", "decode"):
        assert f"| {kernel} " in out, kernel


def test_rows_are_consistent():
    ms = stages.main(quick=True, reps=1)
    assert {m.case.kernel for m in ms} == {"fwd", "prefill", "bwd", "decode"}
    for m in ms:
        assert m.stage_s and all(s >= 0 for s in m.stage_s.values()), m.stage_s
        whole = m.timed_s * m.threads
        # Laps chain inside the workers, so their sum cannot exceed the threads' time of the call.
        assert 0 < m.total() <= 1.05 * whole + 1e-4, (m.case, m.total(), whole)
        assert m.total() == pytest.approx(m.total("vector") + m.total("brgemm"))
        if m.case.kernel != "decode":  # decode's products are vector loops, the others' run on brgemm
            assert m.total("brgemm") > 0, m.case


def _measurement(dtype, vector_s, brgemm_s, timed_s, elements=1000):
    case = stages.Case("fwd", 1, 1, 1, 10, 100, 64, dtype)
    assert case.score_elements() == elements
    return stages.Measurement(case, 1, timed_s, timed_s, {"a": vector_s, "b": brgemm_s},
                              {"a": "vector", "b": "brgemm"})


def test_projection_arithmetic():
    m = _measurement(torch.bfloat16, vector_s=3e-6, brgemm_s=5e-6, timed_s=9e-6)  # residual 1e-6
    assert m.residual_s == pytest.approx(1e-6)
    p = stages.project(m, 5.0)
    assert p.ratio == 5.0
    assert p.vector_ns == pytest.approx(4.0)  # (3 + 1 residual) us / 1000 elements
    assert p.brgemm_ns == pytest.approx(1.0)  # 5 us / 5 / 1000
    assert p.total_ns == pytest.approx(5.0)
    assert p.vector_share == pytest.approx(0.8)
    row = stages.summary_row(m, 5.0)
    assert row[stages.SUMMARY_HEADERS.index("projected ns/elem")] == "5.000"
    assert row[stages.SUMMARY_HEADERS.index("projected vector share")] == "80%"
    assert row[stages.SUMMARY_HEADERS.index("brgemm ns/elem")] == "5.000"
    # fp32 products have no AMX path: the projection is the measurement.
    p32 = stages.project(_measurement(torch.float32, 3e-6, 5e-6, 9e-6), 5.0)
    assert p32.ratio == 1.0 and p32.total_ns == pytest.approx(9.0)


def test_causal_elements_count_the_visible_pairs():
    case = stages.Case("prefill", 2, 3, 3, 4, 4, 64, torch.float32, causal=True)
    assert case.score_elements() == 2 * 3 * (4 + 3 + 2 + 1)
