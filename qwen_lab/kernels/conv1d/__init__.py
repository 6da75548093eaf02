"""Causal depthwise conv1d + SiLU, carrying the last W-1 inputs of every channel between calls.

    xx = [state^T ; x]                                  x [T, C], state [C, W-1], weight [C, W]
    y[t, c] = silu( sum_{j<W} weight[c, j] * xx[t + j, c] )
    state  <- the last W-1 rows of xx, transposed

- teach.py: notebook 08's own kernel (Exercise 08.1's solution);
- causal.py: `causal_conv1d`, the model's operator: a sequential kernel for decode and short calls, a segmented one
  for prefill (both documented there);
- tuning.py: the prefill kernel's GPU configs, STEP_MAX_TOKENS, the block sizes. A config is forced on the prefill
  kernel through `qwen_lab.switches` (`switches.force_config("conv1d_prefill_kernel", config)`).
"""

from __future__ import annotations

from .causal import causal_conv1d, conv1d_prefill_kernel, conv1d_step_kernel
from .tuning import PREFILL_CONFIGS, STEP_MAX_TOKENS, _tuned, block_sizes

__all__ = ["PREFILL_CONFIGS", "STEP_MAX_TOKENS", "block_sizes", "causal_conv1d"]
# reached here by tests/sm90_compile.py, tests/test_pdl.py and qwen_lab/profile_step.py
__all__ += ["conv1d_prefill_kernel", "conv1d_step_kernel", "_tuned"]
