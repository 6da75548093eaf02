"""Attention of one decode token (T == 1): flash-decoding, a split kernel and a combine kernel.

q [1, Hq, D]; k, v [L, Hkv, D] (the cache); positions [1] int on the device (the token sees keys 0 .. p);
out [1, Hq, D]; the fp32 workspace [num_splits, Hq, D + 2] holds each split's partial (acc, m, l) per head.

One query row per head is too little work for one program per KV head, so the keys are split in `num_splits`
chunks over programs; each runs the online softmax of flash.py over its chunk and writes a partial (m, l, acc),
and a combine kernel merges them:  M = max_s m_s,  o = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s
(then o * sigmoid(gate) when a gate is given).
`num_splits` is fixed by the cache capacity L (a graph replays it) and passed to the split kernel as a runtime
value, so a new capacity compiles no new split kernel (beyond Triton's variants for a count of 1 and for the
multiples of 16, which it specialises) and tunes it once per power of two of splits; the small combine kernel
takes that power of two as a constexpr (SPLITS_P), one compile per power of two; the chunk length is computed in
the kernel from the current length; splits that start past the length write a neutral partial (m = -inf, l = 0,
acc = 0) and exit.

The split kernel also serves `qk_norm_rope_cache_attention` (norm_rope_decode.py, PREP=True): it then prepares
q and the new key itself. Launched early under programmatic dependent launch, each program asks L2 for its chunk
of keys and values before its wait (switches.decode_prefetch), while the q/k/v projection before it still runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ... import runtime, tunings
from ...errors import KernelError
from ...switches import switches
from .. import dot_precision, pdl_options
from ..rope import _norm_rope_rows
from .flash import _flash_step
from .tuning import _DECODE_BLOCK_N, _DECODE_CONFIGS, _INTERP_DECODE_BLOCK_N, MAX_SPLITS, _tuned
from .validate import _check_like


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
def _prep_split(q_ptr, stride_qh, k_new_ptr, stride_knh, v_new_ptr, stride_vnh, qw_ptr, kw_ptr, inv_freq_ptr, k_ptr,
                v_ptr, stride_kl, stride_kh, stride_vl, stride_vh, kvh, pos, start, end, eps, G: tl.constexpr,
                D: tl.constexpr, HALF: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """A split's own q/k norm and RoPE (qk_norm_rope_cache folded in): q_ptr, k_new_ptr, v_new_ptr hold this token's
    raw projections. -> the G query heads of KV head kvh normed and rotated, rounded to q's dtype as
    qk_norm_rope_cache would have stored them [ROWS, BLOCK_D]. The one split whose keys [start, end) hold key pos
    writes this token's prepared k and its v to cache row pos; it is the only split that reads that row, and the
    barrier makes the stores of all its threads visible to the loads of its key loop. (A position outside [0, L)
    has no such split: nothing written.)"""
    y, _, _, _ = _norm_rope_rows(q_ptr, qw_ptr, inv_freq_ptr, 0, pos, kvh * G, kvh * G + G, 0, stride_qh, eps,
                                 D, HALF, True, ROWS, BLOCK_D)
    k_new, _, offs_dn, m_new = _norm_rope_rows(k_new_ptr, kw_ptr, inv_freq_ptr, 0, pos, kvh, kvh + 1, 0,
                                               stride_knh, eps, D, HALF, True, 1, BLOCK_D)
    m_new = m_new & (start <= pos) & (pos < end)
    tl.store(k_ptr + pos * stride_kl + kvh * stride_kh + offs_dn[None, :],
             k_new.to(k_new_ptr.dtype.element_ty).to(k_ptr.dtype.element_ty), mask=m_new)
    v_new = tl.load(v_new_ptr + kvh * stride_vnh + offs_dn[None, :], mask=m_new)
    tl.store(v_ptr + pos * stride_vl + kvh * stride_vh + offs_dn[None, :], v_new.to(v_ptr.dtype.element_ty),
             mask=m_new)
    tl.debug_barrier()
    return y.to(q_ptr.dtype.element_ty)


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

    if PREP:   # qk_norm_rope_cache folded in (qk_norm_rope_cache_attention): the raw projections are its inputs
        q = _prep_split(q_ptr, stride_qh, k_new_ptr, stride_knh, v_new_ptr, stride_vnh, qw_ptr, kw_ptr, inv_freq_ptr,
                        k_ptr, v_ptr, stride_kl, stride_kh, stride_vl, stride_vh, kvh, pos, start, end, eps, G, D,
                        HALF, ROWS, BLOCK_D)
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
def _combine_splits(ws_ptr, h, stride_ws, stride_wh, num_splits, offs_d, d_ok, D: tl.constexpr,
                    SPLITS_P: tl.constexpr):
    """Query head h's output at offs_d in fp32 from the splits' partials (ws[s, h] = [acc (D) | m | l]):
    o = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s. (The persistent step's combine items call it too.)"""
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
    return tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)


@triton.jit
def flash_decode_combine_kernel(ws_ptr, out_ptr, gate_ptr, stride_ws, stride_wh, stride_oh, stride_gh, num_splits,
                                D: tl.constexpr, SPLITS_P: tl.constexpr,
                                HAS_GATE: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # program (query head, block of D)
    h = tl.program_id(0)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    o = _combine_splits(ws_ptr, h, stride_ws, stride_wh, num_splits, offs_d, d_ok, D, SPLITS_P)
    if HAS_GATE:
        g = tl.load(gate_ptr + h * stride_gh + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        o = o.to(out_ptr.dtype.element_ty).to(tl.float32) * tl.sigmoid(g)
    tl.store(out_ptr + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=d_ok)


# ---------------------------------------------------------------- launch configuration


def _decode_kernel():
    if "decode" not in _tuned:
        _tuned["decode"] = tunings.stored(triton.autotune(_DECODE_CONFIGS,
                                                          key=["G", "D", "splits_p2", "DOT_PREC", "PREP"])(
            flash_decode_split_kernel))
    return _tuned["decode"]


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


# ---------------------------------------------------------------- launcher


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
        prefetch = bool(switches.decode_prefetch) and D * k.element_size() % 128 == 0 and lines & (lines - 1) == 0
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
