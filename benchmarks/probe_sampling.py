"""Probe: what drawing a token costs inside a CUDA Graph, by sampling setting and by shape of the distribution.

    python benchmarks/probe_sampling.py [--configs [--repeat N]] [--profile]          (an NVIDIA GPU)

`qwen_lab.generate` replays the decode step and the draw of the next token (`kernels.sampling.sample`) in one
graph. Greedy is one launch over the 248320 logits; temperature adds a second; top-k or top-p add the radix-select
rounds (6 on a GPU) between them, each a launch that reads the logits again. Here each setting is timed alone
(20 draws captured back to back in one graph, us per draw) on three kinds of logits:
  peaked: like a trained model's confident next token, a few candidates far above a normal background;
  flat:   N(0, 2) logits, where top-p 0.9 keeps tens of thousands of tokens;
  tied:   every logit equal (the worst case for the rounds: no block ever falls out of play).
--configs times top-k 20 + top-p 0.9 under other launch configurations of the kernels (tokens per program, per
step of a program's loop, bits per round, the test of each chunk for tokens in play, warps);
--repeat N goes through those configurations N times (the spread between rounds on one machine);
--profile lists each kernel of one draw with its GPU time.
One more row times the draw without a workspace (its scratch allocated inside the graph).
"""

import torch

from probe_ab import probe_args

V = 248320
SETTINGS = [  # (name, temperature, top_k, top_p)
    ("greedy", 0.0, 0, 1.0),
    ("temperature 0.7", 0.7, 0, 1.0),
    ("T 0.7, top-p 0.9", 0.7, 0, 0.9),
    ("T 0.7, top-k 20", 0.7, 20, 1.0),
    ("T 0.7, top-k 20, top-p 0.9", 0.7, 20, 0.9),
]


def logits_of(kind: str) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(0)
    if kind == "tied":
        return torch.zeros(V, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(V, device="cuda", generator=g) * 2.0
    if kind == "peaked":
        x[torch.randint(0, V, (8,), device="cuda", generator=g)] += 18.0
    return x.to(torch.bfloat16)


CONFIGS = [  # (block, chunk, nbits, skip_dead, warps): see kernels.sampling._Config
    (1024, 128, 5, True, 4), (1024, 128, 5, False, 4), (512, 128, 5, True, 4), (1024, 64, 5, True, 4),
    (2048, 128, 5, True, 4),
]


def main() -> int:
    args = probe_args(__doc__, ("--configs", dict(action="store_true")), ("--profile", dict(action="store_true")),
                      ("--repeat", dict(type=int, default=1, help="times through the configurations (default 1)")),
                      tokens=False, model=False)
    if args is None:
        return 0
    from qwen_lab import reference
    from qwen_lab.kernels import graph_time_us, sampling
    from qwen_lab.kernels.sampling import sample, sampling_workspace

    ws = sampling_workspace(V, "cuda")
    uniform = torch.full((1,), 0.37, device="cuda")
    out = torch.zeros((), dtype=torch.long, device="cuda")
    for kind in ("peaked", "flat", "tied"):
        logits = logits_of(kind)
        for name, t, k, p in SETTINGS:
            call = (lambda t=t, k=k, p=p: sample(logits, t, k, p, uniform, out=out, workspace=ws))
            us = graph_time_us([call] * 20, warmup=True, replays=20)
            print(f"{kind:6s} {name:28s} {us:7.1f} us per draw", flush=True)
    # the same draw without a workspace: its scratch allocated and its counter cleared inside the graph, as
    # generation did before graph.sampler gave it one
    logits = logits_of("peaked")
    us = graph_time_us([lambda: sample(logits, 0.7, 20, 0.9, uniform, out=out)] * 20, warmup=True, replays=20)
    print(f"peaked top-k 20 + top-p 0.9, no workspace  {us:7.1f} us per draw", flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        logits = logits_of("peaked")
        for _ in range(3):
            sample(logits, 0.7, 20, 0.9, uniform, workspace=ws)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                sample(logits, 0.7, 20, 0.9, uniform, workspace=ws)
                torch.cuda.synchronize()
        kernels = [ev for ev in prof.events() if ev.device_type.name == "CUDA"]
        print("one draw (peaked, T 0.7, top-k 20, top-p 0.9), launched alone, each kernel's GPU time:")
        for ev in kernels[-len(kernels) // 5:]:
            print(f"  {ev.name[:60]:60s} {ev.device_time:8.1f} us")
    if args.configs:
        for cfg in CONFIGS * args.repeat:  # repeated: the spread between rounds, on the same machine
            sampling._GPU = sampling._Config(*cfg)
            ws = sampling_workspace(V, "cuda")
            for kind in ("peaked", "flat", "tied"):
                logits = logits_of(kind)
                call = (lambda: sample(logits, 0.7, 20, 0.9, uniform, out=out, workspace=ws))
                try:
                    us = graph_time_us([call] * 20, warmup=True, replays=20)
                except Exception as e:  # a configuration the compiler or the GPU refuses: say so, go on
                    print(f"config {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                    break
                # the same token as the reference, or the configuration is not worth its time (not checked on
                # tied logits: there the reference's float32 running sum over 248320 equal terms rounds, and its
                # token is a neighbour of the exact one, as tests/test_sampling.py allows)
                def same_token(u):
                    u = torch.tensor(u, device="cuda")
                    return int(sample(logits, 0.7, 20, 0.9, u, workspace=ws)) == \
                        int(reference.sample(logits, 0.7, 20, 0.9, u))
                same = kind == "tied" or all(same_token(u) for u in (0.05, 0.37, 0.9))
                print(f"config {cfg}: {kind:6s} top-k 20, top-p 0.9 {us:7.1f} us per draw"
                      f"{'' if same else '  (DRAWS DIFFER FROM THE REFERENCE)'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
