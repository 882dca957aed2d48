"""The two test tiers (docs/testing.md).

default  README's test command and CI: every op, rule, integration and error path, each semantic space once at
         covering-array depth.
full     TOT_TEST_TIER=full: also the tests and parameter combinations marked `full` (the full products, the
         torch_npu port on the simulated npu too, world size 4, larger shapes) and hypothesis's long profile.

A test or a parameter set joins the full tier with the `full` marker (`FULL` below, or `pytest.param(...,
marks=FULL)`); the default tier deselects it at collection. `pairwise()` marks the combinations of a product that a
pairwise covering array does not need.
"""
import itertools
import os
from typing import Dict, List, Sequence

import pytest

TIERS = ("default", "full")
TIER = os.environ.get("TOT_TEST_TIER", "default")
if TIER not in TIERS:
    raise SystemExit(f"TOT_TEST_TIER must be one of {TIERS}; got {TIER!r}")
IS_FULL = TIER == "full"

FULL = pytest.mark.full


def covering_pairs(axes: Dict[str, Sequence]) -> List[tuple]:
    """A pairwise covering array of the product of `axes` (every value of every axis meets every value of every
    other axis in at least one row), chosen greedily and deterministically: rows of the full product in order, each
    time the one that covers the most uncovered pairs. Rows are tuples in the order of `axes`."""
    values = list(axes.values())
    product = list(itertools.product(*values))
    if len(values) < 2:
        return product

    def pairs(row):
        return {(i, row[i], j, row[j]) for i, j in itertools.combinations(range(len(row)), 2)}

    uncovered = set().union(*(pairs(row) for row in product))
    chosen = []
    while uncovered:
        best = max(product, key=lambda row: len(pairs(row) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


def pairwise(**axes) -> List:
    """pytest parameter sets for the full product of `axes` (for `@pytest.mark.parametrize(",".join(axes), ...)`,
    the same tests as one parametrize per axis); the rows outside covering_pairs(axes) carry the `full` marker. An
    axis is a list of values (ids: str(value)) or a dict {id: value}."""
    named = {name: values if isinstance(values, dict) else {str(v): v for v in values} for name, values in axes.items()}
    keep = set(covering_pairs({name: list(values) for name, values in named.items()}))
    return [pytest.param(*(named[n][i] for n, i in zip(named, ids)), id="-".join(ids),
                         marks=() if ids in keep else FULL)
            for ids in itertools.product(*named.values())]


def outside_marked_full(rows: Sequence[tuple], keep, key=lambda row: row) -> List:
    """pytest parameter sets of `rows`; those whose key(row) is not in `keep` carry the `full` marker."""
    return [pytest.param(*row, marks=() if key(row) in keep else FULL) for row in rows]


def full_only(*values) -> List:
    """Parameter values that run only in the full tier (e.g. world size 4, a larger shape)."""
    return [pytest.param(v, marks=FULL) for v in values]
