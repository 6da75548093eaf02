"""The DeltaNet family's tuning: the GPU configs of its kernels and how a launch picks one.

Its switches live in qwen_lab.switches, read at each call: `scan_group` (the scan waits for the prep once per this
many chunks), `scan_beside_prep` (under PDL the scan is launched beside the prep; off: after it), `prep_persistent`
(the prep as a fixed number of programs under PDL, `_prep_programs`, or its grid). PREP_PROGRAMS_PER_SM and
PREP_ITEM_SCAN_STEPS below size the persistent prep.

Configurations on the GPU: the recurrent kernel and the prep as a grid are autotuned by Triton (`_tuned`: the
state is restored between trials); the chunk scan and the fused conv + decode step are picked by `_pick_in_place`,
each config timed as the model launches it, in a CUDA Graph, and kept by `qwen_lab.tunings` (Triton's autotuner
with QWEN_LAB_TUNE=0 or inside a capture); the persistent prep always runs its 4-warp config. Under the
interpreter the launchers pass one small fixed configuration. A config forced through
`qwen_lab.switches.switches.force_config` runs instead, in either mode: the tests run every GPU config through the
interpreter.

The kernel files import the configs and `_tuned` (used once, at definition). The launchers call `_launch` and
`_pick_in_place` through this module (`tuning._launch(...)`), so a test that replaces one here reaches every
launch.
"""

from __future__ import annotations


import torch
import triton

from ... import runtime, tunings
from ...switches import switches
from .. import gemm, graph_time_us, pdl_options, tensor_core_dots, uncounted

INTERPRET = runtime.interpreter_active()  # fixed at import: the family's kernels are defined for one mode
# switches.prep_persistent: under PDL the prep runs as a fixed number of programs that walk the (head, chunk) items
# (see chunk_prep_kernel), as many as leave one SM slot per scan program: the scan is then placed at once and runs
# beside the whole prep, instead of waiting for SM room until the prep's last wave (docs/experiments.md). False:
# the grid (Hv, chunks); an int sets the number of programs (tests).
# Programs of chunk_prep_kernel per SM at its 4-warp config: 255 registers x 128 threads each, two fill the 64K
# registers of an SM (sm_90, tests/sm90_compile.py); 32 KB of shared memory each, so one prep program and one scan
# program (up to 188 KB) share an SM's 228 KB.
PREP_PROGRAMS_PER_SM = 2
# A prep program spends about as long on one (head, chunk) item as the scan on this many chunk steps (on the H200,
# ~19 us at two programs per SM against ~2 us a step): the persistent prep keeps ahead of the scan with at least
# this many programs per value head.
PREP_ITEM_SCAN_STEPS = 10


_CONFIGS = {}   # kernel name -> (its GPU autotuning configs, their pruning function)
_KEYS = {}      # kernel name -> the arguments whose values key the GPU autotuner's cache
_RESTORED = {}  # kernel name -> the arguments the GPU autotuner puts back after each timing run
_KERNELS = {}   # kernel name -> the kernel as its module holds it (the autotuner on a GPU), for _pick_in_place


def _tuned(configs, key, restore=(), prune=None):
    """triton.autotune on a GPU; under the interpreter the launcher passes one small fixed config instead."""
    def wrap(fn):
        _CONFIGS[fn.fn.__name__] = (configs, prune)
        _KEYS[fn.fn.__name__] = tuple(key)
        _RESTORED[fn.fn.__name__] = tuple(restore)
        if INTERPRET:
            _KERNELS[fn.fn.__name__] = fn
            return fn
        tuner = tunings.stored(triton.autotune(configs=configs, key=key, restore_value=list(restore),
                                               prune_configs_by={"early_config_prune": prune} if prune else None)(fn))
        _KERNELS[fn.fn.__name__] = tuner
        return tuner
    return wrap


def autotune_configs(kernel: str, **named_args) -> list:
    """The configs the GPU autotuner tries for `kernel` (a name, e.g. "chunk_scan_kernel") on arguments like
    `named_args` (those its pruning reads, e.g. Dv=128): the configs a test can force one by one."""
    configs, prune = _CONFIGS[kernel]
    return list(prune(configs, named_args) if prune else configs)


