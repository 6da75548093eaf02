"""Probe: where a DeltaNet layer's prefill time goes, the chunk prep against the scan after it.

    python benchmarks/probe_scan_breakdown.py [--tokens 2048]            (an NVIDIA GPU)

`deltanet_chunked` at Qwen3.5-0.8B's shapes, 18 calls (one per DeltaNet layer) in one CUDA Graph, timed with
kernels left out of each call: the prep alone, the prep and the one-chain scan, the prep and the segments' maps
(chunk_segment_kernel), the prep and the whole scan in segments. With PDL (the scan and the maps beside the prep,
as the model runs) and without (each kernel after the one before has finished, so the differences are each
kernel's own time). The segments also at 4 chunks (the library's SCAN_GROUP is 8). A kernel left out leaves its
counters as the prep filled them; they are zeroed after. Last, the configs the autotuner picked.
"""

import os

import torch
from probe_ab import probe_args

VARIANTS = (  # (label, SCAN_SEGMENTS, SCAN_GROUP (None: the library's), the kernels left out)
    ("prep alone", False, None, {"chunk_scan_kernel"}),
    ("prep + one-chain scan", False, None, set()),
    ("prep + segment maps", True, None, {"chunk_segment_scan_kernel"}),
    ("prep + scan in segments", True, None, set()),
    ("prep + segment maps, segments of 4 chunks", True, 4, {"chunk_segment_scan_kernel"}),
    ("prep + scan in segments of 4 chunks", True, 4, set()),
)


def main() -> int:
    args = probe_args(__doc__, model=False)
    if args is None:
        return 0
    from bench_deltanet import layer_inputs

    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import deltanet, graph_time_us

    T, H, D = args.tokens, cfg.linear_num_value_heads, cfg.linear_key_head_dim
    d = layer_inputs(T, torch.Generator(device="cuda").manual_seed(0))
    q, k, v, a, b, A_log, dt_bias = (d[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias"))
    layers = cfg.num_linear_layers
    states = [d["state"].clone() for _ in range(layers)]
    outs = [torch.empty(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in states]
    ws = deltanet.chunk_workspace(T, H, D, D, torch.bfloat16, "cuda")
    calls = [lambda i=i: deltanet.deltanet_chunked(q, k, v, a, b, A_log, dt_bias, states[i], out=outs[i],
                                                   workspace=ws) for i in range(layers)]
    launch, dropped, library_group = deltanet._launch, set(), deltanet.SCAN_GROUP

    def some_kernels(kernel, *rest):
        fn = kernel.fn if isinstance(kernel, deltanet.triton.runtime.Autotuner) else kernel
        return None if fn.fn.__name__ in dropped else launch(kernel, *rest)

    deltanet._launch = some_kernels
    try:
        for pdl in ("1", "0"):
            os.environ["QWEN_LAB_PDL"] = pdl
            for rnd in range(2):
                for label, segments, group, drop in VARIANTS:
                    deltanet.SCAN_SEGMENTS, deltanet.SCAN_GROUP, dropped = segments, group or library_group, drop
                    us = graph_time_us(calls, warmup=True, replays=10)
                    torch.cuda.synchronize()
                    deltanet._tickets(torch.device("cuda"), 1).zero_()   # what a left-out scan would have cleared
                    print(f"PDL {pdl}, round {rnd + 1}: {label}: {us:.2f} us per layer", flush=True)
        for kernel in ("chunk_scan_kernel", "chunk_segment_kernel", "chunk_segment_scan_kernel"):
            tuned = getattr(getattr(deltanet, kernel), "cache", {})
            print(f"tuned {kernel}:", sorted(str(c) for c in tuned.values()), flush=True)
    finally:
        deltanet._launch, deltanet.SCAN_SEGMENTS, deltanet.SCAN_GROUP = launch, False, library_group
        os.environ.pop("QWEN_LAB_PDL", None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
