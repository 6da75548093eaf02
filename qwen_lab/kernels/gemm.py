r"""Matrix multiplication for every projection of the model: y = x W^T.

    x [M, K] (activations, token-major), W [N, K] (the Hugging Face layout, read as is), y [M, N]

$$ y_{mn} = \sum_{k=0}^{K-1} x_{mk} W_{nk} $$

computed with bf16 (fp16) operands, an fp32 accumulator, and one rounding to x's dtype at the end.
Two regimes need different kernels:

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
  instead of once per block. `QWEN_LAB_GEMV_PERSIST=0` leaves it out of the timing below.

Which form, block shape (and, for the narrow shapes, which SPLIT_K) serves a decode shape best depends on the GPU's
latencies, and the differences are a microsecond or two: too small to time one launch from Python. So the first
call of each shape times every fitting plan inside a CUDA Graph, over copies of the weight that together exceed
the L2 cache (as the model's layers do), and keeps the fastest (`gemv_plan` tells which; on the H200 the persistent
form won every decode projection but the LM head). The pick is recorded on disk for later processes on the same
kind of GPU (`qwen_lab.tunings`, which also keeps what Triton's autotuner picks for the tiled GEMM). On Hopper and
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

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .. import tunings
from ..errors import KernelError
from . import (device_key, dot_precision, env_on, graph_bench, graph_time_us, pdl_enabled, pdl_options,
               sm90_or_newer, uncounted)
from ..runtime import interpreter_active

# M at or below this is served by the GEMV / split-K path (decode and very short prompts).
GEMV_MAX_M = 16
# Above this many outputs the norm is not fused into the GEMV's prologue (the LM head: see _rms_linear).
FUSED_NORM_MAX_N = 65536
# SPLIT_K beyond this buys nothing on any shape of the model and only adds contention.
MAX_SPLIT_K = 64
# K columns per split are rounded up to this many, so every split starts 32-byte aligned.
K_GRANULE = 16

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ------------------------------------------------------------------------------------------------
# Prefill: the tiled GEMM
# ------------------------------------------------------------------------------------------------


def _matmul_configs(swiglu: bool = False):
    """The tiled GEMM's candidate configurations on this machine: the plain GEMM's, or (swiglu) those whose two
    accumulators and doubled W tiles fit a Hopper SM; under the interpreter one small one for both."""
    if interpreter_active():
        # The interpreter runs each program in NumPy, one after another, at a fixed cost per program: one tile,
        # large enough that the tiny model's prefills take few programs (64 tokens: 1.8 s on a CPU, 2.7 with
        # 16 x 32 tiles), small enough that the tests' ragged shapes still span several of them.
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4}, num_warps=4, num_stages=1)]
    if swiglu:
        # Each program multiplies an effective BLOCK_M x 2 BLOCK_N tile (gate and up), so BLOCK_N is halved
        # against the plain shapes: the accumulators stay at 2 BLOCK_M BLOCK_N / (32 num_warps threads) <= 128 fp32
        # registers a thread, and a stage (BLOCK_M + 2 BLOCK_N) BLOCK_K bf16 values times the stages stays
        # well under the 227 KB of shared memory (tests/test_activations.py checks the registers, and
        # tests/sm90_compile.py the shared memory, of each).
        shapes = [(128, 128, 64, 3, 8), (128, 128, 64, 4, 8), (256, 64, 64, 3, 8), (128, 64, 64, 4, 4),
                  (64, 128, 64, 4, 4), (64, 64, 64, 4, 4), (128, 64, 128, 3, 4), (128, 128, 128, 2, 8)]
    else:
        shapes = [  # (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps): Hopper-sized tiles, then smaller ones for
            (128, 256, 64, 3, 8),  # short prompts, where big tiles would leave SMs idle
            (128, 128, 64, 4, 8),
            (128, 128, 64, 3, 4),
            (256, 128, 64, 3, 8),
            (64, 256, 64, 4, 4),
            (128, 64, 64, 4, 4),
            (64, 128, 64, 4, 4),
            (64, 64, 64, 4, 4),
            # deeper K steps: the narrow projections (N = 1024) give only 64-256 tiles, so each program's K loop
            # is long and fewer, larger steps keep the tensor cores fed
            (128, 128, 128, 3, 8),
            (64, 128, 128, 3, 4),
            (128, 64, 128, 3, 4),
        ]
    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=s, num_warps=w)
               for bm, bn, bk, s, w in shapes]
    # The TMA candidates: the large Hopper tiles again, their loads through tensor descriptors. Used only where
    # the call allows them (_prune_matmul_configs): sm_90+, aligned 16-bit operands.
    tma = [(128, 128, 64, 3, 8), (128, 128, 64, 4, 8), (256, 64, 64, 3, 8)] if swiglu else \
        [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (256, 128, 64, 3, 8), (128, 128, 128, 3, 8)]
    configs += [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "TMA": True},
                              num_stages=s, num_warps=w) for bm, bn, bk, s, w in tma]
    # The persistent TMA candidates: one program per SM walks the tiles (PERSIST in the kernel), so the loads of a
    # program's next tile are issued while it still multiplies and stores the current one, and no SM waits for a
    # new program between tiles. On the H200 they are the fastest candidates of every prefill projection, the narrow
    # N = 1024 ones included, level with cuBLAS (docs/perf-log.md). With SWIGLU's two products per K step they
    # measured slower than the one-tile-per-program form; SWIGLU's persistent candidates join the two into one (JOIN).
    if not swiglu:
        configs += [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "TMA": True,
                                   "PERSIST": True}, num_stages=s, num_warps=w)
                    for bm, bn, bk, s, w in [(128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (128, 128, 128, 3, 8),
                                             (128, 128, 64, 4, 4)]]
    else:
        # JOIN: the gate and up rows of a tile arrive in one [2, BLOCK_N, BLOCK_K] TMA tile and meet x in one
        # BLOCK_M x 2 BLOCK_N product (one m64n256 tensor-core instruction instead of two m64n128). Persistent only:
        # on the H200 the persistent JOIN candidates took the SwiGLU prefill GEMM from 60 to 51 us, the one-tile
        # JOIN form measured the same as the two-product one (docs/perf-log.md). Half-size JOIN tiles (64 x 128,
        # 128 x 64: 6.8 rounds of tiles per SM at 2048 tokens instead of 3.4) were slower there and were removed.
        # TAIL = 2: at 2048 tokens the 448 tiles are 3.4 rounds on 132 SMs, and the last round, in half-height
        # slices, ends sooner (H200: 49.6 -> 47.0 us per call, docs/perf-log.md, 2026-12-02). The SwiGLU candidates
        # are the only ones with TAIL, so only the SwiGLU launches make the slices' descriptor (`_tma_descriptors`).
        configs += [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "TMA": True,
                                   "PERSIST": True, "JOIN": True, "TAIL": tail}, num_stages=s, num_warps=w)
                    for bm, bn, bk, s, w in [(128, 128, 64, 3, 8), (128, 128, 64, 4, 8)] for tail in (1, 2)]
    return configs


def _config_id(c: triton.Config) -> tuple:
    return tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages


def _matmul_all_configs() -> list:
    """Every configuration of either mode, once each: the autotuner's list, pruned per call below."""
    seen, configs = set(), []
    for c in _matmul_configs(False) + _matmul_configs(True):
        if _config_id(c) not in seen:
            seen.add(_config_id(c))
            configs.append(c)
    return configs


