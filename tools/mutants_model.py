"""One mutant of `python -m tools.mutants` (the catalogue is tools/mutants_catalog.py)."""
from dataclasses import dataclass
from typing import Tuple

# Paths whose change needs `setup.py build_ext` (C++ sources, the op schema and the generator that reads it).
BUILD_INPUTS = ("aten_ops/", "ascendc/", "native_functions.yaml", "tools/codegen/", "setup.py")


@dataclass(frozen=True)
class Mutant:
    id: str
    layer: str
    family: str
    path: str       # relative to the checkout root
    old: str        # occurs exactly once in path
    new: str
    what: str       # the bug, in user terms
    tests: Tuple[str, ...]  # the pytest paths that should catch it

    def __post_init__(self):
        object.__setattr__(self, "tests", tuple(self.tests))

    @property
    def needs_build(self) -> bool:
        return self.path.startswith(BUILD_INPUTS)
