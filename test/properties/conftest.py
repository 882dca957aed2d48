"""properties/: hypothesis settings for this package, registered once. The default profile "ci" is seeded
(derandomize: the same examples every run), keeps no example database in the checkout, has no deadline (a shared
machine's timings are noisy) and prints the reproduction blob of a failure; each test sets its own example count
through strategies.examples(). HYPOTHESIS_PROFILE=long runs a 25 times longer, unseeded local search."""
import os
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, settings

from test.properties.strategies import PROFILE, PROFILES

# A failure makes hypothesis write a patch file under its storage directory (./.hypothesis by default): keep it out
# of the checkout.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "npu_fa_hypothesis"))
_COMMON = dict(deadline=None, database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("long", derandomize=False, **_COMMON)
assert PROFILE in PROFILES, f"HYPOTHESIS_PROFILE must be one of {sorted(PROFILES)}; got {PROFILE!r}"
settings.load_profile(PROFILE)


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    """Single-threaded kernels: the examples are tiny, so fanning them out over threads costs more than it gains and
    makes the run time depend on the machine's load (thread splits of large shapes are the grid tests' business)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
