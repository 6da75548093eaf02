"""Notebook 07's attention, as the learner writes it: three kernels (scores, masked softmax, weighted sum).

For T queries at positions p_t over a cache of L keys (Hq query heads, Hkv KV heads, G = Hq / Hkv, head_dim D):

    S[h, t, j] = scale * q[t, h] . k[j, h // G]               scores_kernel:         q [T, Hq, D], k [L, Hkv, D]
                                                                                      -> S [Hq, T, L] fp32
    P[h, t, j] = softmax over j <= p_t of S[h, t, :], else 0  masked_softmax_kernel: S, positions [T] -> P [Hq, T, L]
    o[t, h]    = sum_j P[h, t, j] v[j, h // G]                weighted_sum_kernel:   P, v [L, Hkv, D] -> o [T, Hq, D]

A row that sees no key (p_t < 0) gets P = 0 and o = 0, not NaN. Each cell also holds the PyTorch reference the
notebook checks against (ref_scores, ref_masked_softmax, ref_weighted_sum).

The cells below are solutions/07_gated_attention.ipynb's exercise solutions, character for character
(tests/test_attention.py fails if the two drift apart). The library's forms beside this file: three_kernels.py
(the same three steps for any L), prefill.py and decode.py (fused: the scores never leave the chip).
"""

import torch
import triton
import triton.language as tl


# Exercise 07.1: the scores kernel
@triton.jit
def scores_kernel(q_ptr, k_ptr, s_ptr, T, L, scale,
                  stride_qt, stride_qh, stride_kl, stride_kh, stride_sh, stride_st,
                  G: tl.constexpr, D: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m, pid_n, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)      # query tokens
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)      # keys
    offs_d = tl.arange(0, BLOCK_D)                        # head dims
    kv_head = h // G
    q = tl.load(q_ptr + offs_m[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=(offs_m[:, None] < T) & (offs_d[None, :] < D), other=0.0)
    k = tl.load(k_ptr + offs_n[:, None] * stride_kl + kv_head * stride_kh + offs_d[None, :],
                mask=(offs_n[:, None] < L) & (offs_d[None, :] < D), other=0.0)
    s = tl.dot(q, tl.trans(k)) * scale                    # [BLOCK_M, BLOCK_N], fp32 accumulate
    tl.store(s_ptr + h * stride_sh + offs_m[:, None] * stride_st + offs_n[None, :], s,
             mask=(offs_m[:, None] < T) & (offs_n[None, :] < L))


def my_scores(q, k, scale):
    T, Hq, D = q.shape
    L, Hkv, _ = k.shape
    s = torch.empty(Hq, T, L, dtype=torch.float32, device=q.device)
    BLOCK_M, BLOCK_N = 16, 32
    grid = (triton.cdiv(T, BLOCK_M), triton.cdiv(L, BLOCK_N), Hq)
    scores_kernel[grid](q, k, s, T, L, scale, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                        s.stride(0), s.stride(1), G=Hq // Hkv, D=D,
                        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(D)))
    return s


def ref_scores(q, k, scale):
    kf = k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)     # KV head h // G for query head h
    return torch.einsum("thd,lhd->htl", q.float(), kf) * scale


# Exercise 07.2: the masked softmax kernel
@triton.jit
def masked_softmax_kernel(s_ptr, p_ptr, pos_ptr, L, stride_sh, stride_st, BLOCK_L: tl.constexpr):
    t = tl.program_id(0)                # query token
    h = tl.program_id(1)                # head
    pos = tl.load(pos_ptr + t)          # this query sees keys 0 .. pos (none when pos < 0)
    j = tl.arange(0, BLOCK_L)
    row = h * stride_sh + t * stride_st
    visible = (j <= pos) & (j < L)
    s = tl.load(s_ptr + row + j, mask=visible, other=float("-inf"))
    m = tl.max(s, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)      # the guard: no visible key -> subtract 0, not -inf
    e = tl.exp(s - m)                             # masked keys: exp(-inf) = 0
    total = tl.sum(e, axis=0)
    p = e / tl.where(total > 0, total, 1.0)       # an empty row stays all zeros
    tl.store(p_ptr + row + j, p, mask=j < L)


def my_masked_softmax(scores, positions):
    Hq, T, L = scores.shape
    p = torch.empty_like(scores)
    masked_softmax_kernel[(T, Hq)](scores, p, positions, L, scores.stride(0), scores.stride(1),
                                   BLOCK_L=max(16, triton.next_power_of_2(L)))
    return p


def ref_masked_softmax(scores, positions):
    L = scores.shape[-1]
    visible = torch.arange(L, device=scores.device)[None, :] <= positions[:, None]       # [T, L]
    p = torch.softmax(scores.float().masked_fill(~visible[None], float("-inf")), dim=-1)
    return torch.nan_to_num(p, nan=0.0)            # the convention: a row that sees nothing is all zeros


# Exercise 07.3: the weighted-sum kernel
@triton.jit
def weighted_sum_kernel(p_ptr, v_ptr, o_ptr, T, L,
                        stride_ph, stride_pt, stride_vl, stride_vh, stride_ot, stride_oh,
                        G: tl.constexpr, D: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m, h = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)      # query tokens
    offs_l = tl.arange(0, BLOCK_L)                        # keys
    offs_d = tl.arange(0, BLOCK_D)                        # head dims
    p = tl.load(p_ptr + h * stride_ph + offs_m[:, None] * stride_pt + offs_l[None, :],
                mask=(offs_m[:, None] < T) & (offs_l[None, :] < L), other=0.0)
    v = tl.load(v_ptr + offs_l[:, None] * stride_vl + (h // G) * stride_vh + offs_d[None, :],
                mask=(offs_l[:, None] < L) & (offs_d[None, :] < D), other=0.0)
    o = tl.dot(p.to(v.dtype), v)                          # [BLOCK_M, BLOCK_D], fp32 accumulate
    tl.store(o_ptr + offs_m[:, None] * stride_ot + h * stride_oh + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < T) & (offs_d[None, :] < D))


def my_weighted_sum(p, v):
    Hq, T, L = p.shape
    Hkv, D = v.shape[1], v.shape[2]
    o = torch.empty(T, Hq, D, dtype=v.dtype, device=v.device)
    BLOCK_M = 16
    weighted_sum_kernel[(triton.cdiv(T, BLOCK_M), Hq)](
        p, v, o, T, L, p.stride(0), p.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        G=Hq // Hkv, D=D, BLOCK_M=BLOCK_M, BLOCK_L=max(16, triton.next_power_of_2(L)),
        BLOCK_D=max(16, triton.next_power_of_2(D)))
    return o


def ref_weighted_sum(p, v):
    vf = v.float().repeat_interleave(p.shape[0] // v.shape[1], dim=1)
    return torch.einsum("htl,lhd->thd", p.float(), vf).to(v.dtype)
