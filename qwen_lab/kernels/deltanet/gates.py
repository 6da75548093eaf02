"""The pieces every form of the delta rule shares: the gates and the l2 norm of q and k.

Gates (fp32), per token and value head, from the raw projections a, b [T, Hv] and the parameters A_log, dt_bias [Hv]:

    g = -exp(A_log) * softplus(a + dt_bias)     the log of a decay in (0, 1]
    beta = sigmoid(b)                            the write strength

l2norm: x * rsqrt(sum(x^2) + eps) over the last dim, fp32 math, for x [D], [N, D] or [N0, N1, D].

The delta rule's kernels compute the norms of the rows they read themselves, and, given the raw a and b, the gates
too (with `_softplus`): `deltanet_gates` runs where the gates are passed in (the model's unfused route), `l2norm`
serves the checks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import KernelError
from .arguments import _check, _check_gate_params, _check_out, _shape
from .tuning import INTERPRET

EPS = 1e-6  # l2norm epsilon of q and k inside the delta rule (as in the reference and transformers)


@triton.jit
def _softplus(x):
    # torch's softplus: x above the threshold 20, else log(1 + e^x); for tiny e^x, log(1 + e) loses e's low
    # bits in fp32, and e - e^2/2 is exact to fp32 there.
    e = tl.exp(tl.minimum(x, 20.0))
    sp = tl.where(e < 1e-4, e * (1.0 - 0.5 * e), tl.log(1.0 + e))
    return tl.where(x > 20.0, x, sp)


@triton.jit
def l2norm_kernel(x_ptr, out_ptr, N0, N1, D, stride_x0, stride_x1, stride_o0, stride_o1, eps,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # rows r = i0 * N1 + i1 of x [N0, N1, D]; one [BLOCK_R, BLOCK_D] tile holds whole rows
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    i0 = (r // N1).to(tl.int64)
    i1 = r % N1
    offs_d = tl.arange(0, BLOCK_D)
    mask = (r < N0 * N1)[:, None] & (offs_d < D)[None, :]
    x = tl.load(x_ptr + (i0 * stride_x0 + i1 * stride_x1)[:, None] + offs_d[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, 1) + eps)[:, None]
    tl.store(out_ptr + (i0 * stride_o0 + i1 * stride_o1)[:, None] + offs_d[None, :],
             y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def deltanet_gates_kernel(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, T, H,
                          stride_at, stride_bt, stride_gt, stride_betat,
                          BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    offs_t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    mask = (offs_t < T)[:, None] & mask_h[None, :]
    a = tl.load(a_ptr + offs_t[:, None] * stride_at + offs_h[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs_t[:, None] * stride_bt + offs_h[None, :], mask=mask, other=0.0).to(tl.float32)
    neg_A = -tl.exp(tl.load(A_log_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    g = neg_A[None, :] * _softplus(a + dt_bias[None, :])
    tl.store(g_ptr + offs_t[:, None] * stride_gt + offs_h[None, :], g, mask=mask)
    tl.store(beta_ptr + offs_t[:, None] * stride_betat + offs_h[None, :], tl.sigmoid(b), mask=mask)


# ---------------------------------------------------------------- launchers


def l2norm(x: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim, fp32 math; = reference.l2norm.

    x [D], [N, D] or [N0, N1, D] (any strides on the leading dims) -> same shape, x's dtype.
    """
    if not isinstance(x, torch.Tensor) or not 1 <= x.dim() <= 3:
        raise KernelError(f"x: expected a tensor [D], [N, D] or [N0, N1, D], got {_shape(x)}")
    _check("x", x, x.dim(), "[..., D]")
    out = _check_out("out", out, x.shape, x.dtype, x.device)
    x3, o3 = x, out
    while x3.dim() < 3:
        x3, o3 = x3.unsqueeze(0), o3.unsqueeze(0)
    N0, N1, D = x3.shape
    if x3.numel() == 0:
        return out
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_R = max(1, min(64 if INTERPRET else 16, 4096 // BLOCK_D, triton.next_power_of_2(N0 * N1)))
    grid = (triton.cdiv(N0 * N1, BLOCK_R),)
    l2norm_kernel[grid](x3, o3, N0, N1, D, x3.stride(0), x3.stride(1), o3.stride(0), o3.stride(1), float(eps),
                        BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D, num_warps=4)
    return out


def deltanet_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                   g_out: torch.Tensor | None = None, beta_out: torch.Tensor | None = None):
    """g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), both fp32; = reference.deltanet_gates.

    a, b [T, Hv] (strided views allowed); A_log, dt_bias [Hv] -> (g [T, Hv], beta [T, Hv]).
    """
    _check("a", a, 2, "[T, Hv]")
    T, H = a.shape
    _check("b", b, 2, f"[T={T}, Hv={H}]", device=a.device)
    if tuple(b.shape) != (T, H):
        raise KernelError(f"b: shape {tuple(b.shape)}, expected {(T, H)} like a")
    _check_gate_params(A_log, dt_bias, H, a.device)
    g_out = _check_out("g_out", g_out, (T, H), torch.float32, a.device)
    beta_out = _check_out("beta_out", beta_out, (T, H), torch.float32, a.device)
    if T == 0 or H == 0:
        return g_out, beta_out
    BLOCK_H = triton.next_power_of_2(H)
    BLOCK_T = max(1, min(64, 2048 // BLOCK_H, triton.next_power_of_2(T)))
    grid = (triton.cdiv(T, BLOCK_T),)
    deltanet_gates_kernel[grid](a, b, A_log, dt_bias, g_out, beta_out, T, H,
                                a.stride(0), b.stride(0), g_out.stride(0), beta_out.stride(0),
                                BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H, num_warps=4)
    return g_out, beta_out
