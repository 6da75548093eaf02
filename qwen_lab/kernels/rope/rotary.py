"""Rotary position embedding (RoPE), partial and rotate-half: the library's form, and the device functions the
fused forms (norm_rope.py, the attention's decode) build on.

Qwen3.5's attention rotates only the first `rotary_dim` = R dims of each head (64 of 256); the other
D - R dims carry no position and pass through. With half = R / 2, for each token t, head h, i < half:

    inv_freq_i = theta^(-2i / R)            phi_{t,i} = positions[t] * inv_freq_i       (fp32)
    out[t, h, i]        = x[t, h, i] cos(phi) - x[t, h, i + half] sin(phi)
    out[t, h, i + half] = x[t, h, i + half] cos(phi) + x[t, h, i] sin(phi)
    out[t, h, d]        = x[t, h, d]                       for R <= d < D

so each pair (x_i, x_{i+half}) turns by the angle phi_{t,i}. q k^T then depends on the positions only
through their difference, which is what makes this a relative position code.

Shapes: x [T, heads, D], any strides on the two leading dims (q is a view of the fused projection),
stride 1 on the last; positions an int64 or int32 tensor [T] on the device. The position is read *inside* the
kernel from device memory, so a captured CUDA Graph replays at any position without re-capture.

Kernel layout: one program per (token, block of heads); a head row [D] is one tile. Each element also
loads its rotation partner (i + half for the first half, i - half for the second), so no shuffles are
needed; the pass-through dims use cos = 1, sin = 0.

`_norm_rope_rows` (RoPE of a block of head rows, after the q/k RMSNorm when asked) is the piece every fused
form shares: norm_rope.py's kernels and attention's decode split kernel call it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import KernelError


@triton.jit
def _rotary_lanes(inv_freq_ptr, HALF: tl.constexpr, BLOCK_D: tl.constexpr):
    """The lanes d of a head row -> (d, d < HALF, d rotated (d < 2 HALF), d's rotation partner, inv_freq of d)."""
    offs_d = tl.arange(0, BLOCK_D)
    is_first = offs_d < HALF
    is_rot = offs_d < 2 * HALF
    # the partner of d inside the rotated block; outside it d is its own (ignored) partner
    partner = tl.where(is_first, offs_d + HALF, tl.where(is_rot, offs_d - HALF, offs_d))
    freq_idx = tl.where(is_first, offs_d, offs_d - HALF)
    inv_freq = tl.load(inv_freq_ptr + freq_idx, mask=is_rot, other=0.0)
    return offs_d, is_first, is_rot, partner, inv_freq


@triton.jit
def _rotation(phi, is_first, is_rot):
    """(cos, signed sin) of the angles phi (lanes last): out = x cos + x[partner] sin."""
    # phi reaches 2.6e5 rad at the longest context; on NVIDIA GPUs tl.cos/tl.sin compile to libdevice's
    # fully range-reduced cosf/sinf (no sin.approx), so they agree with torch.cos/sin to an ulp
    cos = tl.where(is_rot, tl.cos(phi), 1.0)
    # rotate-half: the first half subtracts its partner, the second half adds it
    sin = tl.sin(phi)
    sin = tl.where(is_first, -sin, tl.where(is_rot, sin, 0.0))
    return cos, sin


@triton.jit
def _norm_rope_rows(x_ptr, w_ptr, inv_freq_ptr, t, pos, h0, H, stride_xt, stride_xh, eps,
                    D: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr,
                    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """RoPE (after the zero-centred RMSNorm when HAS_NORM) of heads h0 .. h0 + BLOCK_H - 1 of token t, in fp32
    (the norm's output rounded to x's dtype first); -> (y [BLOCK_H, BLOCK_D], head offsets, dim offsets, mask)."""
    offs_h = h0 + tl.arange(0, BLOCK_H)
    offs_d, is_first, is_rot, partner, inv_freq = _rotary_lanes(inv_freq_ptr, HALF, BLOCK_D)
    cos, sin = _rotation(pos.to(tl.float32) * inv_freq, is_first, is_rot)

    mask = (offs_h < H)[:, None] & (offs_d < D)[None, :]
    rows = x_ptr + t * stride_xt + offs_h[:, None] * stride_xh
    x = tl.load(rows + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    xp = tl.load(rows + partner[None, :], mask=mask & is_rot[None, :], other=0.0).to(tl.float32)
    if HAS_NORM:
        # fp32 statistics over the whole head row (padding lanes are 0 and add nothing)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        w = tl.load(w_ptr + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=is_rot, other=0.0).to(tl.float32)
        # round to the storage dtype between the two steps, exactly as rms_norm then rope would
        x = (x * rstd[:, None] * (1.0 + w[None, :])).to(x_ptr.dtype.element_ty).to(tl.float32)
        xp = (xp * rstd[:, None] * (1.0 + wp[None, :])).to(x_ptr.dtype.element_ty).to(tl.float32)
    y = x * cos[None, :] + xp * sin[None, :]
    return y, offs_h, offs_d, mask


@triton.jit
def _norm_rope_tile(x_ptr, out_ptr, w_ptr, inv_freq_ptr, t, pos, h0, H,
                    stride_xt, stride_xh, stride_ot, stride_oh, eps,
                    D: tl.constexpr, HALF: tl.constexpr, HAS_NORM: tl.constexpr,
                    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """_norm_rope_rows of token t, stored to row t of out (out has x's dtype)."""
    y, offs_h, offs_d, mask = _norm_rope_rows(x_ptr, w_ptr, inv_freq_ptr, t, pos, h0, H, stride_xt, stride_xh, eps,
                                              D, HALF, HAS_NORM, BLOCK_H, BLOCK_D)
    out_rows = out_ptr + t * stride_ot + offs_h[:, None] * stride_oh
    tl.store(out_rows + offs_d[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope_kernel(x_ptr, out_ptr, pos_ptr, inv_freq_ptr, H,
                stride_xt, stride_xh, stride_ot, stride_oh,
                D: tl.constexpr, HALF: tl.constexpr,
                BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    h0 = tl.program_id(1) * BLOCK_H
    pos = tl.load(pos_ptr + t)  # from device memory: a graph replays at any position
    _norm_rope_tile(x_ptr, out_ptr, x_ptr, inv_freq_ptr, t, pos, h0, H,
                    stride_xt, stride_xh, stride_ot, stride_oh, 0.0,
                    D, HALF, False, BLOCK_H, BLOCK_D)


# ---------------------------------------------------------------- launchers

_INV_FREQ: dict = {}


def inv_freq_table(rotary_dim: int, theta: float, device) -> torch.Tensor:
    """inv_freq_i = theta^(-2i / rotary_dim), fp32 [rotary_dim // 2], computed as the reference does.

    Cached per (rotary_dim, theta, device): the first call (a warm-up, before any graph capture)
    builds it, later calls only look it up. Matching the reference bit for bit keeps phi identical.
    """
    device = torch.device(device)
    key = (int(rotary_dim), float(theta), device)
    table = _INV_FREQ.get(key)
    if table is None:
        exponent = torch.arange(0, rotary_dim, 2, device=device, dtype=torch.float32) / rotary_dim
        table = _INV_FREQ[key] = 1.0 / (theta ** exponent)
    return table


def _check_rows(name: str, x, T=None, D=None):
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise KernelError(f"{name}: expected a tensor [T, heads, head_dim], got {got}")
    if not x.is_floating_point():
        raise KernelError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise KernelError(f"{name}: the last dim must be contiguous (stride 1), got strides {tuple(x.stride())}")
    if T is not None and x.shape[0] != T:
        raise KernelError(f"{name}: {x.shape[0]} tokens, expected {T} (as many as positions)")
    if D is not None and x.shape[2] != D:
        raise KernelError(f"{name}: head_dim {x.shape[2]}, expected {D}")


def _check_positions(positions, T: int, device):
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1:
        got = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise KernelError(f"positions: expected a 1-D integer tensor [T] on the device, got {got}")
    if positions.dtype not in (torch.int64, torch.int32):
        raise KernelError(f"positions: expected int64 or int32, got {positions.dtype}")
    if positions.shape[0] != T:
        raise KernelError(f"positions: {positions.shape[0]} entries, expected T={T}")
    if positions.device != device:
        raise KernelError(f"positions: on {positions.device}, expected {device} (read inside the kernel)")
    if positions.shape[0] > 1 and positions.stride(0) != 1:
        raise KernelError("positions: must be contiguous")


def _check_out(name, out, shape, dtype, device):
    if out is None:
        return
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise KernelError(f"{name}: expected a {dtype} tensor of shape {tuple(shape)} on {device}, got "
                          f"{out.dtype} {tuple(out.shape)} on {out.device}")
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        raise KernelError(f"{name}: the last dim must be contiguous (stride 1)")


def _check_rotary(rotary_dim, D):
    if not isinstance(rotary_dim, int) or rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > D:
        raise KernelError(f"rotary_dim: expected an even int in (0, head_dim={D}], got {rotary_dim!r}")


def _blocks(H: int, D: int):
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_H = min(triton.next_power_of_2(H), max(1, 4096 // BLOCK_D))
    return BLOCK_H, BLOCK_D


def rope(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """Partial rotate-half RoPE on the first `rotary_dim` dims of each head; = reference.rope.

    x [T, heads, D] (strided leading dims allowed), positions [T] int on x's device -> [T, heads, D].
    """
    _check_rows("x", x)
    T, H, D = x.shape
    _check_positions(positions, T, x.device)
    _check_rotary(rotary_dim, D)
    _check_out("out", out, x.shape, x.dtype, x.device)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if T == 0 or H == 0:
        return out
    inv_freq = inv_freq_table(rotary_dim, theta, x.device)
    BLOCK_H, BLOCK_D = _blocks(H, D)
    grid = (T, triton.cdiv(H, BLOCK_H))
    rope_kernel[grid](x, out, positions, inv_freq, H,
                      x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                      D=D, HALF=rotary_dim // 2,
                      BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, num_warps=4)
    return out
