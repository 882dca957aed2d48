"""Arguments are declared once: adding an optional argument to an op's YAML schema changes the generated argument
struct (and its owning copy <Op>Values), the typed dispatcher call, the registration wrappers and the fake-kernel
binding, and nothing else the generator writes (the kernel declarations keep their `(const <Op>Args& args)`
signature). docs/architecture.md shows the resulting diff."""
import difflib
import os

from tools.codegen.main import ROOT, render_all

OLD = "bool alibi_bottom_right=False) -> (Tensor attention_out,"
NEW = "bool alibi_bottom_right=False, int window=0) -> (Tensor attention_out,"


def _render_with_window(tmp_path):
    text = open(os.path.join(ROOT, "native_functions.yaml"), encoding="utf-8").read()
    assert text.count(OLD) == 1, "flash_attention_score's schema changed; update this fixture"
    path = tmp_path / "native_functions.yaml"
    path.write_text(text.replace(OLD, NEW), encoding="utf-8")
    return render_all(os.path.join(ROOT, "native_functions.yaml")), render_all(str(path))


def changed_lines(before: str, after: str):
    """(removed, added) lines of a unified diff, blank lines and lone braces left out, and lines that are both removed
    and added (difflib treats lines repeated all over a file, like a comment of every struct, as junk and may report
    an unchanged one on both sides)."""
    diff = list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0))
    keep = lambda line: line.strip() not in ("", "}")  # noqa: E731
    removed = [d[1:] for d in diff if d.startswith("-") and not d.startswith("---") and keep(d[1:])]
    added = [d[1:] for d in diff if d.startswith("+") and not d.startswith("+++") and keep(d[1:])]
    both = set(removed) & set(added)
    return [r for r in removed if r not in both], [a for a in added if a not in both]


def test_new_optional_argument_reaches_struct_wrappers_and_fake_binding(tmp_path):
    before, after = _render_with_window(tmp_path)
    changed = sorted(f for f in before if before[f] != after[f])
    # The kernel declarations do not change: CPU and PrivateUse1 kernels take the argument struct.
    assert changed == ["aten_ops/generated/op_args.h", "aten_ops/generated/op_calls.h",
                       "aten_ops/generated/register_ops.cpp", "torch_ops_transformer/_library/generated/registrations.py"]

    removed, added = changed_lines(before["aten_ops/generated/op_args.h"], after["aten_ops/generated/op_args.h"])
    assert len(removed) == 3 and len(added) == 5
    assert added[0] == "  int64_t window;"  # the struct member, after `alibi_bottom_right`
    assert added[1] == removed[0].replace("a.alibi_bottom_right);", "a.alibi_bottom_right, a.window);")  # apply_args
    assert added[2] == "  int64_t window = 0;"  # FlashAttentionScoreValues' member, with the schema's default
    assert added[3] == removed[1].replace("alibi_bottom_right(a.alibi_bottom_right) {}",
                                          "alibi_bottom_right(a.alibi_bottom_right), window(a.window) {}")  # the copy
    assert added[4] == removed[2].replace("alibi_bottom_right}; }", "alibi_bottom_right, window}; }")  # args()

    removed, added = changed_lines(before["aten_ops/generated/op_calls.h"], after["aten_ops/generated/op_calls.h"])
    assert len(removed) == len(added) == 2  # call_flash_attention_score: the typed signature and the call
    assert added[0] == removed[0].replace("bool)>();", "bool, int64_t)>();")
    assert added[1] == removed[1].replace("a.alibi_bottom_right);", "a.alibi_bottom_right, a.window);")

    removed, added = changed_lines(before["aten_ops/generated/register_ops.cpp"],
                                   after["aten_ops/generated/register_ops.cpp"])
    assert len(added) == len(removed) == 5 and all("window" in a for a in added)
    assert sum(a.lstrip().startswith('m.def("flash_attention_score(') for a in added) == 1  # the schema
    for wrapper in ("flash_attention_score_cpu_unboxed(", "flash_attention_score_npu_privateuse1("):
        assert sum(wrapper in a and a.endswith("int64_t window) {") for a in added) == 1  # unboxed signatures
    assert sum("FlashAttentionScoreArgs{" in a and a.endswith("alibi_bottom_right, window});") for a in added) == 2  # structs

    removed, added = changed_lines(before["torch_ops_transformer/_library/generated/registrations.py"],
                                   after["torch_ops_transformer/_library/generated/registrations.py"])
    assert all("window" in a for a in added) and len(removed) == 4
    assert any(a.startswith("FlashAttentionScoreArgs = collections.namedtuple(") and a.endswith("'window'])")
               for a in added)
    assert any(a.startswith("def _fake_flash_attention_score(") and a.endswith("alibi_bottom_right=False, window=0):")
               for a in added)
    assert any("= FlashAttentionScoreArgs(" in a and a.endswith("alibi_bottom_right, window)") for a in added)
    # autograd: setup_context unpacks every input; the new argument gets no gradient
    assert any(a.endswith("alibi_bottom_right, window,) = inputs") for a in added)
    assert "        None,  # window" in added


def test_fake_kernel_gets_bound_arguments_with_defaults():
    import torch

    from torch_ops_transformer._library.generated import registrations

    a = registrations.FlashAttentionScoreArgs._fields
    assert a[:5] == ("query", "key", "value", "head_num", "input_layout") and a[-3:] == ("q_start_idx", "kv_start_idx", "alibi_bottom_right")
    seen = {}

    def spy(args):
        seen["args"] = args
        return "result"

    import torch_ops_transformer.attention.fake as fake

    real = fake.flash_attention_score
    fake.flash_attention_score = spy
    try:
        q = torch.empty(1, 2, 4, 8)
        assert registrations._fake_flash_attention_score(q, q, q, 2, "BNSD", scale=0.5) == "result"
    finally:
        fake.flash_attention_score = real
    args = seen["args"]
    assert args.query is q and args.head_num == 2 and args.scale == 0.5
    assert args.pse is None and args.pse_type == 1 and args.pre_tokens == 2147483647 and args.offset is None
