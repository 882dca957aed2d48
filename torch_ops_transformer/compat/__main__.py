"""python -m torch_ops_transformer.compat --pythonpath | SCRIPT [ARGS...]  (see the package docstring)."""
import sys

from . import PYTHONPATH_DIR, install, run_with_shim

USAGE = ("usage: python -m torch_ops_transformer.compat --pythonpath   (prints the directory to put on PYTHONPATH)\n"
         "       python -m torch_ops_transformer.compat SCRIPT [ARGS...]  (runs SCRIPT with the torch_npu shim)")


def main(argv) -> int:
    return run_with_shim(argv, USAGE, PYTHONPATH_DIR, install)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
