"""Where the persistent decode step's time goes: each item's times from the kernel's trace (GPU only).

    python benchmarks/trace_persistent.py [--model qwen3.5-0.8b] [--position 2048] [--variants 4:16x256:n]
        [--programs 132,264] [--json FILE]

One kernel runs the whole step, so a kernel profiler sees one bar. With trace=True each item writes three stamps of
the GPU's global timer (reached, its wait met, its counter bumped). From them, per variant and program count: the
step's span, and per item kind the items, their mean and summed busy time (ready -> done) and the time programs
spent waiting before them (start -> ready), the bytes they read per us of busy time, and the median hop: from the
moment a waiting item's counter reached its need (its producers' done stamps) to its ready stamp; the share of the
span the programs were busy; and, for the first layers, when each group of items (a projection's tiles, a mixer's heads)
started and ended. Random weights (timing only), the cache filled to --position with zeros.
"""

import argparse
import collections
import json
import os
import statistics
import sys

import torch


def summarise(timeline: list[dict], programs: int, costs: list[float]) -> dict:
    """The span of the step, the share of it the programs were busy, and per item kind: items, busy and waiting
    time, and the bytes the kind's items read per us of their busy time (`costs`: each item's estimate, as
    the schedule's deal counts them), the rate of one program."""
    span = max(r["done"] for r in timeline)
    kinds = collections.defaultdict(lambda: {"items": 0, "busy_us": 0.0, "wait_us": 0.0, "bytes": 0.0})
    for r in timeline:
        k = kinds[r["kind"]]
        k["items"] += 1
        k["busy_us"] += r["done"] - r["ready"]
        k["wait_us"] += r["ready"] - r["start"]
        k["bytes"] += costs[r["item"]]
    for k in kinds.values():
        k["mean_busy_us"] = k["busy_us"] / k["items"]
        k["GBps_per_program"] = k["bytes"] / max(k["busy_us"], 1e-9) / 1e3
    busy = sum(r["done"] - r["ready"] for r in timeline)
    return {"span_us": span, "busy_share": busy / (span * programs), "kinds": dict(kinds)}


def handoffs(timeline: list[dict], items: list) -> dict:
    """Per item kind, the median time from the moment an item's wait was met on the GPU (the need-th of its
    counter's bumps, by its producers' done stamps) to its own ready stamp: what one counter hop costs (the
    release, the polls, the acquire), over the items that did wait (met after they were reached). `items`: the
    schedule's Item list (wait (counter, need), done counter)."""
    bumps = collections.defaultdict(list)
    for r in timeline:
        done = items[r["item"]].done
        if done is not None:
            bumps[done].append(r["done"])
    for times in bumps.values():
        times.sort()
    per_kind = collections.defaultdict(list)
    for r in timeline:
        wait = items[r["item"]].wait
        if wait is None:
            continue
        met = bumps[wait[0]][wait[1] - 1]
        if met > r["start"]:   # it did wait: the hop is on its path
            per_kind[r["kind"]].append(r["ready"] - met)
    return {k: statistics.median(v) for k, v in per_kind.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3.5-0.8b")
    p.add_argument("--position", type=int, default=2048)
    p.add_argument("--variants", default="4:16x256:n")
    p.add_argument("--programs", default="", help="comma-separated program counts (default: one per SM)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: the trace reads an NVIDIA GPU's global timer")
        return 0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_persistent import decode_options, parse_variants

    from qwen_lab.kernels.persistent import PersistentDecode
    from qwen_lab.model import load_model

    model = load_model(args.model, device="cuda", dtype=torch.bfloat16)
    counts = [int(c) for c in args.programs.split(",") if c] or [None]
    out, first_logits = [], None
    with torch.inference_mode():
        for name, options in parse_variants(args.variants):
            for programs in counts:
                cache = model.new_cache(args.position + 16)
                try:
                    step = PersistentDecode(model, cache, trace=True, **decode_options(options, programs))
                    for _ in range(3):
                        step.prime(1, args.position)
                        step.step()
                except Exception as e:
                    print(f"{name} programs={programs}: failed: {type(e).__name__}: {e}", flush=True)
                    continue
                # the same step as the first variant's (same weights, zero cache): timing wrong results means nothing
                logits = step.logits.float().clone()
                if first_logits is None:
                    first_logits = logits
                agree = float((logits - first_logits).norm() / first_logits.norm())
                spans, timelines = [], []
                for _ in range(5):
                    step.prime(1, args.position)
                    step.step()
                    tl_ = step.timeline()
                    timelines.append(tl_)
                    spans.append(max(r["done"] for r in tl_))
                # the median run, summarised; its whole timeline kept in the JSON
                mid = timelines[sorted(range(5), key=lambda i: spans[i])[2]]
                s = summarise(mid, step.schedule.programs, [it.cost for it in step.schedule.item_list])
                s["handoff_us"] = handoffs(mid, step.schedule.item_list)
                label = f"{name} P{step.schedule.programs}"
                print(f"\n{label}: span {s['span_us']:.1f} us (runs {', '.join(f'{x:.0f}' for x in spans)}), "
                      f"programs busy {100 * s['busy_share']:.0f}% of it; logits vs the first variant's: "
                      f"relative error {agree:.2e}", flush=True)
                print(f"  {'kind':<18}{'items':>6}{'mean busy us':>14}{'busy us':>10}{'wait us':>10}"
                      f"{'GB/s a program':>16}{'hop us':>8}")
                for kind, k in sorted(s["kinds"].items(), key=lambda kv: -kv[1]["busy_us"]):
                    hop = s["handoff_us"].get(kind)
                    print(f"  {kind:<18}{k['items']:>6}{k['mean_busy_us']:>14.2f}{k['busy_us']:>10.0f}"
                          f"{k['wait_us']:>10.0f}{k['GBps_per_program']:>16.1f}"
                          + (f"{hop:>8.2f}" if hop is not None else f"{'-':>8}"))
                # the layers one after another: when each group's first item got ready and its last one finished
                groups = collections.OrderedDict()
                for r in sorted(mid, key=lambda r: r["item"]):
                    key = r["name"].split(" rows")[0].split(" key head")[0].split(" kv head")[0]
                    g = groups.setdefault(key, [r["ready"], r["done"], 0])
                    g[0], g[1], g[2] = min(g[0], r["ready"]), max(g[1], r["done"]), g[2] + 1
                print("  first groups (ready of the first item -> done of the last, us):")
                for key, (a, b_, n_) in list(groups.items())[:24]:
                    print(f"    {key:<40}{n_:>5}{a:>10.1f}{b_:>10.1f}{b_ - a:>8.1f}")
                out.append({"variant": label, "relative_error_vs_first": agree, "spans_us": spans, "summary": s,
                            "groups": groups, "timeline": mid})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
