"""Notebook 09's chunked form (Exercises 09.1, 09.2 and 09.3's solutions), as the notebook has them.

Per value head, chunks of C tokens; G the cumulative log decays inside a chunk, L = strict_tril((beta K) K^T * Gamma)
with Gamma_ij = exp(G_i - G_j). Then A = I + L is unit lower triangular and

    U = A^-1 (beta V),  W = A^-1 (beta K exp(G));   per chunk, carrying S [Dk, Dv]:
    U' = U - W S,  O = (Q exp(G)) S + (tril(Q K^T) * Gamma) U',  S <- exp(G_C) S + (K exp(G_C - G))^T U'

- `my_tril_inverse(L)`: (I + L)^-1 for a batch L [B, n, n] of strictly lower triangular fp32 matrices, by forward
  substitution, one program per matrix (09.1);
- `prep_chunks`: the parallel part in PyTorch, as the notebook gives it (not an exercise): per (head, chunk) the
  matrices above in row blocks of C rows starting at (h * n_chunks + c) * C;
- `my_delta_rule_chunked(q, k, v, g, beta, state)`: prep_chunks, then the scan kernel, one program per (value head,
  block of BV value columns) (09.2); = reference.delta_rule_chunked;
- `segment_map(A, b)`, `run_segments(maps, S0)`: each chunk as an affine map S -> A_c S + b_c, maps composed (09.3).

The model's fast forms (the prep in one kernel, the scan beside it) are chunk_prep.py and chunk_scan.py.
"""

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from qwen_lab import reference


# Exercise 09.1: the triangular solve
@triton.jit
def tril_inverse_kernel(L_ptr, X_ptr, n, BN: tl.constexpr):
    b = tl.program_id(0)                         # which matrix of the batch
    r = tl.arange(0, BN)
    offs = b * n * n + r[:, None] * n + r[None, :]
    mask = (r[:, None] < n) & (r[None, :] < n)
    L = tl.load(L_ptr + offs, mask=mask, other=0.0)
    X = (r[:, None] == r[None, :]).to(tl.float32)         # row 0 is final; the others are overwritten in order
    for i in range(1, n):
        sel = r[:, None] == i
        l_i = tl.sum(tl.where(sel, L, 0.0), 0)            # L[i, :], indexed by column j
        row = (r == i).to(tl.float32) - tl.sum(l_i[:, None] * X, 0)   # e_i - sum_j L[i, j] X[j, :]
        X = tl.where(sel, row[None, :], X)
    tl.store(X_ptr + offs, X, mask=mask)


def my_tril_inverse(L):
    B, n, _ = L.shape
    X = torch.empty_like(L)
    tril_inverse_kernel[(B,)](L.contiguous(), X, n, BN=triton.next_power_of_2(n))
    return X


def ref_tril_inverse(L):
    return torch.linalg.inv(torch.eye(L.shape[-1], device=L.device) + L)


def prep_chunks(q, k, v, g, beta, scale=None, C=64):
    # the parallel part, in PyTorch: per (head, chunk) the matrices of section 1; the tail padded with zeros
    T, Hk_, Dk_ = q.shape
    Hv_ = v.shape[1]
    rep = Hv_ // Hk_
    scale = Dk_ ** -0.5 if scale is None else scale
    qf = reference.l2norm(q.float()).repeat_interleave(rep, 1) * scale
    kf = reference.l2norm(k.float()).repeat_interleave(rep, 1)
    n = triton.cdiv(T, C)
    pad = n * C - T                                     # padding: k = v = 0, g = beta = 0 -> no decay, no write
    qf, kf, vf = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (qf, kf, v.float()))
    gf, bf = F.pad(g.float(), (0, 0, 0, pad)), F.pad(beta.float(), (0, 0, 0, pad))
    Qc, Kc, Vc = (x.reshape(n, C, Hv_, -1).permute(2, 0, 1, 3) for x in (qf, kf, vf))   # [Hv, n, C, D]
    gc, bc = (x.reshape(n, C, Hv_).permute(2, 0, 1) for x in (gf, bf))                 # [Hv, n, C]
    G = gc.cumsum(-1)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    Gam = torch.where(causal, G[..., :, None] - G[..., None, :], torch.full_like(G[..., None], -math.inf)).exp()
    A_ = torch.eye(C, device=q.device) + ((bc[..., None] * Kc) @ Kc.transpose(-1, -2) * Gam).tril(-1)
    U_ = torch.linalg.solve_triangular(A_, bc[..., None] * Vc, upper=False, unitriangular=True)
    W_ = torch.linalg.solve_triangular(A_, (bc * G.exp())[..., None] * Kc, upper=False, unitriangular=True)
    flat = lambda x: x.reshape(Hv_ * n * C, -1).contiguous()
    return dict(qg=flat(Qc * G.exp()[..., None]), kd=flat(Kc * (G[..., -1:] - G).exp()[..., None]), w=flat(W_),
                u=flat(U_), aqk=flat((Qc @ Kc.transpose(-1, -2)) * Gam), glast=G[..., -1].reshape(-1).contiguous(),
                n_chunks=n)


