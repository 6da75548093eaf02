"""The conv's tuning: the prefill kernel's GPU configs and the block sizes of each mode. A test or a timing script
forces one of the configs with `qwen_lab.switches.switches.force_config("conv1d_prefill_kernel", config)`.
"""

from __future__ import annotations

import triton

from ... import tunings

# Segments of the prefill kernel the GPU autotuner times (per channel count and prompt-length bucket): the kernel
# streams x once (plus W-1 rows per segment) and y once, and which segment keeps enough bytes in flight depends on
# the GPU. BLOCK_T rows are unrolled (each its own registers), so segments stay short and wide; the narrow ones
# keep enough programs for short prompts. (H200, 2048 tokens x 6144 channels: 18.3 us for 8 x 256 with 2 warps
# and the weights stored [W, C], as the model does (18.4 stored [C, W]), against 25.4 for the best [tokens,
# channels] tile of the earlier form and a 14.0 us copy floor; docs/experiments.md, 2026-12-02, sessions 18-19.)
PREFILL_CONFIGS = [triton.Config({"BLOCK_T": bt, "BLOCK_C": bc}, num_warps=w)
                   for bt, bc, w in ((8, 256, 2), (8, 256, 1), (8, 128, 1), (16, 256, 2), (8, 512, 2), (8, 1024, 4))]
_tuned: dict = {}


def _tuned_prefill(kernel):
    """The prefill kernel (causal.py passes it) under Triton's autotuner, made on the first GPU call and kept in
    _tuned["prefill"] (a test deletes it for a fresh one; qwen_lab/profile_step.py reads its picks there)."""
    if "prefill" not in _tuned:
        # restore_value: a timed run may replace the state (WRITE_STATE), and the next must read the same one
        _tuned["prefill"] = tunings.stored(triton.autotune(PREFILL_CONFIGS, key=["C", "T_BUCKET", "W"],
                                                           restore_value=["state_ptr"])(kernel))
    return _tuned["prefill"]


# Up to this many tokens the sequential kernel serves the call: set when the segmented kernel still needed a
# separate state-shift launch, and not re-measured since it writes the state itself (docs/experiments.md, 2026-11-30).
STEP_MAX_TOKENS = 4


def block_sizes(C: int, interpreter: bool) -> tuple[int, int, int]:
    """(BLOCK_C of the step kernel, BLOCK_T and BLOCK_C of the prefill kernel's segments) for C channels.

    On a GPU the prefill segment is autotuned over PREFILL_CONFIGS and these BLOCK_T, BLOCK_C only serve a test
    that runs small segments through the interpreter (interpreter=False: many programs, ragged edges); the
    interpreter's own segment is longer (16 tokens), so that it runs fewer programs.
    """
    if interpreter:
        return min(256, triton.next_power_of_2(C)), 16, min(128, triton.next_power_of_2(C))
    return min(128, triton.next_power_of_2(C)), 8, 256

