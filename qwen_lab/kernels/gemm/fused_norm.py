r"""RMSNorms fused into the projection after them (or split across the two projections around them), so that
the norm costs no launch of its own:

    rms_norm_linear(x, w_n, eps, W)          = rms_norm(x) (1 + w_n) W^T                x [M, H], W [N, H]
    add_rms_norm_linear(x, r, w_n, eps, W)   = (rms_norm(s) (1 + w_n) W^T, s), s = x + r
    gated_rms_norm_linear(o, z, w_n, eps, W) = (rms_norm(o) w_n silu(z)).reshape(M, Hv Dv) W^T   o, z [M, Hv, Dv]
    linear_add_rms_norm(x, W, r, w_n, eps)   = (s, s (1 + w_n), ss), s = r + x W^T, ss: sums of s^2 by column tile
    rms_scaled_linear(h, ss, eps, W)         = (h W^T) / sqrt(sum(ss) / K + eps)

rms(v) = sqrt(mean(v^2) + eps) over the row (per head for the gated norm). At decode (M <= GEMV_MAX_M) the first
three are one launch of the GEMV with the norm as its prologue (`gemv.py`, PRO_RMS, PRO_ADD_RMS, PRO_GATED); the last
two split a prompt's residual add + RMSNorm between the epilogues of the GEMMs before and after it (`tiled.py`,
RES_NORM and ROW_SCALE). This file holds no kernel: it checks the operands and picks the route.
"""

from __future__ import annotations

import torch
import triton

from .common import (GEMV_MAX_M, K_GRANULE, PRO_ADD_RMS, PRO_GATED, PRO_RMS, _DTYPES, _check_matrix, _check_operands,
                     _check_swiglu_operands, _check_weight_out, _fail)
from .gemv import _launch_gemv, linear
from .tiled import _matmul
from .tuning import _gemv_configs, _matmul_configs

# Above this many outputs the norm is not fused into the GEMV's prologue (the LM head: see _rms_linear).
FUSED_NORM_MAX_N = 65536


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last + 1) byte addresses that t's elements can touch."""
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0 or a.device != b.device:
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _check_norm_weight(name: str, norm_weight, D: int, x) -> None:
    if not isinstance(norm_weight, torch.Tensor) or not norm_weight.is_floating_point():
        _fail(name, "norm_weight", f"must be a floating-point torch.Tensor, got "
              f"{norm_weight.dtype if isinstance(norm_weight, torch.Tensor) else type(norm_weight).__name__}")
    if norm_weight.dim() != 1 or norm_weight.shape[0] != D:
        _fail(name, "norm_weight", f"must be [{D}], got shape {tuple(norm_weight.shape)}")
    if norm_weight.device != x.device:
        _fail(name, "norm_weight", f"is on {norm_weight.device}, but x is on {x.device}")
    if D > 1 and norm_weight.stride(0) != 1:
        _fail(name, "norm_weight", f"must be contiguous, got stride {norm_weight.stride(0)}")


