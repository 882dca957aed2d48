"""The main command `python -m torch_ops_transformer demo` in its --quick configuration (the metrics table, the
token check), --model-path with a tiny model saved to a temporary directory, and `bench --plot` writing a PNG."""
import os

import pytest

transformers = pytest.importorskip("transformers")

from torch_ops_transformer.bench import demo  # noqa: E402
from torch_ops_transformer.__main__ import main as cli  # noqa: E402

TABLE_ROWS = ("prefill peak memory growth (MiB, measured RSS)", "first-token latency (ms)",
              "decode throughput (tokens/s)", "decode per-token latency (ms)")


def _assert_table(out: str) -> None:
    for row in TABLE_ROWS:
        assert row in out, out
    for column in ("eager (matmul+softmax)", "sdpa (PyTorch)", "npu_fa (ours)", "ours vs eager", "ours vs sdpa"):
        assert column in out, out
    assert "generated tokens identical for eager, sdpa, npu_fa" in out, out
    routes = next(line for line in out.splitlines() if line.startswith("npu_fa attention calls:"))
    assert "prefill" in routes and "decode" in routes and "fallback" not in routes, routes  # our kernels ran


def test_demo_quick_prints_the_table(capsys):
    """The real command path: each implementation in a fresh process."""
    assert cli(["demo", "--quick"]) == 0
    _assert_table(capsys.readouterr().out)


def test_demo_model_path_loads_local_weights(tmp_path, capsys):
    import torch

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    code = demo.main(["--model-path", str(tmp_path), "--quick", "--same-process", "--prompt-len", "24"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"model {tmp_path}" in out
    _assert_table(out)


def test_demo_reports_token_mismatch_loudly(monkeypatch, capsys):
    fake = {i: dict(tokens=[[1, 2, 3]], checksum=1.0, memory=0, first=1.0, per_step=1.0, threads=1)
            for i in demo.IMPLS}
    fake["npu_fa"] = dict(fake["npu_fa"], tokens=[[1, 2, 4]])
    monkeypatch.setattr(demo, "run_all", lambda args: fake)
    assert demo.main(["--quick"]) == 1
    err = capsys.readouterr().err
    assert "GENERATED TOKENS DIFFER" in err and "npu_fa vs eager: sequence 0 differs from new token 2 (4 vs 3)" in err


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "--batch must be >= 1, got 0"),
    (["--new-tokens", "1"], "--new-tokens must be >= 2"),
    (["--hidden", "100", "--heads", "8"], "--hidden (100) must be a multiple of --heads (8)"),
    (["--model-path", "/nonexistent/llama"], "--model-path must be a local Hugging Face model directory"),
])
def test_demo_rejects_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(argv)
    assert message in capsys.readouterr().err


def test_bench_plot_writes_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    assert cli(["bench", "prefill", "--quick", "--plot", str(path)]) == 0
    out = capsys.readouterr().out
    assert "plot saved to" in out and "fwd speed-up" in out
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 10_000
