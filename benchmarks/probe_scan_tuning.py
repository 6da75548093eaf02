"""Probe: the chunked delta rule's tuning on a short prompt, then used on a long one.

    python benchmarks/probe_scan_tuning.py [--tokens 2048] [--short 150]       (an NVIDIA GPU)

The chunk scan's GPU autotuner keys its cache on the prompt's chunk count rounded up to a power of two
(`deltanet.chunk_class`). Before, its key held no length: the first prompt's tuning served every later one, so a
process that ran a short prompt first (a chat's first turn, notebook 09's checks at 133-150 tokens) ran its
2048-token prompts with the scan tuned for 3 chunks. The probe tunes both classes (a short prompt first), prints
each class's pick, then times `deltanet_chunked` at --tokens (18 calls in one CUDA Graph, one state each, as the
model's layers run) with each pick forced on the scan, alternated twice, the outputs compared.
"""

from probe_ab import deltanet_layer_calls, probe_args


def main() -> int:
    args = probe_args(__doc__, ("--short", dict(type=int, default=150)), model=False)
    if args is None:
        return 0
    import torch
    import triton

    from qwen_lab.kernels import deltanet, graph_time_us

    calls, states, outs = deltanet_layer_calls(args.short)
    calls[0]()                                    # the short prompt first: its class is tuned first
    calls, states, outs = deltanet_layer_calls(args.tokens)
    calls[0]()
    torch.cuda.synchronize()
    scan = deltanet.chunk_scan_kernel
    at = scan.keys.index("N_CLASS")
    picks = {key[at]: cfg for key, cfg in scan.cache.items()}
    for n_class, cfg in sorted(picks.items()):
        print(f"scan tuned for chunk class {n_class}: {cfg}", flush=True)
    short = picks[deltanet.chunk_class(triton.cdiv(args.short, 64))]
    long = picks[deltanet.chunk_class(triton.cdiv(args.tokens, 64))]
    start = [s.clone() for s in states]
    results = {}
    for name, cfg in (("short prompt's pick", short), ("own pick", long)) * 2:
        with deltanet.force_config("chunk_scan_kernel", cfg):
            us = graph_time_us(calls, warmup=True, replays=10)
            for s, s0 in zip(states, start):
                s.copy_(s0)
            calls[0]()
            torch.cuda.synchronize()
        results.setdefault(name, []).append(outs[0].float().clone())
        for s, s0 in zip(states, start):
            s.copy_(s0)
        print(f"deltanet_chunked, T={args.tokens}, {len(calls)} calls in a graph, scan with the {name} ({cfg}): "
              f"{us:.2f} us per call", flush=True)
    a, b = results["short prompt's pick"][0], results["own pick"][0]
    print(f"outputs of the two picks: max abs difference {float((a - b).abs().max()):.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
