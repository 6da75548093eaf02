"""Probe: the decode attention's split kernel, sized and warmed four ways, in the model's decode step.

    python benchmarks/probe_decode_splits.py [--tokens 2048]       (an NVIDIA GPU)

At a cache of about 2k tokens the split kernel gets 33 splits per KV head of 64 keys each (attention.decode_splits
with DECODE_SPLIT_KEYS = 64): 66 programs on a GPU of 132 SMs, each streaming 64 KB of keys and values after the
PDL wait. Two changes, alone and together:
- 32 keys per split (DECODE_SPLIT_KEYS = 32, chunks in multiples of 16 keys): twice the programs, half the bytes
  each;
- the L2 prefetch (DECODE_PREFETCH): each program asks L2 for its chunk before the PDL wait, while the q/k/v
  projection still runs.
The model's decode step (random weights of Qwen3.5-0.8B's shapes, bf16) after a --tokens prompt, captured in a CUDA
Graph with each setting and replayed, three rounds; the last logits of each setting against the default's.
"""

from probe_ab import probe_args

SETTINGS = {"default (64 keys per split)": (64, 0, False), "prefetch": (64, 0, True),
            "32 keys per split": (32, 16, False), "32 keys per split + prefetch": (32, 16, True)}


def main() -> int:
    args = probe_args(__doc__, model=False)
    if args is None:
        return 0
    import torch

    from qwen_lab import checks
    from qwen_lab.graph import capture
    from qwen_lab.kernels import attention as A
    from qwen_lab.kernels import replay_us
    from qwen_lab.model import load_model

    model = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
    cfg = model.config
    ids = torch.randint(0, cfg.vocab_size, (args.tokens,), generator=torch.Generator().manual_seed(0)).cuda()
    cache = model.new_cache(args.tokens + 65)
    token, pos = ids[-1:].clone(), torch.tensor([args.tokens], device="cuda")
    logits = {}
    for rnd in range(3):
        for name, (keys, align, prefetch) in SETTINGS.items():
            A.DECODE_SPLIT_KEYS, A.DECODE_CHUNK_ALIGN, A.DECODE_PREFETCH = keys, align, prefetch
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
                err = checks.relative_error(out.float(), logits["default (64 keys per split)"])
            print(f"round {rnd + 1}, {name}: decode step {us:.1f} us, logits against the default: {err:.2e}",
                  flush=True)
            del graph
    A.DECODE_SPLIT_KEYS, A.DECODE_CHUNK_ALIGN, A.DECODE_PREFETCH = SETTINGS["default (64 keys per split)"]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
