r"""The RMSNorm family of Qwen3.5: one row of D values in, one normalised row out.

Zero-centred RMSNorm (input, post-attention and final norms, and the per-head q/k norms):

    y = x * rsqrt(mean(x^2) + eps) * (1 + w)              x [..., D], w [D]

The checkpoint stores w near 0 and the model multiplies by (1 + w); forgetting the 1 scales every
feature by a number near 0 and the model still produces fluent-looking garbage.

Fused residual add + RMSNorm (the start of every block after the first):

    s = x + residual ;  y = rmsnorm(s) * (1 + w)          returns (y, s)

one read of x and residual, one write of y and of s, instead of an add kernel and a norm kernel.

Gated RMSNorm (the Gated DeltaNet output norm, the exception: plain w, then a SiLU gate):

    y = x * rsqrt(mean(x^2) + eps) * w * silu(z)          x, z [..., D], silu(z) = z * sigmoid(z)

Numerics: the row is loaded in its storage dtype (bf16 on a GPU), all math runs in fp32, and the
result is cast to x's dtype once, after the last multiply (casting the normalised row before the
multiply by w loses a bit for nothing). The sum s of the fused add is rounded to x's dtype first, as
the residual stream is stored, and the norm reads that rounded s.

Layout: one program owns BLOCK_R whole rows, so a row's mean needs no cross-program reduction and
D <= 32768 fits one block (Qwen3.5's widths are 128 to 5120). Inputs are viewed as [n0, n1, D]
with any strides on the two leading dims and stride 1 on the last: the q/k norm runs directly on
q = a slice of the fused projection's output, [T, heads, D] whose row stride is not heads * D and
whose head stride may not be D. Row r of the launch is element (r // n1, r % n1) of that view.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...errors import KernelError
from .. import pdl_options
from ...runtime import interpreter_active

MAX_D = 32768


@triton.jit
def _row_offsets(rows, n1, s0, s1):
    """Element offset of the first value of each row of a [n0, n1, D] view with strides (s0, s1, 1)."""
    # int64: a [2048, 8224] projection output already has 16.8 million elements; offsets of bigger
    # buffers must not wrap around.
    rows = rows.to(tl.int64)
    return (rows // n1) * s0 + (rows % n1) * s1


@triton.jit
def _inv_rms(x, D, eps):
    """rsqrt(mean(x^2) + eps) of each row of an fp32 tile (masked lanes hold 0 and add nothing)."""
    return tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr,
                    R, n1, D,
                    sx0, sx1, so0, so1,
                    eps,
                    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + _row_offsets(rows, n1, sx0, sx1)[:, None] + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = (x * _inv_rms(x, D, eps)[:, None]) * (1.0 + w)[None, :]
    tl.store(out_ptr + _row_offsets(rows, n1, so0, so1)[:, None] + cols[None, :],
             y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, rout_ptr,
                        R, D,
                        sx, sr, so, sro,
                        eps,
                        BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    rows = rows.to(tl.int64)
    x = tl.load(x_ptr + rows[:, None] * sx + cols[None, :], mask=mask, other=0.0)
    r = tl.load(r_ptr + rows[:, None] * sr + cols[None, :], mask=mask, other=0.0)
    # The residual stream is stored in x's dtype: round the sum once, then normalise what is stored,
    # so the next block's add and this norm see the same numbers.
    s = (x.to(tl.float32) + r.to(tl.float32)).to(rout_ptr.dtype.element_ty)
    # Both loads of a row happen before either store of it, and a row belongs to one program:
    # residual_out may therefore be the residual tensor itself (an in-place residual stream).
    tl.store(rout_ptr + rows[:, None] * sro + cols[None, :], s, mask=mask)
    sf = s.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = (sf * _inv_rms(sf, D, eps)[:, None]) * (1.0 + w)[None, :]
    tl.store(out_ptr + rows[:, None] * so + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gated_rms_norm_kernel(x_ptr, z_ptr, w_ptr, out_ptr,
                          R, n1, D,
                          sx0, sx1, sz0, sz1, so0, so1,
                          eps,
                          BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + _row_offsets(rows, n1, sx0, sx1)[:, None] + cols[None, :], mask=mask, other=0.0)
    z = tl.load(z_ptr + _row_offsets(rows, n1, sz0, sz1)[:, None] + cols[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    z = z.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    gate = z * tl.sigmoid(z)                                   # silu(z), fp32
    y = ((x * _inv_rms(x, D, eps)[:, None]) * w[None, :]) * gate   # plain w here, not (1 + w)
    tl.store(out_ptr + _row_offsets(rows, n1, so0, so1)[:, None] + cols[None, :],
             y.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- launchers

def _config(R: int, D: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, num_warps). A whole row per program; on a GPU about 4K elements per program for
    long rows (4 rows of 1024 for the hidden norms), 2K for short ones (16 heads of 128 for the gated norm:
    7.6 us against 8.6 with 32 heads on the H200, 2048 tokens); one fixed small tile under the interpreter,
    which pays for every program it runs."""
    block_d = triton.next_power_of_2(D)
    if interpreter_active():
        return 16, block_d, 1
    per_program = 2048 if block_d <= 256 else 4096
    block_r = max(1, min(64, per_program // block_d, triton.next_power_of_2(R)))
    tile = block_r * block_d
    warps = 1 if tile <= 256 else 2 if tile <= 1024 else 4 if tile <= 4096 else 8
    return block_r, block_d, warps


def _check_float(fn: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise KernelError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise KernelError(f"{fn}: {name} must be a floating-point tensor, got {t.dtype}")


def _rows3(fn: str, name: str, t: torch.Tensor) -> tuple[int, int, int, int]:
    """(n0, n1, s0, s1): t [..., D] seen as [n0, n1, D] with strides (s0, s1, 1), without copying."""
    if t.dim() == 0:
        raise KernelError(f"{fn}: {name} must have at least one dim [..., D], got a 0-d tensor")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise KernelError(f"{fn}: {name}'s last dim must be contiguous (stride 1), got strides {tuple(t.stride())}; "
                          f"leading dims may have any strides")
    if t.dim() == 1:
        return 1, 1, 0, 0
    if t.dim() == 2:
        return t.shape[0], 1, t.stride(0), 0
    if t.dim() > 3:
        try:
            t = t.view(-1, t.shape[-2], t.shape[-1])
        except RuntimeError:
            raise KernelError(f"{fn}: {name} {tuple(t.shape)} with strides {tuple(t.stride())}: the leading dims "
                              f"cannot be merged without a copy; pass at most 3 dims [n0, n1, D]") from None
    return t.shape[0], t.shape[1], t.stride(0), t.stride(1)


def _check_weight(fn: str, weight, x: torch.Tensor) -> None:
    _check_float(fn, "weight", weight)
    D = x.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != D:
        raise KernelError(f"{fn}: weight must be [D] = [{D}] (x's last dim), got {tuple(weight.shape)}")
    if weight.device != x.device:
        raise KernelError(f"{fn}: weight is on {weight.device} but x is on {x.device}")
    if D > 1 and weight.stride(0) != 1:
        raise KernelError(f"{fn}: weight must be contiguous, got stride {weight.stride(0)}")
    if D > MAX_D:
        raise KernelError(f"{fn}: rows of D={D} do not fit one block; this kernel serves D <= {MAX_D}")


def _check_like(fn: str, name: str, t, x: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    _check_float(fn, name, t)
    if tuple(t.shape) != tuple(x.shape) or t.device != x.device:
        raise KernelError(f"{fn}: {name} must have x's shape {tuple(x.shape)} on {x.device}, got "
                          f"{tuple(t.shape)} on {t.device}")
    if dtype is not None and t.dtype != dtype:
        raise KernelError(f"{fn}: {name} must be {dtype}, got {t.dtype}")


def _out_like(fn: str, name: str, out, x: torch.Tensor) -> torch.Tensor:
    """An output buffer like x: a new one when `out` is None, else `out` checked (x's shape, dtype and device)."""
    if out is None:
        return torch.empty(x.shape, device=x.device, dtype=x.dtype)
    _check_like(fn, name, out, x, x.dtype)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Zero-centred RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * (1 + weight).

    x [..., D] (e.g. [T, H], or the per-head q/k norm on [T, heads, D]) in any float dtype; the two leading
    dims may have any strides (q may be a slice of a fused projection), the last must be contiguous.
    weight [D] (any float dtype). Returns a contiguous tensor of x's shape and dtype (or `out`, which may be
    any [..., D] view with a contiguous last dim, and may be x itself).
    """
    fn = "rms_norm"
    _check_float(fn, "x", x)
    n0, n1, sx0, sx1 = _rows3(fn, "x", x)
    _check_weight(fn, weight, x)
    out = _out_like(fn, "out", out, x)
    _, _, so0, so1 = _rows3(fn, "out", out)
    R, D = n0 * n1, x.shape[-1]
    if R == 0 or D == 0:
        return out
    block_r, block_d, warps = _config(R, D)
    rms_norm_kernel[(triton.cdiv(R, block_r),)](x, weight, out, R, n1, D, sx0, sx1, so0, so1, float(eps),
                                                BLOCK_R=block_r, BLOCK_D=block_d, num_warps=warps,
                                                **pdl_options(x.device))
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 out: torch.Tensor | None = None, residual_out: torch.Tensor | None = None):
    """Fused residual add + zero-centred RMSNorm: s = x + residual (rounded to x's dtype), returns (rmsnorm(s), s).

    x, residual [T, H] (rows may be strided, last dim contiguous; residual may be another float dtype).
    `out` receives the normed rows, `residual_out` the sum s, both in x's dtype. `residual_out` may be
    `residual` itself (or x) for an in-place residual stream: every row is read before it is written, by
    the one program that owns it. Pass the very same tensor, not a different view of overlapping memory.
    """
    fn = "add_rms_norm"
    _check_float(fn, "x", x)
    if x.dim() != 2:
        raise KernelError(f"{fn}: x must be [T, H], got shape {tuple(x.shape)}")
    _check_like(fn, "residual", residual, x)
    _check_weight(fn, weight, x)
    out = _out_like(fn, "out", out, x)
    residual_out = _out_like(fn, "residual_out", residual_out, x)
    for name, t in (("x", x), ("residual", residual), ("out", out), ("residual_out", residual_out)):
        _rows3(fn, name, t)                      # last dim contiguous
    R, D = x.shape
    if R == 0 or D == 0:
        return out, residual_out
    block_r, block_d, warps = _config(R, D)
    add_rms_norm_kernel[(triton.cdiv(R, block_r),)](
        x, residual, weight, out, residual_out, R, D,
        x.stride(0), residual.stride(0), out.stride(0), residual_out.stride(0), float(eps),
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=warps, **pdl_options(x.device))
    return out, residual_out


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Gated DeltaNet output norm: rmsnorm(x) * weight * silu(z), with the plain weight (not 1 + weight).

    x, z [..., D] (e.g. x [T, Hv, Dv] and z a strided [T, Hv, Dv] view of the fused in-projection's output),
    leading dims any strides, last dim contiguous; weight [D] (often float32 beside bf16 activations).
    Returns a contiguous tensor of x's shape and dtype (or `out`).
    """
    fn = "gated_rms_norm"
    _check_float(fn, "x", x)
    n0, n1, sx0, sx1 = _rows3(fn, "x", x)
    _check_like(fn, "z", z, x)
    _, _, sz0, sz1 = _rows3(fn, "z", z)
    _check_weight(fn, weight, x)
    out = _out_like(fn, "out", out, x)
    _, _, so0, so1 = _rows3(fn, "out", out)
    R, D = n0 * n1, x.shape[-1]
    if R == 0 or D == 0:
        return out
    block_r, block_d, warps = _config(R, D)
    gated_rms_norm_kernel[(triton.cdiv(R, block_r),)](
        x, z, weight, out, R, n1, D, sx0, sx1, sz0, sz1, so0, so1, float(eps),
        BLOCK_R=block_r, BLOCK_D=block_d, num_warps=warps, **pdl_options(x.device))
    return out


__all__ = ["add_rms_norm", "add_rms_norm_kernel", "gated_rms_norm", "gated_rms_norm_kernel", "rms_norm",
           "rms_norm_kernel"]