def _check_row_like(name: str, arg: str, t, x, dtype=None) -> None:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        _fail(name, arg, f"must be a floating-point torch.Tensor, got "
              f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if tuple(t.shape) != tuple(x.shape) or t.device != x.device:
        _fail(name, arg, f"must have x's shape {tuple(x.shape)} on {x.device}, got {tuple(t.shape)} on {t.device}")
    if dtype is not None and t.dtype != dtype:
        _fail(name, arg, f"must be {dtype} (x's dtype), got {t.dtype}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        _fail(name, arg, f"must be contiguous in its last dim (stride 1), got strides {t.stride()}")


def _rms_linear(name, x, residual, norm_weight, eps, weight, out, residual_out, split_k=None, deterministic=None):
    """add_rms_norm_linear (residual given) or rms_norm_linear; split_k / deterministic as in linear_splitk."""
    _check_matrix(name, "x", x)
    _check_matrix(name, "weight", weight)
    M, H = x.shape
    N, K = _check_weight_out(name, x, weight, out, M, H)
    _check_norm_weight(name, norm_weight, H, x)
    if residual is not None:
        _check_row_like(name, "residual", residual, x)
        if residual_out is None:
            residual_out = torch.empty((M, H), dtype=x.dtype, device=x.device)
        else:
            _check_row_like(name, "residual_out", residual_out, x, x.dtype)
            for arg, t in (("residual", residual), ("x", x)):
                if _overlap(residual_out, t):
                    # At decode every program reads x and residual while one of them writes s: an
                    # in-place residual_out would let a program read a residual already replaced by s.
                    _fail(name, "residual_out", f"overlaps {arg}; pass a separate buffer (e.g. alternate "
                          f"two residual buffers between layers): the fused kernel reads {arg} in every "
                          f"program while one program writes residual_out")
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    # Compute-bound (M large), or an LM-head-sized N: there every one of thousands of programs would redo the
    # row's norm, measured slower on the H200 than one norm kernel and a plain GEMV (146.9 us against 123.5 us).
    if M > GEMV_MAX_M or N > FUSED_NORM_MAX_N:
        from .. import norms
        if residual is None:
            h = norms.rms_norm(x, norm_weight, eps)
        else:
            h, residual_out = norms.add_rms_norm(x, residual, norm_weight, eps, residual_out=residual_out)
        y = _matmul(name, h, weight, out) if M > GEMV_MAX_M else linear(h, weight, out=out)
        return y if residual is None else (y, residual_out)
    args = dict(stride_xm=x.stride(0), nw=norm_weight, eps=eps)
    if residual is not None:
        args.update(r=residual, stride_rm=residual.stride(0), s=residual_out, stride_sm=residual_out.stride(0))
    if M > 0 and N == 0 and residual is not None:  # no GEMV program would run to write s
        residual_out.copy_((x.float() + residual.float()).to(x.dtype))
    _launch_gemv(name, x, weight, out, M, N, K, split_k, deterministic, PRO_RMS if residual is None else PRO_ADD_RMS,
                 args)
    return out if residual is None else (out, residual_out)


def add_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, out: torch.Tensor | None = None,
                        residual_out: torch.Tensor | None = None):
    """Residual add + zero-centred RMSNorm + projection: s = x + residual (rounded to x's dtype),
    h = rms_norm(s) * (1 + norm_weight) rounded to x's dtype, returns (h @ weight^T, s).

    x, residual [M, H] (rows may be strided, last dim contiguous), norm_weight [H], weight [N, H] ->
    (y [M, N], s [M, H]). M <= 16 and N <= FUSED_NORM_MAX_N: ONE launch, the add and the norm computed in the
    GEMV's prologue (every
    program sums the squares of its whole rows; the programs of the first row block and first split write
    s into residual_out). Larger M: norms.add_rms_norm, then the tiled GEMM; N > FUSED_NORM_MAX_N (the LM head):
    norms.add_rms_norm, then the GEMV. `residual_out` must not
    overlap x or residual (KernelError): pass a separate buffer, e.g. alternate two between layers.
    """
    return _rms_linear("add_rms_norm_linear", x, residual, norm_weight, eps, weight, out, residual_out)


def ss_slots(H: int) -> int:
    """Slots per row of the partial sums of squares that linear_add_rms_norm writes for an H-wide output: one per
    column tile at the narrowest tile of any configuration, rounded up to a power of two."""
    narrowest = min(c.kwargs["BLOCK_N"] for c in _matmul_configs(False))
    return triton.next_power_of_2(triton.cdiv(H, narrowest))


def linear_add_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                        eps: float, residual_out: torch.Tensor | None = None):
    """A branch's output projection joining the residual stream, and the part of the next RMSNorm that needs no
    whole row, in one GEMM's epilogue (the norm kernel between two prompt GEMMs is gone):

        s = residual + x weight^T       (the product rounded to x's dtype, then the sum: as add_rms_norm rounds)
        h = s (1 + norm_weight)         (x's dtype)
        ss[m, j] = sum of s[m, n]^2 over the j-th output tile's columns n (fp32; the slots past the tiles: 0)

    x [M, K], weight [H, K], residual [M, H] (rows may be strided), norm_weight [H] -> (s, h, ss), s and h [M, H],
    ss [M, ss_slots(H)]. residual_out (s) may be `residual` itself, updated in place. The norm's row factor is
    left to the next product: rms_norm(s) (1 + w) = s (1 + w) / rms(s), and 1 / rms(s) multiplies each of that
    product's fp32 sums (`rms_scaled_linear`). Always the tiled GEMM."""
    name = "linear_add_rms_norm"
    M, H, K = _check_operands(name, x, weight, None)
    _check_norm_weight(name, norm_weight, H, x)
    for arg, t in [("residual", residual)] + ([("residual_out", residual_out)] if residual_out is not None else []):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (M, H) or t.dtype != x.dtype or t.device != x.device:
            _fail(name, arg, f"must be [{M}, {H}] {x.dtype} on {x.device} (x's rows, weight's outputs), got "
                  f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}"
                  f"{f' {t.dtype} on {t.device}' if isinstance(t, torch.Tensor) else ''}")
        if H > 1 and t.stride(1) != 1:
            _fail(name, arg, f"must be contiguous in its last dim (stride 1), got strides {t.stride()}")
    if residual_out is None:
        residual_out = torch.empty((M, H), dtype=x.dtype, device=x.device)
    elif _overlap(residual_out, residual) and (residual_out.data_ptr(), residual_out.stride()) != \
            (residual.data_ptr(), residual.stride()):
        _fail(name, "residual_out", "overlaps residual without being it: pass residual itself (in place) or a "
              "separate buffer")
    for arg, t in (("residual", residual), ("residual_out", residual_out)):
        if _overlap(t, x):
            _fail(name, arg, "overlaps x, which every program of the product reads")
    h = torch.empty((M, H), dtype=x.dtype, device=x.device)
    ss = torch.empty((M, ss_slots(H)), dtype=torch.float32, device=x.device)
    _matmul(name, x, weight, residual_out,
            epilogue={"residual": residual, "norm_weight": norm_weight, "h": h, "ss": ss})
    return residual_out, h, ss


