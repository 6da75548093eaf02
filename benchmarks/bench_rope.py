"""Rotary embedding (qwen_lab.kernels.rope) against PyTorch, at Qwen3.5-0.8B's shapes: a prompt and a decode token.

    python benchmarks/bench_rope.py [--json FILE] [--rounds N] [--only NAME]

rope (partial rotate-half RoPE on the first rotary_dim dims of each query head), qk_norm_rope (the per-head q/k
RMSNorm and RoPE of q and k in one launch) and qk_norm_rope_cache (that, and the cache write of k and v), each
against qwen_lab.reference (PyTorch: the composition of the same operators). Bound by memory: the bytes are what
each call must read and write. On the harness of benchmarks/harness.py.
"""

import sys

import torch

from harness import Case, main
from qwen_lab import reference
from qwen_lab.kernels import rope


def cases(env):
    c, es = env.config, env.dtype.itemsize
    Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    eps, rot, theta = c.rms_norm_eps, c.rotary_dim, c.rope_theta
    out = []
    for T in (env.tokens, 1):
        L = env.tokens + 1
        start = 0 if T > 1 else env.tokens   # a decode token sits after the prompt

        def qk(seed, T=T, start=start):
            return {"q": env.randn(T, Hq, D, seed=seed), "k": env.randn(T, Hkv, D, seed=seed + 1000),
                    "v": env.randn(T, Hkv, D, seed=seed + 2000), "qw": env.randn(D, seed=7, scale=0.1),
                    "kw": env.randn(D, seed=8, scale=0.1), "pos": torch.arange(start, start + T, device=env.device),
                    "kc": torch.zeros(L, Hkv, D, device=env.device, dtype=env.dtype),
                    "vc": torch.zeros(L, Hkv, D, device=env.device, dtype=env.dtype)}
        out.append(Case(
            "rope", f"T={T} Hq={Hq} D={D} rotary {rot}", qk,
            {"triton": lambda d: rope.rope(d["q"], d["pos"], rot, theta),
             "torch reference": lambda d: reference.rope(d["q"], d["pos"], rot, theta)},
            lambda d: reference.rope(d["q"], d["pos"], rot, theta), bytes=2 * T * Hq * D * es))
        out.append(Case(
            "qk_norm_rope", f"T={T} Hq={Hq} Hkv={Hkv} D={D}", qk,
            {"triton": lambda d: rope.qk_norm_rope(d["q"], d["k"], d["qw"], d["kw"], eps, d["pos"], rot, theta),
             "torch reference": lambda d: reference.qk_norm_rope(d["q"], d["k"], d["qw"], d["kw"], eps, d["pos"],
                                                                  rot, theta)},
            lambda d: reference.qk_norm_rope(d["q"], d["k"], d["qw"], d["kw"], eps, d["pos"], rot, theta),
            bytes=2 * T * (Hq + Hkv) * D * es))

        def with_cache(fn):
            return lambda d: (fn(d["q"], d["k"], d["v"], d["qw"], d["kw"], eps, d["pos"], rot, theta, d["kc"],
                                 d["vc"]), d["kc"], d["vc"])
        out.append(Case(
            "qk_norm_rope_cache", f"T={T} Hq={Hq} Hkv={Hkv} D={D}", qk,
            {"triton": with_cache(rope.qk_norm_rope_cache),
             "torch reference": with_cache(reference.qk_norm_rope_cache)},
            with_cache(reference.qk_norm_rope_cache), bytes=2 * T * (Hq + 2 * Hkv) * D * es))
    return out


if __name__ == "__main__":
    sys.exit(main("bench_rope", cases, __doc__))
