"""Where the time of one prefill and one decode step goes: every kernel of the captured step, timed by the profiler.

    python -m qwen_lab.profile_step [--model qwen3.5-0.8b] [--prefill-len 2048] [--out DIR]

Captures `model.step` for a prompt of --prefill-len tokens and for one decode token in CUDA Graphs (as the
benchmark does), replays each under torch.profiler and prints, per kernel name: launches per step, GPU time
per step (the kernels' spans, and their exclusive time, which adds up to the step under programmatic dependent
launch), and how much of the step no kernel was on the GPU at all (launch gaps); then the decode step's first
kernels in order. Writes profile.json under --out.
"""

import argparse
import json
import os
import sys
import time
from collections import defaultdict

import torch

import qwen_lab
from qwen_lab.graph import capture
from qwen_lab.plan import fast_plan
from qwen_lab.kernels import replay_us


def profile_replays(graph, reps: int) -> tuple[dict, float, float, list]:
    """Kernel name -> [launches, span us, exclusive us] per replay, the wall time per replay in us, the time some
    kernel was on the GPU per replay, and the first replay's kernels in order as (name, span us, exclusive us).

    A kernel's exclusive time is how far it moves the step's end: from the later of its start and the end of the
    kernel before it, to its own end. Kernels of one stream end in order, so these add up to the busy time even
    when programmatic dependent launch overlaps their spans."""
    from torch.profiler import ProfilerActivity, profile

    wall_us = replay_us(graph, reps)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    events = [(ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
              if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0]
    timed = exclusive(events)
    kernels: dict = defaultdict(lambda: [0, 0.0, 0.0])
    for name, span, excl in timed:
        k = kernels[name]
        k[0] += 1
        k[1] += span
        k[2] += excl
    order = timed[:len(timed) // max(reps, 1)]
    spans = [(start, end) for start, end, _ in events]
    return ({name: [n / reps, us / reps, ex / reps] for name, (n, us, ex) in kernels.items()}, wall_us,
            covered(spans) / reps, order)


def exclusive(events) -> list[tuple[str, float, float]]:
    """(name, span, exclusive time) of each kernel event (start, end, name), in start order. The exclusive time
    runs from the later of the kernel's start and the latest end before it, to its own end (0 if it ends
    earlier): how far the kernel moves the stream's end. Summed, they give the time some kernel was running."""
    out, prev_end = [], None
    for start, end, name in sorted(events):
        excl = end - start if prev_end is None else end - max(start, prev_end)
        out.append((name, end - start, max(excl, 0.0)))
        prev_end = end if prev_end is None else max(prev_end, end)
    return out


def covered(spans) -> float:
    """Length of the union of (start, end) spans: the time at least one kernel was on the GPU. With programmatic
    dependent launch a kernel starts before its predecessor ends (and its span includes that wait), so the
    spans overlap and their plain sum exceeds the wall time."""
    total, lo, hi = 0.0, None, None
    for start, end in sorted(spans):
        if hi is None or start > hi:
            total += 0.0 if hi is None else hi - lo
            lo, hi = start, end
        else:
            hi = max(hi, end)
    return total + (0.0 if hi is None else hi - lo)


def table(title: str, kernels: dict, wall_us: float, busy_us: float) -> list[str]:
    launches = sum(n for n, _, _ in kernels.values())
    summed = sum(us for _, us, _ in kernels.values())
    lines = [f"{title}: {wall_us:.1f} us per step; some kernel on the GPU {busy_us:.1f} us, none "
             f"{max(wall_us - busy_us, 0.0):.1f} us; {launches:.0f} launches whose own spans add up to {summed:.1f} us "
             f"(more than the step when kernels overlap under programmatic dependent launch: a kernel's span then "
             f"includes its wait for the one before). 'excl': from the later of the kernel's start and the end of "
             f"the kernel before it, to its end (these add up to the busy time); 'share' is of the exclusive time.",
             f"{'kernel':52s} {'per step':>8s} {'span us':>9s} {'excl us':>9s} {'excl each':>9s} {'share':>6s}"]
    for name, (n, us, ex) in sorted(kernels.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"{name[:52]:52s} {n:8.1f} {us:9.1f} {ex:9.1f} {ex / max(n, 1e-9):9.2f} {ex / wall_us:6.1%}")
    return lines


def sequence(order: list, first: int) -> list[str]:
    """The step's first kernels in launch order, with their spans and exclusive times."""
    lines = [f"the first {min(first, len(order))} kernels of one replay, in order: span us / exclusive us"]
    for i, (name, span, excl) in enumerate(order[:first]):
        lines.append(f"  {i:3d} {name[:52]:52s} {span:8.2f} {excl:8.2f}")
    return lines


def decode_plans(runners: int = 3) -> list[str]:
    """The plan the first-call timing gave each one-row GEMV shape of the model (its prologue, N, K), with the
    runners-up it timed: which tile shapes the decode step actually runs, and how close the others came."""
    from qwen_lab.kernels import gemm

    lines = ["decode GEMV plans (prologue, N, K): us per call of the fastest timed plans"]
    for key, plan in sorted(gemm.tuning._plans.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][0])):
        prologue, m_bucket, N, K = key[:4]
        if m_bucket != 1:
            continue
        timed = sorted(gemm.tuning.plan_times.get(key, {}).items(), key=lambda kv: kv[1])[:runners]
        name = gemm.PROLOGUE_NAMES.get(prologue, prologue)
        lines.append(f"  {name:8s} N={N:<6d} K={K:<5d} -> split {plan[0]} {plan[1]}")
        lines += [f"      {us:6.2f} us  split {split} {config}" for (split, config), us in timed]
    return lines + [""]


