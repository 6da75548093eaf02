"""Probe: which chunk-scan config the chunked delta rule picks, against every config timed as the model runs it.

    python benchmarks/probe_scan_tuning.py [--tokens 2048] [--short 150]       (an NVIDIA GPU)

The scan's config is picked on the first call of each kind of call (`deltanet._pick_in_place`: chunk class, heads,
the prep's form), timing every config beside the prep, as the model runs them. Before, Triton's autotuner picked
it, timing the scan alone after the prep, with no prompt length in its key. The probe runs a --short prompt first,
then --tokens, prints each kind's pick, then times `deltanet_chunked` at --tokens (18 calls in one CUDA Graph, one
state each, as the model's layers run) with every scan config forced in turn, twice, and with Triton's autotuner
(QWEN_LAB_TUNE=0 leaves the pick to it), the outputs compared.
"""

import os

from probe_ab import deltanet_layer_calls, probe_args

os.environ.setdefault("QWEN_LAB_TUNING_CACHE", "0")  # report what this run times, not an earlier process's record


def main() -> int:
    args = probe_args(__doc__, ("--short", dict(type=int, default=150)), model=False)
    if args is None:
        return 0
    import torch

    from qwen_lab.kernels import deltanet, graph_time_us

    calls, states, outs = deltanet_layer_calls(args.short)
    calls[0]()                                    # the short prompt's kind is picked first
    calls, states, outs = deltanet_layer_calls(args.tokens)
    calls[0]()
    torch.cuda.synchronize()
    picks = deltanet._PICKS["chunk_scan_kernel"]
    for key, cfg in picks.items():
        print(f"scan picked beside the prep for chunk class {key[6]} (prep programs {key[8]}): {cfg}", flush=True)
    pick = next(cfg for key, cfg in picks.items()
                if key[6] == deltanet.chunk_class(-(-args.tokens // 64)))
    start = [s.clone() for s in states]

    def timed(label: str) -> torch.Tensor:
        us = graph_time_us(calls, warmup=True, replays=10)
        for s, s0 in zip(states, start):
            s.copy_(s0)
        calls[0]()
        torch.cuda.synchronize()
        first = outs[0].float().clone()
        for s, s0 in zip(states, start):
            s.copy_(s0)
        print(f"deltanet_chunked, T={args.tokens}, {len(calls)} calls in a graph, scan {label}: {us:.2f} us per call",
              flush=True)
        return first

    results = []
    Dv = outs[0].shape[2]
    for rnd in range(2):
        for cfg in deltanet.autotune_configs("chunk_scan_kernel", Dv=Dv):
            with deltanet.force_config("chunk_scan_kernel", cfg):
                mark = " (the pick)" if cfg is pick else ""
                results.append(timed(f"forced to {cfg}{mark}"))
        saved = dict(picks)
        picks.clear()
        os.environ["QWEN_LAB_TUNE"] = "0"
        try:
            results.append(timed("as Triton's autotuner picks it (timed alone)"))
        finally:
            del os.environ["QWEN_LAB_TUNE"]
            picks.update(saved)
    worst = max(float((r - results[0]).abs().max()) for r in results)
    print(f"outputs of every config against the first: max abs difference {worst:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
