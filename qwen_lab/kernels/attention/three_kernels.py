"""Attention in three kernels: the library's copy of the form notebook 07 teaches (teach.py holds the notebook's own).

    S[h, t, j] = s * q[t, h] . k[j, h // G]          attn_scores_kernel: S [Hq, T, L] in fp32
    P[h, t, :] = softmax_j(S[h, t, :]), j <= p_t     attn_masked_softmax_kernel: P over S, in place
    o[t, h]    = sum_j P[h, t, j] v[j, h // G]       attn_weighted_sum_kernel

q [T, Hq, D]; k, v [L, Hkv, D]; positions [T] int on the device -> out [T, Hq, D]. Simple, and it moves
Hq T L floats through memory twice: the fused kernels (prefill.py, decode.py) keep the scores on chip. Unlike
the notebook's, the softmax walks a row in blocks (any L) and the weighted sum stops at the last visible key.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from .. import dot_precision
from .validate import _check_qkv


@triton.jit
def attn_scores_kernel(q_ptr, k_ptr, s_ptr, T, L, scale,
                       stride_qt, stride_qh, stride_kl, stride_kh, stride_sh, stride_st,
                       G: tl.constexpr, D: tl.constexpr, DOT_PREC: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # S[h, t, j] = scale * q[t, h] . k[j, h // G]: one [BLOCK_M, BLOCK_N] tile per program, D in one piece
    pid_m, pid_n, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(q_ptr + offs_m[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=(offs_m < T)[:, None] & d_ok[None, :], other=0.0)
    k = tl.load(k_ptr + offs_n[:, None] * stride_kl + (h // G) * stride_kh + offs_d[None, :],
                mask=(offs_n < L)[:, None] & d_ok[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale
    tl.store(s_ptr + h * stride_sh + offs_m[:, None] * stride_st + offs_n[None, :], s,
             mask=(offs_m < T)[:, None] & (offs_n < L)[None, :])


@triton.jit
def attn_masked_softmax_kernel(s_ptr, pos_ptr, T, L, stride_sh, stride_st,
                               BLOCK_N: tl.constexpr):
    # one program per (head, query) row, in place: P[j] = exp(S[j] - max) / sum for j <= pos, else 0
    t = tl.program_id(0)
    h = tl.program_id(1)
    row = s_ptr + h * stride_sh + t * stride_st
    pos = tl.load(pos_ptr + t)
    n = tl.minimum(pos + 1, L)  # visible keys: 0 .. n - 1 (none when pos < 0)
    offs = tl.arange(0, BLOCK_N)
    # pass 1: running max and running sum over the row, block by block (base-e here: a teaching kernel)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, L, BLOCK_N):
        m, l = _softmax_stats_step(row, start, n, m, l, offs)
    m_row = tl.max(m, 0)
    # the NaN trap: a row that sees no key has max = -inf and exp(-inf - (-inf)) = NaN. Guard it.
    m_row = tl.where(m_row == float("-inf"), 0.0, m_row)
    l_row = tl.sum(l * tl.exp(m - m_row), 0)
    inv = 1.0 / tl.where(l_row > 0, l_row, 1.0)  # no key: every exp below is 0 anyway
    # pass 2: normalise and store (masked keys get exactly 0)
    for start in range(0, L, BLOCK_N):
        _softmax_write_step(row, start, n, L, m_row, inv, offs)


@triton.jit
def _softmax_stats_step(row, start, n, m, l, offs):
    cols = start + offs
    s = tl.load(row + cols, mask=cols < n, other=float("-inf"))
    m_new = tl.maximum(m, s)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    l = l * tl.exp(m - m_use) + tl.exp(s - m_use)
    return m_new, l


@triton.jit
def _softmax_write_step(row, start, n, L, m_row, inv, offs):
    cols = start + offs
    s = tl.load(row + cols, mask=cols < n, other=float("-inf"))
    tl.store(row + cols, tl.exp(s - m_row) * inv, mask=cols < L)


@triton.jit
def attn_weighted_sum_kernel(p_ptr, v_ptr, out_ptr, pos_ptr, T, L,
                             stride_ph, stride_pt, stride_vl, stride_vh, stride_ot, stride_oh,
                             G: tl.constexpr, D: tl.constexpr, DOT_PREC: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # o[t, h] = sum_j P[h, t, j] v[j, h // G]; keys past the last visible one (all P = 0) are skipped
    pid_m, h = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < T
    pos = tl.load(pos_ptr + offs_m, mask=m_ok, other=-1)
    hi = tl.minimum(tl.max(pos, 0) + 1, L)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    p_rows = p_ptr + h * stride_ph + offs_m[:, None] * stride_pt
    v_rows = v_ptr + (h // G) * stride_vh + offs_d[None, :]
    for start in range(0, hi, BLOCK_N):
        acc = _weighted_sum_step(acc, p_rows, v_rows, start, L, m_ok, offs_n, offs_d, stride_vl, D, DOT_PREC)
    tl.store(out_ptr + offs_m[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & (offs_d < D)[None, :])


@triton.jit
def _weighted_sum_step(acc, p_rows, v_rows, start, L, m_ok, offs_n, offs_d, stride_vl, D: tl.constexpr,
                       DOT_PREC: tl.constexpr):
    cols = start + offs_n
    n_ok = cols < L
    p = tl.load(p_rows + cols[None, :], mask=m_ok[:, None] & n_ok[None, :], other=0.0)
    v = tl.load(v_rows + cols[:, None] * stride_vl, mask=n_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    return acc + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)


# ---------------------------------------------------------------- launcher


def attention_three_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                            scale: float | None = None) -> torch.Tensor:
    """The teaching form of reference.attention: scores, masked softmax, weighted sum (three launches).

    Allocates the [Hq, T, L] fp32 scores (overwritten by the probabilities). A query whose position
    is negative (padding) sees no key and gets a zero output instead of NaN.
    """
    T, Hq, D, L, Hkv = _check_qkv(q, k, v, positions)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    scale = D ** -0.5 if scale is None else float(scale)
    G = Hq // Hkv
    interp = runtime.interpreter_active()
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_M = 16 if interp else 64
    BLOCK_N = 32 if interp else 64
    scores = torch.empty(Hq, T, L, dtype=torch.float32, device=q.device)
    attn_scores_kernel[(triton.cdiv(T, BLOCK_M), triton.cdiv(L, BLOCK_N), Hq)](
        q, k, scores, T, L, scale, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        scores.stride(0), scores.stride(1), G=G, D=D, DOT_PREC=dot_precision(q.dtype), BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, num_warps=4)
    attn_masked_softmax_kernel[(T, Hq)](scores, positions, T, L, scores.stride(0), scores.stride(1),
                                        BLOCK_N=min(1024, max(16, triton.next_power_of_2(L))),
                                        num_warps=4)
    attn_weighted_sum_kernel[(triton.cdiv(T, BLOCK_M), Hq)](
        scores, v, out, positions, T, L, scores.stride(0), scores.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), G=G, D=D, DOT_PREC=dot_precision(q.dtype), BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, num_warps=4)
    return out
