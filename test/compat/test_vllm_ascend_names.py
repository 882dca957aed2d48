"""The table of vLLM-Ascend's torch_npu names in docs/torch_npu_compat.md stays true: each row's "provided" column is
what the installed shim gives for that name (checked in a child process; no vLLM-Ascend checkout needed), and the
extraction finds the kinds of reference vLLM-Ascend makes."""
import json
from pathlib import Path

from test.common.checkout import ROOT
from test.compat.test_shim import _run
from tools import vllm_ascend_names as names


def _table() -> dict:
    return names.table_rows(Path(ROOT, "docs", "torch_npu_compat.md").read_text())


def test_the_table_says_what_the_shim_provides():
    rows = _table()
    assert len(rows) >= 100 and set(rows.values()) == set(names.STATUSES)
    out = _run(f"""
        import json
        from tools import vllm_ascend_names as names
        names.install_shim()
        print("STATUS", json.dumps({{n: names.classify(n) for n in {sorted(rows)!r}}}))
        """).stdout
    actual = json.loads(out.split("STATUS ", 1)[1])
    wrong = {n: f"table {rows[n]}, shim {actual[n]}" for n in rows if rows[n] != actual[n]}
    assert wrong == {}, "rerun `python -m tools.vllm_ascend_names --repo ... --write`"


def test_the_table_names_its_commit_and_counts():
    text = Path(ROOT, "docs", "torch_npu_compat.md").read_text()
    block = text.split(names.BEGIN, 1)[1].split(names.END, 1)[0]
    rows = _table()
    counts = {s: sum(1 for v in rows.values() if v == s) for s in names.STATUSES}
    assert f"{len(rows)} names, {counts['yes']} provided" in block
    assert "vLLM-Ascend at commit `" in block


def test_extraction_of_attribute_chains_and_imports():
    source = '''
import torch, torch_npu
import torch_npu.npu
from torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions
from torch_npu.profiler import dynamic_profile as dp
x = torch_npu.npu_format_cast(w, torch_npu.Format.FRACTAL_NZ)
torch.npu.synchronize(); torch.ops.npu.npu_rms_norm(x, g)
torch_npu.npu_fused_infer_attention_score.out(q, k, v, workspace=ws, out=[o, l])
torch.ops._C_ascend.other(x)
'''
    assert names.names_in_source(source) == {
        "torch_npu.npu", "torch_npu.op_plugin.atb._atb_ops._register_atb_extensions",
        "torch_npu.profiler.dynamic_profile", "torch_npu.npu_format_cast", "torch_npu.Format.FRACTAL_NZ",
        "torch.npu.synchronize", "torch.ops.npu.npu_rms_norm", "torch_npu.npu_fused_infer_attention_score.out"}