# From this many rows on (M_BUCKET), a call that may use TMA times only the TMA candidates. Timed alone, the
# out-projection's plain 128 x 128 tile (4 warps) came level with its TMA forms and was picked in one run of three;
# in the model it took ~10 us more per call than they did (the prefill's GEMMs 3619 us against 3379-3440 us in the
# other runs, docs/perf-log.md): an isolated timing does not see what the model's neighbours do to a kernel.
TMA_ONLY_FROM_ROWS = 1024


def _prune_matmul_configs(configs, named_args, **kwargs):
    """Keep the configurations of the call's mode (SWIGLU or not), and the TMA ones only where the call allows
    them (TMA_OK): the autotuner times only those. Long prompts that allow TMA time the TMA ones alone."""
    ids = {_config_id(c) for c in _matmul_configs(bool(kwargs.get("SWIGLU", False)))}
    tma_ok = bool(kwargs.get("TMA_OK", False))
    rows = named_args.get("M_BUCKET", kwargs.get("M_BUCKET", 0))
    kept = [c for c in configs if _config_id(c) in ids and (tma_ok or not c.kwargs.get("TMA", False))]
    if tma_ok and rows >= TMA_ONLY_FROM_ROWS:
        kept = [c for c in kept if c.kwargs.get("TMA", False)]
    return kept


