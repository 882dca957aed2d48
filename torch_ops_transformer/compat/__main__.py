"""python -m torch_ops_transformer.compat --pythonpath | SCRIPT [ARGS...]  (see the package docstring)."""
import runpy
import sys

from . import PYTHONPATH_DIR, install

USAGE = ("usage: python -m torch_ops_transformer.compat --pythonpath   (prints the directory to put on PYTHONPATH)\n"
         "       python -m torch_ops_transformer.compat SCRIPT [ARGS...]  (runs SCRIPT with the torch_npu shim)")


def main(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "--pythonpath":
        print(PYTHONPATH_DIR)
        return 0
    install()
    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
