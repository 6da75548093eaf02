"""Notebook 06's RoPE kernel, as the learner writes it: one program per (token, head), one head row per tile.

    inv_freq_i = theta^(-2i / R)    phi = positions[t] * inv_freq_i    (fp32, R = rotary_dim, half = R / 2)
    out[t, h, i]        = x[t, h, i] cos(phi) - x[t, h, i + half] sin(phi)          i < half
    out[t, h, i + half] = x[t, h, i + half] cos(phi) + x[t, h, i] sin(phi)
    out[t, h, d]        = x[t, h, d]                                                 R <= d < D

x [T, H, D] (strided leading dims allowed, stride 1 on the last), positions [T] int on the device -> out [T, H, D].

The cell below is solutions/06_rope.ipynb's exercise solution, character for character (tests/test_rope.py fails
if the two drift apart). The library's forms: rotary.py (`rope`, blocks of heads per program) and norm_rope.py
(the q/k RMSNorm and the KV-cache write fused in).
"""

import torch
import triton
import triton.language as tl


# Exercise 06.1: the RoPE kernel
@triton.jit
def rope_exercise_kernel(x_ptr, out_ptr, pos_ptr, inv_freq_ptr,
                         stride_xt, stride_xh, stride_ot, stride_oh,
                         D: tl.constexpr, HALF: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)                          # token
    h = tl.program_id(1)                          # head
    pos = tl.load(pos_ptr + t).to(tl.float32)     # this token's position, from device memory
    d = tl.arange(0, BLOCK_D)                     # the lanes of one head row
    x_row = x_ptr + t * stride_xt + h * stride_xh
    out_row = out_ptr + t * stride_ot + h * stride_oh
    is_first = d < HALF                           # x_i of a pair
    is_rot = d < 2 * HALF                         # inside the rotated block
    partner = tl.where(is_first, d + HALF, d - HALF)
    i = tl.where(is_first, d, d - HALF)           # the pair's frequency index
    phi = pos * tl.load(inv_freq_ptr + i, mask=is_rot, other=0.0)
    cos = tl.where(is_rot, tl.cos(phi), 1.0)      # pass-through dims: cos 1, sin 0
    sin = tl.where(is_first, -tl.sin(phi), tl.where(is_rot, tl.sin(phi), 0.0))
    x = tl.load(x_row + d, mask=d < D, other=0.0).to(tl.float32)
    x_partner = tl.load(x_row + partner, mask=is_rot, other=0.0).to(tl.float32)
    y = x * cos + x_partner * sin
    tl.store(out_row + d, y.to(out_ptr.dtype.element_ty), mask=d < D)


def my_rope(x, positions, rotary_dim, theta, out=None):
    T, H, D = x.shape
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    # omega_i = theta^(-2i/R), float32, exactly as reference.rope_cos_sin computes it
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=x.device, dtype=torch.float32) / rotary_dim))
    rope_exercise_kernel[(T, H)](x, out, positions, inv_freq,
                                 x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                                 D=D, HALF=rotary_dim // 2, BLOCK_D=triton.next_power_of_2(D))
    return out
