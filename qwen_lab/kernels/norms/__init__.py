r"""The RMSNorm family of Qwen3.5: one row of D values in, one normalised row out.

    rms_norm(x, w, eps)             = x rsqrt(mean(x^2) + eps) (1 + w)                     x [..., D], w [D]
    add_rms_norm(x, r, w, eps)      = (rms_norm(s, w, eps), s), s = x + r                  x, r [T, H]
    gated_rms_norm(x, z, w, eps)    = x rsqrt(mean(x^2) + eps) w silu(z)  (plain w)       x, z [..., D]

- `teach.py`: notebook 02's kernels, as the learner writes them (`my_rms_norm`, `my_add_rms_norm`,
  `my_gated_rms_norm`).
- `rmsnorm.py`: the finished kernels the model runs (strided q/k views, PDL, a block shape per machine).

The norms fused into the projection after them are the GEMM family's (`qwen_lab.kernels.gemm.fused_norm`).
"""

from __future__ import annotations

from .rmsnorm import (MAX_D, add_rms_norm, add_rms_norm_kernel, gated_rms_norm, gated_rms_norm_kernel, rms_norm,
                      rms_norm_kernel)

__all__ = ["MAX_D", "add_rms_norm", "add_rms_norm_kernel", "gated_rms_norm", "gated_rms_norm_kernel", "rms_norm",
           "rms_norm_kernel"]