def _tma_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the TMA candidates may serve this call: a Hopper-or-newer GPU (not the interpreter), 16-bit
    operands with 16-byte-aligned starts and row strides. QWEN_LAB_TMA=0 leaves them out."""
    if x.element_size() != 2 or not env_on("QWEN_LAB_TMA", True) or not sm90_or_newer(x.device):
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


_MATMUL_ARGS = matmul_kernel.fn.arg_names
matmul_kernel.fn.add_pre_run_hook(_fit_descriptors)


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


# ------------------------------------------------------------------------------------------------
# Decode: the GEMV with split-K
# ------------------------------------------------------------------------------------------------

# How a GEMV program delivers its sums (the kernel's REDUCE; it compares with these literal values).
REDUCE_NONE, REDUCE_ATOMIC, REDUCE_DETERMINISTIC = 0, 1, 2
# What the GEMV computes from its input before the product (the kernel's PROLOGUE): x as is; SwiGLU of
# gate_up; RMSNorm of x; residual add + RMSNorm; the DeltaNet's per-head gated RMSNorm of o with gate z.
PRO_NONE, PRO_SWIGLU, PRO_RMS, PRO_ADD_RMS, PRO_GATED = 0, 1, 2, 3, 4
PROLOGUE_NAMES = {PRO_NONE: "plain", PRO_SWIGLU: "swiglu", PRO_RMS: "rms", PRO_ADD_RMS: "add_rms",
                  PRO_GATED: "gated"}  # for reports
# The norm prologue loads a decode row whole for its statistics up to this many values (8192 fp32 over a
# program's 64-256 threads: 32-128 registers each); longer rows are summed slice by slice.
WHOLE_ROW_MAX = 8192


def _gemv_configs(gpu: bool | None = None):
    """The decode GEMV's candidate configurations: the GPU's (gpu=True), or under the interpreter one small one."""
    if not gpu and (gpu is not None or interpreter_active()):
        # The interpreter runs each program in NumPy, one after another, at a fixed cost per program: 128 rows a
        # program made the tiny model's decode step about 45% faster on a CPU than 32 did, with the same results.
        return [triton.Config({"BLOCK_N": 128, "BLOCK_K": 64, "PREFETCH": 1}, num_warps=4, num_stages=1)]
    # (BLOCK_N, BLOCK_K, warps, stages): each program holds 4-16 KB of bf16 weights in flight, all its
    # loads issued at once when its K slice fits one BLOCK_K (and the next step's tile is prefetched
    # while the current one is multiplied). The 1- and 2-row blocks with a whole 2048-4096 row per step
    # serve the narrow projections (N = 1024) without splitting K: 512-1024 programs, each with one
    # round trip to memory and no partial sums. M = 1 tries them all; M > 1 (tl.dot) needs
    # BLOCK_N >= 16. The pruner below drops what does not fit the call.
    shapes = [(1, 2048, 4, 1), (1, 4096, 8, 1), (2, 2048, 4, 1), (2, 4096, 8, 1), (4, 1024, 4, 1),
              (4, 2048, 8, 1), (8, 1024, 4, 1), (8, 512, 4, 2), (16, 256, 4, 3), (16, 512, 8, 2),
              (32, 256, 4, 3), (64, 128, 4, 3),
              # neighbours of the H200's picks (4 x 1024 rows on 4 warps for the wide projections, 1-4 x 2048 for
              # the narrow ones): the same tile on fewer or more warps
              (4, 1024, 2, 1), (8, 1024, 8, 1), (2, 2048, 8, 1), (1, 4096, 4, 1)]
    # Each shape twice: with the hand-written prefetch of the next weight tile (evicted from L2 first), and with
    # plain loads left to the compiler's pipelining (the first version's body). On the H200 the version with the
    # prefetch ran the narrow projections faster and the wide ones slower than the first version did
    # (docs/perf-log.md); which of its changes slowed the wide ones is not yet known, so the first-call timing
    # in `_launch_gemv` decides.
    configs = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "PREFETCH": p}, num_warps=w, num_stages=s)
               for bn, bk, w, s in shapes for p in (1, 0)]
    # The persistent form (gemv_rows_kernel): PERSIST programs per SM walk the row blocks of W, for one row whose
    # K fits one tile and no split. (BLOCK_N, BLOCK_K, warps, programs per SM, tiles in flight): 8-32 KB tiles.
    # DEPTH = 2 keeps two tiles in flight beside the current one, both requested before the PDL wait: on the H200
    # it is the fastest form of the long rows (the MLP's down projection, K = 3584, with SwiGLU in its prologue:
    # 3.42 us against 3.82), while the K = 1024 projections keep one tile in flight and more programs per SM.
    persistent = [(4, 1024, 4, 2, 1), (4, 1024, 4, 4, 1), (8, 1024, 4, 2, 1), (8, 1024, 4, 4, 1),
                  (8, 1024, 8, 2, 1), (16, 1024, 8, 1, 1), (16, 1024, 8, 2, 1), (2, 2048, 4, 2, 1),
                  (4, 2048, 4, 2, 1), (4, 2048, 8, 1, 1), (8, 2048, 8, 2, 1), (2, 4096, 4, 2, 1),
                  (4, 4096, 8, 1, 1), (4, 4096, 8, 2, 1),
                  (2, 2048, 4, 2, 2), (4, 2048, 8, 1, 2), (2, 4096, 4, 2, 2), (4, 4096, 8, 1, 2)]
    return configs + [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "PERSIST": p, "DEPTH": d}, num_warps=w,
                                    num_stages=1) for bn, bk, w, p, d in persistent]


def _persistent(config) -> bool:
    return bool(config.kwargs.get("PERSIST", 0))


def _fitting_configs(block_m: int, N: int, k_per_split: int, dv: int, K: int | None = None) -> list:
    """The configurations of `_gemv_configs` that suit one launch shape (K: the whole row's length, when the
    launch has one split; the persistent configurations need that and one row)."""
    configs = [c for c in _gemv_configs()
               if not _persistent(c) or (block_m == 1 and K is not None and k_per_split >= K
                                         and c.kwargs["BLOCK_K"] >= K and _persistent_enabled())]
    fits = [c for c in configs if block_m == 1 or c.kwargs["BLOCK_N"] >= 16]  # tl.dot needs 16 rows of W
    # 1- and 2-row blocks only where the rows of W are few (a wide N already gives enough programs).
    fits = [c for c in fits if c.kwargs["BLOCK_N"] >= 4 or N <= 4096] or fits
    # The gated prologue normalises whole heads inside one tile: BLOCK_K must be a multiple of Dv.
    fits = [c for c in fits if c.kwargs["BLOCK_K"] >= dv]
    # No block much wider than a program's slice of K: the extra lanes would only load masked zeros.
    k_slice = triton.next_power_of_2(max(k_per_split, 16))
    narrow = [c for c in fits if c.kwargs["BLOCK_K"] <= max(k_slice, 128)]
    return narrow or [min(fits, key=lambda c: c.kwargs["BLOCK_K"])]


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


def _fail(name: str, arg: str, what: str):
    raise KernelError(f"{name}: {arg} {what}")


def _check_matrix(name: str, arg: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        _fail(name, arg, f"must be 2-D, got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        _fail(name, arg, f"has dtype {t.dtype}; expected bfloat16, float16 or float32")
    if t.shape[1] > 1 and t.stride(1) != 1:
        _fail(name, arg, f"must be contiguous in its last dim (stride 1), got strides {t.stride()}")


def _check_weight_out(name: str, x, weight, out, M: int, x_cols: int, x_name: str = "x", k_of_x=lambda k: k):
    """Validate weight [N, K] against an input of M rows and x_cols columns (= k_of_x(K)), and out [M, N]."""
    N, K = weight.shape[0], weight.shape[1]
    if x_cols != k_of_x(K):
        _fail(name, x_name, f"has {x_cols} columns; weight {tuple(weight.shape)} needs {k_of_x(K)}")
    if weight.dtype != x.dtype:
        _fail(name, "weight", f"has dtype {weight.dtype}, but {x_name} has {x.dtype}; cast one to the other")
    if weight.device != x.device:
        _fail(name, "weight", f"is on {weight.device}, but {x_name} is on {x.device}")
    if K == 0:
        _fail(name, "weight", "has K = 0 columns; expected at least one")
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N):
            _fail(name, "out", f"must be a tensor of shape {(M, N)}, got "
                  f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
        if out.dtype != x.dtype or out.device != x.device:
            _fail(name, "out", f"must be {x.dtype} on {x.device}, got {out.dtype} on {out.device}")
        if N > 1 and out.stride(1) != 1:
            _fail(name, "out", f"must be contiguous in its last dim (stride 1), got strides {out.stride()}")
    return N, K


def _check_operands(name: str, x, weight, out, x_name: str = "x", k_of_x=lambda k: k):
    """Validate x [M, K'] and weight [N, K] (K' = k_of_x(K)), and out [M, N]; return M, N, K."""
    _check_matrix(name, x_name, x)
    _check_matrix(name, "weight", weight)
    N, K = _check_weight_out(name, x, weight, out, x.shape[0], x.shape[1], x_name, k_of_x)
    return x.shape[0], N, K


def matmul(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T with the tiled `tl.dot` GEMM (the prefill path). x [M, K], weight [N, K] -> [M, N]."""
    return _matmul("matmul", x, weight, out)


