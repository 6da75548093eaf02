"""Notebook 01's kernels, as the learner writes them: a vector add, then the embedding gather.

    add:        out[i] = x[i] + y[i]                   x, y, out [n]; one program per BLOCK elements
    embedding:  out[t, :] = weight[ids[t], :]          ids [T] (contiguous), weight [V, H] -> out [T, H];
                                                       one program per tile of BLOCK_T tokens x BLOCK_H columns

The cells below are solutions/01_triton_basics_embedding.ipynb's exercise solutions, character for character
(tests/test_embedding.py fails if the two drift apart). The library's form, `gather.embedding`, adds what the
model needs: ids of any integer type and stride, an id outside [0, V) written as zeros instead of read out of
bounds, tiles sized for the GPU, programmatic dependent launch.
"""

import torch
import triton
import triton.language as tl


# Exercise 01.1: vector add
@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)                       # which block of the vectors this program owns
    offs = pid * BLOCK + tl.arange(0, BLOCK)     # the indices of this block
    mask = offs < n                              # the last block may hang over the end
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def my_add(x, y, out=None):
    """out = x + y for two 1-D tensors of the same length, dtype and device."""
    assert x.shape == y.shape and x.dim() == 1, "my_add adds two 1-D tensors of the same length"
    if out is None:
        out = torch.empty_like(x)
    BLOCK = 256
    grid = (triton.cdiv(x.numel(), BLOCK),)
    add_kernel[grid](x, y, out, x.numel(), BLOCK=BLOCK)
    return out


# Exercise 01.2: the embedding gather
@triton.jit
def embedding_exercise_kernel(ids_ptr, weight_ptr, out_ptr, T, H, stride_w, stride_out,
                              BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)    # the tokens of this tile
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)    # the hidden columns of this tile
    row_ok = rows < T
    col_ok = cols < H
    ids = tl.load(ids_ptr + rows, mask=row_ok, other=0)            # read on the device
    mask = row_ok[:, None] & col_ok[None, :]
    src = weight_ptr + ids.to(tl.int64)[:, None] * stride_w + cols[None, :]
    vals = tl.load(src, mask=mask)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], vals, mask=mask)


def my_embedding(ids, weight, out=None):
    """out[t] = weight[ids[t]]; ids [T] (contiguous), weight [V, H] -> [T, H]."""
    T, H = ids.numel(), weight.shape[1]
    if out is None:
        out = torch.empty(T, H, dtype=weight.dtype, device=weight.device)
    BLOCK_T, BLOCK_H = 16, 32
    grid = (triton.cdiv(T, BLOCK_T), triton.cdiv(H, BLOCK_H))
    embedding_exercise_kernel[grid](ids, weight, out, T, H, weight.stride(0), out.stride(0),
                                    BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H)
    return out
