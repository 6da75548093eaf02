"""Same-process A/B of one public switch: the fast route's prefill and decode step with the switch set one way and
the other, alternated.

    python -m qwen_lab.bench ab --switch QWEN_LAB_PDL=0,1 [--rounds 3] [--model qwen3.5-0.8b]
                                [--prefill-len 2048] [--decode-steps 64] [--json out.json]

Each run is the `triton+cuda-graph` row of `python -m qwen_lab.bench` (bench.bench_qwen_lab): the prefill replayed
from its bucket graphs, the decode step from its graph, both captured afresh under the setting. After one untimed
run of each setting (compiling and tuning both), the settings alternate in both orders, A B B A A B ..., `--rounds`
runs of each: between machines, and between runs of one machine, the prefill moves by more than the 1-2% an A/B is
asked to see, and the order cancels a drift within the process. The report gives each setting's median prefill ms
and decode ms per token, and B's difference from A in %; the JSON holds every run.

The switches are those of qwen_lab.switches, named there or by their environment variable; each run sets its
setting with `switches.set` for that run alone. A switch of FIRST_CALL decides a choice a shape makes on its first
call (the decode GEMV's timed plans), which the process keeps: there the A/B times the first setting's picks both
ways, and says so.

On a CPU there is nothing to time: the command refuses, unless `--cpu-dry-run` runs one round of the tiny model
(the path of the command, for the tests; its times mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

from . import bench, runtime
from .switches import SWITCHES as ENGINE_SWITCHES
from .switches import switches


# Switches read at a shape's first call (the decode GEMV's timed plans), kept for the process.
FIRST_CALL = {"tune", "gemv_persist"}
# The values a setting may take: on and off (the switches' reading of an environment variable), or a number for the
# switches that hold one.
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
SWITCHES = {name: s for name, s in ENGINE_SWITCHES.items() if name != "tuning_cache"}


def switch_name(text: str) -> str | None:
    """The switch named `text`, by its name in qwen_lab.switches or by its environment variable; None if neither."""
    for name, s in SWITCHES.items():
        if text in (name, s.env):
            return name
    return None


def setting_value(name: str, text: str):
    """The value a setting's text gives the switch `name`: True / False, or an int where the switch holds one."""
    if text in ON or text in OFF:
        return text in ON
    default = SWITCHES[name].default
    if (not isinstance(default, bool) or name == "prep_persistent") and text.isdigit():
        return int(text)
    return None


def parse_switch(text: str) -> tuple[str, tuple[str, str]]:
    """"NAME=A,B" -> (NAME, (A, B)), NAME a switch of qwen_lab.switches or its environment variable; ValueError
    saying what was expected."""
    name, sep, values = text.partition("=")
    if not sep:
        raise ValueError(f"--switch {text}: expected NAME=A,B (e.g. QWEN_LAB_PDL=0,1 or pdl=off,on)")
    if switch_name(name) is None:
        known = ", ".join(s.env or n for n, s in SWITCHES.items())
        raise ValueError(f"--switch {text}: unknown switch {name!r}; expected one of {known} (or their names in "
                         f"qwen_lab.switches)")
    settings = tuple(v.strip().lower() for v in values.split(","))
    if len(settings) != 2 or not all(settings):
        raise ValueError(f"--switch {text}: expected two settings A,B after '=', got {values!r}")
    key = switch_name(name)
    for v in settings:
        if setting_value(key, v) is None:
            number = "" if isinstance(SWITCHES[key].default, bool) and key != "prep_persistent" else " nor a number"
            raise ValueError(f"--switch {text}: setting {v!r} is neither on ({'/'.join(ON)}) nor off "
                             f"({'/'.join(OFF)}){number}")
    if setting_value(key, settings[0]) == setting_value(key, settings[1]):
        raise ValueError(f"--switch {text}: A and B are the same setting; expected two different ones")
    return name, settings


def order(rounds: int) -> list[int]:
    """Which setting (0: A, 1: B) runs when: A B, then B A, alternating for `rounds` runs of each."""
    return [i if r % 2 == 0 else 1 - i for r in range(rounds) for i in (0, 1)]


