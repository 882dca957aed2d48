"""Tests of the Ascend C CPU runtime itself (ascendc/cpu_runtime), as torch-free C++ programs ascendc/tests/rt_*.cpp:
every vector instruction, data movement, buffer lifecycles, synchronisation, Matmul, counters and count-only mode
against scalar references, and seeded faults that must raise KernelCheckError naming the check.

Each RT_TEST(name) in a program is one pytest case; a program is built (cached by content) and run once per session.
"""
import concurrent.futures
import os
import re

import pytest

from test.npu import ascendc_programs

PROGRAMS = ["rt_vector_test", "rt_memory_sync_test", "rt_matmul_test", "rt_fault_test"]
TESTS_DIR = os.path.join(ascendc_programs.ROOT, "ascendc", "tests")


def _case_names(program):
    with open(os.path.join(TESTS_DIR, program + ".cpp")) as f:
        return re.findall(r"^RT_TEST\((\w+)\)", f.read(), flags=re.M)


def _build_and_run(program):
    exe = ascendc_programs.build(program, [f"ascendc/tests/{program}.cpp"], flags=["-O0"])  # compiles 2x faster
    proc = ascendc_programs.run(exe, timeout=120)
    results = {}
    for line in proc.stdout.splitlines():
        status, _, rest = line.partition(" ")
        name, _, why = rest.partition(":")
        if status in ("PASS", "FAIL"):
            results[name.strip()] = "ok" if status == "PASS" else why.strip()
    # A clean run ends with the PASSED line; exit 1 = some case failed (reported per case); anything else is a crash.
    if not ascendc_programs.passed(proc) and proc.returncode != 1:
        results["__crash__"] = f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return results


@pytest.fixture(scope="module")
def results():
    # The four programs compile independently: build them two at a time (the machine has 2 cores).
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(PROGRAMS, pool.map(_build_and_run, PROGRAMS)))


CASES = [(p, c) for p in PROGRAMS for c in _case_names(p)]


@pytest.mark.parametrize("program,case", CASES, ids=[f"{p}:{c}" for p, c in CASES])
def test_runtime_case(results, program, case):
    got = results[program]
    assert "__crash__" not in got or case in got, got.get("__crash__")
    assert got.get(case) == "ok", got.get(case, f"did not run: {got.get('__crash__', '')}")


def test_every_case_is_collected(results):
    for program in PROGRAMS:
        assert "__crash__" not in results[program], results[program]["__crash__"]
        assert set(results[program]) - {"__crash__"} == set(_case_names(program)), program
