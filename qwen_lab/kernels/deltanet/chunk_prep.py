"""The chunked form's parallel half (prefill): everything of a chunk that does not depend on the state entering it.

Shapes as in recurrent.py: q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv] fp32 (or the raw a, b: FUSED_GATES).

Cut the T tokens into chunks of C = 64; inside a chunk let G_i = g_1 + ... + g_i (cumulative log decay from the
chunk start) and S0 the state entering the chunk. Unrolling the recurrence, the values written at the C steps
solve one unit lower-triangular system (the UT transform):

    A = I + strict_tril( (beta k) k^T * exp(G_i - G_j) )          [C, C]
    U = A^-1 (beta v)           W = A^-1 (beta k exp(G))          (UT transform)
    V' = U - W S0                                                  (what S0 does not already predict)
    O  = (q exp(G)) S0 + ( tril(q k^T * exp(G_i - G_j)) ) V'       (old state read + intra-chunk part)
    S1 = exp(G_C) S0 + (k exp(G_C - G))^T V'

Everything but the last three lines is independent of S0, so it runs in parallel over (chunk, head), here; only
the state update is sequential, one matmul-sized step per chunk instead of per token (chunk_scan.py).

`chunk_prep_kernel`, grid (Hv, chunks), heads fastest (its programs start chunk by chunk): G, what the scan reads
(q exp(G), k exp(G_C - G), the intra-chunk attention tril(q k^T exp(G_i - G_j))), and the UT transform U, W.
A^-1 is built by doubling: the 2 x 2 diagonal blocks of I + L are inverted exactly (I - L there), then
neighbouring blocks are merged while their size doubles (2 -> 4 -> ... -> 64):
[[P, 0], [M, Q]]^-1 = [[P^-1, 0], [-Q^-1 M P^-1, Q^-1]], two matmuls per merge. Results go to a workspace
[Hv, T padded, .] (`ChunkWorkspace`). With switches.prep_persistent (on a GPU under PDL) the prep runs as a
fixed number of programs, all resident at once, that leave an SM slot for each scan program. Each program counts
its finished chunk in the scan's `ready` counters. The tail of the last chunk is padded with k = v = 0, beta = 0
and g = 0, so it changes neither O nor S; with FUSED_GATES the prep computes the gates of its rows from the raw
projections a, b (no gates kernel runs before it) and sets the tail's to zero explicitly.

Precision: norms, gates, decays and the triangular solve stay fp32. On the GPU the matmul operands are in the
model's 16-bit dtype (bf16, or fp16 below sm_80) with fp32 accumulation, as in flash-linear-attention (the
inverse's merges then use tf32; an fp32 model multiplies in exact fp32); under the interpreter everything is fp32.
"""

from __future__ import annotations

from collections import namedtuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .gates import _softplus
from .tuning import _PREP_CONFIGS, INTERPRET, _prune_prep, _tuned


@triton.jit
def _rows(ptr, rows, stride_t, col0, offs_d, mask_d, T):
    """x[rows, col0 + offs_d] as fp32, zero past T (the padded tail) and past the row width."""
    mask = (rows < T)[:, None] & mask_d[None, :]
    return tl.load(ptr + rows.to(tl.int64)[:, None] * stride_t + col0 + offs_d[None, :], mask=mask,
                   other=0.0).to(tl.float32)


@triton.jit
def _l2_rows(ptr, rows, stride_t, col0, offs_d, mask_d, T, eps):
    x = _rows(ptr, rows, stride_t, col0, offs_d, mask_d, T)
    return x * tl.rsqrt(tl.sum(x * x, 1) + eps)[:, None]


@triton.jit
def _vec(ptr, rows, stride_t, col, T):
    return tl.load(ptr + rows.to(tl.int64) * stride_t + col, mask=rows < T, other=0.0).to(tl.float32)


# T and n_chunks are not specialised (see chunk_scan_kernel); N_CLASS is only the autotuner's key (chunk_class)
# ready_ptr restored: each of the autotuner's timing runs counts its chunks as ready. Left counted, they let the
# scan launched beside the real run (PDL) go on before that run has written its chunks, and the real run's own
# counts then land after the scan has cleared the counters, where they stay for the next call.
@_tuned(_PREP_CONFIGS, key=["Dk", "Dv", "BT", "BK", "BDV", "FUSED_GATES", "N_CLASS"], restore=("ready_ptr",),
        prune=_prune_prep)
