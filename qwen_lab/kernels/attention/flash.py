"""The online softmax over one block of keys: the step the prefill kernel (prefill.py) and the decode split
kernel (decode.py) both loop over.

Per query row, over key blocks j (scores in base 2: qk_scale = s log2(e), s the softmax scale), keep the running
max m, the running sum l and the unnormalised output acc [D]:

    m' = max(m, max_j s_j)
    acc = acc 2^(m - m') + sum_j 2^(s_j - m') v_j        l = l 2^(m - m') + sum_j 2^(s_j - m')

and o = acc / l after the last block: no scores tensor. Rows [BLOCK_M] (or ROWS), a key block [BLOCK_N, BLOCK_D].

Masking: masked scores are -inf, and the row maximum is replaced by 0 when it is -inf, so a row that sees
no key at all (a padding row, position < 0) gives exp(-inf) = 0 weights and a zero output, never NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl


LOG2E = 1.4426950408889634


@triton.jit
def _flash_step(acc, m_i, l_i, q, k_rows, v_rows, start, pos, L, qk_scale, offs_n, d_ok, stride_kl, stride_vl,
                CAUSAL_MASK: tl.constexpr, DOT_PREC: tl.constexpr):
    """One key block of the online softmax (base 2: qk_scale holds log2(e)), K and V loaded through pointers."""
    keys = start + offs_n
    if CAUSAL_MASK:
        k_ok = keys < L
        k = tl.load(k_rows + keys[:, None] * stride_kl, mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_rows + keys[:, None] * stride_vl, mask=k_ok[:, None] & d_ok[None, :], other=0.0)
    else:  # a block every row sees entirely: no mask on keys
        k = tl.load(k_rows + keys[:, None] * stride_kl, mask=d_ok[None, :], other=0.0)
        v = tl.load(v_rows + keys[:, None] * stride_vl, mask=d_ok[None, :], other=0.0)
    return _flash_update(acc, m_i, l_i, q, k, v, keys, pos, L, qk_scale, CAUSAL_MASK, DOT_PREC)


@triton.jit
def _flash_step_tma(acc, m_i, l_i, q, k_desc, v_desc, col, start, pos, L, qk_scale, offs_n,
                    CAUSAL_MASK: tl.constexpr, DOT_PREC: tl.constexpr):
    """The same block, K and V fetched by the TMA unit: the descriptors see the cache as [L, Hkv D] and a block is
    [BLOCK_N, D] at (start, col = KV head x D), rows past L filled with zeros (and masked below). No address
    arithmetic in the threads: on sm_90 the 64 x 64 tile's registers fall from 255 (with spills) to 240."""
    k = k_desc.load([start, col])
    v = v_desc.load([start, col])
    return _flash_update(acc, m_i, l_i, q, k, v, start + offs_n, pos, L, qk_scale, CAUSAL_MASK, DOT_PREC)


@triton.jit
def _flash_update(acc, m_i, l_i, q, k, v, keys, pos, L, qk_scale, CAUSAL_MASK: tl.constexpr,
                  DOT_PREC: tl.constexpr):
    """The online softmax over one key block k, v [BLOCK_N, BLOCK_D] at key indices `keys`."""
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
    if CAUSAL_MASK:
        s = tl.where((keys[None, :] <= pos[:, None]) & (keys < L)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row with nothing visible yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return acc, m_new, l_i
