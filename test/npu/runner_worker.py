"""Run the `case_*` functions of one test module on the simulated npu device, in this (child) process.

`python -m test.npu.runner_worker <module>` enables torch_ops_transformer.npu_sim, runs every `case_*` of
<module> (test.npu.*_worker) and prints one JSON line {case: "ok" | traceback}. Used by runner.run_module: renaming
PrivateUse1 to "npu" is permanent for a process, so it never happens inside the main pytest session.
"""
import importlib
import json
import sys
import traceback


def main(module_name):
    import torch_ops_transformer as tot

    tot.npu_sim.enable()
    module = importlib.import_module(module_name)
    results = {}
    for name in sorted(n for n in dir(module) if n.startswith("case_")):
        try:
            getattr(module, name)()
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - every failure is reported to the parent test
            results[name] = traceback.format_exc()
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
