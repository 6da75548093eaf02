"""The shared harness of the per-family kernel benchmarks (benchmarks/bench_<family>.py).

    python benchmarks/bench_norms.py [--json FILE] [--rounds N] [--only NAME]

A benchmark is a function `cases(env) -> [Case]`: one operator at one shape each (every size from the config in
`env`), its implementations (the library's Triton launcher, PyTorch) as callables of the case's inputs, its truth
(qwen_lab.reference on the same inputs), and the bytes it must move and the FLOPs it must do. For each case:

1. every implementation runs once on fresh inputs and is checked against the truth (relative error, or the case's
   own comparison); one that disagrees is reported, and not timed;
2. on a GPU each is timed as the model runs it: calls captured back to back in one CUDA Graph after a warm-up and
   replayed (qwen_lab.kernels.graph_time_us), cycling through copies of the inputs that together exceed twice the L2
   cache, so that each call reads from memory as the floors assume; the median of --rounds rounds. An
   implementation that synchronises with the host cannot be captured: it is timed eagerly with CUDA events, and its
   row says so;
3. each row gets GB/s and TFLOP/s, and their shares of the floors measured in the same run (qwen_lab.bench:
   the copy bandwidth, bytes read + written; the dense matmul rate in the model's dtype).

A case may also carry notes (what a kernel's tuning picked, asked after its implementation is timed: the row's
"note"), a time limit (a long sweep runs only while the benchmark has run less than that long) and `on_request` (a
sweep that runs only when --only names it); a case left out is listed, with why, in the result's "skipped".

The table goes to stdout, and with --json the result: {"gpu", "torch", "triton", "commit", "date", "floors", "rows",
"skipped", ...}, one row per (case, implementation). On a CPU the same code runs the `tiny` config's shapes through
the Triton interpreter, one wall-clock run each: the rows say that this is not a measurement (it tests the benchmark
and its checks).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("QWEN_LAB_TUNING_CACHE", "0")  # report what this run times, not an earlier process's record

import torch  # noqa: E402

import qwen_lab  # noqa: E402,F401  (sets up the runtime before any kernel module is imported)
from qwen_lab import bench, runtime  # noqa: E402
from qwen_lab.config import QWEN35_0_8B, TINY, Qwen35Config  # noqa: E402

GRAPH = "cuda-graph"
EAGER = "cuda-events, eager (synchronises with the host: no graph)"
WALL = "wall-clock, interpreter: not a measurement"
CALLS_PER_GRAPH = 8     # at least this many calls per captured graph
MAX_COPIES = 16         # copies of a case's inputs cycled through (a small case's stay in L2 anyway)
REPLAYS = 20            # replays of the graph per round


@dataclass
class Env:
    """Where the benchmark runs and at which shapes: the 0.8B model's on a GPU (bf16, a 2048-token prompt), the
    tiny config's on a CPU (float32, 8 tokens)."""
    device: torch.device
    dtype: torch.dtype
    config: Qwen35Config
    tokens: int          # a prompt's tokens: the prefill shapes
    gpu: bool

    def randn(self, *shape, seed: int, scale: float = 1.0, dtype=None) -> torch.Tensor:
        """Seeded normal values of `shape` on the device, in the model dtype (or `dtype`): the same seed gives the
        same tensor, so each implementation gets identical inputs."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        x = torch.randn(*shape, generator=gen, device=self.device, dtype=torch.float32) * scale
        return x.to(dtype or self.dtype)

    def ints(self, high: int, *shape, seed: int) -> torch.Tensor:
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return torch.randint(0, high, shape, generator=gen, device=self.device)


def environment() -> Env:
    rt = runtime.choose()
    gpu = rt.device.type == "cuda"
    return Env(rt.device, rt.dtype, QWEN35_0_8B if gpu else TINY, 2048 if gpu else 8, gpu)


@dataclass
class Case:
    """One operator at one shape. `inputs(seed)` -> a fresh dict of inputs (in-place operators change theirs);
    `impls`: implementation name -> fn(inputs) returning what is checked (a tensor, or a tuple of them: an in-place
    operator returns what it wrote); `truth`: fn(inputs), the reference's result. `bytes`: the least one call must
    read and write; `flops`: what it must compute (0 for data movement). `eager`: implementations known to
    synchronise with the host (timed without a graph). `compare(got, want)` -> an error to hold against `tol`
    (default: the relative error of the outputs, tol by dtype). `notes`: implementation name -> fn() returning a
    line for its row, asked once it is timed (e.g. the config its tuning picked). `time_limit_s`: left out once
    the benchmark has run this many seconds (a sweep that fills the time left). `on_request`: run only when
    --only names it (a sweep too long for every run)."""
    name: str
    shape: str
    inputs: Callable[[int], dict]
    impls: dict[str, Callable[[dict], Any]]
    truth: Callable[[dict], Any]
    bytes: int = 0
    flops: int = 0
    eager: frozenset = frozenset()
    compare: Callable[[Any, Any], float] | None = None
    tol: float | None = None
    notes: dict[str, Callable[[], str | None]] = field(default_factory=dict)
    time_limit_s: float | None = None
    on_request: bool = False


def relative_error(got, want) -> float:
    """The largest over the outputs of ||got - want|| / ||want|| (float64; inf for a shape mismatch or a NaN)."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    if len(got) != len(want):
        return math.inf
    worst = 0.0
    for g, w in zip(got, want):
        if tuple(g.shape) != tuple(w.shape):
            return math.inf
        g, w = g.double(), w.double()
        err = float((g - w).norm() / w.norm().clamp_min(1e-30))
        worst = max(worst, err if math.isfinite(err) else math.inf)
    return worst


