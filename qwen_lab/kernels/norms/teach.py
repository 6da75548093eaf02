r"""Notebook 02's kernels, as the learner writes them in exercises 02.1-02.3 (the notebook's solution cells,
character for character; `tests/test_norms.py` fails if the two drift apart).

    my_rms_norm(x, w, eps)           y = x rsqrt(mean(x^2) + eps) (1 + w)             x [rows, D] or [rows, heads, D]
    my_add_rms_norm(x, r, w, eps)    s = x + r (rounded to x's dtype), (rms_norm(s), s)   x, r [T, H]
    my_gated_rms_norm(x, z, w, eps)  y = x rsqrt(mean(x^2) + eps) w silu(z)  (plain w)    x, z [T, heads, D]

w [D]; one program normalises BLOCK_R whole rows (BLOCK_D >= D), the math in fp32, one rounding at the store.
The finished kernels beside them (`rmsnorm.py`) add strided outputs, argument checks, a block shape per machine
and programmatic dependent launch.
"""

import torch
import triton
import triton.language as tl


def as_rows(t):
    """(n0, n1, s0, s1): t [n0, D] or [n0, n1, D] seen as [n0, n1, D] with strides (s0, s1, 1), no copy."""
    assert t.stride(-1) == 1, "the last dim must be contiguous"
    if t.dim() == 2:
        return t.shape[0], 1, t.stride(0), 0
    assert t.dim() == 3, "x must be [rows, D] or [rows, heads, D]"
    return t.shape[0], t.shape[1], t.stride(0), t.stride(1)


# Exercise 02.1: zero-centred RMSNorm
@triton.jit
def rms_norm_exercise_kernel(x_ptr, w_ptr, out_ptr, R, n1, D, sx0, sx1, eps,
                             BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)          # the rows of this program
    cols = tl.arange(0, BLOCK_D)                                       # a whole row: BLOCK_D >= D
    x_rows = x_ptr + (rows // n1).to(tl.int64) * sx0 + (rows % n1).to(tl.int64) * sx1   # row r = x[r // n1, r % n1]
    out_rows = out_ptr + rows.to(tl.int64) * D                         # the output is contiguous
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    x = tl.load(x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)           # one number per row
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = (x * inv_rms[:, None]) * (1.0 + w)[None, :]
    tl.store(out_rows[:, None] + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def my_rms_norm(x, weight, eps, out=None):
    """Zero-centred RMSNorm of x [rows, D] or [rows, heads, D] (any strides but the last); contiguous result."""
    n0, n1, sx0, sx1 = as_rows(x)
    R, D = n0 * n1, x.shape[-1]
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    BLOCK_R = 8
    rms_norm_exercise_kernel[(triton.cdiv(R, BLOCK_R),)](x, weight, out, R, n1, D, sx0, sx1, eps,
                                                         BLOCK_R=BLOCK_R, BLOCK_D=triton.next_power_of_2(D))
    return out


# Exercise 02.2: fused residual add + RMSNorm
@triton.jit
def add_rms_norm_exercise_kernel(x_ptr, r_ptr, w_ptr, out_ptr, rout_ptr, R, D, sx, sr, so, sro, eps,
                                 BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    rows = rows.to(tl.int64)                                           # offsets rows * stride in int64
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * sx + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows[:, None] * sr + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s = (x + r).to(rout_ptr.dtype.element_ty)                          # what the residual stream stores
    tl.store(rout_ptr + rows[:, None] * sro + cols[None, :], s, mask=mask)
    s = s.to(tl.float32)
    inv_rms = tl.math.rsqrt(tl.sum(s * s, axis=1) / D + eps)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = (s * inv_rms[:, None]) * (1.0 + w)[None, :]
    tl.store(out_ptr + rows[:, None] * so + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def my_add_rms_norm(x, residual, weight, eps, out=None, residual_out=None):
    """(rms_norm(x + residual), x + residual) for x, residual [T, H]; residual_out may be residual itself."""
    R, D = x.shape
    out = torch.empty_like(x) if out is None else out
    residual_out = torch.empty_like(x) if residual_out is None else residual_out
    BLOCK_R = 8
    add_rms_norm_exercise_kernel[(triton.cdiv(R, BLOCK_R),)](
        x, residual, weight, out, residual_out, R, D,
        x.stride(0), residual.stride(0), out.stride(0), residual_out.stride(0), eps,
        BLOCK_R=BLOCK_R, BLOCK_D=triton.next_power_of_2(D))
    return out, residual_out


# Exercise 02.3: gated RMSNorm
@triton.jit
def gated_rms_norm_exercise_kernel(x_ptr, z_ptr, w_ptr, out_ptr, R, n1, D, sx0, sx1, sz0, sz1, eps,
                                   BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    t, h = (rows // n1).to(tl.int64), (rows % n1).to(tl.int64)       # row r = [token t, head h]
    x_rows = x_ptr + t * sx0 + h * sx1
    z_rows = z_ptr + t * sz0 + h * sz1
    out_rows = out_ptr + rows.to(tl.int64) * D
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    x = tl.load(x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = ((x * inv_rms[:, None]) * w[None, :]) * (z * tl.sigmoid(z))
    tl.store(out_rows[:, None] + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def my_gated_rms_norm(x, z, weight, eps, out=None):
    """rmsnorm(x) * weight * silu(z) for x, z [T, heads, D] (or [rows, D]); contiguous result in x's dtype."""
    n0, n1, sx0, sx1 = as_rows(x)
    _, _, sz0, sz1 = as_rows(z)
    R, D = n0 * n1, x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    BLOCK_R = 8
    gated_rms_norm_exercise_kernel[(triton.cdiv(R, BLOCK_R),)](x, z, weight, out, R, n1, D, sx0, sx1, sz0, sz1, eps,
                                                               BLOCK_R=BLOCK_R, BLOCK_D=triton.next_power_of_2(D))
    return out
