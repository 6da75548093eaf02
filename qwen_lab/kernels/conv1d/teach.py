"""Notebook 08's causal conv1d (Exercise 08.1's solution), as the notebook has it: the kernel a learner writes.

For C channels and a filter of width W, with the W-1 inputs carried from the previous call:

    xx = [state^T ; x]                                  [W-1+T, C]: the carried inputs, then this call's
    y[t, c] = silu( sum_{j<W} weight[c, j] * xx[t + j, c] )
    state  <- the last W-1 rows of xx, transposed       state [C, W-1], oldest input first

Shapes: x [T, C] (any row stride, stride 1 between channels), weight [C, W] (stride 1 along W), state [C, W-1]
(updated in place). One program per block of BLOCK_C channels walks the T tokens, then shifts the state.
`my_causal_conv1d(x, weight, state)` -> y [T, C] in x's dtype; = reference.causal_conv1d. The model's fast form,
with a segmented prefill kernel beside this sequential one, is causal.py.
"""

import torch
import triton
import triton.language as tl


# Exercise 08.1: causal conv1d with its state
@triton.jit
def conv1d_kernel(x_ptr, w_ptr, state_ptr, out_ptr, T, C, stride_xt, stride_wc, stride_sc, stride_ot,
                  W: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr):
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    for t in range(T):
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(W):
            p = t + j                      # row of xx
            r = p - (W - 1)                # row of x (negative: a state column)
            xv = tl.load(x_ptr + r * stride_xt + offs_c, mask=mask_c & (r >= 0), other=0.0)
            sv = tl.load(state_ptr + offs_c * stride_sc + p, mask=mask_c & (p < W - 1), other=0.0)
            wj = tl.load(w_ptr + offs_c * stride_wc + j, mask=mask_c, other=0.0)
            acc += wj.to(tl.float32) * (xv.to(tl.float32) + sv.to(tl.float32))
        y = acc * tl.sigmoid(acc)
        tl.store(out_ptr + t * stride_ot + offs_c, y.to(out_ptr.dtype.element_ty), mask=mask_c)
    s = tl.arange(0, BLOCK_S)              # new state column s = xx row T + s
    p = T + s
    r = p - (W - 1)
    keep = mask_c[:, None] & (s < W - 1)[None, :]
    xv = tl.load(x_ptr + r[None, :] * stride_xt + offs_c[:, None], mask=keep & (r >= 0)[None, :], other=0.0)
    sv = tl.load(state_ptr + offs_c[:, None] * stride_sc + p[None, :], mask=keep & (p < W - 1)[None, :], other=0.0)
    new = tl.where((r >= 0)[None, :], xv.to(state_ptr.dtype.element_ty), sv)
    tl.debug_barrier()                     # every thread has read its old columns before any is overwritten
    tl.store(state_ptr + offs_c[:, None] * stride_sc + s[None, :], new, mask=keep)


def my_causal_conv1d(x, weight, state):
    T, C_ = x.shape
    W_ = weight.shape[1]
    weight = weight.contiguous()   # the kernel reads a channel's W taps side by side; the model keeps them C apart
    out = torch.empty(T, C_, dtype=x.dtype, device=x.device)
    BLOCK_C = 64
    conv1d_kernel[(triton.cdiv(C_, BLOCK_C),)](x, weight, state, out, T, C_, x.stride(0), weight.stride(0),
                                              state.stride(0), out.stride(0), W=W_, BLOCK_C=BLOCK_C,
                                              BLOCK_S=triton.next_power_of_2(W_ - 1))
    return out
