"""`python -m torch_ops_transformer.bench decode --quick`: the decode table (incre_flash_attention on contiguous and
paged caches, fused_infer_attention_score's one-token route, PyTorch's SDPA) runs for fp32, bf16 and the int8 cache.
Timings are not checked."""
from torch_ops_transformer.__main__ import main as cli


def test_quick_command_runs(capsys):
    assert cli(["bench", "decode", "--quick"]) == 0
    out = capsys.readouterr().out
    for word in ("FIA contig ms", "fp32", "bf16", "int8 (bf16 q)", "int8 cache vs bf16 cache"):
        assert word in out, (word, out)
