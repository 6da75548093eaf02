r"""The SwiGLU activation of the MLP, and its fusion into the down projection.

Qwen3.5's MLP is  y = W_down (silu(W_gate h) * (W_up h)).  The model stores W_gate and W_up stacked
as one [2I, H] matrix, so one GEMM reads h once and yields gate_up [M, 2I] = [gate | up]; then

$$ \text{silu\_mul}(g, u) = \text{silu}(g)\, u = \frac{g}{1 + e^{-g}}\, u $$

elementwise, in fp32, rounded once to the input dtype: out [M, I]. gate_up may be a strided view
(its rows farther apart than 2I): only its last dim must be contiguous.

`swiglu_down(gate_up, down_weight)` = linear(silu_mul(gate_up), down_weight) in one kernel at decode:
the GEMV of the down projection computes silu(g) * u for each slice of K it loads (the prologue), so
the [M, I] intermediate never goes to memory and one launch disappears. Longer inputs (M > 16) are
compute-bound and take the two kernels, silu_mul then the tiled GEMM.

`linear_silu_mul(x, weight)` = silu_mul(linear(x, weight)) is the MLP's first half, x [M, K] and
weight [2I, K] = [W_gate; W_up] (rows 0..I-1 gate, I..2I-1 up) -> [M, I]:

$$ \text{out}_{mi} = \text{silu}\Big(\sum_k x_{mk} W_{ik}\Big) \sum_k x_{mk} W_{I+i,\,k} $$

At prefill (M > 16) it is ONE launch of the tiled GEMM with SwiGLU in its epilogue: each program
keeps the gate and the up accumulators of the same I columns (both fed by one x tile), and stores
silu(g) u rounded once. Unfused, the GEMM would write gate_up [M, 2I] to memory and silu_mul would
read it back to write [M, I]: for a 2048-token prompt of Qwen3.5-0.8B (2I = 7168) that is 29 MB
written plus 29 MB read and one more launch per layer; fused, only the 14.7 MB of [M, I] is written.
(The fused result skips the rounding of g and u to the input dtype, a difference within its
tolerance.) Short inputs (M <= 16, which decode does not send here) take `linear` then silu_mul.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import KernelError
from ...runtime import interpreter_active
from .. import gemm


@triton.jit
def silu_mul_kernel(gu_ptr, out_ptr, I, stride_gm, stride_om, BLOCK: tl.constexpr):
    # Grid: (rows, column blocks of I). gate sits at columns [0, I) of the row, up at [I, 2I).
    row = tl.program_id(0).to(tl.int64)  # row * stride overflows int32 past 2^31 elements
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    gate_ptrs = gu_ptr + row * stride_gm + cols
    g = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_ptrs + I, mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(g) * u  # fp32 math: silu saturates, but the product of two bf16 would round twice
    tl.store(out_ptr + row * stride_om + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check_gate_up(name: str, gate_up) -> int:
    if not isinstance(gate_up, torch.Tensor):
        raise KernelError(f"{name}: gate_up must be a torch.Tensor, got {type(gate_up).__name__}")
    if gate_up.dim() != 2:
        raise KernelError(f"{name}: gate_up must be 2-D [M, 2I], got shape {tuple(gate_up.shape)}")
    if gate_up.shape[1] % 2:
        raise KernelError(f"{name}: gate_up has {gate_up.shape[1]} columns; expected an even number 2I "
                          f"([gate | up] side by side)")
    if gate_up.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise KernelError(f"{name}: gate_up has dtype {gate_up.dtype}; expected bfloat16, float16 or float32")
    if gate_up.shape[1] > 1 and gate_up.stride(1) != 1:
        raise KernelError(f"{name}: gate_up must be contiguous in its last dim (stride 1), got strides "
                          f"{gate_up.stride()}")
    return gate_up.shape[1] // 2


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up for gate_up [M, 2I] = [gate | up] -> [M, I] in gate_up's dtype."""
    I = _check_gate_up("silu_mul", gate_up)
    M = gate_up.shape[0]
    if out is None:
        out = torch.empty((M, I), dtype=gate_up.dtype, device=gate_up.device)
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, I) or out.dtype != gate_up.dtype
          or out.device != gate_up.device or (I > 1 and out.stride(1) != 1)):
        raise KernelError(f"silu_mul: out must be a {gate_up.dtype} tensor of shape {(M, I)} on {gate_up.device}, "
                          f"contiguous in its last dim")
    if M == 0 or I == 0:
        return out
    # One program per (row, BLOCK columns): 1024 columns x 2 loads keep a GPU program busy; under the
    # interpreter a whole tiny row per program keeps the program count low.
    block = min(triton.next_power_of_2(I), 256 if interpreter_active() else 1024)
    silu_mul_kernel[(M, triton.cdiv(I, block))](gate_up, out, I, gate_up.stride(0), out.stride(0),
                                                 BLOCK=block, num_warps=4)
    return out


def swiglu_down(gate_up: torch.Tensor, down_weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """linear(silu_mul(gate_up), down_weight): gate_up [M, 2I], down_weight [N, I] -> [M, N].

    M <= 16: one fused GEMV / split-K kernel (SwiGLU as its prologue); otherwise silu_mul, then the
    tiled GEMM.
    """
    _check_gate_up("swiglu_down", gate_up)
    if gate_up.shape[0] <= gemm.GEMV_MAX_M:
        return gemm._gemv("swiglu_down", gate_up, down_weight, None, None, out, swiglu=True)
    return gemm._matmul("swiglu_down", silu_mul(gate_up), down_weight, out)


def linear_silu_mul(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu_mul(linear(x, weight)): x [M, K], weight [2I, K] = [W_gate; W_up] -> [M, I] in x's dtype.

    M > 16: one launch, the tiled GEMM with silu(gate) * up in its epilogue (gate_up never stored);
    otherwise `linear` (the GEMV) then silu_mul, two launches.
    """
    name = "linear_silu_mul"
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] > gemm.GEMV_MAX_M:
        return gemm._matmul(name, x, weight, out, swiglu=True)  # which checks the operands itself
    M, I, _ = gemm._check_swiglu_operands(name, x, weight, out)
    if out is None:
        out = torch.empty((M, I), dtype=x.dtype, device=x.device)
    if M == 0 or I == 0:
        return out
    return silu_mul(gemm.linear(x, weight), out=out)


__all__ = ["linear_silu_mul", "silu_mul", "silu_mul_kernel", "swiglu_down"]
