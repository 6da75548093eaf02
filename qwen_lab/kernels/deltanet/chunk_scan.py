"""The chunked form's sequential half (prefill): the scan over chunks, and the launchers of the chunked form.

Shapes as in recurrent.py. With the prep's workspace (chunk_prep.py: q exp(G), k exp(G_C - G), W, U,
tril(q k^T exp(G_i - G_j)) and G per chunk), each chunk's step carries the state S:

    V' = U - W S0                                                  (what S0 does not already predict)
    O  = (q exp(G)) S0 + ( tril(q k^T * exp(G_i - G_j)) ) V'       (old state read + intra-chunk part)
    S1 = exp(G_C) S0 + (k exp(G_C - G))^T V'

`chunk_scan_kernel`, grid (Hv, Dv / BV): carries its [Dk, BV] slice of S through the chunks in order (four matmuls
per chunk), writes O, and the final state in place. Under programmatic dependent launch it starts once the prep's
programs have started, not once they have finished: each prep program adds its chunk to a counter per head and
group of `scan_group` chunks (qwen_lab.switches; a release, after a barrier), and the scan polls that counter (an
acquire) before each group, so it runs beside the prep. The last scan program of a head clears its counters, which live in a small
zeroed buffer kept per device (counters.py). With `prep_persistent` (on a GPU under PDL) the prep leaves an SM
slot for each scan program: the scan is then placed at once, beside the whole prep rather than its last programs.

Two launches per call (prep, then scan); on a GPU, heads narrower than CHUNKED_MIN_HEAD_DIM take the recurrent
kernel. `deltanet_chunked` (the model's prefill) passes the raw projections a, b instead of g, beta: the prep
computes the gates of its rows itself (FUSED_GATES), and no gates kernel runs before it.

Precision: the state stays fp32; the matmul operands are the workspace's dtype (bf16 on the GPU, fp32 under the
interpreter) with fp32 accumulation. The scan's config is picked beside the prep (tuning._pick_in_place).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from ...errors import KernelError
from ...switches import switches
from .. import device_key, dot_precision, pdl_options
from . import tuning
from .arguments import _check_delta, _check_gate_params, _check_out, _shape
from .chunk_prep import ChunkWorkspace, chunk_prep_kernel, chunk_workspace
from .counters import _tickets
from .gates import EPS
from .recurrent import _recurrent_launch
from .tuning import _PREP_CONFIGS, _SCAN_CONFIGS, INTERPRET, _prune_bv, _tuned, chunk_class

# Below this head dim the chunked kernels are not used on a GPU (see delta_rule_chunked).
CHUNKED_MIN_HEAD_DIM = 64


@triton.jit
def _scan_step(qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr, gcum_ptr, out_ptr, S, h, c, i, offs_k, offs_v, mask_k, mask_v,
               T, Tp, Dk, Dv, stride_ot, stride_oh, BT: tl.constexpr, PREC: tl.constexpr):
    """One chunk of the scan for head h and the value columns offs_v: writes chunk c's O, returns the state S
    leaving it (S: the [Dk, BV] fp32 slice entering it)."""
    ws = h.to(tl.int64) * Tp + c * BT + i                  # workspace rows of chunk c
    k_tile = ws[:, None] * Dk + offs_k[None, :]
    w = tl.load(w_ptr + k_tile, mask=mask_k[None, :], other=0.0)
    u = tl.load(u_ptr + ws[:, None] * Dv + offs_v[None, :], mask=mask_v[None, :], other=0.0).to(tl.float32)
    qg = tl.load(qg_ptr + k_tile, mask=mask_k[None, :], other=0.0)
    aqk = tl.load(aqk_ptr + ws[:, None] * BT + i[None, :])
    kd = tl.load(kd_ptr + k_tile, mask=mask_k[None, :], other=0.0)
    G_last = tl.load(gcum_ptr + h.to(tl.int64) * Tp + c * BT + BT - 1)
    S_op = S.to(w.dtype)
    v_new = u - tl.dot(w, S_op, input_precision=PREC)                 # V' = U - W S0
    o = tl.dot(qg, S_op, input_precision=PREC)                        # (q exp(G)) S0
    o = tl.dot(aqk, v_new.to(aqk.dtype), o, input_precision=PREC)     # + tril(q k^T exp(G_i - G_j)) V'
    rows = (c * BT + i).to(tl.int64)
    tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_v[None, :],
             o.to(out_ptr.dtype.element_ty), mask=(rows < T)[:, None] & mask_v[None, :])
    # S1 = exp(G_C) S0 + (k exp(G_C - G))^T V'
    return tl.dot(tl.trans(kd), v_new.to(kd.dtype), S * tl.exp(G_last), input_precision=PREC)


# Hv is in the key only: the best BV depends on how many programs Hv * Dv / BV fill the GPU
# T and n_chunks are not specialised. Triton turns an integer argument equal to 1 into a constant, so it
# compiled a separate scan for every prompt of at most 64 tokens (n_chunks == 1: the chunk loop is folded
# away and the loads, the transposed k tile and the dots are scheduled without the software pipeline) and for
# T == 1. Every failure seen on the H200 ran such a variant (a fault at T = 1, garbage at T = 64), while the
# looped kernel was right for 77, 300 and 2048 tokens; now every length runs the looped kernel.
# N_CLASS (chunk_class) is only the autotuner's key: one tuning per class of prompt length.
@_tuned(_SCAN_CONFIGS, key=["Hv", "Dk", "Dv", "BT", "BK", "N_CLASS"], restore=("state_ptr", "ready_ptr"),
        prune=_prune_bv)
@triton.jit(do_not_specialize=["T", "n_chunks", "N_CLASS"])
def chunk_scan_kernel(qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr, gcum_ptr, ready_ptr, state_ptr, out_ptr,
                      T, Tp, n_chunks, N_CLASS, Hv, Dk, Dv, stride_sh, stride_sk, stride_ot, stride_oh,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      GROUP: tl.constexpr, USE_PDL: tl.constexpr = False):
    # Under PDL the scan starts once every prep program has started, not once they have all finished. So there
    # is no gdc_wait here (everything before the prep is complete by then: each prep program waited for it);
    # the scan waits for the prep's chunks through the `ready` counters instead, and runs beside the prep (its
    # last programs; all of it with switches.prep_persistent). Without PDL (and under the interpreter) the prep has
    # finished and the counters are already full.
    if USE_PDL:
        gdc_launch_dependents()
    h = tl.program_id(0)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    mask_k = offs_k < Dk
    mask_v = offs_v < Dv
    s_ptrs = state_ptr + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    s_mask = mask_k[:, None] & mask_v[None, :]
    S = tl.load(s_ptrs, mask=s_mask, other=0.0)
    i = tl.arange(0, BT)
    counters = ready_ptr + h * (Tp // BT + 1)   # [programs done, chunks ready in group 0, in group 1, ...]
    for c0 in range(0, n_chunks, GROUP):
        c1 = tl.minimum(c0 + GROUP, n_chunks)
        # wait until the prep has published chunks c0 .. c1-1 (an acquire: their stores are visible after it)
        ready = tl.atomic_add(counters + 1 + c0 // GROUP, 0, sem="acquire", scope="gpu")
        while ready < c1 - c0:
            ready = tl.atomic_add(counters + 1 + c0 // GROUP, 0, sem="acquire", scope="gpu")
        # A group of chunks per wait: inside it the software pipeline (num_stages) loads the next chunks' tiles
        # while this chunk's matmuls run; only the step's state update depends on the previous chunk. (A wait
        # inside this loop would keep the pipeline from issuing any load before it.)
        for c in range(c0, c1):
            S = _scan_step(qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr, gcum_ptr, out_ptr, S, h, c, i, offs_k, offs_v,
                           mask_k, mask_v, T, Tp, Dk, Dv, stride_ot, stride_oh, BT, PREC)
    tl.store(s_ptrs, S, mask=s_mask)
    # the last of the head's Dv / BV programs to finish clears its counters for the next call (every program of
    # the head has passed every wait by then)
    done = tl.atomic_add(counters, 1, sem="relaxed", scope="gpu")
    last = done == tl.num_programs(1) - 1
    for g in range(0, tl.cdiv(n_chunks, GROUP) + 1):
        tl.store(counters + g, 0, mask=last)


# ---------------------------------------------------------------- launchers


def delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       state: torch.Tensor, scale: float | None = None, chunk_size: int = 64,
                       out: torch.Tensor | None = None, workspace: ChunkWorkspace | None = None) -> torch.Tensor:
    """The gated delta rule chunk by chunk (prefill form); = reference.delta_rule_chunked.

    Same arguments and result as `delta_rule_recurrent` (state [Hv, Dk, Dv] fp32 read as the initial state and
    overwritten with the final one); chunk_size 64 or 128. Two launches: the parallel intra-chunk work, then
    the sequential scan over chunks. On a GPU a head dim below CHUNKED_MIN_HEAD_DIM (test models only) runs the
    recurrent kernel instead, one launch, the same function.
    """
    return _chunked_launch(q, k, v, g, beta, g, g, state, scale, chunk_size, out, workspace, fused=False)


def deltanet_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, scale: float | None = None,
                     chunk_size: int = 64, out: torch.Tensor | None = None,
                     workspace: ChunkWorkspace | None = None) -> torch.Tensor:
    """deltanet_gates and delta_rule_chunked in two launches instead of three: the chunk prep computes the gates of
    its rows from the raw projections; = reference.deltanet_chunked. (A head dim below CHUNKED_MIN_HEAD_DIM on a
    GPU: the recurrent kernel with the gates inside, one launch.)

    a, b [T, Hv] (strided views allowed); A_log, dt_bias [Hv]; the rest as in `delta_rule_chunked`.
    """
    Hv = v.shape[1] if isinstance(v, torch.Tensor) and v.dim() == 3 else None
    _check_gate_params(A_log, dt_bias, Hv, getattr(q, "device", None))
    return _chunked_launch(q, k, v, a, b, A_log, dt_bias, state, scale, chunk_size, out, workspace, fused=True)


def _chunked_launch(q, k, v, g, beta, A_log, dt_bias, state, scale, chunk_size, out, workspace, fused):
    """delta_rule_chunked (fused=False: g, beta are the gates) or deltanet_chunked (fused: g, beta are a and b)."""
    T, Hk, Dk, Hv, Dv = _check_delta(q, k, v, g, beta, state, ("a", "b") if fused else ("g", "beta"))
    if chunk_size not in (64, 128):
        raise KernelError(f"chunk_size={chunk_size!r}: expected 64 or 128 (a power of two of at least "
                          f"16 rows, the smallest tl.dot)")
    out = _check_out("out", out, (T, Hv, Dv), v.dtype, v.device)
    if T == 0:
        return out
    n_chunks = triton.cdiv(T, chunk_size)
    n_class = chunk_class(n_chunks)
    Tp = n_chunks * chunk_size
    if workspace is not None:
        want = chunk_workspace(T, Hv, Dk, Dv, q.dtype, "meta", chunk_size)
        pitch = workspace[0].shape[1] if isinstance(workspace[0], torch.Tensor) and workspace[0].dim() > 1 else -1
        for name, t, w in zip(ChunkWorkspace._fields, workspace, want):
            shape = (w.shape[0], pitch) + tuple(w.shape[2:])
            if (not isinstance(t, torch.Tensor) or t.dtype != w.dtype or t.device != q.device
                    or not t.is_contiguous() or tuple(t.shape) != shape or pitch < Tp):
                raise KernelError(f"workspace.{name}: expected a contiguous {w.dtype} tensor {tuple(w.shape)} (or "
                                  f"longer in dim 1, like the others) on {q.device}, got {_shape(t)}; build it "
                                  f"with chunk_workspace(T, Hv, Dk, Dv, dtype, device, chunk_size)")
    if min(Dk, Dv) < CHUNKED_MIN_HEAD_DIM and not INTERPRET:
        # Compiled for sm_90 by Triton 3.6, the chunked kernels fault (or return garbage) when a head dim is below
        # 64, while 64 and 128 (every released Qwen3.5) are right: benchmarks/probe_deltanet.py, docs/experiments.md.
        # Such small heads only occur in test models, where the recurrent kernel computes the same function.
        return _recurrent_launch(q, k, v, g, beta, A_log, dt_bias, state, scale, out, fused)
    if workspace is None:
        workspace = chunk_workspace(T, Hv, Dk, Dv, q.dtype, q.device, chunk_size)
    ws = workspace
    Tw = ws.qg.shape[1]  # the workspace row pitch (>= Tp)
    scale = Dk ** -0.5 if scale is None else float(scale)
    BK = max(16, triton.next_power_of_2(Dk))
    BDV = max(16, triton.next_power_of_2(Dv))
    # fp32 operands: exact fp32 products ("ieee"). bf16 operands ignore the setting, except in the inverse's
    # merges, whose fp32 tiles then use tf32 (10-bit mantissa; the result is rounded to bf16 right after).
    prec = dot_precision(ws.qg.dtype)
    # the counters through which the scan waits for the prep, [Hv, chunks + 1] at the workspace's pitch
    ready = _tickets(q.device, Hv * (Tw // chunk_size + 1))
    prep_args = (q, k, v, g, beta, A_log, dt_bias, ws.qg, ws.kd, ws.w, ws.u, ws.aqk, ws.gcum, ready, T, Tw, Dk, Dv,
                 Hv // Hk, Hv, n_chunks, n_class, scale, EPS,
                 q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                 g.stride(0), g.stride(1), beta.stride(0), beta.stride(1))
    prep_meta = dict(BT=chunk_size, BK=BK, BDV=BDV, MERGES=(chunk_size // 2).bit_length() - 1, PREC=prec,
                     INV_PREC=prec, GROUP=switches.scan_group, FUSED_GATES=fused, **pdl_options(q.device))
    programs = tuning._prep_programs(Hv, n_chunks, Dv, q.device)
    scan_args = (ws.qg, ws.kd, ws.w, ws.u, ws.aqk, ws.gcum, ready, state, out, T, Tw, n_chunks, n_class,
                 Hv, Dk, Dv, state.stride(0), state.stride(1), out.stride(0), out.stride(1))
    scan_meta = dict(BT=chunk_size, BK=BK, PREC=prec, GROUP=switches.scan_group,
                     **(pdl_options(q.device) if switches.scan_beside_prep else {}))
    grid = lambda META: (Hv, triton.cdiv(Dv, META["BV"]))  # noqa: E731

    def launch(scan_config=None):
        if programs is None:
            tuning._launch(chunk_prep_kernel, (Hv, n_chunks), prep_args, prep_meta, dict(num_warps=4))
        else:
            # not autotuned: the count assumes the 4-warp config's programs per SM, and the autotuner, timing the
            # prep alone, could pick 8 warps (one program per SM) and leave programs waiting for room
            tuning._launch(chunk_prep_kernel, (programs,), prep_args, dict(prep_meta, PERSIST=True), {},
                           untuned=_PREP_CONFIGS[0])
        tuning._launch(chunk_scan_kernel, grid, scan_args, scan_meta, dict(BV=min(32, BDV), num_warps=4),
                       untuned=scan_config)

    # the scan's config, timed beside the prep on the first call of this kind (three prep + scan pairs per graph).
    # The counters are put back with the state: a scan config that fails to compile (out of shared memory) does so
    # after its prep has counted its chunks, and a count left over would let the next scan run ahead of its prep.
    key = (device_key(q.device), ws.qg.dtype, Hv, Dk, Dv, chunk_size, n_class, fused, programs)
    launch(tuning._pick_in_place("chunk_scan_kernel", key, launch, (state, ready),
                                 not INTERPRET and q.device.type == "cuda", calls=3, Dv=Dv))
    return out
