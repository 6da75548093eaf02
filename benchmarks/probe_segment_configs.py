"""Probe: which of the scan-in-segments kernels goes wrong with which config, with and without PDL.

    python benchmarks/probe_segment_configs.py [--jobs 8]            (an NVIDIA GPU)

Each case runs in its own process (a kernel that faults leaves its process's CUDA context unusable): one kernel of
the pair (chunk_segment_kernel, chunk_segment_scan_kernel) with one of its GPU configs, the other with the config
that forced on both came out right, on two shapes: (300 tokens, 2 heads of 64, segments of 2 chunks) and
Qwen3.5-0.8B's (2048 tokens, 16 heads of 128, segments of 8). Each case compares the output and final state with
the one-chain scan's in the same process and prints the relative errors, or how the process ended.
"""

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

KERNELS = ("chunk_segment_kernel", "chunk_segment_scan_kernel")
SHAPES = {"small": (300, 1, 2, 64, 64, 2), "0.8b": (2048, 16, 16, 128, 128, 8)}


def one_case(kernel: str, index: int, pdl: str, shape: str, good: int) -> None:
    from qwen_lab import checks
    from qwen_lab.kernels import deltanet

    os.environ["QWEN_LAB_PDL"] = pdl
    T, Hk, Hv, Dk, Dv, group = SHAPES[shape]
    deltanet.SCAN_GROUP = group
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    q, k = (torch.nn.functional.silu(torch.randn(T, Hk, Dk, generator=g, device="cuda")).to(bf) for _ in range(2))
    v = torch.randn(T, Hv, Dv, generator=g, device="cuda").to(bf)
    a, b = (torch.randn(T, Hv, generator=g, device="cuda").to(bf) for _ in range(2))
    A_log = torch.empty(Hv, device="cuda").uniform_(0.05, 4.0, generator=g).log()
    dt_bias = torch.randn(Hv, generator=g, device="cuda") - 1.0
    start = torch.randn(Hv, Dk, Dv, generator=g, device="cuda") * 0.5

    def run():
        state = start.clone()
        o = deltanet.deltanet_chunked(q, k, v, a, b, A_log, dt_bias, state)
        torch.cuda.synchronize()
        return o, state

    deltanet.SCAN_SEGMENTS = False
    o_ref, s_ref = run()
    deltanet.SCAN_SEGMENTS = True
    configs = {n: deltanet.autotune_configs(n, Dv=Dv) for n in KERNELS}
    other = KERNELS[1 - KERNELS.index(kernel)]
    with deltanet.force_config(kernel, configs[kernel][index]), \
            deltanet.force_config(other, configs[other][good % len(configs[other])]):
        errs = []
        for _ in range(3):
            o, s = run()
            errs.append((checks.relative_error(o, o_ref), checks.relative_error(s, s_ref)))
    worst = max(errs)
    print(f"o {worst[0]:.2e} state {worst[1]:.2e} {'OK' if worst[0] < 2e-2 and worst[1] < 2e-2 else 'WRONG'} "
          f"({configs[kernel][index]})", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--good", type=int, default=0, help="the config index the other kernel runs with")
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    p.add_argument("--min-bv", type=int, default=0, help="only the configs of at least this BV")
    p.add_argument("--case", nargs=4, metavar=("KERNEL", "INDEX", "PDL", "SHAPE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: the probe runs the kernels on an NVIDIA GPU")
        return 0
    if args.case:
        kernel, index, pdl, shape = args.case
        one_case(kernel, int(index), pdl, shape, args.good)
        return 0
    from qwen_lab.kernels import deltanet

    cases = [(kn, i, pdl, shape) for shape in args.shapes for kn in KERNELS
             for i, c in enumerate(deltanet.autotune_configs(kn, Dv=SHAPES[shape][4])) if c.kwargs["BV"] >= args.min_bv
             for pdl in ("0", "1")]

    def launch(case):
        cmd = [sys.executable, __file__, "--good", str(args.good), "--case", *map(str, case)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
            lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
            said = next((ln for ln in reversed(lines) if ln.startswith("o ") or "Error" in ln), lines[-1] if lines
                        else "")
            return case, (said if r.returncode == 0 else f"rc {r.returncode}: {said}")
        except subprocess.TimeoutExpired:
            return case, "TIMEOUT (240 s)"

    with ThreadPoolExecutor(args.jobs) as pool:
        for (kn, i, pdl, shape), said in pool.map(launch, cases):
            print(f"{shape:5s} {kn:26s} config {i} pdl {pdl}: {said}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
