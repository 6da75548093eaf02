r"""The SwiGLU activation of the MLP, alone and fused into the projections around it.

    silu_mul(gate_up)               = silu(g) u              gate_up [M, 2I] = [g | u] -> [M, I]
    swiglu_down(gate_up, W_down)    = silu_mul(gate_up) W_down^T                          W_down [N, I] -> [M, N]
    linear_silu_mul(x, W)           = silu_mul(x W^T)        W = [W_gate; W_up] [2I, K] -> [M, I]

- `teach.py`: notebook 05's kernel, as the learner writes it (`my_silu_mul`).
- `swiglu.py`: the finished kernel and the fused routes (the GEMV's SwiGLU prologue, the tiled GEMM's SwiGLU
  epilogue: both kernels are the GEMM family's).
"""

from __future__ import annotations

from .swiglu import linear_silu_mul, silu_mul, silu_mul_kernel, swiglu_down

__all__ = ["linear_silu_mul", "silu_mul", "silu_mul_kernel", "swiglu_down"]
