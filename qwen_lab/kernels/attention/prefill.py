"""Gated attention: the KV-cache write, causal grouped-query attention (prefill and decode), the output gate.

For T queries at absolute positions p_t over a key/value cache of capacity L (Hq query heads, Hkv KV heads,
G = Hq / Hkv query heads per KV head, head_dim D, scale s = D^-1/2 by default):

    S[h, t, j] = s * q[t, h] . k[j, h // G]                 for keys j = 0 .. p_t (causal)
    P[h, t, :] = softmax_j(S[h, t, :])
    o[t, h]    = sum_j P[h, t, j] v[j, h // G]              and optionally  o * sigmoid(gate[t, h])

Shapes: q [T, Hq, D]; k, v [L, Hkv, D]; positions [T] int on the device; out [T, Hq, D]. The number of
keys a query sees comes from `positions` in device memory, never from the host, so one captured CUDA
Graph serves every length.

Three forms:
- `attention_three_kernels`: the teaching form. A scores kernel writes S [Hq, T, L] (fp32), a masked-softmax
  kernel turns each row into P in place, a weighted-sum kernel computes P V. Simple, and it moves
  Hq T L floats through memory twice.
- prefill (T > 1): one fused flash-attention kernel. Keys stream through in blocks; an online softmax keeps
  per row the running max m (base 2), the running sum l and the unnormalised output acc:
      m' = max(m, max_j s_j);  acc = acc 2^(m - m') + sum_j 2^(s_j - m') v_j;  l = l 2^(m - m') + sum_j 2^(s_j - m')
  and o = acc / l at the end: no scores tensor. The G query heads of one KV head sit in the same tile
  (rows = (token, head) pairs), so each K/V block is loaded once for all of them. Key blocks that every
  row of the tile may see skip the causal mask. K and V blocks come through pointers, or (TMA configs,
  sm_90+, `QWEN_LAB_ATTN_TMA=1`) from the TMA unit through tensor descriptors the launcher makes, the
  cache seen as an [L, Hkv D] matrix.
- decode (T == 1): flash-decoding. One query row per head is too little work for one program per KV head,
  so the keys are split in `num_splits` chunks over programs; each writes a partial (m, l, acc), and a
  combine kernel merges them:  M = max_s m_s,  o = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s.
  `num_splits` is fixed by the cache capacity L (a graph replays it) and passed to the split kernel as a runtime
  value, so a new capacity compiles no new split kernel (beyond Triton's variants for a count of 1 and for the
  multiples of 16, which it specialises) and tunes it once per power of two of splits; the small combine kernel
  takes that power of two as a constexpr (SPLITS_P), one compile per power of two; the chunk length is computed in the kernel from the current length; splits that start past
  the length write a neutral partial (m = -inf, l = 0, acc = 0) and exit.
  `qk_norm_rope_cache_attention` (the model's decode step) folds the q/k norm, RoPE and cache write of
  rope.qk_norm_rope_cache into the split kernel: each program prepares the query heads it reads, and the
  program whose chunk holds the new key stores it and v in the cache before its key loop reads that row.
  Two launches instead of three. Launched early under programmatic dependent launch,
  each program asks L2 for its chunk of keys and values before its wait (DECODE_PREFETCH), while the q/k/v
  projection before it still runs.

The output gate of Qwen3.5 (o * sigmoid(gate), gate a strided view of the fused q projection) is its own
kernel `sigmoid_gate`, and is also fused into the epilogue of `attention(..., gate=...)`: the attention
output is rounded to the storage dtype (as the unfused pair would store it), multiplied by sigmoid(gate)
in fp32, and stored once, saving a launch and a round trip of [T, Hq, D]. From GATE_APART_FROM_TOKENS
query tokens the launcher runs the pair instead (the attention without its gate, then `sigmoid_gate` in
place over the output): the same values, and on the H200 the faster of the two at every length measured
(64 to 2048 tokens).

Masking: masked scores are -inf, and the row maximum is replaced by 0 when it is -inf, so a row that sees
no key at all (a padding row, position < 0) gives exp(-inf) = 0 weights and a zero output, never NaN.

Key loops take their bounds from device memory (the positions), in plain `for` loops the compiler
software-pipelines; `qwen_lab.runtime` lets the interpreter run the same loops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
import triton.testing
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .. import runtime, tunings
from ..errors import KernelError
from . import dot_precision, env_on, graph_bench, max_shared_memory, pdl_options, sm90_or_newer
from .rope import _check_qk, _check_rotary, _norm_rope_rows, inv_freq_table

LOG2E = 1.4426950408889634


# ---------------------------------------------------------------- KV cache


@triton.jit
def kv_cache_write_kernel(k_cache_ptr, v_cache_ptr, k_ptr, v_ptr, pos_ptr, L, H,
                          stride_kct, stride_kch, stride_vct, stride_vch,
                          stride_kt, stride_kh, stride_vt, stride_vh,
                          D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # one program per token: its K and V rows go to cache row positions[t] (read on the device)
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    # a position outside the cache writes nothing rather than corrupting memory
    ok = (pos >= 0) & (pos < L)
    mask = (offs_h < H)[:, None] & (offs_d < D)[None, :] & ok
    src = offs_h[:, None] * stride_kh + offs_d[None, :]
    k = tl.load(k_ptr + t * stride_kt + src, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(k_cache_ptr + pos * stride_kct + offs_h[:, None] * stride_kch + offs_d[None, :],
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + pos * stride_vct + offs_h[:, None] * stride_vch + offs_d[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- the teaching form: three kernels


@triton.jit
def attn_scores_kernel(q_ptr, k_ptr, s_ptr, T, L, scale,
                       stride_qt, stride_qh, stride_kl, stride_kh, stride_sh, stride_st,
                       G: tl.constexpr, D: tl.constexpr, DOT_PREC: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # S[h, t, j] = scale * q[t, h] . k[j, h // G]: one [BLOCK_M, BLOCK_N] tile per program, D in one piece
    pid_m, pid_n, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q = tl.load(q_ptr + offs_m[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
                mask=(offs_m < T)[:, None] & d_ok[None, :], other=0.0)
    k = tl.load(k_ptr + offs_n[:, None] * stride_kl + (h // G) * stride_kh + offs_d[None, :],
                mask=(offs_n < L)[:, None] & d_ok[None, :], other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * scale
    tl.store(s_ptr + h * stride_sh + offs_m[:, None] * stride_st + offs_n[None, :], s,
             mask=(offs_m < T)[:, None] & (offs_n < L)[None, :])


@triton.jit
def attn_masked_softmax_kernel(s_ptr, pos_ptr, T, L, stride_sh, stride_st,
                               BLOCK_N: tl.constexpr):
    # one program per (head, query) row, in place: P[j] = exp(S[j] - max) / sum for j <= pos, else 0
    t = tl.program_id(0)
    h = tl.program_id(1)
    row = s_ptr + h * stride_sh + t * stride_st
    pos = tl.load(pos_ptr + t)
    n = tl.minimum(pos + 1, L)  # visible keys: 0 .. n - 1 (none when pos < 0)
    offs = tl.arange(0, BLOCK_N)
    # pass 1: running max and running sum over the row, block by block (base-e here: a teaching kernel)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, L, BLOCK_N):
        m, l = _softmax_stats_step(row, start, n, m, l, offs)
    m_row = tl.max(m, 0)
    # the NaN trap: a row that sees no key has max = -inf and exp(-inf - (-inf)) = NaN. Guard it.
    m_row = tl.where(m_row == float("-inf"), 0.0, m_row)
    l_row = tl.sum(l * tl.exp(m - m_row), 0)
    inv = 1.0 / tl.where(l_row > 0, l_row, 1.0)  # no key: every exp below is 0 anyway
    # pass 2: normalise and store (masked keys get exactly 0)
    for start in range(0, L, BLOCK_N):
        _softmax_write_step(row, start, n, L, m_row, inv, offs)


@triton.jit
def _softmax_stats_step(row, start, n, m, l, offs):
    cols = start + offs
    s = tl.load(row + cols, mask=cols < n, other=float("-inf"))
    m_new = tl.maximum(m, s)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    l = l * tl.exp(m - m_use) + tl.exp(s - m_use)
    return m_new, l


@triton.jit
def _softmax_write_step(row, start, n, L, m_row, inv, offs):
    cols = start + offs
    s = tl.load(row + cols, mask=cols < n, other=float("-inf"))
    tl.store(row + cols, tl.exp(s - m_row) * inv, mask=cols < L)


@triton.jit
def attn_weighted_sum_kernel(p_ptr, v_ptr, out_ptr, pos_ptr, T, L,
                             stride_ph, stride_pt, stride_vl, stride_vh, stride_ot, stride_oh,
                             G: tl.constexpr, D: tl.constexpr, DOT_PREC: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # o[t, h] = sum_j P[h, t, j] v[j, h // G]; keys past the last visible one (all P = 0) are skipped
    pid_m, h = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < T
    pos = tl.load(pos_ptr + offs_m, mask=m_ok, other=-1)
    hi = tl.minimum(tl.max(pos, 0) + 1, L)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    p_rows = p_ptr + h * stride_ph + offs_m[:, None] * stride_pt
    v_rows = v_ptr + (h // G) * stride_vh + offs_d[None, :]
    for start in range(0, hi, BLOCK_N):
        acc = _weighted_sum_step(acc, p_rows, v_rows, start, L, m_ok, offs_n, offs_d, stride_vl, D, DOT_PREC)
    tl.store(out_ptr + offs_m[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & (offs_d < D)[None, :])


@triton.jit
def _weighted_sum_step(acc, p_rows, v_rows, start, L, m_ok, offs_n, offs_d, stride_vl, D: tl.constexpr,
                       DOT_PREC: tl.constexpr):
    cols = start + offs_n
    n_ok = cols < L
    p = tl.load(p_rows + cols[None, :], mask=m_ok[:, None] & n_ok[None, :], other=0.0)
    v = tl.load(v_rows + cols[:, None] * stride_vl, mask=n_ok[:, None] & (offs_d < D)[None, :], other=0.0)
    return acc + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)


# ---------------------------------------------------------------- fused (flash) attention


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


@triton.jit
def _gate_epilogue(o, gate_ptr, offs_t, offs_h, offs_d, stride_gt, stride_gh, mask, out_ty: tl.constexpr):
    # round like the stored attention output, then o * sigmoid(gate) in fp32
    g = tl.load(gate_ptr + offs_t[:, None] * stride_gt + offs_h[:, None] * stride_gh + offs_d[None, :],
                mask=mask, other=0.0).to(tl.float32)
    return o.to(out_ty).to(tl.float32) * tl.sigmoid(g)


@triton.jit
def flash_attention_kernel(q_ptr, k_ptr, v_ptr, k_desc, v_desc, pos_ptr, out_ptr, gate_ptr, T, L, qk_scale,
                           stride_qt, stride_qh, stride_kl, stride_kh, stride_vl, stride_vh,
                           stride_ot, stride_oh, stride_gt, stride_gh,
                           G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                           HAS_GATE: tl.constexpr, DOT_PREC: tl.constexpr, T_BUCKET,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr = False,
                           TMA_OK: tl.constexpr = False, TMA: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # T_BUCKET (T rounded up to a power of two) is only an autotuning key; so is TMA_OK (whether the TMA configs
    # may be timed). TMA: K and V through the host tensor descriptors k_desc, v_desc (None otherwise).
    # rows of a tile are (token, query head of this KV head) pairs: BLOCK_T tokens x GP heads (G used)
    BLOCK_T: tl.constexpr = BLOCK_M // GP
    n_tiles = tl.cdiv(T, BLOCK_T)
    tile = n_tiles - 1 - tl.program_id(0)  # the longest rows (last tokens) start first
    kvh = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    offs_t = tile * BLOCK_T + rows // GP
    offs_h = kvh * G + rows % GP
    row_ok = (offs_t < T) & (rows % GP < G)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)

    pos = tl.load(pos_ptr + offs_t, mask=offs_t < T, other=-1).to(tl.int32)
    q = tl.load(q_ptr + offs_t[:, None] * stride_qt + offs_h[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    # key range of this tile, from device memory: [0, n_full) is visible to every row (no mask),
    # [n_full, hi) needs the causal mask
    last = tl.minimum(pos + 1, L)
    hi = tl.max(tl.where(row_ok, last, 0), 0)
    n_full = tl.min(tl.where(row_ok, (tl.maximum(last, 0) // BLOCK_N) * BLOCK_N, L), 0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if TMA:
        for start in range(0, n_full, BLOCK_N):
            acc, m_i, l_i = _flash_step_tma(acc, m_i, l_i, q, k_desc, v_desc, kvh * D, start, pos, L, qk_scale,
                                            offs_n, False, DOT_PREC)
        for start in range(n_full, hi, BLOCK_N):
            acc, m_i, l_i = _flash_step_tma(acc, m_i, l_i, q, k_desc, v_desc, kvh * D, start, pos, L, qk_scale,
                                            offs_n, True, DOT_PREC)
    else:
        k_rows = k_ptr + kvh * stride_kh + offs_d[None, :]
        v_rows = v_ptr + kvh * stride_vh + offs_d[None, :]
        for start in range(0, n_full, BLOCK_N):
            acc, m_i, l_i = _flash_step(acc, m_i, l_i, q, k_rows, v_rows, start, pos, L, qk_scale, offs_n, d_ok,
                                        stride_kl, stride_vl, False, DOT_PREC)
        for start in range(n_full, hi, BLOCK_N):
            acc, m_i, l_i = _flash_step(acc, m_i, l_i, q, k_rows, v_rows, start, pos, L, qk_scale, offs_n, d_ok,
                                        stride_kl, stride_vl, True, DOT_PREC)

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that saw no key stays 0
    mask = row_ok[:, None] & d_ok[None, :]
    if HAS_GATE:
        o = _gate_epilogue(o, gate_ptr, offs_t, offs_h, offs_d, stride_gt, stride_gh, mask,
                           out_ptr.dtype.element_ty)
    tl.store(out_ptr + offs_t[:, None] * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- decode: flash-decoding


@triton.jit
def _prefetch_rows_l2(rows_ptr, start, end, stride_l, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """prefetch.global.L2 for every 128-byte line of rows [start, end) of `rows_ptr` (D elements each, rows
    stride_l elements apart), BLOCK_N rows at a time; a row past `end` in the last step repeats row end - 1."""
    ROW_BYTES: tl.constexpr = D * rows_ptr.dtype.element_ty.primitive_bitwidth // 8
    LINES: tl.constexpr = (ROW_BYTES + 127) // 128
    base = rows_ptr.to(tl.pointer_type(tl.int8))
    line = tl.arange(0, LINES) * 128
    for s in range(start, end, BLOCK_N):
        r = tl.minimum(s + tl.arange(0, BLOCK_N), end - 1)
        addr = base + (r.to(tl.int64) * stride_l * (ROW_BYTES // D))[:, None] + line[None, :]
        # not pure: the result is unused, and a pure asm with an unused result would be dropped
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [addr],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _decode_chunk(pos_ptr, L, split, num_splits, BLOCK_N: tl.constexpr):
    """Keys [start, end) of split `split`: the n = pos + 1 keys (from device memory, at most L) shared by num_splits
    chunks at any length, each whole key blocks of BLOCK_N."""
    pos = tl.load(pos_ptr)
    n = tl.maximum(tl.minimum(pos + 1, L), 0).to(tl.int32)
    chunk = tl.cdiv(tl.cdiv(n, num_splits), BLOCK_N) * BLOCK_N
    start = split * chunk
    return start, tl.minimum(start + chunk, n)


@triton.jit
def flash_decode_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, ws_ptr, L, qk_scale,
                              stride_qh, stride_kl, stride_kh, stride_vl, stride_vh, stride_ws, stride_wh,
                              qw_ptr, kw_ptr, inv_freq_ptr, k_new_ptr, v_new_ptr, eps, stride_knh, stride_vnh,
                              num_splits, splits_p2,
                              G: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                              DOT_PREC: tl.constexpr,
                              BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr = False,
                              PREP: tl.constexpr = False, HALF: tl.constexpr = 0,
                              PREFETCH: tl.constexpr = False):
    # program (KV head, split): the G query heads of this KV head (padded to ROWS >= 16 for tl.dot)
    # against one chunk of the keys; writes the partial (acc, m, l) to the workspace.
    # num_splits is a runtime value (the cache's capacity sets it, see decode_splits): a new capacity compiles
    # nothing new, beyond Triton's own variants for an integer equal to 1 or a multiple of 16. splits_p2 (its next
    # power of two) is read by nothing here: it is the autotuner's key, so caches of similar size share one tuning
    # instead of tuning again for each capacity a generation brings.
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, ROWS)
    row_ok = rows < G
    offs_h = kvh * G + rows
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)

    if PREFETCH:
        # Before the wait: ask L2 for this chunk's keys and values while the kernel before (the q/k/v projection)
        # finishes. The rows below pos come from earlier steps; the new row's stores below land in L2 over its
        # prefetched line. A hint that holds no register and changes no result: were the position not final yet
        # (it is the step's input), only the wrong lines would be warmed.
        start, end = _decode_chunk(pos_ptr, L, split, num_splits, BLOCK_N)
        _prefetch_rows_l2(k_ptr + kvh * stride_kh, start, end, stride_kl, D, BLOCK_N)
        _prefetch_rows_l2(v_ptr + kvh * stride_vh, start, end, stride_vl, D, BLOCK_N)
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    pos = tl.load(pos_ptr)
    start, end = _decode_chunk(pos_ptr, L, split, num_splits, BLOCK_N)

    if PREP:
        # qk_norm_rope_cache folded in (qk_norm_rope_cache_attention): q_ptr, k_new_ptr, v_new_ptr hold this
        # token's raw projections. The G query heads of this KV head are normed and rotated here, rounded to q's
        # dtype as qk_norm_rope_cache would have stored them.
        y, _, _, _ = _norm_rope_rows(q_ptr, qw_ptr, inv_freq_ptr, 0, pos, kvh * G, kvh * G + G, 0, stride_qh, eps,
                                     D, HALF, True, ROWS, BLOCK_D)
        q = y.to(q_ptr.dtype.element_ty)
        # This token's prepared k and its v go to cache row pos. The one program whose chunk holds key pos writes
        # them, and it is the only program that reads that row; the barrier makes the stores of all its threads
        # visible to the loads of the key loop. (A position outside [0, L) has no such program: nothing written.)
        k_new, _, offs_dn, m_new = _norm_rope_rows(k_new_ptr, kw_ptr, inv_freq_ptr, 0, pos, kvh, kvh + 1, 0,
                                                   stride_knh, eps, D, HALF, True, 1, BLOCK_D)
        m_new = m_new & (start <= pos) & (pos < end)
        tl.store(k_ptr + pos * stride_kl + kvh * stride_kh + offs_dn[None, :],
                 k_new.to(k_new_ptr.dtype.element_ty).to(k_ptr.dtype.element_ty), mask=m_new)
        v_new = tl.load(v_new_ptr + kvh * stride_vnh + offs_dn[None, :], mask=m_new)
        tl.store(v_ptr + pos * stride_vl + kvh * stride_vh + offs_dn[None, :], v_new.to(v_ptr.dtype.element_ty),
                 mask=m_new)
        tl.debug_barrier()
    else:
        q = tl.load(q_ptr + offs_h[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0)
    pos_rows = tl.zeros([ROWS], tl.int32) + (end - 1)  # the causal mask of _flash_step, cut at the chunk end
    m_i = tl.full([ROWS], float("-inf"), tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    k_rows = k_ptr + kvh * stride_kh + offs_d[None, :]
    v_rows = v_ptr + kvh * stride_vh + offs_d[None, :]
    # a split that starts past the length runs no iteration and stores the neutral partial below
    for s in range(start, end, BLOCK_N):
        acc, m_i, l_i = _flash_step(acc, m_i, l_i, q, k_rows, v_rows, s, pos_rows, L, qk_scale, offs_n,
                                    d_ok, stride_kl, stride_vl, True, DOT_PREC)
    base = ws_ptr + split * stride_ws + offs_h * stride_wh
    tl.store(base[:, None] + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
    tl.store(base + D, m_i, mask=row_ok)
    tl.store(base + D + 1, l_i, mask=row_ok)


@triton.jit
def flash_decode_combine_kernel(ws_ptr, out_ptr, gate_ptr, stride_ws, stride_wh, stride_oh, stride_gh, num_splits,
                                D: tl.constexpr, SPLITS_P: tl.constexpr,
                                HAS_GATE: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # program (query head, block of D): o = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s
    h = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    offs_s = tl.arange(0, SPLITS_P)
    s_ok = offs_s < num_splits
    base = ws_ptr + offs_s * stride_ws + h * stride_wh
    m = tl.load(base + D, mask=s_ok, other=float("-inf"))
    l = tl.load(base + D + 1, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # no key at all: every weight is 0
    w = tl.exp2(m - m_max)
    acc = tl.load(base[:, None] + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    total = tl.sum(w * l, 0)
    o = tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    if HAS_GATE:
        g = tl.load(gate_ptr + h * stride_gh + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        o = o.to(out_ptr.dtype.element_ty).to(tl.float32) * tl.sigmoid(g)
    tl.store(out_ptr + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=d_ok)


# ---------------------------------------------------------------- the output gate


@triton.jit
def sigmoid_gate_kernel(o_ptr, gate_ptr, out_ptr, H, stride_ot, stride_oh, stride_gt, stride_gh,
                        stride_yt, stride_yh, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
                        USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h < H)[:, None] & (offs_d < D)[None, :]
    o = tl.load(o_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :], mask=mask).to(tl.float32)
    g = tl.load(gate_ptr + t * stride_gt + offs_h[:, None] * stride_gh + offs_d[None, :], mask=mask)
    y = o * tl.sigmoid(g.to(tl.float32))
    tl.store(out_ptr + t * stride_yt + offs_h[:, None] * stride_yh + offs_d[None, :],
             y.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------- launch configuration

# GPU: head_dim 256 in one tile. A [BLOCK_M, 256] bf16 q tile and, per pipeline stage, one [BLOCK_N, 256]
# K and V block live in shared memory (32 + 2 x 32 KB per stage at 64/64: 160 KB with two stages, under the
# H200's 227 KB); the fp32 accumulator [BLOCK_M, 256] lives in registers, hence 8 warps for 128 rows.
# Compiled for sm_90 these configs use 212-255 registers per thread; the 4-warp 64 x 64 tile spills 64-72 bytes
# (docs/perf-log.md, 2026-12-01).
_PREFILL_CONFIGS = [
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=8, num_stages=2),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=2),
]
# GPUs with less shared memory per program (a T4: 64 KB; an L4 or an RTX 30/40: 99 KB) than most of the tiles
# above need (compiled for a T4, sm_75, they take 96-192 KB; tests/test_sm90_compile.py): one-stage tiles of 32
# query rows, 64 and 48 KB there. Offered to the autotuner only on such GPUs (SMALL_SHARED_MEMORY); on the others
# it would compile and time them for nothing.
_SMALL_SMEM_PREFILL_CONFIGS = [
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=1),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 16}, num_warps=4, num_stages=1),
]
SMALL_SHARED_MEMORY = 128 * 1024
# The least shared memory any of the other prefill tiles needs per program (64 x 32 keys, 3 stages: 96 KB compiled
# for sm_75, 128 KB for sm_90; the rest 128-192 KB): below it only the small tiles are offered
LARGE_TILE_SHARED_MEMORY = 96 * 1024
# The same tiles with K and V fetched by the TMA unit through host tensor descriptors (sm_90+, a cache whose heads
# sit side by side in 16-byte-aligned rows, D a power of two). Timed by the autotuner only where
# QWEN_LAB_ATTN_TMA=1 asks for them: on the H200 they measured level with the pointer loads (docs/perf-log.md,
# 2026-12-02), so the default leaves them out of the tuning.
_PREFILL_TMA_CONFIGS = [triton.Config(dict(c.kwargs, TMA=True), num_warps=c.num_warps, num_stages=c.num_stages)
                        for c in _PREFILL_CONFIGS]
_DECODE_CONFIGS = [
    triton.Config({"BLOCK_N": 64}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_N": 64}, num_warps=8, num_stages=3),
]
_tuned: dict = {}


def _prefill_kernel():
    if "prefill" not in _tuned:
        # keyed on the head layout and the length rounded to a power of two: a new prompt length
        # of a similar size reuses the tuning instead of re-running it. Timed in a CUDA Graph (graph_bench): in
        # the model a prompt's attention reads the K and V just written, from L2, and do_bench's flushed L2
        # ranked the configurations differently (on the H200 at 2048 tokens it picked one 6% slower in a graph).
        _tuned["prefill"] = tunings.stored(triton.autotune(
            _PREFILL_CONFIGS + _PREFILL_TMA_CONFIGS + _SMALL_SMEM_PREFILL_CONFIGS,
            key=["G", "D", "HAS_GATE", "DOT_PREC", "T_BUCKET", "TMA_OK"],
            prune_configs_by={"early_config_prune": _prune_prefill_configs},
            do_bench=graph_bench)(flash_attention_kernel))
    return _tuned["prefill"]


def _prune_prefill_configs(configs, named_args, **kwargs):
    """The TMA configurations only for calls that allow them (TMA_OK); the small tiles only on a GPU with less than
    SMALL_SHARED_MEMORY per program, and they alone on one with less than LARGE_TILE_SHARED_MEMORY (a T4), where
    no other tile fits and each would only cost its compile (9-56 s apiece for sm_75 on a 2-core CPU)."""
    room = max_shared_memory(named_args["q_ptr"].device)
    if room < LARGE_TILE_SHARED_MEMORY:
        return list(_SMALL_SMEM_PREFILL_CONFIGS)
    small = room < SMALL_SHARED_MEMORY
    return [c for c in configs if (kwargs.get("TMA_OK", False) or not c.kwargs.get("TMA", False))
            and (small or not any(c is s for s in _SMALL_SMEM_PREFILL_CONFIGS))]


def _kv_tma_ok(k: torch.Tensor, v: torch.Tensor, block_d: int, forced: bool = False) -> bool:
    """Whether K and V [L, Hkv, D] can be described to the TMA unit as [L, Hkv D] matrices: heads side by side
    (stride D) with unit stride inside, 16-byte-aligned starts and rows, D = BLOCK_D. Unless `forced` (a test or
    probe forcing a TMA configuration), also 16-bit values, an sm_90+ GPU, not the interpreter, and
    QWEN_LAB_ATTN_TMA=1."""
    if not forced and not (env_on("QWEN_LAB_ATTN_TMA", False) and k.element_size() == 2 and sm90_or_newer(k.device)):
        return False
    D = k.shape[2]
    for t in (k, v):
        if t.stride(2) != 1 or t.stride(1) != D or t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
            return False
    return D == block_d


def _kv_descriptors(k: torch.Tensor, v: torch.Tensor) -> tuple:
    """Host tensor descriptors of K and V as [L, Hkv D] matrices, their tiles still open (_fit_kv_descriptors)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    L, Hkv, D = k.shape
    return tuple(TensorDescriptor(t, [L, Hkv * D], [t.stride(0), 1], [16, D]) for t in (k, v))