def _launch(kernel, grid, args, kwargs, interpreter_meta, untuned: "triton.Config | None" = None):
    """kernel[grid](*args, **kwargs) plus the meta-parameters of this mode: the autotuner's on a GPU,
    `interpreter_meta` under the interpreter, or the config forced through qwen_lab.switches in either. `untuned`: a
    config to run in place of the autotuner's (and of `interpreter_meta`), where the launch depends on it; a forced
    config still wins."""
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
    forced = switches.forced(fn.fn.__name__)
    config = forced if forced is not None else untuned
    if config is not None:
        meta = dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
        if callable(grid):
            grid = grid(meta)
        return fn[grid](*args, **kwargs, **meta)  # the kernel itself: an autotuner would refuse BV=...
    return kernel[grid](*args, **kwargs, **(interpreter_meta if INTERPRET else {}))


# ---------------------------------------------------------------- the kernels' GPU configs


# (BV, warps): decode is latency-bound, so these trade programs (Hv * Dv / BV) against work per program
_RECURRENT_CONFIGS = [triton.Config({"BV": bv}, num_warps=w, num_stages=1)
                      for bv, w in ((8, 1), (16, 2), (16, 4), (32, 4))]


def _prune_bv(configs, named_args, **kwargs):
    width = max(8, triton.next_power_of_2(named_args["Dv"]))
    kept = [c for c in configs if c.kwargs["BV"] <= width]
    return kept or configs[:1]


_PREP_CONFIGS = [triton.Config({}, num_warps=w, num_stages=1) for w in (4, 8)]   # the first: the persistent prep's


def _prune_prep(configs, named_args, **kwargs):
    """Every config where Triton's products run on tensor cores; below sm_80 (a T4) the first alone. There each
    product is a loop of fp32 FMAs, and compiling this kernel for sm_75 took 224-270 s per config on a 2-core CPU
    (2.3 s for sm_90; docs/experiments.md, 2026-12-03): a second config would double a learner's first prefill."""
    q = named_args.get("q_ptr")  # absent when a test or the offline compile asks for every config
    return configs if q is None or tensor_core_dots(q.device) else configs[:1]


# (BV, warps, stages): narrow BV gives more programs, wide BV reads each W, q, k tile fewer times
_SCAN_CONFIGS = [triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                 for bv, w, s in ((16, 4, 2), (32, 4, 2), (32, 8, 2), (32, 4, 3), (64, 4, 2), (64, 8, 2))]


# ---------------------------------------------------------------- the chunked form's plan


def chunk_class(n_chunks: int) -> int:
    """The chunked kernels' autotuning class of a prompt of `n_chunks` chunks: the count rounded up to a power of
    two. The scan's best block of value columns depends on the length of its chain (a one-chunk prompt is all
    latency, 32 chunks are mostly products), so a tuning made on a short prompt must not serve a long one. On the
    H200, 2048 tokens with the pick tuned on 150 took 90.5 us per layer against 84.6 with their own; notebook 09,
    whose checks run 133-150 tokens first, timed 127 us per layer before the class was keyed, 85 after
    (docs/experiments.md, 2026-12-03)."""
    return triton.next_power_of_2(max(1, int(n_chunks)))


def _prep_programs(Hv: int, n_chunks: int, Dv: int, device) -> int | None:
    """The persistent prep's number of programs (switches.prep_persistent), or None for the grid (Hv, chunks).

    On a GPU it only pays where the scan is launched beside the prep (PDL): every SM slot but one per program of a
    BV = 32 scan (a 16-column scan has twice the programs and waits for room), never more programs than items. With
    P programs the prep publishes P / Hv chunks of every head per PREP_ITEM_SCAN_STEPS scan steps; where that is
    less than one chunk per step (the larger Qwen3.5s' 32 or 48 value heads leave 136 or 72 programs), the scan
    would wait on the prep, which then runs at a fraction of the grid's rate: the grid again. (Measured on an H200
    at 2048 tokens, docs/experiments.md: 85 us per layer against the grid's 91 at 16 value heads, 158
    against 128 at 32, 363 against 190 at 48.)"""
    persistent = switches.prep_persistent
    if persistent is False:
        return None
    items = Hv * n_chunks
    if persistent is True:
        if INTERPRET or not (switches.scan_beside_prep and pdl_options(device)):
            return None
        programs = PREP_PROGRAMS_PER_SM * gemm.sm_count(device) - Hv * triton.cdiv(Dv, 32)
        return min(items, programs) if programs >= PREP_ITEM_SCAN_STEPS * Hv else None
    return max(1, min(items, int(persistent)))


