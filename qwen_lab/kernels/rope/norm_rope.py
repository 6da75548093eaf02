"""RoPE fused with the per-head q/k RMSNorm, and with the attention layer's KV-cache write.

The rotation itself (math, shapes, lanes) is rotary.py's; the kernels here run its `_norm_rope_rows` on q and k.

`qk_norm_rope` fuses the zero-centred RMSNorm of each head row (x * rsqrt(mean(x^2) + eps) * (1 + w),
weight [D]) with RoPE, for q and k in one launch: the reference composition
rope(rms_norm(q, w_q)), rope(rms_norm(k, w_k)) in one read and one write of each row.

`qk_norm_rope_cache` adds the attention layer's KV-cache write to that kernel: the programs of the k heads
store the prepared k and the v rows of their heads straight into k_cache, v_cache [L, Hk, D] at row
positions[t] (read on the device; a position outside [0, L) writes nothing), and only q comes back. For a
prompt this saves the cache write's launch and a round trip of k per attention layer; a decode token does all of
it inside the attention's split kernel instead (attention.qk_norm_rope_cache_attention).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...errors import KernelError
from .. import pdl_options
from .rotary import (_blocks, _check_out, _check_positions, _check_rotary, _check_rows, _norm_rope_rows,
                     _norm_rope_tile, inv_freq_table)


@triton.jit
def qk_norm_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, q_out_ptr, k_out_ptr, pos_ptr, inv_freq_ptr, Hq, Hk, eps,
                        stride_qt, stride_qh, stride_kt, stride_kh,
                        stride_qot, stride_qoh, stride_kot, stride_koh,
                        D: tl.constexpr, HALF: tl.constexpr,
                        BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # grid (T, blocks of q heads + blocks of k heads): one launch serves both tensors
    t = tl.program_id(0)
    j = tl.program_id(1)
    n_q_blocks = tl.cdiv(Hq, BLOCK_H)
    pos = tl.load(pos_ptr + t)
    if j < n_q_blocks:
        _norm_rope_tile(q_ptr, q_out_ptr, qw_ptr, inv_freq_ptr, t, pos, j * BLOCK_H, Hq,
                        stride_qt, stride_qh, stride_qot, stride_qoh, eps,
                        D, HALF, True, BLOCK_H, BLOCK_D)
    else:
        _norm_rope_tile(k_ptr, k_out_ptr, kw_ptr, inv_freq_ptr, t, pos, (j - n_q_blocks) * BLOCK_H, Hk,
                        stride_kt, stride_kh, stride_kot, stride_koh, eps,
                        D, HALF, True, BLOCK_H, BLOCK_D)


@triton.jit
def qk_norm_rope_cache_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, pos_ptr,
                              inv_freq_ptr, Hq, Hk, L, q0, eps,
                              stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                              stride_qot, stride_qoh, stride_kct, stride_kch, stride_vct, stride_vch,
                              D: tl.constexpr, HALF: tl.constexpr,
                              BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # grid (T, blocks of q heads + blocks of k heads), as qk_norm_rope_kernel; a k program stores its prepared
    # k rows and the v rows of the same heads straight into the caches at row positions[t] (read on the device),
    # so the prepared k never goes through memory and the separate cache-write launch disappears.
    # q holds the queries of tokens q0 .. T-1 only (q0 > 0: only the last tokens attend): the q programs of the
    # tokens before q0 have nothing to do.
    t = tl.program_id(0)
    j = tl.program_id(1)
    n_q_blocks = tl.cdiv(Hq, BLOCK_H)
    pos = tl.load(pos_ptr + t)
    if j < n_q_blocks:
        if t >= q0:
            _norm_rope_tile(q_ptr, q_out_ptr, qw_ptr, inv_freq_ptr, t - q0, pos, j * BLOCK_H, Hq,
                            stride_qt, stride_qh, stride_qot, stride_qoh, eps,
                            D, HALF, True, BLOCK_H, BLOCK_D)
    else:
        h0 = (j - n_q_blocks) * BLOCK_H
        y, offs_h, offs_d, mask = _norm_rope_rows(k_ptr, kw_ptr, inv_freq_ptr, t, pos, h0, Hk, stride_kt,
                                                  stride_kh, eps, D, HALF, True, BLOCK_H, BLOCK_D)
        # a position outside the cache writes nothing rather than corrupting memory (as kv_cache_write)
        mask = mask & (pos >= 0) & (pos < L)
        # k rounded to its own dtype first, as qk_norm_rope returns it, then to the cache's
        k_new = y.to(k_ptr.dtype.element_ty).to(k_cache_ptr.dtype.element_ty)
        tl.store(k_cache_ptr + pos * stride_kct + offs_h[:, None] * stride_kch + offs_d[None, :], k_new, mask=mask)
        v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
        tl.store(v_cache_ptr + pos * stride_vct + offs_h[:, None] * stride_vch + offs_d[None, :],
                 v.to(v_cache_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- launchers


def _check_qk(q, k, q_weight, k_weight, last_queries=False):
    """The checks qk_norm_rope and qk_norm_rope_cache share: q [T, Hq, D] (last_queries: [Tq <= T, Hq, D], the
    queries of the last Tq tokens), k [T, Hk, D] of q's dtype and device, contiguous weights [D] on that device.
    -> (T, Hq, Hk, D)."""
    _check_rows("q", q)
    Tq, Hq, D = q.shape
    _check_rows("k", k, T=None if last_queries else Tq, D=D)
    T = k.shape[0]
    if Tq > T:
        raise KernelError(f"q: {Tq} tokens, expected at most k's {T} (the queries of k's last tokens)")
    if k.dtype != q.dtype or k.device != q.device:
        raise KernelError(f"k: expected {q.dtype} on {q.device} like q, got {k.dtype} on {k.device}")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != (D,) or w.device != q.device:
            raise KernelError(f"{name}: expected a tensor [{D}] on {q.device}, got "
                              f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
        if D > 1 and w.stride(0) != 1:
            raise KernelError(f"{name}: must be contiguous")
    return T, Hq, k.shape[1], D


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 positions: torch.Tensor, rotary_dim: int, theta: float,
                 q_out: torch.Tensor | None = None, k_out: torch.Tensor | None = None):
    """(rope(rms_norm(q, q_weight)), rope(rms_norm(k, k_weight))) in one launch.

    q [T, Hq, D], k [T, Hk, D] (strided views allowed), weights [D], positions [T]
    -> (q_out [T, Hq, D], k_out [T, Hk, D]) in the dtypes of q and k.
    """
    T, Hq, Hk, D = _check_qk(q, k, q_weight, k_weight)
    _check_positions(positions, T, q.device)
    _check_rotary(rotary_dim, D)
    _check_out("q_out", q_out, q.shape, q.dtype, q.device)
    _check_out("k_out", k_out, k.shape, k.dtype, k.device)
    if q_out is None:
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if k_out is None:
        k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if T == 0:
        return q_out, k_out
    inv_freq = inv_freq_table(rotary_dim, theta, q.device)
    BLOCK_H, BLOCK_D = _blocks(max(Hq, Hk), D)
    grid = (T, triton.cdiv(Hq, BLOCK_H) + triton.cdiv(Hk, BLOCK_H))
    qk_norm_rope_kernel[grid](q, k, q_weight, k_weight, q_out, k_out, positions, inv_freq, Hq, Hk, float(eps),
                                q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
                                D=D, HALF=rotary_dim // 2,
                                BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, num_warps=4, **pdl_options(q.device))
    return q_out, k_out


def qk_norm_rope_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                       k_weight: torch.Tensor, eps: float, positions: torch.Tensor, rotary_dim: int, theta: float,
                       k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """qk_norm_rope, then the cache write of the prepared k and of v, in one launch; = reference.qk_norm_rope_cache.

    q [Tq, Hq, D], the queries of the last Tq <= T tokens (Tq < T: a prompt's last layer, where only the last
    token attends), k, v [T, Hk, D] (strided views of one fused projection allowed), weights [D], positions [T],
    k_cache, v_cache [L, Hk, D] (updated in place at rows `positions`; a position outside [0, L) writes nothing)
    -> the prepared q [Tq, Hq, D] (in `out` when given).
    """
    T, Hq, Hk, D = _check_qk(q, k, q_weight, k_weight, last_queries=True)
    _check_rows("v", v, T=T, D=D)
    if v.shape[1] != Hk or v.device != q.device:
        raise KernelError(f"v: expected [{T}, {Hk}, {D}] on {q.device} like k, got {tuple(v.shape)} on {v.device}")
    _check_rows("k_cache", k_cache, D=D)
    L = k_cache.shape[0]
    if k_cache.shape[1] != Hk or k_cache.device != q.device:
        raise KernelError(f"k_cache: expected [L, {Hk}, {D}] on {q.device}, got {tuple(k_cache.shape)} on "
                          f"{k_cache.device}")
    _check_rows("v_cache", v_cache)
    if tuple(v_cache.shape) != tuple(k_cache.shape) or v_cache.device != q.device:
        raise KernelError(f"v_cache: expected {tuple(k_cache.shape)} on {q.device} like k_cache, got "
                          f"{tuple(v_cache.shape)} on {v_cache.device}")
    _check_positions(positions, T, q.device)
    _check_rotary(rotary_dim, D)
    _check_out("out", out, q.shape, q.dtype, q.device)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    inv_freq = inv_freq_table(rotary_dim, theta, q.device)
    BLOCK_H, BLOCK_D = _blocks(max(Hq, Hk), D)
    grid = (T, triton.cdiv(Hq, BLOCK_H) + triton.cdiv(Hk, BLOCK_H))
    qk_norm_rope_cache_kernel[grid](q, k, v, q_weight, k_weight, out, k_cache, v_cache, positions, inv_freq,
                                    Hq, Hk, L, T - q.shape[0], float(eps),
                                    q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                                    out.stride(0), out.stride(1), k_cache.stride(0), k_cache.stride(1),
                                    v_cache.stride(0), v_cache.stride(1),
                                    D=D, HALF=rotary_dim // 2,
                                    BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, num_warps=4, **pdl_options(q.device))
    return out
