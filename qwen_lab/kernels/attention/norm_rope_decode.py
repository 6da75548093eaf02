"""A decode token's attention from its raw projections: the q/k RMSNorm, RoPE and the cache write of
rope.qk_norm_rope_cache folded into the split kernel of flash-decoding (decode.py), then the combine kernel.

    q' = rope(rms_norm(q, q_weight)),  k' = rope(rms_norm(k, k_weight))
    k_cache[p], v_cache[p] = k', v           o = attention(q', k_cache, v_cache, p)  (* sigmoid(gate))

q [1, Hq, D], k, v [1, Hkv, D] (strided views of the fused projection allowed), weights [D], positions [1],
k_cache, v_cache [L, Hkv, D]. Each program of the split kernel prepares the query heads it reads, and the
program whose chunk holds the new key stores it and v in the cache before its key loop reads that row:
two launches instead of three, and the prepared q never goes through memory. The model's decode step.
"""

from __future__ import annotations

import torch

from ...errors import KernelError
from ..rope import _check_qk, _check_rotary, inv_freq_table
from .decode import _decode
from .flash import LOG2E
from .validate import _check_3d, _check_like, _check_positions, _out_and_gate


def qk_norm_rope_cache_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                                 k_weight: torch.Tensor, eps: float, positions: torch.Tensor, rotary_dim: int,
                                 theta: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 gate: torch.Tensor | None = None, scale: float | None = None,
                                 out: torch.Tensor | None = None, num_splits: int | None = None,
                                 workspace: torch.Tensor | None = None) -> torch.Tensor:
    """One decode token of attention from its raw projections: qk_norm_rope_cache folded into the split kernel of
    flash-decoding, then the combine kernel; = reference.qk_norm_rope_cache_attention. Two launches instead of
    three: the prepared q never goes through memory.

    q [1, Hq, D], k, v [1, Hkv, D] (strided views of the fused projection allowed), weights [D], positions [1],
    k_cache, v_cache [L, Hkv, D] (row positions[0] updated in place; a position outside [0, L) writes nothing),
    gate: optional [1, Hq, D]. -> out [1, Hq, D] in q's dtype.
    """
    T, Hq, Hk, D = _check_qk(q, k, q_weight, k_weight)
    if T != 1:
        raise KernelError(f"q: {T} tokens; qk_norm_rope_cache_attention serves one decode token (a prompt runs "
                          f"qk_norm_rope_cache, then attention)")
    if Hq % Hk:
        raise KernelError(f"k: {Hk} KV heads; expected a divisor of the {Hq} query heads")
    _check_like("v", v, k.shape, None, q.device)
    _check_rotary(rotary_dim, D)
    _check_3d("k_cache", k_cache, "[L, Hkv, D]")
    _check_like("k_cache", k_cache, (k_cache.shape[0], Hk, D), q.dtype, q.device)
    _check_like("v_cache", v_cache, k_cache.shape, k_cache.dtype, q.device)
    _check_positions(positions, 1, q.device)
    out = _out_and_gate(q, out, gate)
    scale = D ** -0.5 if scale is None else float(scale)
    prep = (q_weight, k_weight, inv_freq_table(rotary_dim, theta, q.device), k, v, eps, rotary_dim // 2)
    return _decode(q, k_cache, v_cache, positions, scale * LOG2E, out, gate, num_splits, workspace, prep)
