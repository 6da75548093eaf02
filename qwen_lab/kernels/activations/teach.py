r"""Notebook 05's SwiGLU kernel, as the learner writes it in exercise 05.1 (the notebook's solution cell, character
for character; `tests/test_activations.py` fails if the two drift apart).

    gate_up [M, 2I] = [gate | up] -> out [M, I]

$$ \text{silu\_mul}(g, u) = \text{silu}(g)\, u = \frac{g}{1 + e^{-g}}\, u $$

elementwise in fp32, rounded once. One program per (row, BLOCK columns of I). The finished kernel beside it
(`swiglu.py`) adds the argument checks and int64 row offsets; the fused forms live in the GEMM's prologue and
epilogue.
"""

import torch
import triton
import triton.language as tl

from ...runtime import interpreter_active

# the notebook's global: wide blocks on a GPU, small ones under the interpreter
on_gpu = torch.cuda.is_available() and not interpreter_active()


# Exercise 05.1: the silu(gate) * up kernel
@triton.jit
def my_silu_mul_kernel(gu_ptr, out_ptr, I, stride_gm, stride_om, BLOCK: tl.constexpr):
    """out[row, c] = silu(gate_up[row, c]) * gate_up[row, I + c] for BLOCK columns c of one row."""
    row = tl.program_id(0)
    pid = tl.program_id(1)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    gate = tl.load(gu_ptr + row * stride_gm + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride_gm + I + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def my_silu_mul(gate_up, out=None):
    """silu(gate) * up for gate_up [M, 2I] = [gate | up] -> [M, I]."""
    M, two_i = gate_up.shape
    I = two_i // 2
    if out is None:
        out = torch.empty((M, I), dtype=gate_up.dtype, device=gate_up.device)
    BLOCK = min(triton.next_power_of_2(I), 1024 if on_gpu else 128)
    my_silu_mul_kernel[(M, triton.cdiv(I, BLOCK))](gate_up, out, I, gate_up.stride(0), out.stride(0), BLOCK=BLOCK)
    return out
