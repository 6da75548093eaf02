"""Probe: what the boundary between two decode-step replays costs, and what the draw of the token adds.

    python benchmarks/probe_graph_steps.py [--tokens 2048]       (an NVIDIA GPU)

`python -m qwen_lab.bench` replays a graph of one decode step per token. Inside a graph the kernels overlap their
neighbours (programmatic dependent launch); the first kernel of a replay cannot start before the previous replay
has ended, and each replay is a launch of its own. Here the model's decode step (random weights of Qwen3.5-0.8B's
shapes, bf16, after a --tokens prompt) is captured 1, 2, 4 and 8 times back to back in one graph, and the time per
step compared: the difference is what a replay boundary costs. A last row adds the greedy draw of the next token
(`model.ops["sample"]`, temperature 0) to each step, as `qwen_lab.generate` replays it. Three rounds, alternated.
"""

from probe_ab import decode_setup, probe_args

STEPS = (1, 2, 4, 8)


def main() -> int:
    args = probe_args(__doc__, model=False)
    if args is None:
        return 0
    import torch

    from qwen_lab.graph import capture
    from qwen_lab.kernels import replay_us

    model, ids, cache, token, pos = decode_setup(args.tokens, 64)
    sample = model.ops["sample"]
    uniform = torch.zeros((), device="cuda")
    nxt = torch.zeros((), dtype=torch.long, device="cuda")

    def steps(n, draw=False):
        def body():
            for _ in range(n):
                logits = model.step(token, pos, cache)[-1]
                if draw:
                    sample(logits, 0.0, 0, 1.0, uniform, out=nxt)
            return logits
        return body

    cases = [(f"{n} step{'s' if n > 1 else ''} per graph", n, False) for n in STEPS]
    cases.append(("1 step per graph + greedy draw", 1, True))
    with torch.inference_mode():
        model.step(ids, torch.arange(args.tokens, device="cuda"), cache)
        for rnd in range(3):
            for name, n, draw in cases:
                graph, _ = capture(steps(n, draw), warmup=2)
                us = replay_us(graph, max(300 // n, 40)) / n
                print(f"round {rnd + 1}, {name}: {us:.1f} us per step", flush=True)
                del graph
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