def run(switch: str, settings: tuple[str, str], rounds: int = 3, source: str = "qwen3.5-0.8b",
        prefill_len: int = 2048, decode_steps: int = 64, cpu_dry_run: bool = False, seed: int = 0,
        log=print) -> dict:
    """Time the fast route with `switch` at each of `settings`, alternated (see the module's docstring) -> the
    result as written to JSON."""
    from .model import load_model
    from .plan import fast_plan

    from .errors import ConfigError

    rt = runtime.choose()
    gpu = rt.device.type == "cuda"
    model = load_model(source, backend="triton", rt=rt)
    limit = model.config.max_position_embeddings
    if prefill_len + decode_steps + 1 > limit:  # as bench.run: the prompt, the timed steps and one warm-up step
        raise ConfigError(f"prefill_len={prefill_len} + decode_steps={decode_steps} (+ 1 warm-up step) exceed the "
                          f"model's max_position_embeddings={limit} ({model.config.name}); shorten --prefill-len or "
                          "--decode-steps")
    plan = fast_plan(model)
    name = switch_name(switch)
    runs: dict[str, dict[str, list]] = {v: {"prefill_ms": [], "decode_ms": []} for v in settings}
    sequence = order(rounds)

    def one(value):   # the switch set for this run alone (qwen_lab.switches), the process as it was after it
        with switches.set(**{name: setting_value(name, value)}):
            return bench.bench_qwen_lab(plan, prefill_len, decode_steps, graph=gpu,
                                        gen=torch.Generator().manual_seed(seed))

    if not cpu_dry_run:
        for value in settings:     # compiling and tuning under each setting, untimed
            log(f"warm-up: {switch}={value}")
            one(value)
    for i in sequence:
        value = settings[i]
        r = one(value)
        runs[value]["prefill_ms"].append(r["prefill_ms"])
        runs[value]["decode_ms"].append(r["decode_ms"])
        log(f"{switch}={value}: prefill {r['prefill_ms']:.3f} ms, decode {r['decode_ms']:.4f} ms per token")
    median = {v: {k: statistics.median(ts) for k, ts in runs[v].items()} for v in settings}
    a, b = settings
    diff = {k: (median[b][k] - median[a][k]) / median[a][k] * 100 for k in ("prefill_ms", "decode_ms")}
    notes = []
    if name in FIRST_CALL:
        notes.append(f"{switch} acts at a shape's first call and the process keeps that call's picks: both settings "
                     f"ran with the picks of {switch}={settings[0]} (the first setting run); time "
                     f"each setting in a process of its own (python -m qwen_lab.bench with {switch} set)")
    if not gpu:
        notes.append("cpu dry run: the Triton interpreter, launched from Python; these times mean nothing")
    return {**bench.run_info(rt.device), "dtype": str(rt.dtype).removeprefix("torch."), "config": model.config.name,
            "prefill_len": prefill_len, "decode_steps": decode_steps, "method": "triton+cuda-graph" if gpu else
            "triton (interpreter)", "switch": switch, "settings": list(settings),
            "order": [settings[i] for i in sequence], "runs": runs, "median": median, "diff_pct": diff,
            "notes": notes}


def format_report(result: dict) -> str:
    a, b = result["settings"]
    s, m, d = result["switch"], result["median"], result["diff_pct"]
    lines = [f"{result['config']} on {result['gpu']}, {result['dtype']}, prefill {result['prefill_len']} tokens, "
             f"{result['method']}, {len(result['order']) // 2} run(s) of each setting ({result['date']})", "",
             f"| {s} | prefill ms (median) | decode ms/token (median) |", "| --- | --- | --- |"]
    for v in (a, b):
        lines.append(f"| {v} | {m[v]['prefill_ms']:.3f} | {m[v]['decode_ms']:.4f} |")
    lines.append(f"| {b} against {a} | {d['prefill_ms']:+.2f}% | {d['decode_ms']:+.2f}% |")
    lines += [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qwen_lab.bench ab",
                                description=" ".join(__doc__.split("\n\n")[0].split()),
                                epilog="switches (qwen_lab.switches, where each is described): "
                                       + ", ".join(f"{k} ({v.env})" if v.env else k for k, v in SWITCHES.items()))
    p.add_argument("--switch", required=True, help="NAME=A,B: the switch and its two settings, e.g. QWEN_LAB_PDL=0,1")
    p.add_argument("--rounds", type=int, default=3, help="timed runs of each setting (default 3)")
    p.add_argument("--model", default="qwen3.5-0.8b", help="a preset, snapshot directory or hub id "
                                                           "(default qwen3.5-0.8b)")
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--json", default=None, help="write every run and the medians as JSON to this file")
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="on a CPU: one round of the tiny model through the interpreter (tests the command)")
    args = p.parse_args(argv)
    try:
        name, settings = parse_switch(args.switch)
    except ValueError as e:
        p.error(str(e))
    for flag, value in (("--rounds", args.rounds), ("--prefill-len", args.prefill_len),
                        ("--decode-steps", args.decode_steps)):
        if value < 1:
            p.error(f"{flag} {value}: expected at least 1")
    folder = os.path.dirname(os.path.abspath(args.json)) if args.json else None
    if folder and not os.path.isdir(folder):
        p.error(f"--json {args.json}: the folder {folder} does not exist")
    gpu = runtime.choose().device.type == "cuda"
    if not gpu and not args.cpu_dry_run:
        print("error: bench ab times CUDA Graph replays on an NVIDIA GPU, and this machine has none (--cpu-dry-run "
              "runs one round of the tiny model, its times meaningless, to test the command)", file=sys.stderr)
        return 2
    if gpu and args.cpu_dry_run:
        p.error("--cpu-dry-run: this machine has a GPU; leave the flag out to time on it")
    if args.cpu_dry_run:
        source, prefill_len, decode_steps, rounds = "tiny", 4, 1, 1
    else:
        source, prefill_len, decode_steps, rounds = args.model, args.prefill_len, args.decode_steps, args.rounds
    from .errors import QwenLabError

    try:
        result = run(name, settings, rounds, source, prefill_len, decode_steps, cpu_dry_run=args.cpu_dry_run,
                     log=lambda line: print(line, file=sys.stderr, flush=True))
    except QwenLabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
