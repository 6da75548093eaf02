r"""The tiled GEMM: every projection of more than GEMV_MAX_M rows (the prefill), y = x W^T.

    x [M, K] (activations, token-major), W [N, K] (the Hugging Face layout, read as is), y [M, N]
    SWIGLU: W = [W_gate; W_up] [2I, K], y = silu(x W_gate^T) (x W_up^T) [M, I]

$$ y_{mn} = \sum_{k=0}^{K-1} x_{mk} W_{nk} $$

computed with bf16 (fp16) operands, an fp32 accumulator, and one rounding to x's dtype at the end.

- Prefill (M = prompt length, hundreds to thousands): compute-bound. `matmul_kernel` tiles y into
  BLOCK_M x BLOCK_N blocks; each program walks K in BLOCK_K steps and feeds `tl.dot` (the tensor
  cores). Programs are visited in groups of GROUP_M block-rows so that neighbours in time share
  x rows and W columns in L2. Autotuned on the GPU over a few Hopper tile shapes.
  With SWIGLU=True the same kernel computes the MLP's gate/up projection and its activation at once:
  W = [W_gate; W_up] [2I, K], and the program of output columns [n0, n0 + BLOCK_N) of [0, I) keeps
  two accumulators, one for the gate rows n0.. and one for the up rows I + n0.., fed by the same x
  tile; its epilogue stores silu(g) u (fp32, rounded once) into y [M, I]. The [M, 2I] projection
  never goes to memory and the separate activation kernel disappears. Two accumulators need twice
  the registers and a W tile twice as wide in shared memory, so SWIGLU has its own tile shapes.
  On Hopper (sm_90) and newer a few extra candidates (TMA=True) load their x and W tiles through
  tensor descriptors: the Tensor Memory Accelerator copies a whole tile into shared memory from one
  instruction, with no address arithmetic in the threads and zeros past the matrix's edges (no masks).
  The launcher makes the descriptors on the host (`triton.tools.tensor_descriptor.TensorDescriptor`)
  and they travel in the launch's parameters (in a CUDA Graph: made once, at capture). Made on the
  device instead (`tl.make_tensor_descriptor`), every program wrote and fenced its own copy in global
  memory before its first load: 2-3.5 us more per call on the H200, a sixth of a narrow projection.
  The autotuner times them with the others (from TMA_ONLY_FROM_ROWS rows, alone) and keeps the fastest. They
  need 16-byte-aligned rows (bf16/fp16, row strides a multiple of 8 elements), which the launcher
  checks (`_tma_ok`, part of the autotuning key); never under the interpreter. Some of them are
  persistent (PERSIST: one program per SM walks the tiles), and SWIGLU's persistent ones describe W as
  [2, I, K] (JOIN): one TMA request brings a tile's gate and up rows together and one BLOCK_M x 2 BLOCK_N
  product replaces the two.

The candidate configurations and their pruning are in `tuning.py`; what the autotuner picks is kept on disk for
later processes (`qwen_lab.tunings`). The norm-splitting epilogues (RES_NORM, ROW_SCALE) serve
`fused_norm.linear_add_rms_norm` and `fused_norm.rms_scaled_linear`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ... import tunings
from ...switches import switches
from .. import dot_precision, graph_bench, pdl_options, sm90_or_newer
from .common import _check_operands, _check_swiglu_operands, sm_count
from .tuning import _matmul_all_configs, _prune_matmul_configs


@tunings.stored
@triton.autotune(configs=_matmul_all_configs(), key=["M_BUCKET", "N", "K", "SWIGLU", "TMA_OK", "RES_NORM", "ROW_SCALE"],
                 do_bench=graph_bench,
                 prune_configs_by={"early_config_prune": _prune_matmul_configs})
@triton.jit
def matmul_kernel(x_ptr, w_ptr, out_ptr, x_desc, w_desc, xt_desc, M, N, K, M_BUCKET,
                  stride_xm, stride_wn, stride_om,
                  r_ptr, nw_ptr, h_ptr, ss_ptr, stride_rm, stride_hm, eps,
                  DOT_PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  SWIGLU: tl.constexpr = False, TMA_OK: tl.constexpr = False, TMA: tl.constexpr = False,
                  PERSIST: tl.constexpr = False, JOIN: tl.constexpr = False, USE_PDL: tl.constexpr = False,
                  TAIL: tl.constexpr = 1, RES_NORM: tl.constexpr = False, ROW_SCALE: tl.constexpr = False,
                  SS_SLOTS: tl.constexpr = 1):
    # M_BUCKET (M rounded up to a power of two, at most 4096) is only an autotuning key: one tuning per prompt-length
    # bucket, not per prompt length; so is TMA_OK (whether the TMA configurations may be timed for this
    # call). With SWIGLU, N is I (the output's width) and W has 2N rows. x_desc, w_desc, xt_desc: the TMA
    # configurations' host tensor descriptors of x, W and (TAIL > 1 only) x in row slices (`_fit_descriptors`),
    # None for calls without TMA.
    # RES_NORM and ROW_SCALE split a residual add + RMSNorm between two GEMMs (see linear_add_rms_norm): RES_NORM's
    # epilogue adds the tile to the residual r (out = r + y), stores h = out (1 + nw) and the tile's share of each
    # row's sum of squares in ss [M, SS_SLOTS]; ROW_SCALE's multiplies each row by rsqrt(sum(ss[m]) / K + eps).
    # Their pointers are never read by the calls without them.
    if USE_PDL:
        # launched early (programmatic dependent launch): wait for the previous kernel's writes (x) first
        gdc_wait()
        gdc_launch_dependents()
    tl.static_assert(TMA or not PERSIST, "the persistent configurations load through TMA")
    if TMA:
        _tma_program(x_desc, w_desc, out_ptr, M, N, K, stride_om, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                     SWIGLU, PERSIST, JOIN, xt_desc, TAIL, r_ptr, nw_ptr, h_ptr, ss_ptr, stride_rm, stride_hm, eps,
                     RES_NORM, ROW_SCALE, SS_SLOTS)
        return
    pid_m, pid_n = _grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if SWIGLU:
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # Rows past M (columns past N) wrap onto valid ones: the loads need no mask along M and N (so they
    # stay wide), and the store below drops those rows.
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_xm + offs_k[None, :]   # [BLOCK_M, BLOCK_K]
    w_ptrs = w_ptr + cols[None, :].to(tl.int64) * stride_wn + offs_k[:, None]   # [BLOCK_K, BLOCK_N] = W^T tile
    if SWIGLU:
        # the up rows of the same output columns sit N rows further down: W = [W_gate; W_up]
        u_ptrs = w_ptr + (cols + N)[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    for k0 in range(0, K, BLOCK_K):
        k_left = K - k0  # only the last step is ragged: mask columns k >= K to zero in both operands
        a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)  # bf16 x bf16 -> fp32 on the tensor cores
        if SWIGLU:
            # the same x tile feeds both products: x is read once for gate and up
            bu = tl.load(u_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc_u = tl.dot(a, bu, acc_u, input_precision=DOT_PRECISION)
            u_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if ROW_SCALE:
        r = _row_scale(ss_ptr, pid_m * BLOCK_M, M, K, eps, BLOCK_M, SS_SLOTS)[:, None]
        acc = acc * r
        if SWIGLU:
            acc_u = acc_u * r
    if SWIGLU:
        # silu(g) * u on the fp32 sums, rounded once at the store (the unfused path rounds g and u first)
        acc = acc * tl.sigmoid(acc) * acc_u
    _store_tile(out_ptr, acc, pid_m, pid_n, M, N, stride_om, BLOCK_M, BLOCK_N,
                RES_NORM, r_ptr, nw_ptr, h_ptr, ss_ptr, stride_rm, stride_hm, SS_SLOTS)


@triton.jit
def _tma_program(x_desc, w_desc, out_ptr, M, N, K, stride_om, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SWIGLU: tl.constexpr,
                 PERSIST: tl.constexpr, JOIN: tl.constexpr, xt_desc=None, TAIL: tl.constexpr = 1,
                 r_ptr=None, nw_ptr=None, h_ptr=None, ss_ptr=None, stride_rm=0, stride_hm=0, eps=0.0,
                 RES_NORM: tl.constexpr = False, ROW_SCALE: tl.constexpr = False, SS_SLOTS: tl.constexpr = 1):
    """A TMA configuration's program: its one tile, or (PERSIST: one program per SM, the launcher's grid) tiles p,
    p + P, p + 2P, ... Flattening the two loops into one lets the compiler's pipeline run straight across tile
    boundaries: the first K steps of the next tile are loading while this one's epilogue runs.

    TAIL > 1 (persistent only): when the tiles do not divide evenly among the P programs, the last round would keep
    only some of them busy (the SwiGLU GEMM at 2048 tokens: 448 tiles, 3.4 rounds on 132 SMs). That round runs
    instead as TAIL row slices of BLOCK_M / TAIL rows per tile (x through xt_desc), TAIL times as many pieces
    spread over the programs, each piece ~1/TAIL of a tile's time."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    if PERSIST:
        n_tiles = num_pid_m * num_pid_n
        whole = n_tiles
        if TAIL > 1:
            whole = (n_tiles // tl.num_programs(0)) * tl.num_programs(0)  # the rounds every program takes part in
        for tile in tl.range(tl.program_id(0), whole, tl.num_programs(0), flatten=True):
            pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
            acc = _tma_tile(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, N, K, DOT_PRECISION,
                            BLOCK_M, BLOCK_N, BLOCK_K, SWIGLU, JOIN, ROW_SCALE, ss_ptr, M, eps, SS_SLOTS)
            _store_tile(out_ptr, acc, pid_m, pid_n, M, N, stride_om, BLOCK_M, BLOCK_N,
                        RES_NORM, r_ptr, nw_ptr, h_ptr, ss_ptr, stride_rm, stride_hm, SS_SLOTS)
        if TAIL > 1:
            SUB: tl.constexpr = BLOCK_M // TAIL
            for piece in tl.range(tl.program_id(0), (n_tiles - whole) * TAIL, tl.num_programs(0)):
                pid_m, pid_n = _grouped_tile(whole + piece // TAIL, num_pid_m, num_pid_n, GROUP_M)
                sub_m = pid_m * TAIL + piece % TAIL  # the slice's index in units of SUB rows
                acc = _tma_tile(xt_desc, w_desc, sub_m * SUB, pid_n * BLOCK_N, N, K, DOT_PRECISION,
                                SUB, BLOCK_N, BLOCK_K, SWIGLU, JOIN, ROW_SCALE, ss_ptr, M, eps, SS_SLOTS)
                _store_tile(out_ptr, acc, sub_m, pid_n, M, N, stride_om, SUB, BLOCK_N,
                            RES_NORM, r_ptr, nw_ptr, h_ptr, ss_ptr, stride_rm, stride_hm, SS_SLOTS)
    else:
        pid_m, pid_n = _grouped_tile(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
        acc = _tma_tile(x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, N, K, DOT_PRECISION,
                        BLOCK_M, BLOCK_N, BLOCK_K, SWIGLU, JOIN, ROW_SCALE, ss_ptr, M, eps, SS_SLOTS)
        _store_tile(out_ptr, acc, pid_m, pid_n, M, N, stride_om, BLOCK_M, BLOCK_N,
                    RES_NORM, r_ptr, nw_ptr, h_ptr, ss_ptr, stride_rm, stride_hm, SS_SLOTS)


@triton.jit
def _tma_tile(x_desc, w_desc, m0, n0, N, K, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWIGLU: tl.constexpr, JOIN: tl.constexpr = False,
              ROW_SCALE: tl.constexpr = False, ss_ptr=None, M=0, eps=0.0, SS_SLOTS: tl.constexpr = 1):
    """The fp32 tile of x W^T at rows m0.., columns n0.., from the tensor descriptors (with SWIGLU: silu(gate) * up,
    the up rows N further down W). The TMA unit fetches whole tiles and fills what lies past the matrix with zeros
    (rows past M or 2N, columns past K), so no masks. With SWIGLU a gate tile that runs past row N reads up rows
    instead: only output columns >= N use them, and the store drops those. With JOIN, w_desc describes W as
    [2, N, K]: one [2, BLOCK_N, BLOCK_K] tile holds the gate rows and the up rows of the same output columns.
    ROW_SCALE: the sums of each row scaled by its 1 / rms (`_row_scale`) before SwiGLU."""
    if ROW_SCALE:  # requested before the products, so their latency hides behind them
        r = _row_scale(ss_ptr, m0, M, K, eps, BLOCK_M, SS_SLOTS)[:, None]
    if SWIGLU and JOIN:
        # one product of a [BLOCK_M, 2 BLOCK_N] tile: the gate columns, then the up columns of the same outputs
        acc2 = tl.zeros([BLOCK_M, 2 * BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            b = tl.reshape(w_desc.load([0, n0, k0]), [2 * BLOCK_N, BLOCK_K])
            acc2 = tl.dot(x_desc.load([m0, k0]), b.T, acc2, input_precision=DOT_PRECISION)
        if ROW_SCALE:
            acc2 = acc2 * r
        gate, up = tl.split(tl.permute(tl.reshape(acc2, [BLOCK_M, 2, BLOCK_N]), [0, 2, 1]))
        acc = gate * tl.sigmoid(gate) * up
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if SWIGLU:
            acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = x_desc.load([m0, k0])                                                      # [BLOCK_M, BLOCK_K]
            acc = tl.dot(a, w_desc.load([n0, k0]).T, acc, input_precision=DOT_PRECISION)  # W rows [BLOCK_N, BLOCK_K]
            if SWIGLU:
                acc_u = tl.dot(a, w_desc.load([N + n0, k0]).T, acc_u, input_precision=DOT_PRECISION)
        if ROW_SCALE:
            acc = acc * r
            if SWIGLU:
                acc_u = acc_u * r
        if SWIGLU:
            acc = acc * tl.sigmoid(acc) * acc_u
    return acc


@triton.jit
def _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile number -> (pid_m, pid_n) in the grouped order: GROUP_M block-rows down one block-column before moving
    right, so the programs running at the same time read few distinct x rows and W rows, which then stay in L2."""
    per_group = GROUP_M * num_pid_n
    first_m = (tile // per_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@triton.jit
def _store_tile(out_ptr, acc, pid_m, pid_n, M, N, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                RES_NORM: tl.constexpr = False, r_ptr=None, nw_ptr=None, h_ptr=None, ss_ptr=None, stride_rm=0,
                stride_hm=0, SS_SLOTS: tl.constexpr = 1):
    """The fp32 tile rounded to out's dtype and stored, rows past M and columns past N dropped.

    RES_NORM: the tile y is a branch's output joining the residual stream r, and what the next RMSNorm can do
    without the whole row is done here: out = r + y (y rounded first, the sum rounded: as the unfused pair
    rounds), h = out (1 + nw) in out's dtype, and each row's sum of out^2 over this tile's columns into
    ss[m, pid_n]. The program of column tile 0 writes zeros into the slots past the last column tile (a call with
    narrower tiles may have filled them). r may be out itself: each element is read before the same thread
    writes it."""
    out_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (out_m[:, None] < M) & (out_n[None, :] < N)
    rows = out_m[:, None].to(tl.int64)
    y = acc.to(out_ptr.dtype.element_ty)
    if RES_NORM:
        res = tl.load(r_ptr + rows * stride_rm + out_n[None, :], mask=mask, other=0.0)
        y = (res.to(tl.float32) + y.to(tl.float32)).to(out_ptr.dtype.element_ty)
        s = y.to(tl.float32)
        w1 = 1.0 + tl.load(nw_ptr + out_n, mask=out_n < N, other=0.0).to(tl.float32)
        tl.store(h_ptr + rows * stride_hm + out_n[None, :], (s * w1[None, :]).to(h_ptr.dtype.element_ty), mask=mask)
        # (ss_slots sizes SS_SLOTS for the narrowest tile of any configuration; the guard keeps a narrower one
        # inside the buffer)
        tl.store(ss_ptr + out_m.to(tl.int64) * SS_SLOTS + pid_n, tl.sum(tl.where(mask, s * s, 0.0), 1),
                 mask=(out_m < M) & (pid_n < SS_SLOTS))
        if pid_n == 0:
            slot = tl.arange(0, SS_SLOTS)
            tl.store(ss_ptr + rows * SS_SLOTS + slot[None, :], tl.zeros([BLOCK_M, SS_SLOTS], dtype=tl.float32),
                     mask=(out_m[:, None] < M) & (slot[None, :] >= tl.cdiv(N, BLOCK_N)))
    tl.store(out_ptr + rows * stride_om + out_n[None, :], y, mask=mask)


@triton.jit
def _row_scale(ss_ptr, m0, M, K, eps, BLOCK_M: tl.constexpr, SS_SLOTS: tl.constexpr):
    """[BLOCK_M] 1 / rms of rows m0.. of a K-wide activation whose sums of squares a RES_NORM epilogue left in
    ss [M, SS_SLOTS]: rsqrt(sum(ss[m]) / K + eps), the slots added in a fixed order (the same bits every call)."""
    rows = m0 + tl.arange(0, BLOCK_M)
    slot = tl.arange(0, SS_SLOTS)
    part = tl.load(ss_ptr + rows[:, None].to(tl.int64) * SS_SLOTS + slot[None, :], mask=(rows < M)[:, None],
                   other=0.0)
    return tl.rsqrt(tl.sum(part, 1) / K + eps)


# ------------------------------------------------------------------------------------------------
# Launchers
# ------------------------------------------------------------------------------------------------


def _tma_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the TMA candidates may serve this call: a Hopper-or-newer GPU (not the interpreter), 16-bit
    operands with 16-byte-aligned starts and row strides. QWEN_LAB_TMA=0 leaves them out."""
    if x.element_size() != 2 or not switches.tma or not sm90_or_newer(x.device):
        return False
    for t in (x, weight):
        if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


def _tma_descriptors(x: torch.Tensor, weight: torch.Tensor, tail: bool = False) -> tuple:
    """Host tensor descriptors of x [M, K] and W for the TMA candidates, and (`tail`, for a configuration with
    TAIL > 1) x again for its row slices, else None; their tile shapes still open: `_fit_descriptors` sets them (and
    W's layout) for the configuration that runs."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    M, K = x.shape
    return (TensorDescriptor(x, [M, K], [x.stride(0), 1], [16, 16]),
            TensorDescriptor(weight, [weight.shape[0], K], [weight.stride(0), 1], [16, 16]),
            TensorDescriptor(x, [M, K], [x.stride(0), 1], [16, 16]) if tail else None)


def _fit_descriptors(*args, **meta) -> None:
    """matmul_kernel's pre-run hook (Triton calls it at every launch, the autotuner's timing runs included, with the
    launch's arguments and the configuration's meta-parameters): shape the call's host descriptors for its tiles.
    A descriptor's tile shape is part of the compiled kernel's signature, so it must match the configuration's BLOCK
    sizes. W is [2N, K] ([W_gate; W_up] with SWIGLU), or with JOIN [2, N, K]: one [2, BLOCK_N, BLOCK_K] tile holds the
    gate rows and the up rows of the same output columns. xt_desc (x again, only for a TAIL configuration) gets
    the slices' tile [BLOCK_M / TAIL, BLOCK_K]. Calls without TMA pass None for all three (the kernel's pointer branch
    never reads them). A hook, not a per-configuration pre_hook: those keep Triton from caching its tuning on disk."""
    nargs = dict(zip(_MATMUL_ARGS, args), **meta)
    x_desc, w_desc, xt_desc = nargs["x_desc"], nargs["w_desc"], nargs["xt_desc"]
    if x_desc is None:
        return
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    N, K, stride_wn = nargs["N"], nargs["K"], nargs["stride_wn"]
    x_desc.block_shape = [bm, bk]
    if xt_desc is not None:
        xt_desc.block_shape = [bm // nargs.get("TAIL", 1), bk]
    if nargs.get("SWIGLU") and nargs.get("JOIN"):
        w_desc.shape, w_desc.strides, w_desc.block_shape = [2, N, K], [N * stride_wn, stride_wn, 1], [2, bn, bk]
    else:
        rows = 2 * N if nargs.get("SWIGLU") else N
        w_desc.shape, w_desc.strides, w_desc.block_shape = [rows, K], [stride_wn, 1], [bn, bk]


_MATMUL_ARGS = matmul_kernel.fn.arg_names
matmul_kernel.fn.add_pre_run_hook(_fit_descriptors)


def matmul_grid(M: int, N: int, meta: dict, device) -> tuple:
    """matmul_kernel's grid for one configuration: a program per tile, or (PERSIST) one per SM, at most a tile each."""
    tiles = triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"])
    return (min(tiles, sm_count(device)) if meta.get("PERSIST") else tiles,)


def matmul_with_config(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, config: "triton.Config",
                       swiglu: bool = False, epilogue: dict | None = None) -> torch.Tensor:
    """matmul_kernel with one given configuration, past the autotuner (tests and benchmarks time or check each
    candidate this way): out [M, N] = x weight^T, or with swiglu silu(x W_gate^T) * (x W_up^T) [M, N] for weight
    [2N, K]. No checks: the caller passes operands `matmul` would accept. A TMA configuration needs `_tma_ok`.
    epilogue: the norm-splitting arguments `_norm_epilogue` makes (linear_add_rms_norm, rms_scaled_linear)."""
    M, K = x.shape
    N = out.shape[1]
    tail = config.kwargs.get("TAIL", 1) > 1
    x_desc, w_desc, xt_desc = _tma_descriptors(x, weight, tail) if config.kwargs.get("TMA") else (None, None, None)
    matmul_kernel.fn[matmul_grid(M, N, config.kwargs, x.device)](
        x, weight, out, x_desc, w_desc, xt_desc, M, N, K, triton.next_power_of_2(M), x.stride(0), weight.stride(0),
        out.stride(0), *_norm_epilogue(out, epilogue), DOT_PRECISION=dot_precision(x.dtype), SWIGLU=swiglu,
        num_warps=config.num_warps, num_stages=config.num_stages, **config.kwargs, **pdl_options(x.device),
        **_norm_epilogue_meta(epilogue))
    return out


def matmul_candidates(x: torch.Tensor, weight: torch.Tensor, swiglu: bool = False) -> list:
    """Every configuration the autotuner may time for a call on x [M, K] and weight: those of its mode (plain, or
    SwiGLU for weight [2N, K]), the TMA ones only where they may serve it. A benchmark times them one by one with
    `matmul_with_config`. (From TMA_ONLY_FROM_ROWS rows on, the autotuner itself times only the TMA ones.)"""
    return _prune_matmul_configs(_matmul_all_configs(), {}, SWIGLU=bool(swiglu), TMA_OK=_tma_ok(x, weight))


def matmul(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T with the tiled `tl.dot` GEMM (the prefill path). x [M, K], weight [N, K] -> [M, N]."""
    return _matmul("matmul", x, weight, out)


def _matmul(name, x, weight, out, swiglu=False, epilogue=None):
    """The tiled GEMM, one launch: y = x weight^T [M, N], or with swiglu silu(x W_gate^T) * (x W_up^T) [M, I]
    for weight = [W_gate; W_up] [2I, K]. epilogue: see `_norm_epilogue`."""
    if swiglu:
        M, N, K = _check_swiglu_operands(name, x, weight, out)
    else:
        M, N, K = _check_operands(name, x, weight, out)
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out

    def grid(meta):
        return matmul_grid(M, N, meta, x.device)

    tma_ok = _tma_ok(x, weight)
    # the TMA candidates' descriptors: made here, shaped for each configuration's tiles at its launch
    # (_fit_descriptors); the slice descriptor only for SwiGLU, the one product with TAIL candidates
    x_desc, w_desc, xt_desc = _tma_descriptors(x, weight, tail=bool(swiglu)) if tma_ok else (None, None, None)
    matmul_kernel[grid](x, weight, out, x_desc, w_desc, xt_desc, M, N, K, triton.next_power_of_2(min(M, 4096)),
                        x.stride(0), weight.stride(0), out.stride(0), *_norm_epilogue(out, epilogue),
                        DOT_PRECISION=dot_precision(x.dtype), SWIGLU=bool(swiglu), TMA_OK=tma_ok,
                        **pdl_options(x.device), **_norm_epilogue_meta(epilogue))
    return out


def _norm_epilogue(out, epilogue):
    """matmul_kernel's (r, nw, h, ss, stride_rm, stride_hm, eps) for an epilogue dict: {"residual", "norm_weight",
    "h", "ss"} (RES_NORM) or {"ss", "eps"} (ROW_SCALE); None: placeholders the kernel never reads."""
    e = epilogue or {}
    r, h = e.get("residual", out), e.get("h", out)
    return (r, e.get("norm_weight", out), h, e.get("ss", out), r.stride(0), h.stride(0), float(e.get("eps", 0.0)))


def _norm_epilogue_meta(epilogue):
    if not epilogue:
        return {}
    return dict(RES_NORM="residual" in epilogue, ROW_SCALE="residual" not in epilogue,
                SS_SLOTS=epilogue["ss"].shape[1])
