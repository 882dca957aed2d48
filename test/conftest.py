"""Global test setup: the package must be this checkout's (not another editable install); pytest's rootdir import
of the `test` package puts the checkout's root first on sys.path, which also makes tools/ importable. Fixtures of
one family live in its folder's conftest.py."""
import hashlib
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

# The suite never reads or writes the user's tuning cache: tiles come from the built-in choice unless a test
# tunes into its own directory (set before the package loads its cache at import).
os.environ["TORCH_OPS_TRANSFORMER_CACHE_DIR"] = tempfile.mkdtemp(prefix="tot-test-cache-")
os.environ.pop("TORCH_OPS_TRANSFORMER_TUNE", None)

import torch_ops_transformer  # noqa: E402
from test.common.checkout import ROOT  # noqa: E402

# Inductor's on-disk cache (default /tmp/torchinductor_<user>, shared by every checkout on the machine) keys a
# compiled graph without the schemas of the custom ops it calls: a graph compiled while an op had other arguments
# is reused and calls the op with arguments it no longer takes. The suite keeps one cache per op schema.
with open(os.path.join(ROOT, "native_functions.yaml"), "rb") as _yaml:
    _SCHEMA_DIGEST = hashlib.sha1(_yaml.read()).hexdigest()[:12]
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(ROOT, "build", f"torchinductor-{_SCHEMA_DIGEST}"))
from test.common.tiers import IS_FULL, TIER  # noqa: E402

assert os.path.dirname(os.path.dirname(os.path.abspath(torch_ops_transformer.__file__))) == ROOT, (
    f"tests must run against this checkout ({ROOT}); imported {torch_ops_transformer.__file__}")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: compiles with Inductor or runs larger shapes (deselect with -m 'not slow')")
    config.addinivalue_line("markers", "asan: index, stride and zero-size tests that `python -m tools.asan` also runs "
                                       "against the AddressSanitizer build (docs/sanitizers.md)")
    config.addinivalue_line("markers", "full: exhaustive variant, run only in the full tier (TOT_TEST_TIER=full, "
                                       "test/common/tiers.py, docs/testing.md)")


def pytest_report_header(config):
    return f"test tier: {TIER} (docs/testing.md)"


@pytest.hookimpl(tryfirst=True)  # before xdist's worker turns the groups into node-id suffixes
def pytest_collection_modifyitems(config, items):
    """The default tier deselects what is marked `full` (deselected, not skipped: the summary counts them apart);
    under pytest-xdist, the work is grouped for `--dist loadgroup`."""
    if not IS_FULL:
        kept = [item for item in items if item.get_closest_marker("full") is None]
        if len(kept) != len(items):
            config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("full") is not None])
            items[:] = kept
    if hasattr(config, "workerinput"):  # an xdist worker (its own config says dist "no"; the controller schedules)
        _group_for_xdist(items)


def _group_for_xdist(items):
    """One xdist group per test module (a module-scoped fixture, e.g. a compiled C++ program, then runs once), except
    the simulated-npu cases: they share one session-scoped child process (test/npu/conftest.py), so they form one
    group, placed first because it is the longest (the scheduler hands out groups in collection order). Every worker
    collects the same items and reorders them identically, as xdist requires."""
    groups = {item: "npu-child" if "_npu_results" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
              for item in items}
    items.sort(key=lambda item: groups[item] != "npu-child")  # stable: the order within each part is kept
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item]))


@pytest.fixture(autouse=True)
def _fixed_seed():
    """Every test starts from the same global RNG state."""
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True, scope="module")
def _no_process_group_left_behind():
    """The MC2 opcheck cases (test/mc2/mc2_cases.py: single_rank_group) create a one-rank default group on first use
    and keep it for the cases after them; a module that then calls init_process_group itself
    (test/mc2/test_training.py) fails with "initialize the default process group twice". In one process the file
    order hid this; which module runs next in a pytest-xdist worker depends on the scheduling, so each module ends
    with no default group. Module scope, not test scope: a module-scoped fixture may hold a group for all of its
    module's tests (test/moe/test_distribute.py), and this fixture, set up first, is torn down after it."""
    yield
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def dynamo_reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