def default_tol(dtype) -> float:
    return 1e-4 if dtype == torch.float32 else 2e-2


def check(case: Case, env: Env) -> tuple[dict[str, float], dict[str, str]]:
    """Each implementation's error against the case's truth, each run on fresh inputs of the same seed, and what
    an implementation that raised said (its error is then inf)."""
    errors, raised = {}, {}
    with torch.inference_mode():
        want = case.truth(case.inputs(0))
        for name, fn in case.impls.items():
            try:
                errors[name] = (case.compare or relative_error)(fn(case.inputs(0)), want)
            except Exception as e:   # reported in its row; the other implementations still run
                errors[name], raised[name] = math.inf, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    if env.gpu:
        torch.cuda.synchronize()
    return errors, raised


def copies_for(case: Case, env: Env) -> int:
    """Copies of the inputs to cycle through: together at least twice the L2 cache, at most MAX_COPIES."""
    if not env.gpu or case.bytes <= 0:
        return 1
    l2 = getattr(torch.cuda.get_device_properties(env.device), "L2_cache_size", 50 << 20) or (50 << 20)
    return max(1, min(MAX_COPIES, math.ceil(2 * l2 / case.bytes)))


def time_impl(fn, inputs: list, env: Env, rounds: int, eager: bool) -> tuple[list[float], str]:
    """Microseconds per call of fn over the inputs' copies, per round, and how they were timed."""
    from qwen_lab.kernels import graph_time_us

    calls = [lambda d=inputs[i % len(inputs)]: fn(d) for i in range(max(len(inputs), CALLS_PER_GRAPH))]
    with torch.inference_mode():
        if not env.gpu:
            t0 = time.perf_counter()
            fn(inputs[0])
            return [(time.perf_counter() - t0) * 1e6], WALL
        if not eager:
            try:
                return [graph_time_us(calls, warmup=r == 0, replays=REPLAYS) for r in range(rounds)], GRAPH
            except RuntimeError:   # a capture refused (a host synchronisation): timed eagerly below, and said
                torch.cuda.synchronize()
        for call in calls:   # warm-up
            call()
        times = []
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(REPLAYS):
                for call in calls:
                    call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / (REPLAYS * len(calls)))
        return times, EAGER


def run_case(case: Case, env: Env, floors: dict, rounds: int) -> list[dict]:
    """The rows of one case: each implementation checked, then timed (if it passed)."""
    errors, raised = check(case, env)
    tol = case.tol if case.tol is not None else default_tol(env.dtype)
    inputs = [case.inputs(i) for i in range(copies_for(case, env))]
    rows = []
    for name, fn in case.impls.items():
        ok = errors[name] <= tol
        row = {"case": case.name, "shape": case.shape, "impl": name, "error": errors[name], "tol": tol, "ok": ok,
               "bytes": case.bytes, "flops": case.flops, "us": None, "us_rounds": [], "timing": None,
               "GBps": None, "TFLOPs": None, "copy_share": None, "matmul_share": None, "copies": len(inputs),
               "note": raised.get(name)}
        if ok:
            times, how = time_impl(fn, inputs, env, rounds, name in case.eager)
            us = statistics.median(times)
            row.update(us=us, us_rounds=times, timing=how)
            if name in case.notes:
                try:
                    row["note"] = case.notes[name]()
                except Exception as e:   # a note is a record beside the time: its failure is said, not fatal
                    row["note"] = f"note failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            if case.bytes:
                row["GBps"] = case.bytes / (us * 1e-6) / 1e9
                if floors.get("copy_GBps"):
                    row["copy_share"] = row["GBps"] / floors["copy_GBps"]
            if case.flops:
                row["TFLOPs"] = case.flops / (us * 1e-6) / 1e12
                if floors.get("matmul_TFLOPs"):
                    row["matmul_share"] = row["TFLOPs"] / floors["matmul_TFLOPs"]
        rows.append(row)
    del inputs
    return rows


