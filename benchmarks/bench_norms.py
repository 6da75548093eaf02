"""The norms (qwen_lab.kernels.norms) against PyTorch, at Qwen3.5-0.8B's shapes: a prompt's rows and a decode token's.

    python benchmarks/bench_norms.py [--json FILE] [--rounds N] [--only NAME]

rms_norm over the hidden size (the input, post-attention and final norms) and per head (the q/k norms of the
attention layers), add_rms_norm (the residual add with the norm, both outputs written), gated_rms_norm (the
DeltaNet output norm, silu(z) gating). Each against qwen_lab.reference (PyTorch, fp32 math) and, for rms_norm,
torch.nn.functional.rms_norm on the (1 + w) weight. Bound by memory: the bytes are what each call must read and
write. On the harness of benchmarks/harness.py.
"""

import sys

import torch
import torch.nn.functional as F

from harness import Case, main
from qwen_lab import reference
from qwen_lab.kernels import norms


def cases(env):
    c, es = env.config, env.dtype.itemsize
    eps, H = c.rms_norm_eps, c.hidden_size
    Hq, D, Hv, Dv = c.num_attention_heads, c.head_dim, c.linear_num_value_heads, c.linear_value_head_dim
    out = []
    for T in (env.tokens, 1):
        def rows(seed, T=T):
            w = env.randn(H, seed=7, scale=0.1)
            return {"x": env.randn(T, H, seed=seed), "r": env.randn(T, H, seed=seed + 1000), "w": w,
                    "w1": 1.0 + w}   # torch's RMSNorm multiplies by its weight, ours by (1 + w)
        out.append(Case(
            "rms_norm", f"T={T} H={H}", rows,
            {"triton": lambda d: norms.rms_norm(d["x"], d["w"], eps),
             "torch reference": lambda d: reference.rms_norm(d["x"], d["w"], eps),
             "torch F.rms_norm": lambda d: F.rms_norm(d["x"], (H,), d["w1"], eps)},
            lambda d: reference.rms_norm(d["x"], d["w"], eps), bytes=(2 * T * H + H) * es))
        out.append(Case(
            "add_rms_norm", f"T={T} H={H}", rows,
            {"triton": lambda d: norms.add_rms_norm(d["x"], d["r"], d["w"], eps),
             "torch reference": lambda d: reference.add_rms_norm(d["x"], d["r"], d["w"], eps)},
            lambda d: reference.add_rms_norm(d["x"], d["r"], d["w"], eps), bytes=(4 * T * H + H) * es))

        def heads(seed, T=T):
            return {"q": env.randn(T, Hq, D, seed=seed), "w": env.randn(D, seed=7, scale=0.1)}
        out.append(Case(
            "rms_norm per head", f"T={T} Hq={Hq} D={D}", heads,
            {"triton": lambda d: norms.rms_norm(d["q"], d["w"], eps),
             "torch reference": lambda d: reference.rms_norm(d["q"], d["w"], eps)},
            lambda d: reference.rms_norm(d["q"], d["w"], eps), bytes=(2 * T * Hq * D + D) * es))

        def gated(seed, T=T):
            return {"o": env.randn(T, Hv, Dv, seed=seed), "z": env.randn(T, Hv, Dv, seed=seed + 1000),
                    "w": env.randn(Dv, seed=7, scale=0.1, dtype=torch.float32) + 1.0}
        out.append(Case(
            "gated_rms_norm", f"T={T} Hv={Hv} Dv={Dv}", gated,
            {"triton": lambda d: norms.gated_rms_norm(d["o"], d["z"], d["w"], eps),
             "torch reference": lambda d: reference.gated_rms_norm(d["o"], d["z"], d["w"], eps)},
            lambda d: reference.gated_rms_norm(d["o"], d["z"], d["w"], eps), bytes=3 * T * Hv * Dv * es + Dv * 4))
    return out


if __name__ == "__main__":
    sys.exit(main("bench_norms", cases, __doc__))
