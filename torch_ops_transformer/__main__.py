"""`python -m torch_ops_transformer <command>`:

  demo   a Llama generates with eager / PyTorch SDPA / our attention; identical tokens, a table of serving metrics
  bench  the benchmark tables (same as `python -m torch_ops_transformer.bench`)
  tune   tune the CPU FlashAttention tile sizes of the common shapes on this machine, print the measured table and
         write the per-machine cache (docs/attention.md, "Block-size tuning")
  oracle `oracle replay FILE`: recompute a call the differential oracle saved on CPU and judge it again
         (docs/oracle.md)

`python -m torch_ops_transformer <command> --help` lists a command's options. A missing optional package
(transformers for demo, matplotlib for bench --plot) prints one line with its install command and exits with 2.
"""
import sys

from ._internal.optional import run_cli

COMMANDS = ("demo", "bench", "tune", "oracle")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    # lazy: each command imports only what it needs (demo: transformers; bench: the peers; tune: nothing more)
    if command == "demo":
        from .bench.demo import main as run  # lazy: see above
    elif command == "bench":
        from .bench.__main__ import main as run  # lazy: see above
    elif command == "tune":
        from .attention.tuning import main as run  # lazy: see above
    elif command == "oracle":
        from .oracle.replay import main as run  # lazy: see above
    else:
        print(f"unknown command {command!r}; expected one of {', '.join(COMMANDS)}\n{__doc__}", file=sys.stderr)
        return 2
    # A missing optional package (transformers, matplotlib) is one line on stderr and exit status 2.
    return run_cli(run, rest, f"torch_ops_transformer {command}")


if __name__ == "__main__":
    sys.exit(main())