# ---------------------------------------------------------------- configs picked where the kernel runs


# Configs picked by their launchers, each timed where the kernel runs (_pick_in_place):
# kernel name -> {the kind of call (a tuple) -> triton.Config}
_PICKS: dict = {"chunk_scan_kernel": {}, "conv_decode_step_kernel": {}}
_time_in_graph = graph_time_us  # the timer of _pick_in_place (tests replace it on the CPU)


def picks(kernel: str) -> dict:
    """What `_pick_in_place` picked for `kernel` ("chunk_scan_kernel" or "conv_decode_step_kernel") so far in this
    process: {the kind of call: triton.Config, or None where the launch kept its own}. A benchmark's record."""
    if kernel not in _PICKS:
        raise KeyError(f"picks({kernel!r}): expected one of {', '.join(_PICKS)}")
    return dict(_PICKS[kernel])


def _pick_in_place(kernel: str, key: tuple, launch, states, on_gpu: bool, calls: int, **named_args):
    """`kernel`'s config for the calls of `key`: on the first such call, each of its GPU configs (those
    `autotune_configs(kernel, **named_args)` lists) timed through launch(config), the launcher's own launch as the
    model makes it, `calls` times back to back in a CUDA Graph; `states` (the tensors the launch updates in place)
    are put back after each. The pick is recorded on disk, and a pick an earlier process recorded is taken without
    timing (`qwen_lab.tunings`). None: the launch takes its config as it would without this pick (Triton's
    autotuner on a GPU with QWEN_LAB_TUNE=0 or inside a capture, a config forced through qwen_lab.switches, the
    interpreter's fixed config).

    Two kernels are picked this way, because Triton's autotuner times a kernel alone, launched from Python:
    - the chunk scan runs beside the persistent prep, which leaves one SM slot per scan program of 32 value columns
      and 4 warps; a scan of 16 columns (twice the programs) or of 8 warps waits for room. On the H200 at 2048
      tokens the autotuner, timing the scan after the prep, picked 16 columns in one run (99.7 us per layer beside
      the prep) and 32 columns with 3 stages (84.7 us) in another (docs/experiments.md, 2026-12-03);
    - the fused conv + delta-rule decode step runs for ~4 us, against 11-16 us of launch cost for each launch the
      autotuner times from Python: its ranking is mostly the host's noise. In the replayed decode step of
      Qwen3.5-0.8B its configs are 12-19 us per token apart (docs/experiments.md)."""
    picks = _PICKS[kernel]
    if key in picks:
        return picks[key]
    if (not on_gpu or switches.forced(kernel) is not None or not gemm.tuning_enabled()
            or any(s.is_cuda and torch.cuda.is_current_stream_capturing() for s in states)):
        return None
    candidates = autotune_configs(kernel, **named_args)

    def time_them():
        times = {}
        # uncounted: the timing runs are not this call's launches. Inference mode: a state allocated under it (as
        # the model's generation allocates its cache) may be put back in place only under it, and a normal one
        # either way.
        with uncounted(), torch.inference_mode():
            saved = [s.clone() for s in states]
            for config in candidates:
                try:
                    times[config] = _time_in_graph([lambda c=config: launch(c)] * calls, warmup=True, replays=5)
                except triton.runtime.errors.OutOfResources:
                    pass
                for s, v in zip(states, saved):
                    s.copy_(v)
        return (min(times, key=times.get) if times else None), times
    # what an earlier process timed, if it did (qwen_lab.tunings; the file changes with any kernel module, so the
    # scan's pick follows the prep it is timed beside), else timed here and recorded
    picks[key] = tunings.pick(states[0].device, tunings.kernel_id(_KERNELS[kernel]), key, candidates, time_them)[0]
    return picks[key]
