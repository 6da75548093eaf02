"""Notebook 08's gates and recurrent delta rule (Exercises 08.2 and 08.3's solutions), as the notebook has them.

Gates, per token and value head, fp32: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).
a, b [T, H] (any row strides), A_log, dt_bias [H] -> g, beta [T, H]. One program per token.

The delta rule, per value head h (q/k head h // REP), token by token, with q, k l2-normalised and q scaled:

    S <- exp(g_t) S;   S <- S + k_t (x) beta_t (v_t - S^T k_t);   o_t = S^T q_t

q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv] fp32; state [Hv, Dk, Dv] fp32, updated in place -> o [T, Hv, Dv].
One program per (value head, block of BV value columns) holds its [Dk, BV] slice of S in registers for all T
tokens. The model's fast forms (gates fused in, the conv fused in for decode) are gates.py and recurrent.py.
"""

import torch
import triton
import triton.language as tl


# Exercise 08.2: the gates
@triton.jit
def gates_kernel(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, H, stride_at, stride_bt,
                 BLOCK_H: tl.constexpr):
    t = tl.program_id(0)
    offs_h = tl.arange(0, BLOCK_H)
    mask = offs_h < H
    a = tl.load(a_ptr + t * stride_at + offs_h, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + t * stride_bt + offs_h, mask=mask, other=0.0).to(tl.float32)
    A = tl.exp(tl.load(A_log_ptr + offs_h, mask=mask, other=0.0).to(tl.float32))
    x = a + tl.load(dt_bias_ptr + offs_h, mask=mask, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    tl.store(g_ptr + t * H + offs_h, -A * softplus, mask=mask)
    tl.store(beta_ptr + t * H + offs_h, tl.sigmoid(b), mask=mask)


def my_deltanet_gates(a, b, A_log, dt_bias):
    T, H = a.shape
    g_out = torch.empty(T, H, dtype=torch.float32, device=a.device)
    beta_out = torch.empty(T, H, dtype=torch.float32, device=a.device)
    gates_kernel[(T,)](a, b, A_log, dt_bias, g_out, beta_out, H, a.stride(0), b.stride(0),
                       BLOCK_H=triton.next_power_of_2(H))
    return g_out, beta_out


# Exercise 08.3: the recurrent delta rule
@triton.jit
def recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr, T, scale,
                     stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_bt,
                     stride_sh, stride_sk, stride_ot, stride_oh,
                     REP: tl.constexpr, Dk: tl.constexpr, Dv: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    h = tl.program_id(0)                         # value head
    hk = h // REP                                # its q/k head
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < Dk, offs_v < Dv
    s_ptrs = state_ptr + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    s_mask = mask_k[:, None] & mask_v[None, :]
    S = tl.load(s_ptrs, mask=s_mask, other=0.0)
    for t in range(T):
        q = tl.load(q_ptr + t * stride_qt + hk * stride_qh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + t * stride_kt + hk * stride_kh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t * stride_vt + h * stride_vh + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * scale
        k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
        g = tl.load(g_ptr + t * stride_gt + h)
        beta = tl.load(beta_ptr + t * stride_bt + h)
        S = S * tl.exp(g)                                    # forget
        predicted = tl.sum(S * k[:, None], 0)                # S^T k, [BV]
        S = S + k[:, None] * ((v - predicted) * beta)[None, :]
        o = tl.sum(S * q[:, None], 0)                        # S^T q
        tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(s_ptrs, S, mask=s_mask)


def my_delta_rule_recurrent(q, k, v, g, beta, state, scale=None):
    T, Hk_, Dk_ = q.shape
    Hv_, Dv_ = v.shape[1], v.shape[2]
    scale = Dk_ ** -0.5 if scale is None else scale
    out = torch.empty(T, Hv_, Dv_, dtype=v.dtype, device=v.device)
    BV = 16
    grid = (Hv_, triton.cdiv(Dv_, BV))
    recurrent_kernel[grid](q, k, v, g, beta, state, out, T, scale,
                           q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                           g.stride(0), beta.stride(0), state.stride(0), state.stride(1), out.stride(0), out.stride(1),
                           REP=Hv_ // Hk_, Dk=Dk_, Dv=Dv_, BK=triton.next_power_of_2(Dk_), BV=BV)
    return out
