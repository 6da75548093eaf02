"""The sampler's launch configuration: tokens per program and per loop step, bits per radix round, warps.

On a GPU the one measured fastest (`_GPU`); under the interpreter, few big programs (`_config`).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton

from ...runtime import interpreter_active


@dataclass(frozen=True)
class _Config:
    block: int         # tokens per program
    chunk: int         # tokens per step of a program's loop
    nbits: int         # bits of tau fixed per radix round (KEY_BITS must be a multiple)
    skip_dead: bool    # after round 0, test each chunk for tokens still in play (a reduction; on a GPU only)
    warps: int


# GPU: 243 programs of 1024 tokens for V = 248320, two per SM of an H200; 6 rounds of 32 bins; after round 0 each
# chunk of 128 tokens tested for tokens still in play. Timed in a graph (docs/experiments.md,
# 2026-12-03), top-k 20 + top-p 0.9, us per draw on peaked / flat / tied logits, two rounds in
# one run: 30.2 / 30.8 / 92.0 and 29.9 / 30.5 / 91.4, against 34.7 / 36.0 / 87.4 and 34.9 / 36.1 / 87.9 with one
# look at the whole block instead (taken out), and 30.6 / 31.2 / 94.6 with both. Slower in earlier runs: blocks of
# 2048 (one program of 4 warps per SM leaves the one-hot tiles' latency bare), 512 or 256, 64- or 256-token chunks,
# 8 warps, the last program summing the histograms in slices of 32 rows (fewer registers, 48 us).
_GPU = _Config(block=1024, chunk=128, nbits=5, skip_dead=True, warps=4)


def _config(V: int) -> _Config:
    """The constexpr configuration for V logits. The interpreter pays ~1-3 ms of Python for every
    reduction or nested @jit call a program makes, whatever its size: there, few big programs (one
    chunk each), and for a small vocabulary 3 rounds of 1024 bins instead of 5 of 64."""
    if not interpreter_active():
        return _GPU
    block = min(1024, max(16, triton.next_power_of_2(V)))
    return _Config(block=block, chunk=block, nbits=10 if block <= 64 else 6, skip_dead=False, warps=1)
