"""Probe: where a DeltaNet layer's prefill time goes, the chunk prep against the scan after it.

    python benchmarks/probe_scan_breakdown.py [--tokens 2048]            (an NVIDIA GPU)

`deltanet_chunked` at Qwen3.5-0.8B's shapes, 18 calls (one per DeltaNet layer) in one CUDA Graph, timed whole and
with the scan left out (the prep alone). With PDL (the scan beside the prep's last programs, as the model runs) and
without (the scan after the whole prep, so the difference is the scan's own time). A scan left out leaves its
counters as the prep filled them; they are zeroed after. Last, the configs the autotuner picked.
(docs/perf-log.md, 2026-12-02: the prep ~38 us, the scan ~64 us alone and ~54 us beside the prep.)
"""

import os

import torch
from probe_ab import deltanet_layer_calls, probe_args

VARIANTS = (("prep alone", {"chunk_scan_kernel"}), ("prep + scan", set()))  # (label, the kernels left out)


def main() -> int:
    args = probe_args(__doc__, model=False)
    if args is None:
        return 0
    from qwen_lab.kernels import deltanet, graph_time_us

    calls, _, _ = deltanet_layer_calls(args.tokens)
    launch, dropped, pdl_before = deltanet._launch, set(), os.environ.get("QWEN_LAB_PDL")

    def some_kernels(kernel, *rest):
        fn = kernel.fn if isinstance(kernel, deltanet.triton.runtime.Autotuner) else kernel
        return None if fn.fn.__name__ in dropped else launch(kernel, *rest)

    deltanet._launch = some_kernels
    try:
        for pdl in ("1", "0"):
            os.environ["QWEN_LAB_PDL"] = pdl
            for rnd in range(2):
                for label, drop in VARIANTS:
                    dropped = drop
                    us = graph_time_us(calls, warmup=True, replays=10)
                    torch.cuda.synchronize()
                    deltanet._tickets(torch.device("cuda"), 1).zero_()   # what a left-out scan would have cleared
                    print(f"PDL {pdl}, round {rnd + 1}: {label}: {us:.2f} us per layer", flush=True)
        for kernel in ("chunk_prep_kernel", "chunk_scan_kernel"):
            tuned = getattr(getattr(deltanet, kernel), "cache", {})
            print(f"tuned {kernel}:", sorted(str(c) for c in tuned.values()), flush=True)
    finally:
        deltanet._launch = launch
        if pdl_before is None:
            os.environ.pop("QWEN_LAB_PDL", None)
        else:
            os.environ["QWEN_LAB_PDL"] = pdl_before
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
