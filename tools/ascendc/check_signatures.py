"""Check ascendc/cpu_runtime/SIGNATURES.md, the provenance table of the Ascend C API subset our CPU runtime declares.

    python tools/ascendc/check_signatures.py                 # every runtime API our kernels use is in the table
    python tools/ascendc/check_signatures.py ASC_DEVKIT_DIR  # ... and each row's parameter types match asc-devkit

The first mode greps ascendc/kernels for identifiers the runtime headers declare (functions, types, enums, macros
of namespace AscendC) and fails on any that SIGNATURES.md does not list. The second also extracts the prototypes of
every listed API from an asc-devkit checkout (include/**/*_intf.h first, then the other include/**/*.h) and diffs
names and parameter types (qualifiers, references, parameter names and default values ignored) against ours.
"""
import argparse
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNTIME_INCLUDE = os.path.join(ROOT, "ascendc", "cpu_runtime", "include")
TABLE = os.path.join(ROOT, "ascendc", "cpu_runtime", "SIGNATURES.md")
KERNELS = os.path.join(ROOT, "ascendc", "kernels")


# ---- SIGNATURES.md ----

def read_table(path=TABLE):
    """Rows of the table as (api, signature) pairs; api is `Name` or `Class::Name`, signature may be ''."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 3 or not cells[0].startswith("`"):
                continue
            api = cells[0].strip("`").strip()
            sig = cells[1].strip()
            sig = sig[1:-1] if sig.startswith("`") and sig.endswith("`") else sig
            rows.append((api, sig))
    return rows


def listed_names(rows):
    names = set()
    for api, _ in rows:
        names.add(api)
        names.add(api.split("::")[-1])
    return names


# ---- C++ text helpers ----

def strip_comments_and_strings(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def drop_namespace_blocks(text, names=("cpu", "AscendC::cpu")):
    """Remove the bodies of `namespace cpu { ... }` (simulator internals, not Ascend C API)."""
    out, i = [], 0
    pattern = re.compile(r"namespace\s+(%s)\s*\{" % "|".join(re.escape(n) for n in names))
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j


def runtime_api_names():
    """Identifiers the runtime headers declare as Ascend C API (namespace AscendC, not AscendC::cpu)."""
    names = set()
    for path in glob.glob(os.path.join(RUNTIME_INCLUDE, "**", "*.h"), recursive=True):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        text = drop_namespace_blocks(strip_comments_and_strings(text.replace("\\\n", " ")))
        names |= set(re.findall(r"__aicore__\s+inline\s+[^;{()]*?\b(\w+)\s*\(", text))
        names |= set(re.findall(r"ASCENDC_CPU_\w+\((\w+),", text))  # instructions stamped out by macros
        names |= set(re.findall(r"\b(?:class|struct)\s+(\w+)\s*(?:[:{]|final)", text))
        names |= set(re.findall(r"\benum\s+(?:class\s+)?(\w+)", text))
        names |= set(re.findall(r"\busing\s+(\w+)\s*=", text))
        names |= set(re.findall(r"^\s*#define\s+(\w+)", text, flags=re.M))
        names |= set(re.findall(r"\bconstexpr\s+\w+\s+(\w+)\s*[{=]", text))
    names |= set(re.findall(r"^\s*(?:void\*?|GM_ADDR)\s+(\w+)\([^;{]*\);", text, flags=re.M))  # GmAlloc, ...
    # Template parameters and class-internal aliases the regexes also catch.
    internal = {"operator", "Name", "T", "U", "SrcAT", "SrcBT", "DstT", "BiasT", "Params", "isTrans", "pos", "e",
                "per_block", "inited_"}
    return {n for n in names if n not in internal and not n.startswith("ASCENDC_CPU_") and not n.startswith("k")}


def kernel_identifiers(kernel_dir=KERNELS):
    """identifier -> first file using it, over every kernel source."""
    used = {}
    for path in sorted(glob.glob(os.path.join(kernel_dir, "**", "*.*"), recursive=True)):
        if not path.endswith((".cpp", ".h", ".hpp", ".cc")):
            continue
        with open(path, encoding="utf-8") as f:
            text = strip_comments_and_strings(f.read())
        for ident in re.findall(r"\b[A-Za-z_]\w*\b", text):
            used.setdefault(ident, os.path.relpath(path, ROOT))
    return used


def unlisted_kernel_apis(kernel_dir=KERNELS, table=TABLE):
    """[(name, file)] for runtime APIs the kernels use that SIGNATURES.md does not list."""
    api = runtime_api_names()
    listed = listed_names(read_table(table))
    return sorted((n, f) for n, f in kernel_identifiers(kernel_dir).items() if n in api and n not in listed)


# ---- prototypes and parameter types ----

def split_params(params):
    parts, depth, cur = [], 0, ""
    for ch in params:
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def normalize_type(param):
    """`const LocalTensor<T>& dst = x` -> `LocalTensor<T>`: the type without qualifiers, name or default."""
    p = param.split("=")[0]
    p = re.sub(r"\b(const|volatile|__gm__|__ubuf__|__aicore__|typename|__restrict__|__restrict)\b|\bAscendC::", " ", p)
    p = re.sub(r"\bPrimT<\s*T\s*>|\bPrimType\b", "T", p)
    is_array = "[" in p
    p = re.sub(r"\[[^\]]*\]", "", p)
    tokens = re.findall(r"[\w:]+(?:<[^()]*>)?|\*", p.replace("&", " "))
    if len(tokens) >= 2 and re.fullmatch(r"\w+", tokens[-1]) and tokens[-2] != "*" or (
            len(tokens) >= 2 and tokens[-2] == "*" and re.fullmatch(r"\w+", tokens[-1])):
        tokens = tokens[:-1]  # the parameter's name
    t = "".join(tok if tok == "*" else " " + tok for tok in tokens).strip()
    t = re.sub(r"\s+", "", t)
    return t + ("[]" if is_array else "")


def param_types(signature):
    m = re.search(r"\b\w+\s*\((.*)\)\s*(const)?\s*$", signature.strip())
    if not m:
        return None
    return [normalize_type(p) for p in split_params(m.group(1)) if p.strip() and p.strip() != "void"]


def balanced_params(text, open_idx):
    depth, j = 0, open_idx
    while j < len(text):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return text[open_idx + 1:j]
        j += 1
    return ""


# Where a class's members are declared in asc-devkit (a path fragment), so that e.g. Matmul::SetBias is not compared
# with the Conv3D SetBias.
CLASS_FILES = {"Matmul": "matmul", "TPipe": "tpipe", "TQue": "tpipe", "TBuf": "tpipe", "GlobalTensor": "tensor",
               "LocalTensor": "tensor"}
_HEADER_CACHE = {}


def _headers(checkout):
    """[(relative path, text)] of include/**/*_intf.h first, then the other include/**/*.h."""
    if checkout not in _HEADER_CACHE:
        include = os.path.join(checkout, "include")
        first = sorted(glob.glob(os.path.join(include, "**", "*_intf.h"), recursive=True))
        rest = sorted(set(glob.glob(os.path.join(include, "**", "*.h"), recursive=True)) - set(first))
        out = []
        for path in first + rest:
            with open(path, encoding="utf-8", errors="replace") as f:
                out.append((os.path.relpath(path, checkout), strip_comments_and_strings(f.read())))
        _HEADER_CACHE[checkout] = out
    return _HEADER_CACHE[checkout]


def devkit_prototypes(checkout, api):
    """(file, parameter types) of every `__aicore__ inline ... Name(...)` the checkout declares for api."""
    cls, _, name = api.rpartition("::")
    # The return type may carry macros with arguments, e.g. `__inout_pipe__(MTE2) void DataCopy(`.
    pattern = re.compile(r"__aicore__\s+inline\s+(?:[^;{}()]|\([^()]*\))*?\b%s\s*\(" % re.escape(name))
    found = []
    for rel, text in _headers(checkout):
        if cls and CLASS_FILES.get(cls, cls.lower()) not in rel.lower():
            continue
        for m in pattern.finditer(text):
            params = balanced_params(text, m.end() - 1)
            types = [normalize_type(p) for p in split_params(params) if p.strip() and p.strip() != "void"]
            found.append((rel, types))
    return found


def diff_against_devkit(checkout, table=TABLE):
    """[(api, ours, verdict)] where verdict is 'ok', 'not found' or the closest documented overloads."""
    report = []
    for api, sig in read_table(table):
        name = api.split("::")[-1]
        declaration = re.match(r"(#define|struct|enum|using|class|constexpr|see)\b", sig) or re.search(
            r"\b(class|struct)\s+\w+\s*$", sig)
        if declaration or not re.fullmatch(r"\w+", name) or "(" not in sig:
            continue  # types, enums, macros and operators: listed for provenance, not diffed
        ours = param_types(sig)
        protos = devkit_prototypes(checkout, api)
        if not protos:
            report.append((api, ours, "not found"))
        elif any(types == ours for _, types in protos):
            report.append((api, ours, "ok"))
        else:
            closest = sorted(protos, key=lambda p: abs(len(p[1]) - len(ours)))[:3]
            report.append((api, ours, "; ".join(f"{f}: ({', '.join(t)})" for f, t in closest)))
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("asc_devkit", nargs="?", help="path to an asc-devkit checkout (optional)")
    ap.add_argument("--kernels", default=KERNELS, help="kernel source tree to scan (default: ascendc/kernels)")
    args = ap.parse_args(argv)
    failed = False
    missing = unlisted_kernel_apis(args.kernels)
    for name, path in missing:
        print(f"UNLISTED {name} (used in {path}): add a row to ascendc/cpu_runtime/SIGNATURES.md")
    failed |= bool(missing)
    print(f"kernel APIs: {len(missing)} unlisted")
    if args.asc_devkit:
        report = diff_against_devkit(args.asc_devkit)
        for api, ours, verdict in report:
            if verdict != "ok":
                print(f"{'MISSING' if verdict == 'not found' else 'DIFF'} {api}({', '.join(ours)}): {verdict}")
        bad = [r for r in report if r[2] != "ok" and r[2] != "not found"]
        print(f"signatures: {len(report)} checked, {len(report) - len(bad)} match or absent, {len(bad)} differ")
        failed |= bool(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
