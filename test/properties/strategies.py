"""Shared pieces of the property tests: the example budget per test, seeds, dtypes and the drawing helpers.

Tensors are never drawn element by element: a test draws a seed and the shape/argument choices, then builds its
tensors from a torch.Generator with that seed (cheap, and a failing example stays reproducible from its printed
arguments). The example counts are sized so that the whole package runs in well under a minute on 2 cores; the
long profile (HYPOTHESIS_PROFILE=long) multiplies them by its PROFILES entry and draws new examples every run.
"""
import os

import torch
from hypothesis import strategies as st

from test.common.tiers import IS_FULL

PROFILES = {"ci": 1, "long": 25}  # profile name -> example multiplier
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "long" if IS_FULL else "ci")  # the full tier searches longer
MAX_TOKENS = 2147483647

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
dtype_names = st.sampled_from(sorted(DTYPES))
seeds = st.integers(0, 2**31 - 1)


def examples(n: int) -> int:
    """The example count of a test whose ci budget is n."""
    return n * PROFILES.get(PROFILE, 1)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(gen: torch.Generator, shape, dtype=torch.float32, std: float = 1.0) -> torch.Tensor:
    """Normal values drawn in float64, rounded to dtype (the references then see exactly the op's inputs)."""
    return (torch.randn(tuple(shape), generator=gen, dtype=torch.float64) * std).to(dtype)


def randint(gen: torch.Generator, low: int, high: int, shape=()) -> torch.Tensor:
    return torch.randint(low, high, tuple(shape), generator=gen)


def permutation(gen: torch.Generator, n: int) -> torch.Tensor:
    return torch.randperm(n, generator=gen)


@st.composite
def per_batch_lengths(draw, batch: int, max_len: int, min_len: int = 0):
    """A tuple of `batch` lengths in [min_len, max_len], zeros and full lengths included."""
    return tuple(draw(st.lists(st.integers(min_len, max_len), min_size=batch, max_size=batch)))


def broadcast_shape(draw, shape, min_rank: int = 1):
    """A shape that broadcasts to `shape` by the right-aligned rules and keeps its last dim: a suffix of at least
    min_rank dims of `shape`, every dim but the last either kept or 1."""
    rank = draw(st.integers(min_rank, len(shape)))
    tail = list(shape[len(shape) - rank:])
    for i in range(len(tail) - 1):
        if draw(st.booleans()):
            tail[i] = 1
    return tuple(tail)
