"""`python -m torch_ops_transformer demo`: a Llama generates with three attention implementations.

LLaMA serving with FlashAttention swapped in, on a CPU: the same Llama — random
weights from a seeded LlamaConfig, or a local Hugging Face directory with --model-path — runs prefill and greedy
generation with attention "eager" (transformers' matmul-softmax-matmul), "sdpa" (PyTorch's
F.scaled_dot_product_attention) and "npu_fa" (ours: prefill through the FlashAttention kernel, decode steps through
the decode kernel). The generated tokens must be identical; a table of four serving metrics is printed:

- prefill peak memory: MEASURED as the growth of the peak resident set (VmHWM) during one prefill forward, each
  implementation in its own fresh process, after a warm-up (so one-time allocations are not counted);
- first-token latency: time from calling generate() to the logits of the first new token (the prefill);
- decode throughput / per-token latency: over the remaining greedy steps, each one token per sequence.

Each implementation runs in its own process, one after the other (2-core machine: never concurrently);
--same-process runs them all in this one. transformers is needed (pip install "transformers==5.24.0"); without it,
in this process or in a worker, the command prints one line saying so and exits with status 2.
"""
import argparse
import multiprocessing
import os
import statistics
import sys
import time
import traceback
from typing import Dict, List, Optional

import torch

from .._internal.optional import MissingDependency, missing_package, require
from ..integrations import sdpa
from .common import format_table, peak_memory_growth

IMPLS = ("eager", "sdpa", "npu_fa")
LABELS = {"eager": "eager (matmul+softmax)", "sdpa": "sdpa (PyTorch)", "npu_fa": "npu_fa (ours)"}
STAGES = ("load", "warm-up", "memory", "generate")
PROG = "torch_ops_transformer demo"

# A long prompt (4096 tokens) and a narrow model, so attention is about half of the prefill work; head_dim 128
# as in LLaMA-7B. About a minute on 2 cores.
DEFAULTS = dict(batch=1, prompt_len=4096, new_tokens=32, layers=2, hidden=512, heads=4, kv_heads=2,
                intermediate=1024, vocab=2048, dtype="fp32", reps=3)
QUICK = dict(batch=2, prompt_len=64, new_tokens=4, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128,
             vocab=256, reps=1)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m torch_ops_transformer demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, help=f"sequences generated together (default {DEFAULTS['batch']})")
    p.add_argument("--prompt-len", type=int, help=f"prompt tokens per sequence (default {DEFAULTS['prompt_len']})")
    p.add_argument("--new-tokens", type=int, help=f"greedy tokens generated (default {DEFAULTS['new_tokens']})")
    p.add_argument("--dtype", choices=("fp32", "bf16"), help="model and activation dtype (default fp32)")
    p.add_argument("--layers", type=int, help=f"decoder layers (default {DEFAULTS['layers']})")
    p.add_argument("--hidden", type=int, help=f"hidden size (default {DEFAULTS['hidden']})")
    p.add_argument("--heads", type=int, help=f"attention heads (default {DEFAULTS['heads']})")
    p.add_argument("--kv-heads", type=int, help=f"key/value heads, < heads for GQA (default {DEFAULTS['kv_heads']})")
    p.add_argument("--intermediate", type=int, help=f"MLP size (default {DEFAULTS['intermediate']})")
    p.add_argument("--vocab", type=int, help=f"vocabulary size (default {DEFAULTS['vocab']})")
    p.add_argument("--reps", type=int, help="timed generate() runs per implementation, median reported (default 3)")
    p.add_argument("--model-path", help="local Hugging Face model directory (real weights; nothing is downloaded)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads in every worker (default: all cores)")
    p.add_argument("--quick", action="store_true", help="tiny configuration: checks the command works in seconds")
    p.add_argument("--same-process", action="store_true",
                   help="run every implementation in this process (faster start; memory growth is then less "
                        "isolated, since freed memory from earlier runs can be reused)")
    args = p.parse_args(argv)
    base = dict(DEFAULTS, **(QUICK if args.quick else {}))
    for name, value in base.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("batch", "prompt_len", "new_tokens", "layers", "hidden", "heads", "kv_heads", "intermediate",
                 "vocab", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.new_tokens < 2:
        p.error(f"--new-tokens must be >= 2 (one prefill token and at least one decode step), got {args.new_tokens}")
    if args.model_path is not None and not os.path.isfile(os.path.join(args.model_path, "config.json")):
        p.error(f"--model-path must be a local Hugging Face model directory (with config.json), got {args.model_path!r}")
    if args.model_path is None and (args.hidden % args.heads or args.heads % args.kv_heads):
        p.error(f"--hidden ({args.hidden}) must be a multiple of --heads ({args.heads}) and --heads a multiple of "
                f"--kv-heads ({args.kv_heads})")
    return args


# ----------------------------------------------------------------------------------------------------------------
# Worker: one implementation in a fresh process


def _build_model(args, impl: str):
    from transformers import AutoModelForCausalLM, LlamaConfig  # lazy: transformers (optional, checked by main)

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if args.model_path:
        model = AutoModelForCausalLM.from_pretrained(args.model_path, local_files_only=True, dtype=dtype,
                                                     attn_implementation=impl)
    else:
        cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=args.kv_heads, max_position_embeddings=args.prompt_len + args.new_tokens)
        torch.manual_seed(0)  # the same random weights in every worker
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).to(dtype)
    return model.eval()