def _fit_kv_descriptors(*args, **meta) -> None:
    """flash_attention_kernel's pre-run hook (every launch, the autotuner's timing runs included): give the K and V
    descriptors the configuration's tile [BLOCK_N, BLOCK_D], part of the compiled kernel's signature."""
    nargs = dict(zip(flash_attention_kernel.arg_names, args), **meta)
    for name in ("k_desc", "v_desc"):
        if nargs[name] is not None:
            nargs[name].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_D"]]


flash_attention_kernel.add_pre_run_hook(_fit_kv_descriptors)


def _decode_kernel():
    if "decode" not in _tuned:
        _tuned["decode"] = tunings.stored(triton.autotune(_DECODE_CONFIGS,
                                                          key=["G", "D", "splits_p2", "DOT_PREC", "PREP"])(
            flash_decode_split_kernel))
    return _tuned["decode"]


# the interpreter runs each program in NumPy: one small fixed config
_INTERP_PREFILL = dict(BLOCK_M=32, BLOCK_N=32)
# Tests set this to a triton.Config to run the prefill kernel with that config instead of the autotuner's pick
# (on a GPU) or the small fixed one (under the interpreter).
FORCE_PREFILL_CONFIG = None
# From this many query tokens the gate is applied apart, by `sigmoid_gate` after an attention without it. Every
# program of the flash kernel holds a whole SM (its K/V stages fill the shared memory), so the gate's loads in its
# epilogue leave the SM idle, and the gate's registers change the autotuner's pick. On the H200 (docs/perf-log.md,
# 2026-12-02), us per layer, fused against apart: 2048 tokens 59.6-60.0 against 56.1-56.2, 1024 tokens
# 32.9 against 31.1, 512 tokens 21.8 against 19.6, 256 tokens 16.3 against 13.6, 64 tokens 10.2 against 8.7.
# Shorter prompts (the smallest prefill buckets), not measured, keep the epilogue and its saved launch.
GATE_APART_FROM_TOKENS = 64
_INTERP_DECODE_BLOCK_N = 16
_DECODE_BLOCK_N = 64  # the chunk granularity used to choose the number of splits on the GPU
MAX_SPLITS = 64
# Each program of the split kernel asks L2 for its chunk of keys and values before its PDL wait, while the q/k/v
# projection still runs (flash_decode_split_kernel). The model's decode step on the H200, 2k cached tokens, three
# rounds: 663.5 / 669.5 / 669.2 us with it, 672.0 / 671.1 / 671.0 without, logits equal bit for bit
# (benchmarks/probe_decode_prefetch.py; docs/perf-log.md, 2026-12-03). Not part of the autotuning key: the config
# timed with the prefetch serves the kernel without it, so the two give the same bits.
DECODE_PREFETCH = True