def tuned_picks() -> list[str]:
    """The configuration each autotuned kernel chose, per autotuning key: which tiles the profile above ran (a
    kernel's time in a profile can differ from the same kernel timed alone, and this says whether its tile did)."""
    from qwen_lab.kernels import attention, conv1d, deltanet, gemm

    tuners = {"matmul_kernel": gemm.matmul_kernel, "flash_attention_kernel": attention._tuned.get("prefill"),
              "flash_decode_split_kernel": attention._tuned.get("decode"),
              "conv1d_prefill_kernel": conv1d._tuned.get("prefill"), "chunk_prep_kernel": deltanet.chunk_prep_kernel,
              "chunk_scan_kernel": deltanet.chunk_scan_kernel,
              "conv_decode_step_kernel": deltanet.conv_decode_step_kernel}
    lines = ["autotuned kernels: the configuration chosen for each key (the key's values in the autotuner's order)"]
    for name, tuner in tuners.items():
        for key, config in sorted(getattr(tuner, "cache", {}).items(), key=lambda kv: str(kv[0])):
            shown = ", ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
            lines.append(f"  {name} [{shown}]: {config}")
    # the picks their launchers time where the kernels run (deltanet._pick_in_place), not an autotuner's
    where = {"chunk_scan_kernel": "timed beside the prep", "conv_decode_step_kernel": "timed in a graph"}
    for name, picks in deltanet.tuning._PICKS.items():
        for key, config in sorted(picks.items(), key=lambda kv: str(kv[0])):
            shown = ", ".join(str(k) for k in key)
            lines.append(f"  {name}, {where[name]} [{shown}]: {config}")
    return lines + [""]


def main(argv=None) -> int:
    from .errors import QwenLabError

    p = argparse.ArgumentParser(prog="python -m qwen_lab.profile_step", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3.5-0.8b", help="a preset, snapshot directory or hub id "
                                                          "(default: qwen3.5-0.8b)")
    p.add_argument("--prefill-len", type=int, default=2048, help="tokens of the profiled prompt (default: 2048)")
    p.add_argument("--reps", type=int, default=10, help="profiled replays of each graph (default: 10)")
    p.add_argument("--out", default=None, help="write profile.json into this folder")
    args = p.parse_args(argv)
    for flag, value in (("--prefill-len", args.prefill_len), ("--reps", args.reps)):
        if value < 1:
            p.error(f"{flag} {value}: expected at least 1")
    if not torch.cuda.is_available():
        print("skipped: profiling the captured steps needs an NVIDIA GPU")
        return 0
    t0 = time.time()
    try:
        model = qwen_lab.load_model(args.model, backend="triton")
    except QwenLabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    T = args.prefill_len
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (T,), generator=gen).to(model.device)
    positions = torch.arange(T, device=model.device)
    cache = model.new_cache(T + 8)
    token, pos = ids[-1:].clone(), torch.tensor([T], device=model.device)
    result = {"model": args.model, "prefill_len": T, "gpu": torch.cuda.get_device_name()}
    lines = []
    with torch.inference_mode():
        plan = fast_plan(model)
        g_prefill, _ = capture(lambda: plan.step(ids, positions, cache), warmup=2)
        g_decode, _ = capture(lambda: plan.step(token, pos, cache), warmup=2)
        for name, graph in (("prefill", g_prefill), ("decode", g_decode)):
            kernels, wall, busy, order = profile_replays(graph, args.reps)
            result[name] = {"wall_us": wall, "busy_us": busy, "kernels": kernels, "order": order}
            lines += table(f"{name} ({T} tokens)" if name == "prefill" else "decode (1 token)", kernels, wall,
                           busy) + [""]
            if name == "decode":  # the embedding, layers 0-4 (3: the first attention layer) and the start of 5
                lines += sequence(order, 30) + [""]
    lines += decode_plans() + tuned_picks()
    print("\n".join(lines))
    print(f"{time.time() - t0:.0f} s")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "profile.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