def _check_swiglu_operands(name: str, x, weight, out):
    """Validate x [M, K], weight [2I, K] = [W_gate; W_up] and out [M, I]; return M, I, K."""
    _check_matrix(name, "x", x)
    _check_matrix(name, "weight", weight)
    if weight.shape[0] % 2:
        _fail(name, "weight", f"has {weight.shape[0]} rows; expected an even number 2I ([W_gate; W_up] stacked)")
    M = x.shape[0]
    _check_weight_out(name, x, weight, None, M, x.shape[1])  # K, dtype and device against the whole weight
    I, K = _check_weight_out(name, x, weight[: weight.shape[0] // 2], out, M, x.shape[1])  # out [M, I]
    return M, I, K


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


@functools.lru_cache(maxsize=None)
def _sm_count_cached(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device; a nominal 4 for the CPU interpreter."""
    device = torch.device(device)
    if device.type != "cuda":
        return 4
    return _sm_count_cached(device.index if device.index is not None else torch.cuda.current_device())


def choose_split_k(M: int, N: int, K: int, sms: int) -> int:
    """SPLIT_K for the GEMV path: split K only when the rows of W alone give too few programs.

    The heuristic assumes blocks of 8 rows (16 for M > 1); on a GPU the first call also times other
    SPLIT_K values and block shapes and may keep another (`chosen_split_k`). The GPU wants about three
    programs per multiprocessor in flight to hide the memory latency; when N alone provides them (the LM
    head: 31040 blocks; the in-projections: 640-1028) SPLIT_K = 1 and there is no reduction at all.
    Otherwise K is split in powers of two until there are enough programs, keeping at least 256 columns
    per split (a short slice spends more on its partial sums than on its loads), and at most 16 splits.
    """
    blocks = triton.cdiv(N, 8 if M == 1 else 16) * triton.cdiv(M, 16)
    want = 3 * sms
    split = 1
    while blocks * split < want and split < 16 and K // (2 * split) >= 256:
        split *= 2
    return split


def deterministic_mode() -> bool:
    """True when QWEN_LAB_DETERMINISTIC is set to 1 (true/yes/on): split-K then reduces in a fixed order."""
    return env_on("QWEN_LAB_DETERMINISTIC", False)


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


# The launch plan of every GEMV shape met so far, measured on the GPU:
# (prologue, M bucket, N, K, deterministic, dtype, device, split_k asked for, PDL) -> (SPLIT_K, triton.Config).
_plans: dict = {}
# SPLIT_K values timed for a narrow shape (one where choose_split_k wants to split), with its own choice.
SPLIT_CANDIDATES = (1, 2, 4, 8)
# Tests set this to run every GEMV with one configuration: a triton.Config of `_gemv_configs` (BLOCK_N, BLOCK_K and
# PREFETCH, or a persistent one with PERSIST and DEPTH, which serves one row with K <= BLOCK_K).
GEMV_FORCE = None
# The (SPLIT_K, config) of the last GEMV launched: what a benchmark reports.
last_plan = None
# What the first-call timing measured, per plan key (as in _plans): {(SPLIT_K, config): microseconds per call}.
plan_times: dict = {}


def _persistent_enabled() -> bool:
    """Whether the first-call timing may pick the persistent GEMV (QWEN_LAB_GEMV_PERSIST=0 leaves it out)."""
    return env_on("QWEN_LAB_GEMV_PERSIST", True)


def tuning_enabled() -> bool:
    """On a GPU the first call of each GEMV shape times its candidate plans (block shapes, and SPLIT_K for the
    narrow shapes) and keeps the fastest, as the chunked delta rule times its scan's tiles beside the prep and the
    decode step its configs in a graph (deltanet._pick_in_place); QWEN_LAB_TUNE=0 turns all of them off (the first
    fitting plan is used, and those two kernels' configs are left to Triton's autotuner)."""
    return env_on("QWEN_LAB_TUNE", True)


def _plan_key(prologue, M, N, K, deterministic, dtype, device, split_k, pdl):
    return (prologue, triton.next_power_of_2(M), N, K, bool(deterministic), dtype, device_key(device), split_k, pdl)


def _call_key(M, N, K, prologue, deterministic, dtype, device, split_k):
    """The plan key of a call shape as the launcher forms it (deterministic None: the environment's mode)."""
    det = deterministic_mode() if deterministic is None else deterministic
    return _plan_key(prologue, M, N, K, det, dtype, device, split_k, pdl_enabled(device))


def gemv_plan(M: int, N: int, K: int, prologue: int = PRO_NONE, deterministic: bool | None = None,
              dtype=torch.bfloat16, device="cuda", split_k: int | None = None):
    """The (SPLIT_K, triton.Config) chosen for this call shape on its first call, or None if none was chosen yet."""
    return _plans.get(_call_key(M, N, K, prologue, deterministic, dtype, device, split_k))


def gemv_plan_times(M: int, N: int, K: int, prologue: int = PRO_NONE, deterministic: bool | None = None,
                    dtype=torch.bfloat16, device="cuda", split_k: int | None = None) -> dict:
    """What the first-call timing measured for this call shape, {(SPLIT_K, triton.Config): microseconds per call}
    (read from `qwen_lab.tunings` when an earlier process timed it); empty when nothing was timed (not yet called,
    the interpreter, QWEN_LAB_TUNE=0)."""
    return dict(plan_times.get(_call_key(M, N, K, prologue, deterministic, dtype, device, split_k), {}))


def chosen_split_k(M: int, N: int, K: int, prologue: int = PRO_NONE, deterministic: bool | None = None,
                   dtype=torch.bfloat16, device="cuda") -> int:
    """The SPLIT_K the GEMV launchers use for this call shape: the one measured fastest on its first call when there
    was one (see `_tune_plan`), else `choose_split_k`'s."""
    plan = gemv_plan(M, N, K, prologue, deterministic, dtype, device)
    return plan[0] if plan else choose_split_k(M, N, K, sm_count(device))


def _tune_plan(plans, launch, weight) -> tuple:
    """The fastest of `plans` [(split, config)], each timed inside a CUDA Graph over copies of `weight` that
    together exceed the L2 cache, so every call reads its weights from HBM as the model's layers do.
    -> (the fastest plan, {plan: microseconds per call})."""
    dev = weight.device
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 64 << 20) or (64 << 20)
    nbytes = weight.numel() * weight.element_size()
    copies = 1 if nbytes >= 2 * l2 else min(64, triton.cdiv(3 * l2, max(nbytes, 1)))
    weights = [weight] + [weight.clone() for _ in range(copies - 1)]
    calls_per_graph = max(copies, 8)
    times = {}
    for plan in plans:
        try:
            launch(plan, weight)  # compile, and allocate the workspace outside the graph
        except triton.runtime.errors.OutOfResources:
            continue
    torch.cuda.synchronize()
    for plan in plans:
        try:
            times[plan] = graph_time_us([lambda w=weights[i % copies]: launch(plan, w)
                                         for i in range(calls_per_graph)])
        except triton.runtime.errors.OutOfResources:
            continue
    del weights
    return min(times, key=times.get), times


def _launch_gemv(name, x, weight, out, M, N, K, split_k, deterministic, prologue, args, dv=1):
    """Validate split_k, pick the plan (SPLIT_K and block shape), the reduction and the workspace, and launch
    gemv_splitk_kernel or gemv_rows_kernel once; returns out.

    args: the prologue's tensors and strides (x_ptr is `x`; r, z, nw, s default to x and are not read).
    With the gated prologue every split starts at a head boundary (K_PER_SPLIT a multiple of dv).
    """
    global last_plan
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
    plan = _plans.get(key)
    if plan is None:
        if GEMV_FORCE is not None:
            plan = (split_k, GEMV_FORCE)
            splits = per_split(split_k)[1]
            if _persistent(GEMV_FORCE) and (block_m != 1 or splits != 1 or GEMV_FORCE.kwargs["BLOCK_K"] < K):
                # (the timed plans come from _fitting_configs, which offers the persistent form only where it fits)
                _fail(name, "GEMV_FORCE", f"{GEMV_FORCE} is the persistent form, which serves one row, one split "
                      f"and K <= BLOCK_K; this call has {M} rows, {splits} splits and K={K}")
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
            plan, plan_times[key], _ = tunings.pick(x.device, tunings.kernel_id(gemv_rows_kernel, gemv_splitk_kernel),
                                                    key, plans, time_plans)
            _plans[key] = plan
    last_plan = plan
    launch(plan, weight)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight^T, fp32 accumulation, x's dtype out. x [M, K], weight [N, K] -> [M, N].

    M <= GEMV_MAX_M (decode): the GEMV / split-K kernel; otherwise the tiled GEMM.
    """
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] <= GEMV_MAX_M:
        return _gemv("linear", x, weight, None, None, out, swiglu=False)
    return _matmul("linear", x, weight, out)


# ------------------------------------------------------------------------------------------------
# Norms fused into the GEMV's prologue
# ------------------------------------------------------------------------------------------------


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
        from . import norms
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
        from . import norms
        h = norms.gated_rms_norm(o, z, norm_weight, eps)
        return linear(h.reshape(M, K), weight, out=out)
    args = dict(stride_xm=o.stride(0), stride_xh=o.stride(1), z=z, stride_zm=z.stride(0), stride_zh=z.stride(1),
                nw=norm_weight, eps=eps)
    return _launch_gemv(name, o, weight, out, M, N, K, split_k, deterministic, PRO_GATED, args, dv=Dv)


__all__ = ["GEMV_MAX_M", "add_rms_norm_linear", "choose_split_k", "chosen_split_k", "deterministic_mode",
           "gated_rms_norm_linear", "gemv_plan_times", "gemv_rows_kernel", "gemv_splitk_kernel", "linear",
           "linear_splitk", "matmul", "matmul_grid", "matmul_kernel", "matmul_with_config", "rms_norm_linear",
           "sm_count"]
