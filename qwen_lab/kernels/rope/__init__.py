"""The RoPE family: partial rotate-half rotary position embedding, alone or fused.

- `teach.py`: notebook 06's kernel as the learner writes it.
- `rotary.py`: `rope`, and the device functions the fused forms share (`_norm_rope_rows`, ...).
- `norm_rope.py`: `qk_norm_rope` (the q/k RMSNorm + RoPE in one launch) and `qk_norm_rope_cache` (with the
  KV-cache write too).

The private names re-exported here are reached from outside the family: attention's decode (`_check_qk`,
`_check_rotary`, `_norm_rope_rows`).
"""

from .norm_rope import _check_qk, qk_norm_rope, qk_norm_rope_cache, qk_norm_rope_cache_kernel, qk_norm_rope_kernel
from .rotary import _check_rotary, _norm_rope_rows, inv_freq_table, rope, rope_kernel

__all__ = ["_check_qk", "_check_rotary", "_norm_rope_rows", "inv_freq_table",
           "qk_norm_rope", "qk_norm_rope_cache", "qk_norm_rope_cache_kernel", "qk_norm_rope_kernel", "rope",
           "rope_kernel"]
