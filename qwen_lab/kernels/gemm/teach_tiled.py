r"""Notebook 03's tiled GEMM, as the learner writes it in exercise 03.1 (the notebook's solution cell, character
for character; `tests/test_gemm.py` fails if the two drift apart).

    y = x W^T:   x [M, K], W [N, K] (the Hugging Face layout), y [M, N]

$$ y_{mn} = \sum_{k=0}^{K-1} x_{mk} W_{nk} $$

One program per BLOCK_M x BLOCK_N tile of y walks K in BLOCK_K steps, each a `tl.dot` of an x tile and a W^T tile
into an fp32 accumulator, rounded once at the store. The finished kernel beside it (`tiled.py`) adds the grouped
tile order, the autotuned tile shapes, TMA loads and persistent programs on Hopper, and the SwiGLU epilogue.
"""

import torch
import triton
import triton.language as tl

from ...runtime import interpreter_active

# the notebook's global: tensor-core sized tiles on a GPU, small ones under the interpreter
on_gpu = torch.cuda.is_available() and not interpreter_active()


# Exercise 03.1: the tiled GEMM kernel
@triton.jit
def my_matmul_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m, n] = sum_k x[m, k] * w[n, k] for one BLOCK_M x BLOCK_N tile of out (fp32 accumulation)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :],
                    mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)          # [BLOCK_M, BLOCK_K]
        b = tl.load(w_ptr + offs_n[None, :] * stride_wn + k[:, None],
                    mask=(offs_n[None, :] < N) & (k[:, None] < K), other=0.0)          # [BLOCK_K, BLOCK_N] = W^T
        acc = tl.dot(a, b, acc)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def my_matmul(x, weight, out=None):
    """y = x @ weight^T with my_matmul_kernel. x [M, K], weight [N, K] -> [M, N]."""
    M, K = x.shape
    N = weight.shape[0]
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    # tensor-core sized tiles on a GPU; small ones in the interpreter, which runs every program in NumPy
    BLOCK_M, BLOCK_N, BLOCK_K = (128, 128, 64) if on_gpu else (16, 32, 32)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    my_matmul_kernel[grid](x, weight, out, M, N, K, x.stride(0), weight.stride(0), out.stride(0),
                           BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out
