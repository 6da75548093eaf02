r"""Matrix multiplication for every projection of the model: y = x W^T.

    x [M, K] (activations, token-major), W [N, K] (the Hugging Face layout, read as is), y [M, N]

$$ y_{mn} = \sum_{k=0}^{K-1} x_{mk} W_{nk} $$

computed with bf16 (fp16) operands, an fp32 accumulator, and one rounding to x's dtype at the end.
Two regimes need different kernels, the tiled GEMM (prefill: compute-bound) and the GEMV (decode: bandwidth-bound),
one file each, beside the kernels a learner writes:

- `teach_tiled.py`: notebook 03's tiled GEMM, as the learner writes it (`my_matmul`).
- `teach_splitk.py`: notebook 04's split-K GEMV, atomic and deterministic (`my_linear_splitk`, ...).
- `tiled.py`: the finished tiled GEMM (`matmul`, `matmul_kernel`): grouped tile order, TMA loads and persistent
  programs on Hopper, SwiGLU and norm-splitting epilogues.
- `gemv.py`: the finished GEMV (`linear_splitk`, `gemv_splitk_kernel`, `gemv_rows_kernel`) with its prologues,
  and `linear`, which picks the regime from M.
- `fused_norm.py`: the norms fused into a projection (`rms_norm_linear`, `add_rms_norm_linear`,
  `gated_rms_norm_linear`, `linear_add_rms_norm`, `rms_scaled_linear`).
- `tuning.py`: the candidate configurations, the GEMV's plans and their first-call timing.
- `common.py`: the operand checks, the limits and the prologue ids the others share.

This module re-exports what the model, the notebooks and the other families use. The GEMV's plan state
(`last_plan`, `_plans`, `plan_times`) lives in `tuning`, where the launcher keeps it: read it there
(`gemm.tuning.last_plan`).
"""

from __future__ import annotations

from . import tuning
from .common import (GEMV_MAX_M, K_GRANULE, MAX_SPLIT_K, PRO_ADD_RMS, PRO_GATED, PRO_NONE, PRO_RMS, PRO_SWIGLU,
                     PROLOGUE_NAMES, REDUCE_ATOMIC, REDUCE_DETERMINISTIC, REDUCE_NONE, _check_swiglu_operands,
                     sm_count)
from .fused_norm import (FUSED_NORM_MAX_N, add_rms_norm_linear, gated_rms_norm_linear, linear_add_rms_norm,
                         rms_norm_linear, rms_scaled_linear, ss_slots)
from .gemv import WHOLE_ROW_MAX, _gemv, _launch_gemv, gemv_rows_kernel, gemv_splitk_kernel, linear, linear_splitk
from .tiled import (_matmul, _tma_ok, _tma_program, matmul, matmul_candidates, matmul_grid, matmul_kernel,
                    matmul_with_config)
from .tuning import (SPLIT_CANDIDATES, TMA_ONLY_FROM_ROWS, _gemv_configs, _matmul_all_configs, _matmul_configs,
                     _prune_matmul_configs, choose_split_k, chosen_split_k, deterministic_mode, gemv_plan,
                     gemv_plan_times, tuning_enabled)


__all__ = ["tuning", "FUSED_NORM_MAX_N", "GEMV_MAX_M", "K_GRANULE", "MAX_SPLIT_K", "PROLOGUE_NAMES", "PRO_ADD_RMS", "PRO_GATED",
           "PRO_NONE", "PRO_RMS", "PRO_SWIGLU", "REDUCE_ATOMIC", "REDUCE_DETERMINISTIC", "REDUCE_NONE",
           "SPLIT_CANDIDATES", "TMA_ONLY_FROM_ROWS", "WHOLE_ROW_MAX", "add_rms_norm_linear", "choose_split_k",
           "chosen_split_k", "deterministic_mode", "gated_rms_norm_linear", "gemv_plan", "gemv_plan_times",
           "gemv_rows_kernel", "gemv_splitk_kernel", "linear", "linear_add_rms_norm", "linear_splitk", "matmul",
           "matmul_candidates", "matmul_grid", "matmul_kernel", "matmul_with_config", "rms_norm_linear",
           "rms_scaled_linear", "sm_count", "ss_slots", "tuning_enabled",
           # private, re-exported where the other families (activations: _gemv, _matmul, _check_swiglu_operands),
           # the benchmarks and the probes reach them today
           "_check_swiglu_operands", "_gemv", "_gemv_configs", "_launch_gemv", "_matmul", "_matmul_all_configs",
           "_matmul_configs", "_prune_matmul_configs", "_tma_ok", "_tma_program"]
