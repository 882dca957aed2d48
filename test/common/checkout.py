"""This checkout's root, and how a child process imports from it: its torch_ops_transformer (not another editable
install) and the `test` package (which would otherwise be the standard library's regression-test package)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pythonpath() -> str:
    """PYTHONPATH for a child process: this checkout first, then whatever this process was given."""
    return os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p])
