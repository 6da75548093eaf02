"""Causal grouped-query attention over a KV cache; the prefill (T > 1) as one fused flash-attention kernel.

For T queries at absolute positions p_t over a key/value cache of capacity L (Hq query heads, Hkv KV heads,
G = Hq / Hkv query heads per KV head, head_dim D, scale s = D^-1/2 by default):

    S[h, t, j] = s * q[t, h] . k[j, h // G]                 for keys j = 0 .. p_t (causal)
    o[t, h]    = sum_j softmax_j(S[h, t, :]) v[j, h // G]    and optionally  o * sigmoid(gate[t, h])

Shapes: q [T, Hq, D]; k, v [L, Hkv, D]; positions [T] int on the device; out [T, Hq, D]. The number of
keys a query sees comes from `positions` in device memory, never from the host, so one captured CUDA
Graph serves every length. `attention` is the launcher of both forms: T == 1 goes to decode.py.

Keys stream through in blocks with the online softmax of flash.py. The G query heads of one KV head sit in the
same tile (rows = (token, head) pairs), so each K/V block is loaded once for all of them. Key blocks that every
row of the tile may see skip the causal mask. K and V blocks come through pointers, or (TMA configs,
sm_90+, `QWEN_LAB_ATTN_TMA=1`) from the TMA unit through tensor descriptors the launcher makes, the
cache seen as an [L, Hkv D] matrix.

The output gate of Qwen3.5 (o * sigmoid(gate), gate a strided view of the fused q projection) is its own
kernel `sigmoid_gate` (gate.py), and is also fused into the epilogue of `attention(..., gate=...)`: the attention
output is rounded to the storage dtype (as the unfused pair would store it), multiplied by sigmoid(gate)
in fp32, and stored once, saving a launch and a round trip of [T, Hq, D]. From switches.gate_apart_from_tokens
query tokens the launcher runs the pair instead (the attention without its gate, then `sigmoid_gate` in
place over the output): the same values, and on the H200 the faster of the two at every length measured
(64 to 2048 tokens).

Key loops take their bounds from device memory (the positions), in plain `for` loops the compiler
software-pipelines; `qwen_lab.runtime` lets the interpreter run the same loops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ... import runtime, tunings
from ...errors import KernelError
from ...switches import switches
from .. import dot_precision, graph_bench, pdl_options, sm90_or_newer
from .decode import _decode
from .flash import LOG2E, _flash_step, _flash_step_tma
from .gate import sigmoid_gate
from .tuning import (_INTERP_PREFILL, _PREFILL_CONFIGS, _PREFILL_TMA_CONFIGS, _SMALL_SMEM_PREFILL_CONFIGS,
                     _prune_prefill_configs, _tuned)
from .validate import _check_qkv, _out_and_gate


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


# ---------------------------------------------------------------- launch configuration


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


def _kv_tma_ok(k: torch.Tensor, v: torch.Tensor, block_d: int, forced: bool = False) -> bool:
    """Whether K and V [L, Hkv, D] can be described to the TMA unit as [L, Hkv D] matrices: heads side by side
    (stride D) with unit stride inside, 16-byte-aligned starts and rows, D = BLOCK_D. Unless `forced` (a test or
    probe forcing a TMA configuration), also 16-bit values, an sm_90+ GPU, not the interpreter, and the attn_tma
    switch on."""
    if not forced and not (switches.attn_tma and k.element_size() == 2 and sm90_or_newer(k.device)):
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


# ---------------------------------------------------------------- launcher


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
              scale: float | None = None, gate: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
              num_splits: int | None = None, workspace: torch.Tensor | None = None) -> torch.Tensor:
    """Causal grouped-query attention over a KV cache; = reference.attention (with `gate`: then sigmoid_gate).

    q [T, Hq, D]; k, v [L, Hkv, D]; positions [T] int on the device (query t sees keys 0 .. positions[t]).
    T > 1: the fused flash-attention kernel. T == 1: flash-decoding over `num_splits` chunks (default
    `decode_splits(L)`) with an fp32 `workspace` [num_splits, Hq, D + 2] (allocated when None), then the
    combine kernel. gate: optional [T, Hq, D] (a strided view is fine): returns o * sigmoid(gate), in the
    kernel's epilogue, or from switches.gate_apart_from_tokens tokens by `sigmoid_gate` afterwards.
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
    gate_apart = gate if gate is not None and T >= switches.gate_apart_from_tokens else None
    if gate_apart is not None:
        gate = None
    G = Hq // Hkv
    GP = triton.next_power_of_2(G)
    if GP > 64:
        raise KernelError(f"k: a group of {G} query heads per KV head is larger than the 64 rows of a tile")
    g = gate if gate is not None else out  # never read when HAS_GATE is False
    BLOCK_D = max(16, triton.next_power_of_2(D))
    forced = switches.forced("flash_attention_kernel")  # a config forced by a test or a timing script
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
