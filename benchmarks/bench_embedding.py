"""The embedding lookup (qwen_lab.kernels.embedding) against PyTorch, at Qwen3.5-0.8B's shapes.

    python benchmarks/bench_embedding.py [--json FILE] [--rounds N] [--only NAME]

embedding: the rows of the [vocab, hidden] table at a prompt's ids and at a decode token's, against
torch.nn.functional.embedding and qwen_lab.reference (indexing). Bound by memory: each call reads its rows and writes
them once. The table is made once (half a gigabyte at 0.8B's shapes); the copies the harness cycles through are the
ids, so that each call reads other rows. On the harness of benchmarks/harness.py.
"""

import sys

import torch.nn.functional as F

from harness import Case, main
from qwen_lab import reference
from qwen_lab.kernels import embedding


def cases(env):
    c, es = env.config, env.dtype.itemsize
    V, H = c.vocab_size, c.hidden_size
    table = env.randn(V, H, seed=1, scale=0.02)
    out = []
    for T in (env.tokens, 1):
        def ids(seed, T=T):
            return {"ids": env.ints(V, T, seed=seed), "w": table}
        out.append(Case(
            "embedding", f"T={T} V={V} H={H}", ids,
            {"triton": lambda d: embedding.embedding(d["ids"], d["w"]),
             "torch F.embedding": lambda d: F.embedding(d["ids"], d["w"]),
             "torch reference": lambda d: reference.embedding(d["ids"], d["w"])},
            lambda d: reference.embedding(d["ids"], d["w"]), bytes=2 * T * H * es + T * 8))
    return out


if __name__ == "__main__":
    sys.exit(main("bench_embedding", cases, __doc__))