class _StepClock:
    """A logits processor that only timestamps: generate() calls it once per step, right after the forward."""

    def __init__(self):
        self.stamps: List[float] = []

    def __call__(self, input_ids, scores):
        self.stamps.append(time.perf_counter())
        return scores


def _generate(model, ids, new_tokens: int):
    """Greedy generation of exactly `new_tokens` tokens; returns (tokens, first-token s, decode s per step)."""
    from transformers import LogitsProcessorList  # lazy: transformers (optional, checked by main)

    clock = _StepClock()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             pad_token_id=model.config.pad_token_id or 0, logits_processor=LogitsProcessorList([clock]))
    first = clock.stamps[0] - start
    per_step = (clock.stamps[-1] - clock.stamps[0]) / (len(clock.stamps) - 1)
    return out[:, ids.shape[1]:].tolist(), first, per_step


def run_worker(args, impl: str, report) -> None:
    """Everything one implementation does; progress and the result go to `report` (a queue)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    require("transformers", PROG)  # a missing one is MissingDependency here, reported as one line by the parent
    from ..integrations.hf import register_hf_attention  # lazy: transformers (hf.py imports it)

    register_hf_attention()  # registered already if transformers was imported; idempotent
    sdpa.route_counts.clear()
    model = _build_model(args, impl)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(1))
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    report.put(("stage", impl, "warm-up"))
    _generate(model, ids[:, : min(32, args.prompt_len)], 2)  # thread pools, kernel tables, allocator
    report.put(("stage", impl, "memory"))
    with torch.no_grad():
        mem = peak_memory_growth(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1))
    report.put(("stage", impl, "generate"))
    runs = [_generate(model, ids, args.new_tokens) for _ in range(args.reps)]
    tokens = runs[0][0]
    if any(r[0] != tokens for r in runs):
        raise RuntimeError(f"{impl}: repeated greedy generation is not deterministic")
    routes = dict(sdpa.route_counts)  # which of our kernels npu_fa used, over all runs of this worker
    report.put(("result", impl, dict(tokens=tokens, memory=mem, checksum=checksum, threads=torch.get_num_threads(),
                                     routes=routes,
                                     first=statistics.median(r[1] for r in runs),
                                     per_step=statistics.median(r[2] for r in runs))))


def _worker_entry(args, impl, report):
    try:
        run_worker(args, impl, report)
    except BaseException as e:  # the parent reports it; a silent dead worker would hang the queue
        package = missing_package(e)
        if package is not None:  # the parent prints one line, no traceback
            report.put(("missing", impl, package))
            return
        report.put(("error", impl, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


# ----------------------------------------------------------------------------------------------------------------
# Parent: progress bar, token check, table


class _Progress:
    """tqdm when installed, plain lines otherwise (tqdm is optional: the bar is the only thing it adds)."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm  # lazy: tqdm (optional: plain lines without it)

            self.bar = tqdm(total=total, desc="demo", unit="stage", file=sys.stderr)
        except ImportError:
            self.bar = None

    def step(self, text: str) -> None:
        if self.bar is None:
            print(f"  {text}", flush=True)
        else:
            self.bar.set_description(text)
            self.bar.update(1)

    def close(self, failed: bool = False) -> None:
        if self.bar is not None:
            if failed:  # clear the bar, so that the error is the last thing on the terminal
                self.bar.leave = False
            self.bar.close()


class _Inline:
    """The queue interface for --same-process: messages are handled as soon as they are put."""

    def __init__(self, handle):
        self.put = handle


def _handle(message, progress, results) -> bool:
    """Progress or result of a worker; True once the worker is finished."""
    kind, who, payload = message
    if kind == "stage":
        progress.step(f"{who}: {payload}")
        return False
    if kind == "missing":
        raise MissingDependency(payload, PROG)
    if kind == "error":
        raise RuntimeError(f"demo worker for attention '{who}' failed:\n{payload}")
    results[who] = payload
    return True


