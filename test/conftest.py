"""Test setup: import the package of this checkout (not another editable install) and expose tools/ (the generator
lives at the repository root, outside the package)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[0] != ROOT:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

import torch_ops_transformer  # noqa: E402

assert os.path.dirname(os.path.dirname(os.path.abspath(torch_ops_transformer.__file__))) == ROOT, (
    f"tests must run against this checkout ({ROOT}); imported {torch_ops_transformer.__file__}")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: compiles with Inductor or runs larger shapes (deselect with -m 'not slow')")


@pytest.fixture(autouse=True)
def _fixed_seed():
    """Every test starts from the same global RNG state."""
    torch.manual_seed(0)
    yield


@pytest.fixture
def dynamo_reset():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
