"""The DeltaNet's causal depthwise conv (qwen_lab.kernels.conv1d) against PyTorch, at Qwen3.5-0.8B's shapes.

    python benchmarks/bench_conv1d.py [--json FILE] [--rounds N] [--only NAME]

causal_conv1d over a prompt (the segmented prefill kernel, which also writes the new state) and for a decode token
(the step kernel), each against torch.nn.functional.conv1d (depthwise, the state prepended, then SiLU and the state
shifted) and qwen_lab.reference. Checked: the output and the state. Bound by memory: x, the output, the weight and
the state once each. On the harness of benchmarks/harness.py.
"""

import sys

import torch
import torch.nn.functional as F

from harness import Case, main
from qwen_lab import reference
from qwen_lab.kernels import conv1d


def torch_conv(x, weight, state):
    """causal_conv1d with PyTorch's depthwise conv: y = silu(conv([state^T; x])), state <- the last W-1 inputs."""
    T, C = x.shape
    xx = torch.cat([state.t(), x], dim=0)                         # [W-1+T, C]
    y = F.conv1d(xx.t()[None], weight[:, None, :], groups=C)[0]   # [C, T]
    state.copy_(xx[T:].t())
    return F.silu(y).t()


def cases(env):
    c, es = env.config, env.dtype.itemsize
    C, W = c.linear_conv_dim, c.linear_conv_kernel_dim
    out = []
    for T in (env.tokens, 1):
        def inputs(seed, T=T):
            return {"x": env.randn(T, C, seed=seed), "w": env.randn(C, W, seed=7, scale=0.5),
                    "s": env.randn(C, W - 1, seed=seed + 1000)}

        def with_state(fn):
            return lambda d: (fn(d["x"], d["w"], d["s"]), d["s"])
        out.append(Case(
            "causal_conv1d", f"T={T} C={C} W={W}", inputs,
            {"triton": with_state(conv1d.causal_conv1d), "torch F.conv1d": with_state(torch_conv),
             "torch reference": with_state(reference.causal_conv1d)},
            with_state(reference.causal_conv1d), bytes=(2 * T * C + C * W + 2 * C * (W - 1)) * es,
            flops=2 * T * C * W))
    return out


if __name__ == "__main__":
    sys.exit(main("bench_conv1d", cases, __doc__))