# Exercise 09.2: the chunk scan
@triton.jit
def chunk_scan_kernel(qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr, glast_ptr, state_ptr, out_ptr, n_chunks,
                      Dk: tl.constexpr, Dv: tl.constexpr, C: tl.constexpr, BV: tl.constexpr):
    h = tl.program_id(0)                              # value head
    offs_k = tl.arange(0, Dk)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    i = tl.arange(0, C)
    s_ptrs = state_ptr + h * Dk * Dv + offs_k[:, None] * Dv + offs_v[None, :]
    S = tl.load(s_ptrs)
    for c in range(n_chunks):
        rows = (h * n_chunks + c) * C + i
        w = tl.load(w_ptr + rows[:, None] * Dk + offs_k[None, :])
        u = tl.load(u_ptr + rows[:, None] * Dv + offs_v[None, :])
        qg = tl.load(qg_ptr + rows[:, None] * Dk + offs_k[None, :])
        kd = tl.load(kd_ptr + rows[:, None] * Dk + offs_k[None, :])
        aqk = tl.load(aqk_ptr + rows[:, None] * C + i[None, :])
        u_new = u - tl.dot(w, S)                              # U' = U - W S
        o = tl.dot(qg, S) + tl.dot(aqk, u_new)                # old state read + intra-chunk part
        tl.store(out_ptr + rows[:, None] * Dv + offs_v[None, :], o)
        S = tl.exp(tl.load(glast_ptr + h * n_chunks + c)) * S + tl.dot(tl.trans(kd), u_new)
    tl.store(s_ptrs, S)


def my_delta_rule_chunked(q, k, v, g, beta, state, scale=None, chunk_size=64):
    T, Hv_, Dv_ = v.shape
    Dk_ = q.shape[2]
    P = prep_chunks(q, k, v, g, beta, scale, chunk_size)
    n = P["n_chunks"]
    out = torch.empty(Hv_ * n * chunk_size, Dv_, device=v.device)
    BV = 16
    # num_stages=1: the chunk loop carries S from one tl.dot to the next, and software pipelining would keep several
    # chunks' fp32 tiles in shared memory at once, more than an SM has at Dk = 128
    chunk_scan_kernel[(Hv_, Dv_ // BV)](P["qg"], P["kd"], P["w"], P["u"], P["aqk"], P["glast"], state, out, n,
                                        Dk=Dk_, Dv=Dv_, C=chunk_size, BV=BV, num_stages=1)
    out = out.reshape(Hv_, n * chunk_size, Dv_).permute(1, 0, 2)[:T]       # -> [T, Hv, Dv]
    return out.to(v.dtype)


# Exercise 09.3: a segment's map, and the segments composed
def segment_map(A, b):
    """The chunks (A[0], b[0]) first ... (A[-1], b[-1]) last as one map S -> M S + B: -> (M [Dk, Dk], B [Dk, Dv])."""
    M = torch.eye(A[0].shape[0], device=A[0].device, dtype=A[0].dtype)
    B = torch.zeros_like(b[0])
    for A_c, b_c in zip(A, b):
        M, B = A_c @ M, A_c @ B + b_c
    return M, B


def run_segments(maps, S0):
    """The state after the segments' maps [(M, B), ...], applied in order to S0 [Dk, Dv]."""
    S = S0
    for M, B in maps:
        S = M @ S + B
    return S
