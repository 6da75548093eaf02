"""Drawing a token (qwen_lab.kernels.sampling) against PyTorch, over Qwen3.5-0.8B's vocabulary.

    python benchmarks/bench_sampling.py [--json FILE] [--rounds N] [--only NAME]

sample, by setting: greedy (one launch over the logits), temperature (a second), and temperature with top-k 20 and
top-p 0.9 (the radix-select rounds between them, each reading the logits again). The logits are peaked, like a
trained model's confident next token: a few candidates far above a N(0, 2) background. Against qwen_lab.reference
(PyTorch: softmax, sort, cumulative sums; it synchronises with the host, so it is timed eagerly) and, greedy,
torch.argmax. Checked: the same token. Bytes: the logits read once, what any draw must do. On the harness of
benchmarks/harness.py.
"""

import math
import sys

import torch

from harness import Case, main
from qwen_lab import reference
from qwen_lab.kernels import sampling

SETTINGS = [("greedy", 0.0, 0, 1.0), ("temperature 0.7", 0.7, 0, 1.0), ("T 0.7, top-k 20, top-p 0.9", 0.7, 20, 0.9)]


def same_token(got, want) -> float:
    return 0.0 if int(got) == int(want) else math.inf


def cases(env):
    V, es = env.config.vocab_size, env.dtype.itemsize
    out = []
    for name, t, k, p in SETTINGS:
        def logits(seed):
            x = env.randn(V, seed=seed, scale=2.0, dtype=torch.float32)
            x[env.ints(V, 8, seed=seed + 1000)] += 18.0
            return {"x": x.to(env.dtype), "u": torch.full((1,), 0.37, device=env.device),
                    "out": torch.zeros((), dtype=torch.long, device=env.device),
                    "ws": sampling.sampling_workspace(V, env.device)}
        impls = {"triton": lambda d, t=t, k=k, p=p: sampling.sample(d["x"], t, k, p, d["u"], out=d["out"],
                                                                    workspace=d["ws"]),
                 "torch reference": lambda d, t=t, k=k, p=p: reference.sample(d["x"], t, k, p, d["u"])}
        if t == 0:
            impls["torch argmax"] = lambda d: torch.argmax(d["x"])
        out.append(Case(
            f"sample {name}", f"V={V}", logits, impls,
            lambda d, t=t, k=k, p=p: reference.sample(d["x"], t, k, p, d["u"]), bytes=V * es,
            eager=frozenset({"torch reference"}), compare=same_token))
    return out


if __name__ == "__main__":
    sys.exit(main("bench_sampling", cases, __doc__))
