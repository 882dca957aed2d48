"""Run selected `case_*` functions of test modules on the simulated npu device, in this (child) process.

`python -m test.npu.runner_worker '{"test.npu.rope_worker": ["case_a", ...], ...}'` enables
torch_ops_transformer.npu_sim, runs the listed cases module by module and prints one JSON line
{module: {case: "ok" | traceback}}. `python -m test.npu.runner_worker test.npu.rope_worker` runs every case of one
module. Used by runner.run_cases: renaming PrivateUse1 to "npu" is permanent for a process, so it never happens inside
the main pytest session.
"""
import importlib
import json
import sys
import traceback


def _selection(arg):
    if arg.lstrip().startswith("{"):
        return json.loads(arg)
    module = importlib.import_module(arg)
    return {arg: sorted(n for n in dir(module) if n.startswith("case_"))}


def main(arg):
    import torch_ops_transformer as tot

    tot.npu_sim.enable()
    results = {}
    for module_name, cases in _selection(arg).items():
        module = importlib.import_module(module_name)
        results[module_name] = {}
        for name in cases:
            try:
                getattr(module, name)()
                results[module_name][name] = "ok"
            except Exception:  # noqa: BLE001 - every failure is reported to the parent test
                results[module_name][name] = traceback.format_exc()
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