@triton.jit(do_not_specialize=["T", "n_chunks", "N_CLASS"])
def chunk_prep_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
                      qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr, gcum_ptr, ready_ptr,
                      T, Tp, Dk, Dv, REP, Hv, n_chunks, N_CLASS, scale, eps,
                      stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                      stride_gt, stride_gh, stride_bt, stride_bh,
                      BT: tl.constexpr, BK: tl.constexpr, BDV: tl.constexpr, MERGES: tl.constexpr,
                      PREC: tl.constexpr, INV_PREC: tl.constexpr, GROUP: tl.constexpr,
                      FUSED_GATES: tl.constexpr = False, USE_PDL: tl.constexpr = False,
                      PERSIST: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    if PERSIST:
        # grid (P,): program p prepares the (head, chunk) items p, p + P, p + 2P, ... numbered heads fastest, so
        # the chunks still come out in the order the scan needs them. Every program is resident from the start,
        # so the dependent scan's programs are placed at once, in the room the P programs leave beside them.
        for item in range(tl.program_id(0), Hv * n_chunks, tl.num_programs(0)):
            _prep_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, qg_ptr, kd_ptr, w_ptr, u_ptr,
                        aqk_ptr, gcum_ptr, ready_ptr, item % Hv, item // Hv, T, Tp, Dk, Dv, REP, scale, eps,
                        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_gh,
                        stride_bt, stride_bh, BT, BK, BDV, MERGES, PREC, INV_PREC, GROUP, FUSED_GATES)
    else:
        # grid (Hv, chunks), heads fastest: the programs start chunk by chunk, in the order the scan needs them
        _prep_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, qg_ptr, kd_ptr, w_ptr, u_ptr,
                    aqk_ptr, gcum_ptr, ready_ptr, tl.program_id(0), tl.program_id(1), T, Tp, Dk, Dv, REP, scale, eps,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_gh,
                    stride_bt, stride_bh, BT, BK, BDV, MERGES, PREC, INV_PREC, GROUP, FUSED_GATES)


