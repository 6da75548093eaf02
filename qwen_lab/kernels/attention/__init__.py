"""The attention family: the KV-cache write, causal grouped-query attention (prefill and decode), the output gate.

For T queries at absolute positions p_t over a key/value cache of capacity L (Hq query heads, Hkv KV heads,
G = Hq / Hkv query heads per KV head, head_dim D, scale s = D^-1/2 by default):

    S[h, t, j] = s * q[t, h] . k[j, h // G]                 for keys j = 0 .. p_t (causal)
    P[h, t, :] = softmax_j(S[h, t, :])
    o[t, h]    = sum_j P[h, t, j] v[j, h // G]              and optionally  o * sigmoid(gate[t, h])

Shapes: q [T, Hq, D]; k, v [L, Hkv, D]; positions [T] int on the device; out [T, Hq, D].

- `teach.py`: notebook 07's three kernels as the learner writes them (scores, masked softmax, weighted sum).
- `three_kernels.py`: `attention_three_kernels`, the library's copy of that form.
- `flash.py`: the online softmax over one key block, shared by the two fused forms.
- `prefill.py`: `attention` (T > 1: one flash-attention kernel, the gate in its epilogue; T == 1: decode.py).
- `decode.py`: flash-decoding, a split kernel and a combine kernel; `decode_splits`, `decode_workspace`.
- `norm_rope_decode.py`: `qk_norm_rope_cache_attention`, the q/k norm, RoPE and cache write folded into decode.
- `kv_cache.py`, `gate.py`: `kv_cache_write`, `sigmoid_gate`.
- `tuning.py`: the autotuners' candidates.

Its switches (`decode_prefetch`, `gate_apart_from_tokens`, `attn_tma`, and a config forced on
`flash_attention_kernel`) are in `qwen_lab.switches`.
"""

from .. import dot_precision
from .decode import decode_splits, decode_workspace, flash_decode_combine_kernel, flash_decode_split_kernel
from .gate import sigmoid_gate, sigmoid_gate_kernel
from .kv_cache import kv_cache_write, kv_cache_write_kernel
from .norm_rope_decode import qk_norm_rope_cache_attention
from .prefill import attention, flash_attention_kernel
from .three_kernels import (attention_three_kernels, attn_masked_softmax_kernel, attn_scores_kernel,
                            attn_weighted_sum_kernel)
from .tuning import (_DECODE_CONFIGS, _PREFILL_CONFIGS, _PREFILL_TMA_CONFIGS, _SMALL_SMEM_PREFILL_CONFIGS,
                     LARGE_TILE_SHARED_MEMORY, MAX_SPLITS, SMALL_SHARED_MEMORY, _tuned)

__all__ = ["LARGE_TILE_SHARED_MEMORY",
           "MAX_SPLITS", "SMALL_SHARED_MEMORY", "_DECODE_CONFIGS", "_PREFILL_CONFIGS", "_PREFILL_TMA_CONFIGS",
           "_SMALL_SMEM_PREFILL_CONFIGS", "_tuned", "attention", "attention_three_kernels",
           "attn_masked_softmax_kernel", "attn_scores_kernel", "attn_weighted_sum_kernel", "decode_splits",
           "decode_workspace", "dot_precision", "flash_attention_kernel", "flash_decode_combine_kernel",
           "flash_decode_split_kernel", "kv_cache_write", "kv_cache_write_kernel", "qk_norm_rope_cache_attention",
           "sigmoid_gate", "sigmoid_gate_kernel"]
