"""`python -m torch_ops_transformer.bench <table> [options]` — benchmark tables that print ratios vs the peer."""
import argparse
import sys

import torch

TABLES = ("attention", "prefill", "decode", "moe", "moe_routing")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torch_ops_transformer.bench", description=__doc__)
    p.add_argument("table", choices=TABLES + ("all",), help="which benchmark table to run")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: all cores)")
    p.add_argument("--reps", type=int, default=5, help="repetitions per contender (median reported)")
    p.add_argument("--quick", action="store_true", help="tiny shapes: checks the command runs (numbers meaningless)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tables = TABLES if args.table == "all" else (args.table,)
    for name in tables:
        if name == "attention":
            from . import attention

            attention.main(quick=args.quick, reps=1 if args.quick else args.reps)
        elif name == "prefill":
            from . import prefill

            prefill.main(quick=args.quick, reps=1 if args.quick else args.reps)
        elif name == "decode":
            from . import decode

            decode.main(quick=args.quick, reps=1 if args.quick else args.reps)
        elif name == "moe":
            from . import moe

            moe.main(quick=args.quick, reps=1 if args.quick else args.reps)
        elif name == "moe_routing":
            from . import moe_routing

            moe_routing.main(quick=args.quick, reps=1 if args.quick else args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