def rms_scaled_linear(h: torch.Tensor, ss: torch.Tensor, eps: float, weight: torch.Tensor, swiglu: bool = False, *,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """The projection after linear_add_rms_norm, the norm's row factor applied to its fp32 sums:

        y[m] = (h[m] weight^T) / sqrt(sum(ss[m]) / K + eps)        (K: h's width, the norm's)

    h [M, K], ss [M, S] fp32 (S a power of two), weight [N, K] -> y [M, N]; with swiglu, weight = [W_gate; W_up]
    [2N, K], both sums scaled, then silu(gate) * up. Equals linear(rms_norm(s, w, eps), weight) (or
    linear_silu_mul of it) up to where the rounding falls. Always the tiled GEMM."""
    name = "rms_scaled_linear"
    M, N, K = _check_swiglu_operands(name, h, weight, out) if swiglu else _check_operands(name, h, weight, out)
    if (not isinstance(ss, torch.Tensor) or ss.dim() != 2 or ss.shape[0] != M or ss.dtype != torch.float32
            or ss.device != h.device or ss.shape[1] & (ss.shape[1] - 1) or not ss.is_contiguous()):
        _fail(name, "ss", f"must be a contiguous float32 [{M}, S] on {h.device}, S a power of two (from "
              f"linear_add_rms_norm), got {tuple(ss.shape) if isinstance(ss, torch.Tensor) else type(ss).__name__}"
              f"{f' {ss.dtype}' if isinstance(ss, torch.Tensor) else ''}")
    return _matmul(name, h, weight, out, swiglu=swiglu, epilogue={"ss": ss, "eps": eps})


def rms_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Zero-centred RMSNorm + projection: rms_norm(x) * (1 + norm_weight) rounded to x's dtype, @ weight^T.

    x [M, H], norm_weight [H], weight [N, H] -> [M, N]; one launch for M <= 16 and N <= FUSED_NORM_MAX_N, else
    rms_norm then the GEMM (M > 16) or the GEMV (N larger).
    """
    return _rms_linear("rms_norm_linear", x, None, norm_weight, eps, weight, out, None)


def _gated_fusable(Dv: int) -> bool:
    """The fused gated prologue normalises whole heads inside one tile: Dv a power of two, 16 or more, and
    no wider than the largest BLOCK_K the configs offer."""
    widest = max(c.kwargs["BLOCK_K"] for c in _gemv_configs())
    return Dv >= K_GRANULE and Dv & (Dv - 1) == 0 and Dv <= widest


def gated_rms_norm_linear(o: torch.Tensor, z: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                          weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The Gated DeltaNet's output: gated_rms_norm(o, z, norm_weight, eps).reshape(M, Hv * Dv) @ weight^T.

    o, z [M, Hv, Dv] (any strides on the leading dims, e.g. z a view of the in-projection's output; last
    dim contiguous), norm_weight [Dv] (any float dtype), weight [N, Hv * Dv] -> [M, N]. M <= 16 and Dv a
    power of two (16 .. the widest BLOCK_K): ONE launch, each program normalising the heads of its slice of
    K in the GEMV's prologue (BLOCK_K and the split points are multiples of Dv, so a tile holds whole
    heads). Otherwise norms.gated_rms_norm, then `linear`.
    """
    return _gated_linear(o, z, norm_weight, eps, weight, out)


def _gated_linear(o, z, norm_weight, eps, weight, out, split_k=None, deterministic=None):
    """gated_rms_norm_linear with split_k / deterministic as in linear_splitk (the fused path only)."""
    name = "gated_rms_norm_linear"
    if not isinstance(o, torch.Tensor) or o.dim() != 3:
        _fail(name, "o", f"must be a 3-D tensor [M, Hv, Dv], got "
              f"{tuple(o.shape) if isinstance(o, torch.Tensor) else type(o).__name__}")
    if o.dtype not in _DTYPES:
        _fail(name, "o", f"has dtype {o.dtype}; expected bfloat16, float16 or float32")
    if o.shape[-1] > 1 and o.stride(-1) != 1:
        _fail(name, "o", f"must be contiguous in its last dim (stride 1), got strides {o.stride()}")
    _check_row_like(name, "z", z, o)
    _check_matrix(name, "weight", weight)
    M, Hv, Dv = o.shape
    N, K = _check_weight_out(name, o, weight, out, M, Hv * Dv, "o")
    _check_norm_weight(name, norm_weight, Dv, o)
    if out is None:
        out = torch.empty((M, N), dtype=o.dtype, device=o.device)
    if M > GEMV_MAX_M or not _gated_fusable(Dv):
        from .. import norms
        h = norms.gated_rms_norm(o, z, norm_weight, eps)
        return linear(h.reshape(M, K), weight, out=out)
    args = dict(stride_xm=o.stride(0), stride_xh=o.stride(1), z=z, stride_zm=z.stride(0), stride_zh=z.stride(1),
                nw=norm_weight, eps=eps)
    return _launch_gemv(name, o, weight, out, M, N, K, split_k, deterministic, PRO_GATED, args, dv=Dv)