def run_all(args) -> Dict[str, dict]:
    ctx = multiprocessing.get_context("spawn")
    progress = _Progress(len(IMPLS) * len(STAGES))
    results: Dict[str, dict] = {}
    failed = True
    try:
        for impl in IMPLS:
            progress.step(f"{impl}: load")
            if args.same_process:
                run_worker(args, impl, _Inline(lambda m: _handle(m, progress, results)))
                continue
            report = ctx.Queue()
            proc = ctx.Process(target=_worker_entry, args=(args, impl, report))
            proc.start()
            try:
                while not _handle(report.get(), progress, results):
                    pass
            finally:
                proc.join()
        failed = False
    finally:
        progress.close(failed)
    return results


def check_tokens(results: Dict[str, dict]) -> List[str]:
    """Mismatch descriptions (empty when every implementation generated the same tokens)."""
    problems = []
    ref = results[IMPLS[0]]
    for impl in IMPLS[1:]:
        if results[impl]["checksum"] != ref["checksum"]:
            problems.append(f"{impl}: model weights differ from {IMPLS[0]}'s (checksum)")
        for b, (mine, theirs) in enumerate(zip(results[impl]["tokens"], ref["tokens"])):
            if mine != theirs:
                pos = next(i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y)
                problems.append(f"{impl} vs {IMPLS[0]}: sequence {b} differs from new token {pos} "
                                f"({mine[pos]} vs {theirs[pos]})")
    return problems


def table(results: Dict[str, dict], batch: int) -> str:
    mib = {k: r["memory"] / 2**20 for k, r in results.items()}
    first = {k: r["first"] * 1e3 for k, r in results.items()}
    step = {k: r["per_step"] * 1e3 for k, r in results.items()}
    tps = {k: batch / r["per_step"] for k, r in results.items()}

    def ratio(values, other, higher_is_better=False):
        ours = values["npu_fa"]
        x = ours / values[other] if higher_is_better else values[other] / max(ours, 1e-9)
        return f"{x:.2f}x"

    rows = []
    for name, values, fmt, hib in (("prefill peak memory growth (MiB, measured RSS)", mib, "{:.0f}", False),
                                   ("first-token latency (ms)", first, "{:.1f}", False),
                                   ("decode throughput (tokens/s)", tps, "{:.1f}", True),
                                   ("decode per-token latency (ms)", step, "{:.2f}", False)):
        rows.append([name] + [fmt.format(values[i]) for i in IMPLS]
                    + [ratio(values, "eager", hib), ratio(values, "sdpa", hib)])
    return format_table(["metric"] + [LABELS[i] for i in IMPLS] + ["ours vs eager", "ours vs sdpa"], rows)


def describe(args) -> str:
    if args.model_path:
        model = f"model {args.model_path}"
    else:
        model = (f"random Llama: {args.layers} layers, hidden {args.hidden}, heads {args.heads}/{args.kv_heads} "
                 f"(head_dim {args.hidden // args.heads}), MLP {args.intermediate}, vocab {args.vocab}")
    return (f"{model}, {args.dtype}; batch {args.batch}, prompt {args.prompt_len} tokens, "
            f"{args.new_tokens} greedy new tokens, median of {args.reps} generate() runs")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    require("transformers", PROG)  # before any output; the workers check again (MissingDependency -> one line)
    print(f"# demo: {describe(args)}", flush=True)
    start = time.perf_counter()
    results = run_all(args)
    threads = results[IMPLS[0]]["threads"]
    where = "all in this process" if args.same_process else "each implementation in a fresh process"
    print(f"# {threads} threads, {where}, {time.perf_counter() - start:.0f} s total")
    print(table(results, args.batch))
    print("speed-up columns: > 1 means ours is better (less memory, lower latency, more tokens/s). "
          "Memory = growth of the peak resident set during one prefill forward (VmHWM, after a warm-up), "
          "whole model: weights are excluded, activations and the KV cache included.")
    routes = results["npu_fa"].get("routes") or {}
    print("npu_fa attention calls: " + (", ".join(f"{k} {v}" for k, v in sorted(routes.items())) or "none"))
    problems = check_tokens(results)
    if problems:
        print("\n!!! GENERATED TOKENS DIFFER BETWEEN ATTENTION IMPLEMENTATIONS !!!", file=sys.stderr)
        for line in problems:
            print(f"!!! {line}", file=sys.stderr)
        return 1
    n = len(results[IMPLS[0]]["tokens"][0])
    print(f"generated tokens identical for {', '.join(IMPLS)} ({args.batch} x {n} tokens)")
    return 0