@triton.jit
def _prep_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr,
                gcum_ptr, ready_ptr, h, c, T, Tp, Dk, Dv, REP, scale, eps,
                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_gh,
                stride_bt, stride_bh, BT: tl.constexpr, BK: tl.constexpr, BDV: tl.constexpr, MERGES: tl.constexpr,
                PREC: tl.constexpr, INV_PREC: tl.constexpr, GROUP: tl.constexpr, FUSED_GATES: tl.constexpr):
    """Chunk c of value head h: everything the scan reads of it, into the workspace, then counted as ready."""
    hk = h // REP
    rows_ws = h.to(tl.int64) * Tp + c * BT + tl.arange(0, BT)   # this chunk's rows of the workspace [Hv, Tp, .]
    DT = qg_ptr.dtype.element_ty                                 # the matmul operand dtype (the workspace's)
    i = tl.arange(0, BT)
    rows = c * BT + i
    offs_k = tl.arange(0, BK)
    mask_k = offs_k < Dk
    offs_v = tl.arange(0, BDV)
    mask_v = offs_v < Dv

    # ---- decays: G_i = g_1 + ... + g_i inside the chunk (g = 0 in the padded tail: the decay stops at T-1)
    g = _vec(g_ptr, rows, stride_gt, h * stride_gh, T)
    beta = _vec(beta_ptr, rows, stride_bt, h * stride_bh, T)
    if FUSED_GATES:  # g_ptr and beta_ptr hold the raw projections a and b: the gates of deltanet_gates, here
        neg_A = -tl.exp(tl.load(A_log_ptr + h).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
        g = tl.where(rows < T, neg_A * _softplus(g + dt_bias), 0.0)  # the padded tail keeps g = 0, beta = 0
        beta = tl.where(rows < T, tl.sigmoid(beta), 0.0)
    G = tl.cumsum(g, 0)
    G_last = tl.sum(tl.where(i == BT - 1, G, 0.0), 0)
    tl.store(gcum_ptr + rows_ws, G)
    causal = i[:, None] >= i[None, :]
    decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))  # exp(G_i - G_j), masked before exp

    # ---- what the scan reads: q exp(G), k exp(G_C - G), and the intra-chunk attention
    k_tile = rows_ws[:, None] * Dk + offs_k[None, :]
    k = _l2_rows(k_ptr, rows, stride_kt, hk * stride_kh, offs_k, mask_k, T, eps)
    tl.store(kd_ptr + k_tile, (k * tl.exp(G_last - G)[:, None]).to(DT), mask=mask_k[None, :])
    k = k.to(DT)  # from here on only a matmul operand: hold it in the narrow dtype
    q = _l2_rows(q_ptr, rows, stride_qt, hk * stride_qh, offs_k, mask_k, T, eps) * scale
    tl.store(qg_ptr + k_tile, (q * tl.exp(G)[:, None]).to(DT), mask=mask_k[None, :])
    qk = tl.dot(q.to(DT), tl.trans(k), input_precision=PREC)
    tl.store(aqk_ptr + rows_ws[:, None] * BT + i[None, :], tl.where(causal, qk * decay, 0.0).to(DT))

    # ---- A = I + L, L = strict_tril((beta k) k^T exp(G_i - G_j))
    kk = tl.dot((k.to(tl.float32) * beta[:, None]).to(DT), tl.trans(k), input_precision=PREC)
    L = tl.where(i[:, None] > i[None, :], kk * decay, 0.0)

    # ---- X = A^-1 by doubling: start from the inverses of the 2 x 2 diagonal blocks of A = I + L (exactly I - L
    #      there: one entry below the diagonal), then merge neighbouring blocks while their size doubles
    #      (2 -> 4 -> ... -> BT). For [[P, 0], [M, Q]] the inverse is [[P^-1, 0], [-Q^-1 M P^-1, Q^-1]], i.e.
    #      X <- X - X M X with M the link blocks of L: two [BT, BT] tensor-core products per level, MERGES levels.
    #      (Row-by-row forward substitution of 16 x 16 blocks was 15 dependent steps of small reductions, a third
    #      of this kernel's time; an error analysis of the doubling in tf32 is in docs/experiments.md.)
    X = (i[:, None] == i[None, :]).to(tl.float32) - tl.where((i[:, None] == i[None, :] + 1) & (i[:, None] % 2 == 1),
                                                             L, 0.0)
    for level in tl.static_range(MERGES):
        s = 2 << level
        link = ((i // s) % 2 == 1)[:, None] & ((i[:, None] // s) == (i[None, :] // s) + 1)
        M = tl.where(link, L, 0.0)
        X = X - tl.dot(X, tl.dot(M, X, input_precision=INV_PREC), input_precision=INV_PREC)

    # ---- the UT transform: U = X (beta v), W = X (beta k exp(G))
    v = _rows(v_ptr, rows, stride_vt, h * stride_vh, offs_v, mask_v, T)
    X_op = X.to(DT)
    u = tl.dot(X_op, (v * beta[:, None]).to(DT), input_precision=PREC)
    tl.store(u_ptr + rows_ws[:, None] * Dv + offs_v[None, :], u.to(DT), mask=mask_v[None, :])
    w = tl.dot(X_op, (k.to(tl.float32) * (beta * tl.exp(G))[:, None]).to(DT), input_precision=PREC)
    tl.store(w_ptr + k_tile, w.to(DT), mask=mask_k[None, :])

    # ---- chunk c of head h is ready: count it in its group's counter, which the scan may already be polling
    #      (see chunk_scan_kernel). The barrier makes every thread's stores above happen before the one release
    #      that publishes them.
    tl.debug_barrier()
    tl.atomic_add(ready_ptr + h * (Tp // BT + 1) + 1 + c // GROUP, 1, sem="release", scope="gpu")


# ---------------------------------------------------------------- the workspace


ChunkWorkspace = namedtuple("ChunkWorkspace", "qg kd w u aqk gcum")
ChunkWorkspace.__doc__ = """Scratch of delta_rule_chunked for T tokens padded to Tp = chunks * C:
qg, kd, w [Hv, Tp, Dk], u [Hv, Tp, Dv], aqk [Hv, Tp, C] in the matmul dtype; gcum [Hv, Tp] fp32."""


def _workspace_dtype(dtype: torch.dtype) -> torch.dtype:
    # the interpreter computes bf16 tl.dot wrongly, so it always works in fp32
    return dtype if dtype in (torch.bfloat16, torch.float16) and not INTERPRET else torch.float32


def chunk_workspace(T: int, Hv: int, Dk: int, Dv: int, dtype: torch.dtype, device, chunk_size: int = 64):
    """Allocate the scratch of delta_rule_chunked (pass it as `workspace=` to allocate nothing per call)."""
    Tp = triton.cdiv(max(T, 1), chunk_size) * chunk_size
    dt = _workspace_dtype(dtype)
    e = dict(device=device, dtype=dt)
    return ChunkWorkspace(torch.empty(Hv, Tp, Dk, **e), torch.empty(Hv, Tp, Dk, **e), torch.empty(Hv, Tp, Dk, **e),
                          torch.empty(Hv, Tp, Dv, **e), torch.empty(Hv, Tp, chunk_size, **e),
                          torch.empty(Hv, Tp, device=device, dtype=torch.float32))