def skipped_why(case: Case, only: str | None, elapsed_s: float) -> str | None:
    """Why the case is left out of this run (None: it runs). A case --only does not name is left out unlisted."""
    if case.on_request and not only:
        return f"runs on request only: --only '{case.name}'"
    if case.time_limit_s is not None and elapsed_s >= case.time_limit_s:
        return f"past its time limit: the benchmark had run {elapsed_s:.0f} s of {case.time_limit_s:g}"
    return None


def run(cases: Callable[[Env], list], name: str, rounds: int = 5, only: str | None = None,
        progress: bool = True) -> dict:
    """Every case of the benchmark `cases` (those whose name contains `only`) -> the result as written to JSON."""
    started = time.perf_counter()
    env = environment()
    floors = bench.measure_floors(env.device, env.dtype)
    result = {"benchmark": name, **bench.run_info(env.device), "dtype": str(env.dtype).removeprefix("torch."),
              "config": env.config.name, "tokens": env.tokens, "rounds": rounds if env.gpu else 1,
              "floors": floors, "measured": env.gpu, "rows": [], "skipped": []}
    for case in cases(env):
        if only and only not in case.name:
            continue
        why = skipped_why(case, only, time.perf_counter() - started)
        if why:
            result["skipped"].append({"case": case.name, "shape": case.shape, "why": why})
            continue
        if progress:
            print(f"{name}: {case.name} {case.shape}", file=sys.stderr, flush=True)
        result["rows"] += run_case(case, env, floors, rounds)
    return result


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def format_table(result: dict) -> str:
    f = result["floors"]
    lines = [f"{result['benchmark']}: {result['config']} on {result['gpu']}, {result['dtype']}, torch "
             f"{result['torch']}, triton {result['triton']}, commit {result['commit'] or 'unknown'} "
             f"({result['date']})"]
    if not result["measured"]:
        lines.append("NOT A MEASUREMENT: no GPU here, the kernels ran through the Triton interpreter on tiny shapes "
                     "(this tests the benchmark and its checks)")
    elif f.get("copy_GBps"):
        lines.append(f"floors: copy {f['copy_GBps']:.0f} GB/s (read + written), matmul {f['matmul_TFLOPs']:.0f} "
                     f"TFLOP/s; median of {result['rounds']} rounds")
    lines += ["", "| case | shape | impl | us | GB/s | % copy | TFLOP/s | % matmul | error | timing |",
              "|" + " --- |" * 10]
    for r in result["rows"]:
        err = f"{r['error']:.1e}" + ("" if r["ok"] else f" > {r['tol']:g} FAILED")
        err = f"{err}; {r['note']}" if r["note"] and math.isfinite(r["error"]) else r["note"] or err
        share = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
        lines.append(f"| {r['case']} | {r['shape']} | {r['impl']} | {_fmt(r['us'], '.2f')} | "
                     f"{bench.format_rate(r['GBps'])} | {share(r['copy_share'])} | {bench.format_rate(r['TFLOPs'])} | "
                     f"{share(r['matmul_share'])} | {err} | {r['timing'] or 'not timed'} |")
    lines += [f"skipped: {s['case']} ({s['shape']}): {s['why']}" for s in result.get("skipped", [])]
    return "\n".join(lines)


def main(name: str, cases: Callable[[Env], list], doc: str, argv=None) -> int:
    """The command line of the benchmark `name` (its script's name): run its cases, print the table, write the
    JSON. Returns 1 if a check failed, else 0."""
    p = argparse.ArgumentParser(prog=f"python benchmarks/{name}.py",
                                description=" ".join(doc.split("\n\n")[0].split()))
    p.add_argument("--json", default=None, help="write the result as JSON to this file")
    p.add_argument("--rounds", type=int, default=5, help="timing rounds per implementation, median (default 5)")
    p.add_argument("--only", default=None, help="only the cases whose name contains this text")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: expected at least 1")
    folder = os.path.dirname(os.path.abspath(args.json)) if args.json else None
    if folder and not os.path.isdir(folder):
        p.error(f"--json {args.json}: the folder {folder} does not exist")
    result = run(cases, name, args.rounds, args.only)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    failed = [f"{r['case']} ({r['shape']}) {r['impl']}" for r in result["rows"] if not r["ok"]]
    if failed:
        print("checks failed (not timed): " + "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0
