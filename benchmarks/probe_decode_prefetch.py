"""Probe: the decode attention split kernel with and without the L2 prefetch of its chunk, in the decode step.

    python benchmarks/probe_decode_prefetch.py [--tokens 2048]       (an NVIDIA GPU)

At a cache of about 2k tokens the split kernel runs 33 splits per KV head of 64 keys each (attention.decode_splits):
66 programs, each streaming 64 KB of keys and values after the PDL wait. With attention.DECODE_PREFETCH each program
first asks L2 for its chunk (prefetch.global.L2, before griddepcontrol.wait), while the q/k/v projection still runs.
The model's decode step (random weights of Qwen3.5-0.8B's shapes, bf16) after a --tokens prompt, captured in a CUDA
Graph each way and replayed, three rounds; the last logits of each way against those without the prefetch.
(Measured and dropped beside it, docs/perf-log.md, 2026-12-03: splits of 32 keys in chunks of 16, twice the
programs: slower, 685-691 us against 671-672.)
"""

from probe_ab import decode_setup, probe_args

SETTINGS = {"without the prefetch": False, "with the prefetch": True}


def main() -> int:
    args = probe_args(__doc__, model=False)
    if args is None:
        return 0
    import torch

    from qwen_lab import checks
    from qwen_lab.graph import capture
    from qwen_lab.kernels import attention as A
    from qwen_lab.kernels import replay_us

    model, ids, cache, token, pos = decode_setup(args.tokens, 65)
    logits, default = {}, A.DECODE_PREFETCH
    for rnd in range(3):
        for name, prefetch in SETTINGS.items():
            A.DECODE_PREFETCH = prefetch
            with torch.inference_mode():
                cache.reset()
                model.step(ids, torch.arange(args.tokens, device="cuda"), cache)
                graph, out = capture(lambda: model.step(token, pos, cache), warmup=2)
                us = replay_us(graph, 300)
                # (each replay advances the DeltaNet states: the logits compared are those of one step after a
                # fresh prefill, the same for every setting)
                cache.reset()
                model.step(ids, torch.arange(args.tokens, device="cuda"), cache)
                graph.replay()
                torch.cuda.synchronize()
                logits.setdefault(name, out.float().clone())
                err = checks.relative_error(out.float(), logits["without the prefetch"])
            print(f"round {rnd + 1}, {name}: decode step {us:.1f} us, logits against those without: {err:.2e}",
                  flush=True)
            del graph
    A.DECODE_PREFETCH = default
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
