r"""The decode GEMV: y = x W^T for a few rows of x (M <= GEMV_MAX_M), with an optional prologue (SwiGLU, the
norms: `fused_norm.py`); and `linear`, which picks the regime from M.

    x [M, K] (M = 1 at decode), W [N, K] (the Hugging Face layout, read as is), y [M, N]

- Decode (M = 1, a handful at most): bandwidth-bound. Each weight element is used once, so the whole
  cost is reading W: 2 N K bytes. `gemv_splitk_kernel` gives each program BLOCK_N contiguous rows of
  W and a slice of K; a wide matrix (N large) already yields enough programs, a narrow one (N = 1024
  outputs) does not, so K is split SPLIT_K ways and each program adds its partial sums into y:

$$ y_{mn} = \sum_{s=0}^{S-1} \sum_{k \in \text{split } s} x_{mk} W_{nk} $$

  The S partial sums of a block meet in an fp32 workspace, in one of two ways:
  - atomic (default): `tl.atomic_add` into a zeroed fp32 buffer [M, N]. Fast, but the order of the
    additions varies from run to run, so the last bits of y do too;
  - deterministic (`QWEN_LAB_DETERMINISTIC=1` or `deterministic=True`): each split stores its
    partials in [S, M, N] and they are added in the fixed order s = 0, 1, ..., S-1: bitwise repeatable.
  Either way the reduction costs no extra launch: every program counts itself in a per-block counter
  with an atomic increment; the program that arrives last adds the partials up, casts to x's
  dtype, writes y, and resets the counter (and, in atomic mode, the sums to zeros) for the next call. One
  launch per projection matters: inside a CUDA Graph each launch still costs about 1 us, as much
  as the whole read of a 4 MB weight at full bandwidth.
  `gemv_rows_kernel` is the persistent form for one row: a few programs per SM walk the row blocks of W
  with no split of K (the row fits one K tile), the next block's tile requested before the current one is
  multiplied, and the activation row (and a norm prologue's statistics) computed once per program
  instead of once per block. `QWEN_LAB_GEMV_PERSIST=0` leaves it out of the first-call timing (`tuning.py`).

Which plan serves a shape (form, block shape, SPLIT_K) is timed on its first call: `tuning.py`. On Hopper and
newer GPUs the GEMV is launched with programmatic dependent launch: it starts while the kernel before it finishes
and only then waits for the previous kernel's results (`gdc_wait`); the one-row plans with PREFETCH, and the
persistent kernel always, request their first weight tiles before that wait (W is never written, so that is safe):
the weight stream overlaps the previous kernel's tail and the launch gap.

`linear` picks the regime from M. Launchers take an optional `out=` so that a CUDA Graph can own
every buffer; the workspaces are allocated per device (zeroed) by the first call that needs them and
grown when a later shape needs more (both must happen before graph capture: the warm-up run of the same
shapes does it); later calls on that device reuse them; calls on concurrent streams must not share a device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ... import tunings  # the picks kept on disk, for later processes
from ...errors import KernelError
from ...runtime import interpreter_active
from .. import dot_precision, pdl_enabled, uncounted
from ...switches import switches
from . import tuning  # the plan state (_plans, plan_times, last_plan), read and written there
from .common import (GEMV_MAX_M, K_GRANULE, MAX_SPLIT_K, PRO_ADD_RMS, PRO_NONE, PRO_RMS, PRO_SWIGLU,
                     REDUCE_ATOMIC, REDUCE_DETERMINISTIC, REDUCE_NONE, _check_operands, _fail, sm_count)
from .tiled import _matmul
from .tuning import (SPLIT_CANDIDATES, _fitting_configs, _persistent, _plan_key, _tune_plan, choose_split_k,
                     deterministic_mode, tuning_enabled)

# The norm prologue loads a decode row whole for its statistics up to this many values (8192 fp32 over a
# program's 64-256 threads: 32-128 registers each); longer rows are summed slice by slice.
WHOLE_ROW_MAX = 8192


@triton.jit
def _residual_sum(x_rows, r_rows, offs_k, mask, ADD: tl.constexpr):
    """x, or s = x + residual rounded to x's dtype (the residual stream as it is stored), [rows, BLOCK_K]."""
    x = tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0)
    if ADD:
        r = tl.load(r_rows + offs_k[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _activation_tile(x_rows, r_rows, z_rows, nw_ptr, rstd, offs_k, mask, up_offset, stride_xh, stride_zh, eps,
                     PROLOGUE: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The activation block [rows, BLOCK_K] for columns offs_k, in the input dtype, rounded once after fp32
    math exactly as the unfused operator would have stored it: x itself; silu(gate) * up from
    gate_up = [gate | up]; the zero-centred RMSNorm (1 + w) of x (or of x + residual) with the row's rstd
    computed beforehand; or the gated RMSNorm of o (heads of DV values, normalised here: the tile holds
    whole heads) times silu(z)."""
    if PROLOGUE == 1:
        g = tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0)
        u = tl.load(x_rows + up_offset + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        gf = g.to(tl.float32)
        return (gf * tl.sigmoid(gf) * u).to(g.dtype)
    elif PROLOGUE == 2 or PROLOGUE == 3:
        s = _residual_sum(x_rows, r_rows, offs_k, mask, PROLOGUE == 3)
        nw = tl.load(nw_ptr + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        return ((s.to(tl.float32) * rstd[:, None]) * (1.0 + nw)).to(s.dtype)
    elif PROLOGUE == 4:
        # column k of the flattened [Hv * Dv] row is value d = k % DV of head k // DV (DV a power of two)
        head = offs_k // DV
        d = offs_k % DV
        o = tl.load(x_rows + (head.to(tl.int64) * stride_xh + d)[None, :], mask=mask, other=0.0)
        z = tl.load(z_rows + (head.to(tl.int64) * stride_zh + d)[None, :], mask=mask, other=0.0).to(tl.float32)
        o3 = tl.reshape(o.to(tl.float32), (BLOCK_M, BLOCK_K // DV, DV))
        inv = tl.math.rsqrt(tl.sum(o3 * o3, axis=2) / DV + eps)      # [rows, heads]: masked heads are all 0
        y = tl.reshape(o3 * inv[:, :, None], (BLOCK_M, BLOCK_K))
        nw = tl.load(nw_ptr + d[None, :], mask=mask, other=0.0).to(tl.float32)
        return ((y * nw) * (z * tl.sigmoid(z))).to(o.dtype)             # plain w, then silu(z)
    else:
        return tl.load(x_rows + offs_k[None, :], mask=mask, other=0.0)


@triton.jit
def gemv_splitk_kernel(x_ptr, w_ptr, out_ptr, ws_ptr, count_ptr,
                       r_ptr, z_ptr, nw_ptr, s_ptr,
                       M, N, K, K_PER_SPLIT, SPLIT_K,
                       stride_xm, stride_wn, stride_om, up_offset,
                       stride_rm, stride_sm, stride_xh, stride_zm, stride_zh, eps,
                       BLOCK_M: tl.constexpr, REDUCE: tl.constexpr, PROLOGUE: tl.constexpr, DV: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       PREFETCH: tl.constexpr, USE_PDL: tl.constexpr, K_POW2: tl.constexpr = 0):
    # Grid: (row blocks of W, K splits, row blocks of x). Program (n, s, m) computes the partial
    # y[m block, n block] over columns [s * K_PER_SPLIT, (s + 1) * K_PER_SPLIT) of K.
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Clamp rows instead of masking them: loads along K stay unmasked except at the slice's end, so
    # they compile to 16-byte vector loads; the duplicated rows are never stored.
    w_rows = w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * stride_wn      # [BLOCK_N, 1]
    rows_m = tl.minimum(offs_m, M - 1).to(tl.int64)[:, None]                           # [BLOCK_M, 1]
    x_rows = x_ptr + rows_m * stride_xm
    r_rows = r_ptr + rows_m * stride_rm
    z_rows = z_ptr + rows_m * stride_zm
    # Every program runs the same number of steps; the last slice may end early at K (masked).
    k_lo = pid_k * K_PER_SPLIT
    k_hi = tl.minimum(K, k_lo + K_PER_SPLIT)

    if BLOCK_M == 1 and PREFETCH:
        # The first weight tile is requested before anything else (the norm prologue below included),
        # so that its trip to memory overlaps the prologue. W is read once per call: evict it first,
        # keep L2 for the activation row every program reads.
        offs_k = k_lo + tl.arange(0, BLOCK_K)
        w_next = tl.load(w_rows + offs_k[None, :], mask=offs_k[None, :] < k_hi, other=0.0,
                         eviction_policy="evict_first")

    if USE_PDL:
        # Programmatic dependent launch: this kernel may start while the previous one is still finishing.
        # Everything above reads only W, which no kernel writes, so its trip to memory overlaps the previous
        # kernel's tail; from here on we read what that kernel wrote (x, the residual) and write what it may
        # still read, so wait for it to complete. Then let the next kernel start its own weight reads.
        gdc_wait()
        gdc_launch_dependents()

    rstd = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PROLOGUE == 2 or PROLOGUE == 3:
        # RMSNorm needs the whole row: every program sums the squares of its rows over all K (a row of
        # 1024-5120 values, in L2 after the first program read it), so the slices of every split use the
        # same rstd and no second kernel is needed. The programs of the first N block and first split
        # store s = x + residual (residual_out): exactly one writer per row; no program reads what another
        # writes (the launcher refuses residual_out overlapping x or residual).
        writer = (pid_n == 0) & (pid_k == 0)
        if K_POW2 > 0:
            # One row (decode): loaded whole, in one trip to L2. A loop over BLOCK_K slices makes one trip per
            # slice, each issued after the last returned: about 0.15 us each, 8 of them at K = 1024, between
            # the PDL wait and the first multiply.
            # (names apart from the loop's `s`: Triton types a name once per scope, and the deterministic
            # reduction below counts splits in `s`)
            offs_row = tl.arange(0, K_POW2)
            row_mask = offs_row[None, :] < K
            row = _residual_sum(x_rows, r_rows, offs_row, row_mask, PROLOGUE == 3)
            if PROLOGUE == 3:
                tl.store(s_ptr + rows_m * stride_sm + offs_row[None, :], row,
                         mask=row_mask & (offs_m[:, None] < M) & writer)
            row_f = row.to(tl.float32)
            ss = tl.sum(row_f * row_f, axis=1)
        else:
            ss = tl.zeros([BLOCK_M], dtype=tl.float32)
            for h0 in range(0, K, BLOCK_K):
                offs_h = h0 + tl.arange(0, BLOCK_K)
                hmask = offs_h[None, :] < K
                s = _residual_sum(x_rows, r_rows, offs_h, hmask, PROLOGUE == 3)
                if PROLOGUE == 3:
                    tl.store(s_ptr + rows_m * stride_sm + offs_h[None, :], s,
                             mask=hmask & (offs_m[:, None] < M) & writer)
                sf = s.to(tl.float32)
                ss += tl.sum(sf * sf, axis=1)
        rstd = tl.math.rsqrt(ss / K + eps)

    if BLOCK_M == 1:
        # GEMV: a [BLOCK_N, BLOCK_K] block of products per step, summed over K only once at the end
        # (one cross-thread reduction per program instead of one per step). With PREFETCH the next step's
        # tile is loaded before this one is multiplied: two tiles in flight when the slice takes several steps.
        prod = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k_step in range(0, K_PER_SPLIT, BLOCK_K):
            offs_k = k_lo + k_step + tl.arange(0, BLOCK_K)
            kmask = offs_k[None, :] < k_hi
            if PREFETCH:
                w = w_next
                offs_next = offs_k + BLOCK_K
                w_next = tl.load(w_rows + offs_next[None, :], mask=offs_next[None, :] < k_hi, other=0.0,
                                 eviction_policy="evict_first")
            else:
                w = tl.load(w_rows + offs_k[None, :], mask=kmask, other=0.0)
            a = _activation_tile(x_rows, r_rows, z_rows, nw_ptr, rstd, offs_k, kmask, up_offset, stride_xh,
                                 stride_zh, eps, PROLOGUE, DV, BLOCK_M, BLOCK_K)                 # [1, BLOCK_K]
            prod += w.to(tl.float32) * a.to(tl.float32)
        acc = tl.sum(prod, axis=1)[None, :]                                                    # [1, BLOCK_N]
    else:
        # A few rows of x (a short prompt): the tensor cores, x block [BLOCK_M, BLOCK_K] times W^T.
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k_step in range(0, K_PER_SPLIT, BLOCK_K):
            offs_k = k_lo + k_step + tl.arange(0, BLOCK_K)
            kmask = offs_k[None, :] < k_hi
            w = tl.load(w_rows + offs_k[None, :], mask=kmask, other=0.0, eviction_policy="evict_first")
            a = _activation_tile(x_rows, r_rows, z_rows, nw_ptr, rstd, offs_k, kmask, up_offset, stride_xh,
                                 stride_zh, eps, PROLOGUE, DV, BLOCK_M, BLOCK_K)
            acc = tl.dot(a, tl.trans(w), acc, input_precision=DOT_PRECISION)

    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    o_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    if REDUCE == 0:
        # SPLIT_K = 1: this program owns its block of y outright.
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        ws_offs = offs_m[:, None] * N + offs_n[None, :]  # workspace [M, N] (atomic) or [SPLIT_K, M, N]
        if REDUCE == 1:
            tl.atomic_add(ws_ptr + ws_offs, acc, mask=out_mask, sem="relaxed")
        else:
            tl.store(ws_ptr + pid_k * M * N + ws_offs, acc, mask=out_mask)
        # Every thread's partials must be out before the counter says this program is done: a barrier
        # in the block, then one acquire-release increment. The old value tells who came last.
        tl.debug_barrier()
        block = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(count_ptr + block, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            # ".cg" loads read L2, where the other programs' sums are, never a stale L1 line; the
            # acquire above orders them after every partial counted so far.
            if REDUCE == 1:
                ws_ptrs = ws_ptr + ws_offs
                total = tl.load(ws_ptrs, mask=out_mask, other=0.0, cache_modifier=".cg")
                # Every thread has its sums before any thread clears them for the next call: the compiler may
                # spread the load and the clearing store over the threads differently (with several rows it
                # does), and a thread clearing an element another has yet to read would lose that element.
                tl.debug_barrier()
                tl.store(ws_ptrs, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), mask=out_mask)
            else:
                # Fixed order s = 0, 1, ...: the same bits every run, whoever arrived last.
                total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for s in range(SPLIT_K):
                    total += tl.load(ws_ptr + s * M * N + ws_offs, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=out_mask)
            tl.store(count_ptr + block, 0)  # ready for the next call (kernel boundaries order it)


@triton.jit
def gemv_rows_kernel(x_ptr, w_ptr, out_ptr, r_ptr, z_ptr, nw_ptr, s_ptr,
                     N, K, stride_wn, up_offset, stride_xh, stride_zh, eps,
                     PROLOGUE: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     PERSIST: tl.constexpr, USE_PDL: tl.constexpr, DEPTH: tl.constexpr = 1):
    # The persistent form of the decode GEMV, for one row of x whose K values fit one tile (K <= BLOCK_K) and no
    # split: G = PERSIST programs per SM (fewer when W has fewer row blocks), program p owning the row blocks
    # p, p + G, p + 2G, ... of W. Against one program per row block it launches a few hundred programs instead
    # of thousands, computes the activation row (and a norm prologue's statistics) once per program instead of
    # once per row block, and streams its blocks with the next DEPTH weight tiles always in flight (1 or 2).
    # DEPTH = 2 issues a program's first two tiles before the PDL wait and the prologue: a program that owns
    # two or three blocks then has its whole share of W requested before it can do anything else, and the
    # wait for the previous kernel and the activation's trip to L2 no longer hold up the second request.
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    n_blocks = tl.cdiv(N, BLOCK_N)
    offs_b = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    kmask = offs_k[None, :] < K
    # W is never written: its first tile is requested before the PDL wait (see gemv_splitk_kernel)
    rows = pid * BLOCK_N + offs_b
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    w_next = tl.load(w_rows + offs_k[None, :], mask=(rows < N)[:, None] & kmask, other=0.0,
                     eviction_policy="evict_first")
    if DEPTH == 2:
        rows2 = (pid + G) * BLOCK_N + offs_b   # this program's second block, if it has one (else masked)
        w_rows2 = w_ptr + rows2.to(tl.int64)[:, None] * stride_wn
        w_next2 = tl.load(w_rows2 + offs_k[None, :], mask=(rows2 < N)[:, None] & kmask, other=0.0,
                          eviction_policy="evict_first")
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
    zero = tl.zeros([1, 1], dtype=tl.int64)   # the one row of x, r, z as [1, 1] pointers (BLOCK_M = 1)
    x_rows, r_rows, z_rows = x_ptr + zero, r_ptr + zero, z_ptr + zero
    rstd = tl.zeros([1], dtype=tl.float32)
    if PROLOGUE == 2 or PROLOGUE == 3:
        s = _residual_sum(x_rows, r_rows, offs_k, kmask, PROLOGUE == 3)
        if PROLOGUE == 3:  # the new residual stream: one writer
            tl.store(s_ptr + zero + offs_k[None, :], s, mask=kmask & (pid == 0))
        sf = s.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(sf * sf, axis=1) / K + eps)
    a = _activation_tile(x_rows, r_rows, z_rows, nw_ptr, rstd, offs_k, kmask, up_offset, stride_xh, stride_zh,
                         eps, PROLOGUE, DV, 1, BLOCK_K).to(tl.float32)                          # [1, BLOCK_K]
    for blk in range(pid, n_blocks, G):
        w = w_next
        if DEPTH == 2:
            w_next = w_next2
            rows_next = (blk + 2 * G) * BLOCK_N + offs_b
        else:
            rows_next = (blk + G) * BLOCK_N + offs_b
        # the tile DEPTH blocks ahead (past the last block: masked, nothing is read)
        w_load = tl.load(w_ptr + rows_next.to(tl.int64)[:, None] * stride_wn + offs_k[None, :],
                         mask=(rows_next < N)[:, None] & kmask, other=0.0, eviction_policy="evict_first")
        if DEPTH == 2:
            w_next2 = w_load
        else:
            w_next = w_load
        y = tl.sum(w.to(tl.float32) * a, axis=1)                                               # [BLOCK_N]
        rows = blk * BLOCK_N + offs_b
        tl.store(out_ptr + rows, y.to(out_ptr.dtype.element_ty), mask=rows < N)


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------


# Per-device workspaces, grown on demand and kept for the life of the process (a CUDA Graph captures
# their addresses). "sums" (fp32) and "counts" (int32) must be all zeros between calls: every launch
# leaves them so. "partials" holds the deterministic mode's [SPLIT_K, M, N] and may hold anything.
_workspaces: dict = {}


def _workspace(kind: str, numel: int, dtype, device) -> torch.Tensor:
    key = (kind, device)
    buf = _workspaces.get(key)
    if buf is None or buf.numel() < numel:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelError(f"linear_splitk: the split-K workspace '{kind}' needs {numel} elements but only "
                              f"{0 if buf is None else buf.numel()} exist, and a CUDA Graph is being captured; run "
                              f"the same shapes once before capture (the warm-up) so it is allocated outside it")
        buf = torch.zeros(max(numel, 1024), dtype=dtype, device=device)
        _workspaces[key] = buf
    return buf


def linear_splitk(x: torch.Tensor, weight: torch.Tensor, split_k: int | None = None,
                  deterministic: bool | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T with the GEMV / split-K kernel (the decode path). x [M, K], weight [N, K] -> [M, N].

    split_k: how many slices of K (None: on a GPU the first call of a shape that `choose_split_k` splits times
    SPLIT_CANDIDATES and that value (those leaving at least 128 columns per split) and keeps the fastest, a shape it
    does not split keeps SPLIT_K = 1 and times only block shapes, see `chosen_split_k`; elsewhere, or with
    QWEN_LAB_TUNE=0, `choose_split_k`). deterministic: reduce the partial sums in a fixed order (None: the
    QWEN_LAB_DETERMINISTIC environment variable), else with atomic adds. Either way one kernel launch.
    """
    return _gemv("linear_splitk", x, weight, split_k, deterministic, out, swiglu=False)


def _gemv(name, x, weight, split_k, deterministic, out, swiglu=False):
    """Launch the decode GEMV (gemv_splitk_kernel, or the persistent gemv_rows_kernel where that plan was picked).
    With swiglu, x is gate_up [M, 2K] and the kernel multiplies silu(gate) * up."""
    x_name = "gate_up" if swiglu else "x"
    M, N, K = _check_operands(name, x, weight, out, x_name, (lambda k: 2 * k) if swiglu else (lambda k: k))
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    prologue = PRO_SWIGLU if swiglu else PRO_NONE
    return _launch_gemv(name, x, weight, out, M, N, K, split_k, deterministic, prologue,
                        dict(stride_xm=x.stride(0), up_offset=K))


def _launch_gemv(name, x, weight, out, M, N, K, split_k, deterministic, prologue, args, dv=1):
    """Validate split_k, pick the plan (SPLIT_K and block shape), the reduction and the workspace, and launch
    gemv_splitk_kernel or gemv_rows_kernel once; returns out.

    args: the prologue's tensors and strides (x_ptr is `x`; r, z, nw, s default to x and are not read).
    With the gated prologue every split starts at a head boundary (K_PER_SPLIT a multiple of dv).
    """
    granule = max(K_GRANULE, dv)
    asked = split_k
    heuristic = choose_split_k(M, N, K, sm_count(x.device))
    if split_k is None:
        split_k = heuristic
    if isinstance(split_k, bool) or not isinstance(split_k, int) or not 1 <= split_k <= MAX_SPLIT_K:
        _fail(name, "split_k", f"must be an int in [1, {MAX_SPLIT_K}], got {split_k!r}")
    if split_k > triton.cdiv(K, granule):
        _fail(name, "split_k", f"is {split_k}, too many for K={K}: each split needs at least {granule} "
              f"columns, so at most {triton.cdiv(K, granule)} splits")
    if deterministic is None:
        deterministic = deterministic_mode()
    if M == 0 or N == 0:
        return out
    block_m = 1 if M == 1 else 16
    m_blocks = triton.cdiv(M, block_m)
    # the norm prologue's statistics from one load of the whole row (one row, up to WHOLE_ROW_MAX values)
    k_pow2 = triton.next_power_of_2(K) if block_m == 1 and prologue in (PRO_RMS, PRO_ADD_RMS) \
        and K <= WHOLE_ROW_MAX else 0
    precision = dot_precision(x.dtype)
    pdl = pdl_enabled(x.device)

    def per_split(split):
        # Whole granules per split keep every slice aligned; rounding may leave fewer, non-empty, splits.
        k_per_split = triton.cdiv(triton.cdiv(K, split), granule) * granule
        return k_per_split, triton.cdiv(K, k_per_split)

    def launch(plan, w):
        split, config = plan
        k_per_split, splits = per_split(split)
        extra = {"launch_pdl": True} if pdl else {}
        if _persistent(config):
            blocks = triton.cdiv(N, config.kwargs["BLOCK_N"])
            grid = (min(blocks, sm_count(x.device) * config.kwargs["PERSIST"]),)
            gemv_rows_kernel[grid](
                x, w, out, args.get("r", x), args.get("z", x), args.get("nw", x), args.get("s", x),
                N, K, w.stride(0), args.get("up_offset", 0), args.get("stride_xh", 0), args.get("stride_zh", 0),
                float(args.get("eps", 0.0)), PROLOGUE=prologue, DV=dv, USE_PDL=pdl,
                num_warps=config.num_warps, num_stages=config.num_stages, **extra, **config.kwargs)
            return
        reduce = REDUCE_NONE if splits == 1 else (REDUCE_DETERMINISTIC if deterministic else REDUCE_ATOMIC)
        ws_numel = splits * M * N if reduce == REDUCE_DETERMINISTIC else M * N
        if reduce != REDUCE_NONE and ws_numel >= 2**31:
            _fail(name, "x", f"with M={M}, N={N} and {splits} splits needs a workspace of {ws_numel} elements "
                  f"(2^31 or more, past 32-bit offsets); use matmul for this many rows")
        if reduce == REDUCE_NONE:
            ws, counts = out, out  # not read: the kernel stores y directly
        else:
            counts = _workspace("counts", m_blocks * N, torch.int32, x.device)  # >= one counter per block
            if reduce == REDUCE_ATOMIC:
                ws = _workspace("sums", ws_numel, torch.float32, x.device)
            else:
                ws = _workspace("partials", ws_numel, torch.float32, x.device)
        grid = (triton.cdiv(N, config.kwargs["BLOCK_N"]), splits, m_blocks)
        gemv_splitk_kernel[grid](
            x, w, out, ws, counts,
            args.get("r", x), args.get("z", x), args.get("nw", x), args.get("s", x),
            M, N, K, k_per_split, splits,
            args["stride_xm"], w.stride(0), out.stride(0), args.get("up_offset", 0),
            args.get("stride_rm", 0), args.get("stride_sm", 0), args.get("stride_xh", 0),
            args.get("stride_zm", 0), args.get("stride_zh", 0), float(args.get("eps", 0.0)),
            BLOCK_M=block_m, REDUCE=reduce, PROLOGUE=prologue, DV=dv, DOT_PRECISION=precision,
            USE_PDL=pdl, K_POW2=k_pow2, num_warps=config.num_warps, num_stages=config.num_stages, **extra,
            **config.kwargs)

    def candidates(splits):
        return [(s, c) for s in splits for c in _fitting_configs(block_m, N, per_split(s)[0], dv, K)]

    key = _plan_key(prologue, M, N, K, deterministic, x.dtype, x.device, asked, pdl)
    plan = tuning._plans.get(key)
    if plan is None:
        forced = switches.forced("gemv_splitk_kernel")  # a config forced by a test
        if forced is not None:
            plan = (split_k, forced)
            splits = per_split(split_k)[1]
            if _persistent(forced) and (block_m != 1 or splits != 1 or forced.kwargs["BLOCK_K"] < K):
                # (the timed plans come from _fitting_configs, which offers the persistent form only where it fits)
                _fail(name, "the config forced on gemv_splitk_kernel",
                      f"{forced} is the persistent form, which serves one row, one split and K <= BLOCK_K; this call has {M} rows, {splits} splits and K={K}")
        elif x.device.type != "cuda" or interpreter_active():
            plan = candidates([split_k])[0]
        elif not tuning_enabled() or torch.cuda.is_current_stream_capturing():
            plan = candidates([split_k])[0]  # no timing inside a capture: the first fitting plan
        else:
            # Narrow shapes (the heuristic splits K) also time other SPLIT_K values: whether one whole row per
            # program beats 4 slices and a reduction depends on the GPU's latencies. Wide ones keep SPLIT_K = 1.
            most = triton.cdiv(K, granule)
            splits = [split_k] if asked is not None or heuristic == 1 else sorted(
                {s for s in (*SPLIT_CANDIDATES, heuristic) if s <= most and (s == 1 or K // s >= 128)})
            plans = candidates(splits)

            def time_plans():
                with uncounted():  # the timing runs are not this call's launches
                    return _tune_plan(plans, launch, weight)
            # what an earlier process timed, if it did (qwen_lab.tunings), else timed here and recorded
            plan, tuning.plan_times[key], _ = tunings.pick(
                x.device, tunings.kernel_id(gemv_rows_kernel, gemv_splitk_kernel), key, plans, time_plans)
            tuning._plans[key] = plan
    tuning.last_plan = plan
    launch(plan, weight)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T, fp32 accumulation, x's dtype out. x [M, K], weight [N, K] -> [M, N].

    M <= GEMV_MAX_M (decode): the GEMV / split-K kernel; otherwise the tiled GEMM.
    """
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] <= GEMV_MAX_M:
        return _gemv("linear", x, weight, None, None, out, swiglu=False)
    return _matmul("linear", x, weight, out)
