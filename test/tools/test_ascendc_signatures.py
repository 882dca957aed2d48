"""tools/ascendc/check_signatures.py without an asc-devkit checkout: every Ascend C API our kernels call is listed
in ascendc/cpu_runtime/SIGNATURES.md (with its docs page), and the check itself notices an unlisted one."""
import os

from tools.ascendc import check_signatures


def test_every_kernel_api_is_listed():
    missing = check_signatures.unlisted_kernel_apis()
    assert not missing, "add rows to ascendc/cpu_runtime/SIGNATURES.md for: " + ", ".join(
        f"{n} ({f})" for n, f in missing)


def test_every_runtime_api_is_listed():
    unlisted = check_signatures.runtime_api_names() - check_signatures.listed_names(check_signatures.read_table())
    assert not unlisted, f"runtime headers declare APIs without a SIGNATURES.md row: {sorted(unlisted)}"


def test_rows_name_docs_page_and_version():
    with open(check_signatures.TABLE, encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("| `")]
    assert len(rows) > 150
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[1].startswith("see "):
            continue
        assert cells[2] and cells[3] == "CANN 8.3.RC1 (asc-devkit docs)", line


def test_detects_an_unlisted_api(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "k.cpp").write_text('#include "kernel_operator.h"\n// Brcb in a comment does not count\n'
                                   "void f() { AscendC::Exp(a, b, 8); }\n")
    table = tmp_path / "SIGNATURES.md"
    with open(check_signatures.TABLE, encoding="utf-8") as f:
        table.write_text("".join(line for line in f if not line.startswith("| `Exp`")))
    assert check_signatures.unlisted_kernel_apis(str(kernels), str(table)) == [("Exp", os.path.relpath(
        str(kernels / "k.cpp"), check_signatures.ROOT))]


def test_parameter_type_normalisation():
    sig = "template <typename T> void Add(const LocalTensor<T>& dst, uint64_t mask[], const int32_t& count = 0)"
    assert check_signatures.param_types(sig) == ["LocalTensor<T>", "uint64_t[]", "int32_t"]
    assert check_signatures.normalize_type("__gm__ PrimType* buffer") == "T*"
