r"""The GEMM family's tuning: the tiled GEMM's candidate configurations (Triton's autotuner times them on a GPU,
`tiled.matmul_kernel`), the decode GEMV's candidates, and the plans (SPLIT_K and block shape) that the GEMV's first
call of each shape times (`gemv.py`).

Which form, block shape (and, for the narrow shapes, which SPLIT_K) serves a decode shape best depends on the GPU's
latencies, and the differences are a microsecond or two: too small to time one launch from Python. So the first
call of each shape times every fitting plan inside a CUDA Graph, over copies of the weight that together exceed
the L2 cache (as the model's layers do), and keeps the fastest (`gemv_plan` tells which; on the H200 the persistent
form won every decode projection but the LM head). The pick is recorded on disk for later processes on the same
kind of GPU (`qwen_lab.tunings`, which also keeps what Triton's autotuner picks for the tiled GEMM).

The plan state lives here, and the GEMV launcher reads and writes it here: `_plans`, `plan_times` and `last_plan`.
`qwen_lab.kernels.gemm` reads the three from this module too. A config forced on every GEMV comes from
`qwen_lab.switches` (`switches.force_config("gemv_splitk_kernel", config)`).
"""

from __future__ import annotations

import torch
import triton

from ...switches import switches
from .. import device_key, graph_time_us, pdl_enabled
from ...runtime import interpreter_active
from .common import PRO_NONE, sm_count


# ------------------------------------------------------------------------------------------------
# The tiled GEMM's candidates
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
    # N = 1024 ones included, level with cuBLAS (docs/experiments.md). With SWIGLU's two products per K step they
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
        # JOIN form measured the same as the two-product one (docs/experiments.md). Half-size JOIN tiles (64 x 128,
        # 128 x 64: 6.8 rounds of tiles per SM at 2048 tokens instead of 3.4) were slower there and were removed.
        # TAIL = 2: at 2048 tokens the 448 tiles are 3.4 rounds on 132 SMs, and the last round, in half-height
        # slices, ends sooner (H200: 49.6 -> 47.0 us per call, docs/experiments.md, 2026-12-02). The SwiGLU candidates
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
# other runs, docs/experiments.md): an isolated timing does not see what the model's neighbours do to a kernel.
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


# ------------------------------------------------------------------------------------------------
# The decode GEMV's candidates and plans
# ------------------------------------------------------------------------------------------------


def _gemv_configs(gpu: bool | None = None):
    """The decode GEMV's candidate configurations: the GPU's (gpu=True), or under the interpreter 512 rows a program
    and BLOCK_K from 1024 down to 64, the widest first (`_fitting_configs` keeps those that fit the slice)."""
    if not gpu and (gpu is not None or interpreter_active()):
        # The interpreter runs each program in NumPy, one after another, at a fixed cost per program (some 10-20 ms
        # on a CPU, whatever the tile): 512 rows a program run the 4096-row LM head of tiny-english in 8 programs, 4
        # times faster than 128 rows did. Each step of the loop over K costs as much again (the prologue's device
        # function is set up anew at every call), so the widest BLOCK_K that fits the slice comes first.
        return [triton.Config({"BLOCK_N": 512, "BLOCK_K": bk, "PREFETCH": 1}, num_warps=4, num_stages=1)
                for bk in (1024, 512, 256, 128, 64)]
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
    # (docs/experiments.md); which of its changes slowed the wide ones is not yet known, so the first-call timing
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
    """The `deterministic` switch (QWEN_LAB_DETERMINISTIC, qwen_lab.switches): split-K then reduces in a fixed
    order."""
    return switches.deterministic


# The launch plan of every GEMV shape met so far, measured on the GPU:
# (prologue, M bucket, N, K, deterministic, dtype, device, split_k asked for, PDL) -> (SPLIT_K, triton.Config).
_plans: dict = {}
# SPLIT_K values timed for a narrow shape (one where choose_split_k wants to split), with its own choice.
SPLIT_CANDIDATES = (1, 2, 4, 8)
# A test forces every GEMV's configuration with switches.force_config("gemv_splitk_kernel", config): a triton.Config
# of `_gemv_configs` (BLOCK_N, BLOCK_K and PREFETCH, or a persistent one with PERSIST and DEPTH, which runs
# gemv_rows_kernel and serves one row with K <= BLOCK_K).
# The (SPLIT_K, config) of the last GEMV launched: what a benchmark reports.
last_plan = None
# What the first-call timing measured, per plan key (as in _plans): {(SPLIT_K, config): microseconds per call}.
plan_times: dict = {}


def _persistent_enabled() -> bool:
    """Whether the first-call timing may pick the persistent GEMV (the `gemv_persist` switch)."""
    return switches.gemv_persist


def tuning_enabled() -> bool:
    """On a GPU the first call of each GEMV shape times its candidate plans (block shapes, and SPLIT_K for the
    narrow shapes) and keeps the fastest, as the chunked delta rule times its scan's tiles beside the prep and the
    decode step its configs in a graph (deltanet._pick_in_place); QWEN_LAB_TUNE=0 turns all of them off (the first
    fitting plan is used, and those two kernels' configs are left to Triton's autotuner). The `tune` switch."""
    return switches.tune


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
