"""`python -m torch_ops_transformer oracle replay FILE`: a call the oracle saved (its CPU inputs, the device's
outputs, the report) recomputed by the CPU kernels on this machine — no device needed — and judged by the same rule.
Exit status 1 when the saved device result still disagrees (the mismatch reproduces), 0 when it now passes.
"""
import argparse
import sys

import torch

from . import OUR_NAMESPACE, judge, judged_run, reference_for_name


def replay(path: str) -> int:
    saved = torch.load(path, weights_only=False)
    op, args, kwargs, devs = saved["op"], saved["args"], saved["kwargs"], saved["device_outputs"]
    print(f"replaying {op} from {path}\nsaved report:\n{saved['report']}\n")
    reference = reference_for_name(op)
    if reference is None:
        print(f"no CPU reference for {op} in this build")
        return 2
    clone = (lambda x: x.clone() if isinstance(x, torch.Tensor) else x)
    a = [clone(x) for x in args]
    k = {n: clone(v) for n, v in kwargs.items()}
    func = getattr(torch.ops.npu_fa, op.split("::", 1)[1]).default if op.startswith(OUR_NAMESPACE + "::") else None
    run = judged_run(reference, func)
    try:
        cpus = run(*a, **k)
    except Exception as e:
        print(f"the CPU kernel raises {type(e).__name__}: {e}")
        return 1
    # Written arguments (caches) follow the outputs in the saved device list; compare what both sides have.
    bad = judge(op, func, run, (tuple(args), dict(kwargs)), cpus, devs[:len(cpus)])
    if bad is None:
        print("the saved device outputs now pass against the CPU kernels of this build")
        return 0
    print("\n".join([f"reproduced on CPU: output {bad.output}: {bad.what}"] + bad.details()))
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_ops_transformer oracle",
                                     description="the differential oracle's tools (docs/oracle.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="recompute a saved mismatching call on CPU and judge it again")
    rp.add_argument("file")
    ns = parser.parse_args(argv)
    return replay(ns.file)


if __name__ == "__main__":
    sys.exit(main())
