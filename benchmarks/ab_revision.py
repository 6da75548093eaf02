"""This checkout's fast route against another revision's, in one process on one GPU: the same logits (bitwise, in
deterministic mode with tuning off) and the time of a prefill and a decode step, both replayed from CUDA Graphs,
alternated over several rounds in both orders.

The other revision is a copy of its `qwen_lab` package renamed `qwen_lab_old` (its absolute imports rewritten), so
both packages load side by side:

    mkdir -p .ab && git archive REV qwen_lab | tar -x -C .ab && mv .ab/qwen_lab .ab/qwen_lab_old
    grep -rl 'qwen_lab\\.' .ab/qwen_lab_old | xargs sed -i 's/qwen_lab\\./qwen_lab_old./g'
    python benchmarks/ab_revision.py --old .ab [--rounds 6] [--json FILE]

Both models hold the very same weight tensors. Run on a GPU only.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys

import torch


def graph_ms(step, reps: int = 20) -> float:
    """Median ms of one replay of step() captured in a CUDA Graph (after the capture's own warm-up)."""
    from qwen_lab.graph import capture

    g, _ = capture(step, warmup=2)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del g
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="folder holding the other revision's package as qwen_lab_old")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: the A/B times CUDA Graphs on a GPU")
        return 0
    sys.path.insert(0, os.path.abspath(args.old))
    import qwen_lab
    from qwen_lab.model import Qwen35Model
    from qwen_lab.plan import fast_plan
    old_pkg = importlib.import_module("qwen_lab_old")
    old_model = old_pkg.load_model("qwen3.5-0.8b", backend="triton")
    new = fast_plan(Qwen35Model(qwen_lab.config.QWEN35_0_8B, old_model.weights, backend="triton"))
    runners = {"old": old_model, "new": new}
    T = args.prefill_len
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, new.config.vocab_size, (T,), generator=gen).to(new.device)
    positions = torch.arange(T, device=new.device)
    token, pos = ids[-1:].clone(), torch.tensor([T], device=new.device)
    result = {"gpu": torch.cuda.get_device_name(), "prefill_len": T, "bitwise": {}, "rounds": []}

    # 1. the same logits, bitwise, with every reduction in a fixed order and no timed choices
    os.environ["QWEN_LAB_DETERMINISTIC"], os.environ["QWEN_LAB_TUNE"] = "1", "0"
    logits = {}
    with torch.inference_mode():
        for name, m in runners.items():
            cache = m.new_cache(T + 8)
            out = [m.step(ids, positions, cache).clone()]
            for n in range(6):
                out.append(m.step(token, pos + n, cache).clone())
            logits[name] = out
    same = [bool(torch.equal(a, b)) for a, b in zip(logits["old"], logits["new"])]
    result["bitwise"] = {"prefill": same[0], "decode_steps": same[1:]}
    print(f"bitwise equal logits: prefill {same[0]}, decode steps {same[1:]}")
    del os.environ["QWEN_LAB_DETERMINISTIC"], os.environ["QWEN_LAB_TUNE"]

    # 2. the time of each, alternated: old new, new old, ...
    with torch.inference_mode():
        caches = {name: m.new_cache(T + 8) for name, m in runners.items()}
        for r in range(args.rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            row = {}
            for name in order:
                m, cache = runners[name], caches[name]
                prefill = graph_ms(lambda: m.step(ids, positions, cache))
                decode = graph_ms(lambda: m.step(token, pos, cache))
                row[name] = {"prefill_ms": prefill, "decode_ms": decode}
            result["rounds"].append(row)
            print(f"round {r}: " + ", ".join(f"{n} prefill {row[n]['prefill_ms']:.3f} ms decode "
                                             f"{row[n]['decode_ms']:.4f} ms" for n in order))
    for what in ("prefill_ms", "decode_ms"):
        med = {n: statistics.median(r[n][what] for r in result["rounds"]) for n in runners}
        result[what] = med
        print(f"{what}: old {med['old']:.4f}, new {med['new']:.4f} ({100 * (med['new'] / med['old'] - 1):+.2f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
