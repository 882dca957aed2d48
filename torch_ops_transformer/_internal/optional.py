"""Optional dependencies: importing one that is missing gives one line naming the package and its install command.

    transformers  the Hugging Face drop-in (hf.py) and `python -m torch_ops_transformer demo`   extra "hf"
    tqdm          the demo's progress bar (plain lines without it)                               extra "hf"
    matplotlib    `python -m torch_ops_transformer bench ... --plot PNG`                         extra "plot"

`require(package, needed_by)` imports the package or raises `MissingDependency` (an ImportError). The command-line
entry points (`python -m torch_ops_transformer ...`, `python -m torch_ops_transformer.bench ...`) turn it into that
one line on stderr and exit status 2, also when a worker process of the demo hit it.
"""
import importlib
import sys
from typing import Callable, List, Optional

# package -> (extra of torch_ops_transformer that installs it, the plain pip requirement the message names)
OPTIONAL = {
    "transformers": ("hf", "transformers==5.24.0"),
    "tqdm": ("hf", "tqdm"),
    "matplotlib": ("plot", "matplotlib"),
}


class MissingDependency(ImportError):
    """An optional package is not installed; str(e) is the one line to show."""

    def __init__(self, package: str, needed_by: str, detail: Optional[str] = None):
        requirement = OPTIONAL.get(package, (None, package))[1]
        line = f"{needed_by}: needs '{package}', which is not installed: pip install \"{requirement}\""
        if detail:
            line += f" [{detail}]"
        super().__init__(line, name=package)
        self.package = package


def require(package: str, needed_by: str):
    """Import and return `package`, or raise MissingDependency naming it."""
    try:
        return importlib.import_module(package)
    except ImportError as e:
        top = (e.name or "").split(".")[0]
        detail = None if top in ("", package) else f"importing it failed: {e}"
        raise MissingDependency(package, needed_by, detail) from None


def missing_package(error: BaseException) -> Optional[str]:
    """The optional package an ImportError is about (None for anything else)."""
    if isinstance(error, MissingDependency):
        return error.package
    if isinstance(error, ImportError):
        top = (error.name or "").split(".")[0]
        return top if top in OPTIONAL else None
    return None


def run_cli(main: Callable[[Optional[List[str]]], int], argv: Optional[List[str]], prog: str) -> int:
    """Run a command's main(argv); a missing optional package becomes one line on stderr and exit status 2."""
    try:
        return main(argv)
    except ImportError as e:
        package = missing_package(e)
        if package is None:
            raise
        message = str(e) if isinstance(e, MissingDependency) else str(MissingDependency(package, prog))
        print(message, file=sys.stderr, flush=True)
        return 2
