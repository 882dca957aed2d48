"""The mutation check's catalogue stays applicable as the code moves: every mutant's file exists, its `old` text
occurs exactly once there (tools.mutants refuses otherwise), and the tests it names exist. Running the mutants
themselves is `python -m tools.mutants` (docs/testing.md); this only keeps the catalogue from rotting."""
import os

import pytest

from test.common.checkout import ROOT
from tools.mutants_catalog import MUTANTS


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_mutant_applies_to_this_checkout(mutant):
    path = os.path.join(ROOT, mutant.path)
    assert os.path.isfile(path), f"{mutant.id}: {mutant.path} does not exist"
    with open(path, encoding="utf-8") as f:
        count = f.read().count(mutant.old)
    assert count == 1, f"{mutant.id}: `old` occurs {count} times in {mutant.path}, not once"
    assert mutant.new != mutant.old
    for test in mutant.tests:
        assert os.path.exists(os.path.join(ROOT, test.split("::")[0])), f"{mutant.id}: no test path {test}"


def test_mutant_ids_are_unique():
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids))
