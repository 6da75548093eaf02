"""Causal depthwise conv1d + SiLU, carrying the last W-1 inputs of every channel between calls.

    xx = [state^T ; x]                                  x [T, C], state [C, W-1], weight [C, W]
    y[t, c] = silu( sum_{j<W} weight[c, j] * xx[t + j, c] )
    state  <- the last W-1 rows of xx, transposed

- teach.py: notebook 08's own kernel (Exercise 08.1's solution);
- causal.py: `causal_conv1d`, the model's operator: a sequential kernel for decode and short calls, a segmented one
  for prefill (both documented there);
- tuning.py: the prefill kernel's GPU configs, FORCE_PREFILL_CONFIG, STEP_MAX_TOKENS, the block sizes.

The launcher reads the tuning names in tuning.py at each call. A read or a write of them on this package goes there
(benchmarks/probe_conv.py sets `conv1d.FORCE_PREFILL_CONFIG`), so each has one value.
"""

from __future__ import annotations

import sys
import types

from . import tuning
from .causal import causal_conv1d, conv1d_prefill_kernel, conv1d_step_kernel
from .tuning import _tuned

__all__ = ["PREFILL_CONFIGS", "STEP_MAX_TOKENS", "block_sizes", "causal_conv1d"]
# reached here by tests/sm90_compile.py, tests/test_pdl.py and qwen_lab/profile_step.py
__all__ += ["FORCE_PREFILL_CONFIG", "conv1d_prefill_kernel", "conv1d_step_kernel", "_tuned"]

_IN_TUNING = frozenset({"PREFILL_CONFIGS", "FORCE_PREFILL_CONFIG", "STEP_MAX_TOKENS", "block_sizes"})


def __getattr__(name):
    if name in _IN_TUNING:
        return getattr(tuning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if name in _IN_TUNING:
            setattr(tuning, name, value)
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