def decode_splits(cache_len: int) -> int:
    """The number of splits of the decode kernel for a cache of capacity `cache_len` (fixed per cache, so per graph).

    Enough chunks that Hkv x splits programs fill a large GPU (64 x 2 KV heads = 128 on 132 SMs of an
    H200), never more than one chunk per key block.
    """
    block = _INTERP_DECODE_BLOCK_N if runtime.interpreter_active() else _DECODE_BLOCK_N
    return max(1, min(MAX_SPLITS, triton.cdiv(int(cache_len), block)))


def decode_workspace(q: torch.Tensor, k: torch.Tensor, num_splits: int | None = None) -> torch.Tensor:
    """The fp32 scratch of decode attention: [num_splits, Hq, D + 2] (acc, then m and l per head).

    Pass it as `attention(..., workspace=...)` to keep every allocation outside a captured graph.
    """
    splits = decode_splits(k.shape[0]) if num_splits is None else num_splits
    return torch.empty(splits, q.shape[1], q.shape[2] + 2, dtype=torch.float32, device=q.device)


# ---------------------------------------------------------------- launchers


def _check_3d(name, x, expect=None):
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise KernelError(f"{name}: expected a 3-D tensor {expect}, got {got}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise KernelError(f"{name}: the last dim must be contiguous (stride 1), got strides {tuple(x.stride())}")


def _check_positions(positions, T, device):
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.shape[0] != T:
        got = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise KernelError(f"positions: expected an integer tensor [{T}] (one per token), got {got}")
    if positions.dtype not in (torch.int64, torch.int32):
        raise KernelError(f"positions: expected int64 or int32, got {positions.dtype}")
    if positions.device != device:
        raise KernelError(f"positions: on {positions.device}, expected {device} (read inside the kernel)")
    if T > 1 and positions.stride(0) != 1:
        raise KernelError("positions: must be contiguous")


def _check_like(name, x, shape, dtype, device):
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(shape) or x.device != device:
        got = f"{x.dtype} {tuple(x.shape)} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise KernelError(f"{name}: expected shape {tuple(shape)} on {device}, got {got}")
    if dtype is not None and x.dtype != dtype:
        raise KernelError(f"{name}: expected dtype {dtype}, got {x.dtype}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise KernelError(f"{name}: the last dim must be contiguous (stride 1)")


def _check_qkv(q, k, v, positions):
    _check_3d("q", q, "[T, Hq, D]")
    _check_3d("k", k, "[L, Hkv, D]")
    T, Hq, D = q.shape
    L, Hkv, Dk = k.shape
    if Dk != D:
        raise KernelError(f"k: head_dim {Dk}, expected {D} (q's head_dim)")
    if Hkv == 0 or Hq % Hkv:
        raise KernelError(f"k: {Hkv} KV heads; expected a divisor of the {Hq} query heads")
    _check_like("v", v, k.shape, k.dtype, k.device)
    if k.dtype != q.dtype or k.device != q.device:
        raise KernelError(f"k: expected {q.dtype} on {q.device} like q, got {k.dtype} on {k.device}")
    if not q.is_floating_point():
        raise KernelError(f"q: expected a floating-point tensor, got {q.dtype}")
    _check_positions(positions, T, q.device)
    return T, Hq, D, L, Hkv


def _out_and_gate(q, out, gate):
    """Check `out` and `gate` against q ([T, Hq, D]: out of q's dtype, gate any float dtype) -> out, allocated
    when None."""
    if gate is not None:
        _check_like("gate", gate, q.shape, None, q.device)
    if out is None:
        return torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _check_like("out", out, q.shape, q.dtype, q.device)
    return out


def kv_cache_write(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   positions: torch.Tensor) -> None:
    """In place: k_cache[positions] = k, v_cache[positions] = v; = reference.kv_cache_write.

    caches [L, Hkv, D]; k, v [T, Hkv, D] (strided views allowed); positions [T] on the device. A position
    outside [0, L) is skipped (no host check can see it without a synchronisation).
    """
    _check_3d("k_cache", k_cache, "[L, Hkv, D]")
    _check_like("v_cache", v_cache, k_cache.shape, k_cache.dtype, k_cache.device)
    _check_3d("k", k, "[T, Hkv, D]")
    T = k.shape[0]
    if tuple(k.shape[1:]) != tuple(k_cache.shape[1:]) or k.device != k_cache.device:
        raise KernelError(f"k: expected [T, {k_cache.shape[1]}, {k_cache.shape[2]}] on {k_cache.device}, "
                          f"got {tuple(k.shape)} on {k.device}")
    _check_like("v", v, k.shape, None, k.device)
    _check_positions(positions, T, k.device)
    if T == 0:
        return None
    L, H, D = k_cache.shape
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_H = triton.next_power_of_2(H)
    kv_cache_write_kernel[(T,)](k_cache, v_cache, k, v, positions, L, H,
                                k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
                                k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                                D=D, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, num_warps=4, **pdl_options(k.device))
    return None


def attention_three_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                            scale: float | None = None) -> torch.Tensor:
    """The teaching form of reference.attention: scores, masked softmax, weighted sum (three launches).

    Allocates the [Hq, T, L] fp32 scores (overwritten by the probabilities). A query whose position
    is negative (padding) sees no key and gets a zero output instead of NaN.
    """
    T, Hq, D, L, Hkv = _check_qkv(q, k, v, positions)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    scale = D ** -0.5 if scale is None else float(scale)
    G = Hq // Hkv
    interp = runtime.interpreter_active()
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_M = 16 if interp else 64
    BLOCK_N = 32 if interp else 64
    scores = torch.empty(Hq, T, L, dtype=torch.float32, device=q.device)
    attn_scores_kernel[(triton.cdiv(T, BLOCK_M), triton.cdiv(L, BLOCK_N), Hq)](
        q, k, scores, T, L, scale, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        scores.stride(0), scores.stride(1), G=G, D=D, DOT_PREC=dot_precision(q.dtype), BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, num_warps=4)
    attn_masked_softmax_kernel[(T, Hq)](scores, positions, T, L, scores.stride(0), scores.stride(1),
                                        BLOCK_N=min(1024, max(16, triton.next_power_of_2(L))),
                                        num_warps=4)
    attn_weighted_sum_kernel[(triton.cdiv(T, BLOCK_M), Hq)](
        scores, v, out, positions, T, L, scores.stride(0), scores.stride(1), v.stride(0), v.stride(1),
        out.stride(0), out.stride(1), G=G, D=D, DOT_PREC=dot_precision(q.dtype), BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, num_warps=4)
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
              scale: float | None = None, gate: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
              num_splits: int | None = None, workspace: torch.Tensor | None = None) -> torch.Tensor:
    """Causal grouped-query attention over a KV cache; = reference.attention (with `gate`: then sigmoid_gate).

    q [T, Hq, D]; k, v [L, Hkv, D]; positions [T] int on the device (query t sees keys 0 .. positions[t]).
    T > 1: the fused flash-attention kernel. T == 1: flash-decoding over `num_splits` chunks (default
    `decode_splits(L)`) with an fp32 `workspace` [num_splits, Hq, D + 2] (allocated when None), then the
    combine kernel. gate: optional [T, Hq, D] (a strided view is fine): returns o * sigmoid(gate), in the
    kernel's epilogue, or from GATE_APART_FROM_TOKENS tokens by `sigmoid_gate` afterwards.
    -> out [T, Hq, D] in q's dtype.
    """
    T, Hq, D, L, Hkv = _check_qkv(q, k, v, positions)
    out = _out_and_gate(q, out, gate)
    if T == 0:
        return out
    scale = D ** -0.5 if scale is None else float(scale)
    qk_scale = scale * LOG2E
    if T == 1:
        return _decode(q, k, v, positions, qk_scale, out, gate, num_splits, workspace)
    # the gate in the flash kernel's epilogue, or (a long prompt) applied after it by sigmoid_gate
    gate_apart = gate if gate is not None and T >= GATE_APART_FROM_TOKENS else None
    if gate_apart is not None:
        gate = None
    G = Hq // Hkv
    GP = triton.next_power_of_2(G)
    if GP > 64:
        raise KernelError(f"k: a group of {G} query heads per KV head is larger than the 64 rows of a tile")
    g = gate if gate is not None else out  # never read when HAS_GATE is False
    BLOCK_D = max(16, triton.next_power_of_2(D))
    forced = FORCE_PREFILL_CONFIG
    # a forced TMA configuration uses the descriptors wherever the layout allows them (the pointer loads otherwise)
    tma_forced = forced is not None and forced.kwargs.get("TMA", False)
    tma_ok = _kv_tma_ok(k, v, BLOCK_D, forced=tma_forced)
    k_desc, v_desc = _kv_descriptors(k, v) if tma_ok else (None, None)
    common = (q, k, v, k_desc, v_desc, positions, out, g, T, L, qk_scale,
              q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
              out.stride(0), out.stride(1), g.stride(0), g.stride(1))

    def grid(meta):  # a tile per BLOCK_M // GP tokens (each with the GP heads of its KV head), per KV head
        return (triton.cdiv(T, meta["BLOCK_M"] // GP), Hkv)

    meta = dict(G=G, GP=GP, D=D, BLOCK_D=BLOCK_D, HAS_GATE=gate is not None, DOT_PREC=dot_precision(q.dtype),
                T_BUCKET=triton.next_power_of_2(T), **pdl_options(q.device))
    if forced is not None or runtime.interpreter_active():
        cfg = dict(forced.kwargs, num_warps=forced.num_warps, num_stages=forced.num_stages) \
            if forced is not None else dict(_INTERP_PREFILL)
        cfg["BLOCK_M"] = max(cfg["BLOCK_M"], GP)
        cfg["TMA"] = tma_ok
        flash_attention_kernel[grid(cfg)](*common, **meta, **cfg)
    else:
        _prefill_kernel()[grid](*common, **meta, TMA_OK=tma_ok)
    if gate_apart is not None:  # in place: each element read, then written, by the same thread
        sigmoid_gate(out, gate_apart, out=out)
    return out


def _decode(q, k, v, positions, qk_scale, out, gate, num_splits, workspace, prep=None):
    """Flash-decoding of one query token: the split kernel, then the combine kernel (with the gate when given).
    prep: None (q is ready and this token's k, v are in the cache), or the arguments that fold
    qk_norm_rope_cache into the split kernel: (q_weight, k_weight, inv_freq, k_new, v_new, eps, HALF)."""
    _, Hq, D = q.shape
    L, Hkv = k.shape[0], k.shape[1]
    G = Hq // Hkv
    BLOCK_D = max(16, triton.next_power_of_2(D))
    splits = decode_splits(L) if num_splits is None else int(num_splits)
    if splits < 1:
        raise KernelError(f"num_splits: expected a positive int, got {num_splits!r}")
    if workspace is None:
        workspace = torch.empty(splits, Hq, D + 2, dtype=torch.float32, device=q.device)
    else:
        _check_like("workspace", workspace, (splits, Hq, D + 2), torch.float32, q.device)
    rows = max(16, triton.next_power_of_2(G))
    if prep is None:  # (the prep arguments are never read: any pointers will do)
        prep_args, prep_meta = (q, q, q, q, q, 0.0, 0, 0), {}
    else:
        q_weight, k_weight, inv_freq, k_new, v_new, eps, half = prep
        prep_args = (q_weight, k_weight, inv_freq, k_new, v_new, float(eps), k_new.stride(1), v_new.stride(1))
        prep_meta = dict(PREP=True, HALF=half)
    common = (q, k, v, positions, workspace, L, qk_scale, q.stride(1), k.stride(0), k.stride(1),
              v.stride(0), v.stride(1), workspace.stride(0), workspace.stride(1), *prep_args,
              splits, triton.next_power_of_2(splits))
    prec = dot_precision(q.dtype)
    if runtime.interpreter_active():
        flash_decode_split_kernel[(Hkv, splits)](*common, G=G, ROWS=rows, D=D, BLOCK_D=BLOCK_D,
                                                 DOT_PREC=prec, BLOCK_N=_INTERP_DECODE_BLOCK_N, **prep_meta)
    else:
        # (the prefetch walks whole 128-byte lines of a row: a power of two of them, as head_dim 128 or 256 gives)
        lines = D * k.element_size() // 128
        prefetch = bool(DECODE_PREFETCH) and D * k.element_size() % 128 == 0 and lines & (lines - 1) == 0
        _decode_kernel()[(Hkv, splits)](*common, G=G, ROWS=rows, D=D, BLOCK_D=BLOCK_D,
                                        DOT_PREC=prec, **prep_meta, PREFETCH=prefetch,
                                        **pdl_options(q.device))
    has_gate = gate is not None
    g = gate if has_gate else out  # never read when HAS_GATE is False
    block_dc = min(BLOCK_D, 64)
    flash_decode_combine_kernel[(Hq, triton.cdiv(D, block_dc))](
        workspace, out, g, workspace.stride(0), workspace.stride(1), out.stride(1), g.stride(1), splits,
        D=D, SPLITS_P=triton.next_power_of_2(splits), HAS_GATE=has_gate, BLOCK_D=block_dc,
        num_warps=4, **pdl_options(q.device))
    return out


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


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """o * sigmoid(gate), fp32 math; = reference.sigmoid_gate. o, gate [T, H, D] (gate may be a strided view)."""
    _check_3d("o", o, "[T, H, D]")
    _check_like("gate", gate, o.shape, None, o.device)
    if out is not None:
        _check_like("out", out, o.shape, o.dtype, o.device)
    else:
        out = torch.empty(o.shape, dtype=o.dtype, device=o.device)
    T, H, D = o.shape
    if T == 0 or H == 0:
        return out
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_H = min(triton.next_power_of_2(H), max(1, 4096 // BLOCK_D))
    sigmoid_gate_kernel[(T, triton.cdiv(H, BLOCK_H))](o, gate, out, H, o.stride(0), o.stride(1),
                                                      gate.stride(0), gate.stride(1), out.stride(0), out.stride(1),
                                                      D=D, BLOCK_H=BLOCK_H, BLOCK_D=BLOCK_D, num_warps=4,
                                                      **pdl_options(o.device))
    return out


__all__ = ["attention", "attention_three_kernels", "decode_splits", "decode_workspace", "kv_cache_write",
           "qk_norm_rope_cache_attention", "sigmoid_gate"]
