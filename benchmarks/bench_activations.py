"""SwiGLU (qwen_lab.kernels.activations) against PyTorch, at Qwen3.5-0.8B's MLP shapes.

    python benchmarks/bench_activations.py [--json FILE] [--rounds N] [--only NAME]

silu_mul (silu(gate) * up from the fused [gate | up] projection) at a prompt's rows and a decode token's; the fused
forms of the MLP: swiglu_down (a decode token: SwiGLU as the prologue of the down projection's GEMV, bound by
reading the weight) and linear_silu_mul (a prompt: SwiGLU in the epilogue of the gate/up GEMM, bound by the matmul).
Each against PyTorch in the model dtype (F.silu, F.linear) and qwen_lab.reference (fp32 math). On the harness of
benchmarks/harness.py.
"""

import sys

import torch.nn.functional as F

from harness import Case, main
from qwen_lab import reference
from qwen_lab.kernels import activations


def torch_silu_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def cases(env):
    c, es = env.config, env.dtype.itemsize
    H, I, T = c.hidden_size, c.intermediate_size, env.tokens
    out = []
    for M in (T, 1):
        def gate_up(seed, M=M):
            return {"gu": env.randn(M, 2 * I, seed=seed)}
        out.append(Case(
            "silu_mul", f"M={M} I={I}", gate_up,
            {"triton": lambda d: activations.silu_mul(d["gu"]),
             "torch": lambda d: torch_silu_mul(d["gu"]),
             "torch reference": lambda d: reference.silu_mul(d["gu"])},
            lambda d: reference.silu_mul(d["gu"]), bytes=3 * M * I * es))

    def down(seed):
        return {"gu": env.randn(1, 2 * I, seed=seed), "w": env.randn(H, I, seed=seed + 1000, scale=I ** -0.5)}
    out.append(Case(
        "swiglu_down", f"M=1 I={I} H={H}", down,
        {"triton": lambda d: activations.swiglu_down(d["gu"], d["w"]),
         "torch": lambda d: F.linear(torch_silu_mul(d["gu"]), d["w"]),
         "torch reference": lambda d: reference.swiglu_down(d["gu"], d["w"])},
        lambda d: reference.swiglu_down(d["gu"], d["w"]), bytes=(H * I + 2 * I + H) * es, flops=2 * H * I))

    def up(seed):
        return {"x": env.randn(T, H, seed=seed), "w": env.randn(2 * I, H, seed=seed + 1000, scale=H ** -0.5)}
    out.append(Case(
        "linear_silu_mul", f"M={T} H={H} 2I={2 * I}", up,
        {"triton": lambda d: activations.linear_silu_mul(d["x"], d["w"]),
         "torch": lambda d: torch_silu_mul(F.linear(d["x"], d["w"]))},
        lambda d: reference.linear_silu_mul(d["x"], d["w"]), bytes=(T * H + 2 * I * H + T * I) * es,
        flops=2 * T * H * 2 * I))
    return out


if __name__ == "__main__":
    sys.exit(main("bench_activations", cases, __doc__))
