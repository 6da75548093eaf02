r"""Notebook 04's split-K GEMV, as the learner writes it in exercises 04.1 and 04.2 (the notebook's solution cells,
character for character; `tests/test_gemm.py` fails if the two drift apart).

    y = x W^T:   x [M, K] (M = 1 at decode), W [N, K], y [M, N]

$$ y_{mn} = \sum_{s=0}^{S-1} \sum_{k \in \text{split } s} x_{mk} W_{nk} $$

Program (n block, split s, row m) sums BLOCK_N outputs over its slice of K (K_PER_SPLIT columns):
- `my_linear_splitk`: `tl.atomic_add` of the partial sums into a zeroed fp32 buffer [M, N], then a cast (three
  launches; the order of the additions, so the last bits, vary from run to run);
- `my_linear_splitk_deterministic`: partials [S, M, N], then a second kernel adds them in the order s = 0, 1, ...
  (the same bits every run).
The finished kernel beside them (`gemv.py`) does the reduction inside its one launch (the last program of a block
adds the partials), adds the prologues and times its plan per shape (`tuning.py`).
"""

import torch
import triton
import triton.language as tl

from ...runtime import interpreter_active

# the notebook's global: tile shapes for a GPU, small ones under the interpreter
on_gpu = torch.cuda.is_available() and not interpreter_active()


# Exercise 04.1: split-K with atomic_add
@triton.jit
def my_splitk_kernel(x_ptr, w_ptr, acc_ptr, N, K, K_PER_SPLIT, stride_xm, stride_wn,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc[m, n] += sum over this program's slice of K of x[m, k] * w[n, k] (acc: fp32 [M, N], zeroed)."""
    pid_n = tl.program_id(0)   # which block of BLOCK_N outputs
    s = tl.program_id(1)       # which slice of K
    m = tl.program_id(2)       # which row of x
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = s * K_PER_SPLIT
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k_step in range(0, K_PER_SPLIT, BLOCK_K):
        k = k_lo + k_step + tl.arange(0, BLOCK_K)
        k_ok = (k < K) & (k < k_lo + K_PER_SPLIT)
        xv = tl.load(x_ptr + m * stride_xm + k, mask=k_ok, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :],
                     mask=(offs_n[:, None] < N) & k_ok[None, :], other=0.0).to(tl.float32)
        total += tl.sum(wv * xv[None, :], axis=1)
    tl.atomic_add(acc_ptr + m * N + offs_n, total, mask=offs_n < N)


def my_linear_splitk(x, weight, split_k=4, out=None):
    """y = x @ weight^T by split-K: x [M, K], weight [N, K] -> [M, N]."""
    M, K = x.shape
    N = weight.shape[0]
    acc = torch.zeros((M, N), dtype=torch.float32, device=x.device)   # launch 1: the zeroed fp32 buffer
    k_per_split = triton.cdiv(K, split_k)
    BLOCK_N, BLOCK_K = (8, 512) if on_gpu else (16, 32)
    grid = (triton.cdiv(N, BLOCK_N), split_k, M)
    my_splitk_kernel[grid](x, weight, acc, N, K, k_per_split, x.stride(0), weight.stride(0),   # launch 2
                           BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    if out is None:
        return acc.to(x.dtype)                                          # launch 3: the cast
    return out.copy_(acc)


# Exercise 04.2: deterministic split-K (partial sums, then a sum in a fixed order)
@triton.jit
def my_partials_kernel(x_ptr, w_ptr, part_ptr, M, N, K, K_PER_SPLIT, stride_xm, stride_wn,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """part[s, m, n] = sum over slice s of K of x[m, k] * w[n, k] (part: fp32 [S, M, N], contiguous)."""
    pid_n = tl.program_id(0)   # which block of BLOCK_N outputs
    s = tl.program_id(1)       # which slice of K
    m = tl.program_id(2)       # which row of x
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = s * K_PER_SPLIT
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k_step in range(0, K_PER_SPLIT, BLOCK_K):
        k = k_lo + k_step + tl.arange(0, BLOCK_K)
        k_ok = (k < K) & (k < k_lo + K_PER_SPLIT)
        xv = tl.load(x_ptr + m * stride_xm + k, mask=k_ok, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :],
                     mask=(offs_n[:, None] < N) & k_ok[None, :], other=0.0).to(tl.float32)
        total += tl.sum(wv * xv[None, :], axis=1)
    tl.store(part_ptr + (s * M + m) * N + offs_n, total, mask=offs_n < N)


@triton.jit
def my_sum_partials_kernel(part_ptr, y_ptr, M, N, S, BLOCK_N: tl.constexpr):
    """y[m, n] = part[0, m, n] + part[1, m, n] + ... + part[S - 1, m, n], added in that order in fp32, cast to
    y's dtype (part: fp32 [S, M, N] and y: [M, N], both contiguous)."""
    pid_n = tl.program_id(0)   # which block of BLOCK_N outputs
    m = tl.program_id(1)       # which row
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs_n < N
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in range(S):         # a fixed order: s = 0, 1, ..., S - 1, whatever order the programs ran in
        total += tl.load(part_ptr + (s * M + m) * N + offs_n, mask=mask, other=0.0)
    tl.store(y_ptr + m * N + offs_n, total.to(y_ptr.dtype.element_ty), mask=mask)


def my_linear_splitk_deterministic(x, weight, split_k=4, out=None):
    """y = x @ weight^T by split-K, the same bits every run: x [M, K], weight [N, K] -> [M, N]."""
    M, K = x.shape
    N = weight.shape[0]
    part = torch.empty((split_k, M, N), dtype=torch.float32, device=x.device)   # no zero fill: all written
    k_per_split = triton.cdiv(K, split_k)
    BLOCK_N, BLOCK_K = (8, 512) if on_gpu else (16, 32)
    my_partials_kernel[(triton.cdiv(N, BLOCK_N), split_k, M)](
        x, weight, part, M, N, K, k_per_split, x.stride(0), weight.stride(0), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device) if out is None else out
    SUM_BLOCK = 128
    my_sum_partials_kernel[(triton.cdiv(N, SUM_BLOCK), M)](part, y, M, N, split_k, BLOCK_N=SUM_BLOCK)
    return y
