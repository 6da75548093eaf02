"""Gated DeltaNet: l2norm, the gates, and the gated delta rule in its recurrent (decode) and chunked (prefill) forms.

Shapes (batch 1, token-major): T tokens; q, k [T, Hk, Dk]; v [T, Hv, Dv] with Hv a multiple of Hk (value head
h reads q/k head h // (Hv / Hk)); g, beta [T, Hv] fp32; state S [Hv, Dk, Dv] fp32, updated in place.
Qwen3.5-0.8B: Hk = Hv = 16, Dk = Dv = 128. q, k, v may be strided views of the conv output (any strides on
the leading dims, stride 1 on the last).

Gates (fp32):   g = -exp(A_log) * softplus(a + dt_bias)  (the log of a decay in (0, 1]),   beta = sigmoid(b)

The delta rule, per value head, one token at a time (q, k l2-normalised, q also scaled by Dk^-1/2):

    S <- exp(g_t) S                            forget a little of everything
    S <- S + k_t (x) beta_t (v_t - S^T k_t)    move the value stored under key k_t towards v_t
    o_t = S^T q_t                              read the memory with q_t

S^T k_t is what the memory currently returns for k_t, so each step is one step of online regression of v on
k with learning rate beta_t: the "delta" (v_t - S^T k_t) is the prediction error.

Recurrent kernel (decode): one program per (value head, block of BV value columns) keeps its [Dk, BV] slice
of S in registers for the T tokens and writes it back once. The columns of S are independent (every
update above acts on each column alone), so the programs need no communication.

Decode with the conv fused in (`deltanet_conv_decode_step`): the same grid and the same step, each program
first computing the causal conv + SiLU (see kernels/conv1d.py) of the q, k and v channels it reads, straight
from the in-projection output and the carried conv state [2 Hk Dk + Hv Dv, W-1], which it shifts in place.
The q/k channels of a key head are read by several programs; the last of them to finish reading (an atomic
ticket) writes their shifted state. One launch per DeltaNet layer and token instead of two.

Chunked form (prefill): cut the T tokens into chunks of C = 64; inside a chunk let G_i = g_1 + ... + g_i
(cumulative log decay from the chunk start) and S0 the state entering the chunk. Unrolling the recurrence,
the values written at the C steps solve one unit lower-triangular system (the UT transform):

    A = I + strict_tril( (beta k) k^T * exp(G_i - G_j) )          [C, C]
    U = A^-1 (beta v)           W = A^-1 (beta k exp(G))          (UT transform)
    V' = U - W S0                                                  (what S0 does not already predict)
    O  = (q exp(G)) S0 + ( tril(q k^T * exp(G_i - G_j)) ) V'       (old state read + intra-chunk part)
    S1 = exp(G_C) S0 + (k exp(G_C - G))^T V'

Everything but the last three lines is independent of S0, so it runs in parallel over (chunk, head); only
the state update is sequential, one matmul-sized step per chunk instead of per token.

Chunked kernels (two launches; on a GPU, heads narrower than CHUNKED_MIN_HEAD_DIM take the recurrent kernel):
- `chunk_prep_kernel`, grid (Hv, chunks), heads fastest (its programs start chunk by chunk): G, what the scan
  reads (q exp(G), k exp(G_C - G), the intra-chunk attention tril(q k^T exp(G_i - G_j))), and the UT transform
  U, W. A^-1 is built by doubling: the 2 x 2 diagonal blocks of I + L are inverted exactly (I - L there), then
  neighbouring blocks are merged while their size doubles (2 -> 4 -> ... -> 64):
  [[P, 0], [M, Q]]^-1 = [[P^-1, 0], [-Q^-1 M P^-1, Q^-1]], two matmuls per merge. Results go to a workspace
  [Hv, T padded, .].
- `chunk_scan_kernel`, grid (Hv, Dv / BV): carries its [Dk, BV] slice of S through the chunks in order
  (V', O and S1 above: four matmuls per chunk), writes O, and the final state in place. Under programmatic
  dependent launch it starts once the prep's programs have started, not once they have finished: each prep
  program adds its chunk to a counter per head and group of SCAN_GROUP chunks (a release, after a barrier), and
  the scan polls that counter (an acquire) before each group, so it runs beside the prep. The last scan program
  of a head clears its counters, which live in a small zeroed buffer kept per device. With PREP_PERSISTENT (on a
  GPU under PDL) the prep runs as a fixed number of programs, all resident at once, that leave an SM slot for
  each scan program: the scan is then placed at once, beside the whole prep rather than its last programs.
The tail of the last chunk is padded with k = v = 0, beta = 0 and g = 0, so it changes neither O nor S.
`deltanet_chunked` (the model's prefill) passes the raw projections a, b instead of g, beta: the prep computes the
gates of its rows itself (FUSED_GATES), and no gates kernel runs before it.

Precision: norms, gates, decays, the triangular solve and the state stay fp32. On the GPU the matmul
operands are in the model's 16-bit dtype (bf16, or fp16 below sm_80) with fp32 accumulation, as in
flash-linear-attention (the inverse's merges then use tf32; an fp32 model multiplies in exact fp32); under the
interpreter everything is fp32. Configurations on the GPU: the recurrent kernel and the prep as a grid are
autotuned by Triton (the state is restored between trials); the chunk scan and the fused conv + decode step are
picked by `_pick_in_place`, each config timed as the model launches it, in a CUDA Graph, and kept by
`qwen_lab.tunings` (Triton's autotuner with QWEN_LAB_TUNE=0 or inside a capture); the persistent prep always runs
its 4-warp config. Under the interpreter the launchers pass one small fixed configuration. `force_config` runs
one chosen GPU config instead, in either mode: the tests run every GPU config through the interpreter.
"""

from __future__ import annotations

import contextlib
from collections import namedtuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .. import runtime, tunings
from ..errors import KernelError
from . import device_key, dot_precision, gemm, graph_time_us, pdl_options, tensor_core_dots, uncounted

EPS = 1e-6  # l2norm epsilon of q and k inside the delta rule (as in the reference and transformers)
INTERPRET = runtime.interpreter_active()  # fixed at import: the kernels below are defined for one mode
# Below this head dim the chunked kernels are not used on a GPU (see delta_rule_chunked).
CHUNKED_MIN_HEAD_DIM = 64
# The scan waits for the prep once per this many chunks (see chunk_scan_kernel)
SCAN_GROUP = 8
# Under PDL the scan is launched beside the prep's last programs; False launches it after the whole prep (the
# form before, kept for benchmarks/probe_scan_overlap.py)
SCAN_BESIDE_PREP = True
# Under PDL the prep runs as a fixed number of programs that walk the (head, chunk) items (see chunk_prep_kernel),
# as many as leave one SM slot per scan program: the scan is then placed at once and runs beside the whole prep,
# instead of waiting for SM room until the prep's last wave. On the H200 a DeltaNet layer at 2048 tokens took
# 84.8 us against 91.0 with the grid (benchmarks/probe_prep_persistent.py, docs/perf-log.md, 2026-12-02). False:
# the grid (Hv, chunks); an int sets the number of programs (tests).
PREP_PERSISTENT: bool | int = True
# Programs of chunk_prep_kernel per SM at its 4-warp config: 255 registers x 128 threads each, two fill the 64K
# registers of an SM (sm_90, tests/sm90_compile.py); 32 KB of shared memory each, so one prep program and one scan
# program (up to 188 KB) share an SM's 228 KB.
PREP_PROGRAMS_PER_SM = 2
# A prep program spends about as long on one (head, chunk) item as the scan on this many chunk steps (on the H200,
# ~19 us at two programs per SM against ~2 us a step): the persistent prep keeps ahead of the scan with at least
# this many programs per value head.
PREP_ITEM_SCAN_STEPS = 10


_CONFIGS = {}   # kernel name -> (its GPU autotuning configs, their pruning function)
_KEYS = {}      # kernel name -> the arguments whose values key the GPU autotuner's cache
_RESTORED = {}  # kernel name -> the arguments the GPU autotuner puts back after each timing run
_FORCED = {}    # kernel name -> the triton.Config every launch uses instead (see force_config)


def _tuned(configs, key, restore=(), prune=None):
    """triton.autotune on a GPU; under the interpreter the launcher passes one small fixed config instead."""
    def wrap(fn):
        _CONFIGS[fn.fn.__name__] = (configs, prune)
        _KEYS[fn.fn.__name__] = tuple(key)
        _RESTORED[fn.fn.__name__] = tuple(restore)
        if INTERPRET:
            return fn
        return tunings.stored(triton.autotune(configs=configs, key=key, restore_value=list(restore),
                                              prune_configs_by={"early_config_prune": prune} if prune else None)(fn))
    return wrap


def autotune_configs(kernel: str, **named_args) -> list:
    """The configs the GPU autotuner tries for `kernel` (a name, e.g. "chunk_scan_kernel") on arguments like
    `named_args` (those its pruning reads, e.g. Dv=128): the configs `force_config` can run one by one."""
    configs, prune = _CONFIGS[kernel]
    return list(prune(configs, named_args) if prune else configs)


@contextlib.contextmanager
def force_config(kernel: str, config: "triton.Config"):
    """Launch `kernel` with this one config (meta-parameters, num_warps, num_stages), bypassing the autotuner
    on a GPU and the small fixed config under the interpreter. Tests use it to run every GPU config through
    the interpreter, where a config that indexes out of bounds shows up on the CPU."""
    if kernel not in _CONFIGS:
        raise KernelError(f"force_config: {kernel!r} is not an autotuned kernel; expected one of {sorted(_CONFIGS)}")
    previous = _FORCED.get(kernel)
    _FORCED[kernel] = config
    try:
        yield
    finally:
        if previous is None:
            del _FORCED[kernel]
        else:
            _FORCED[kernel] = previous


def _launch(kernel, grid, args, kwargs, interpreter_meta, untuned: "triton.Config | None" = None):
    """kernel[grid](*args, **kwargs) plus the meta-parameters of this mode: the autotuner's on a GPU,
    `interpreter_meta` under the interpreter, or the config of `force_config` in either. `untuned`: a config to
    run in place of the autotuner's (and of `interpreter_meta`), where the launch depends on it; `force_config`
    still wins."""
    fn = kernel.fn if isinstance(kernel, triton.runtime.Autotuner) else kernel
    config = _FORCED.get(fn.fn.__name__, untuned)
    if config is not None:
        meta = dict(config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
        if callable(grid):
            grid = grid(meta)
        return fn[grid](*args, **kwargs, **meta)  # the kernel itself: an autotuner would refuse BV=...
    return kernel[grid](*args, **kwargs, **(interpreter_meta if INTERPRET else {}))


# ---------------------------------------------------------------- small pieces


@triton.jit
def _softplus(x):
    # torch's softplus: x above the threshold 20, else log(1 + e^x); for tiny e^x, log(1 + e) loses e's low
    # bits in fp32, and e - e^2/2 is exact to fp32 there.
    e = tl.exp(tl.minimum(x, 20.0))
    sp = tl.where(e < 1e-4, e * (1.0 - 0.5 * e), tl.log(1.0 + e))
    return tl.where(x > 20.0, x, sp)


@triton.jit
def l2norm_kernel(x_ptr, out_ptr, N0, N1, D, stride_x0, stride_x1, stride_o0, stride_o1, eps,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    # rows r = i0 * N1 + i1 of x [N0, N1, D]; one [BLOCK_R, BLOCK_D] tile holds whole rows
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    i0 = (r // N1).to(tl.int64)
    i1 = r % N1
    offs_d = tl.arange(0, BLOCK_D)
    mask = (r < N0 * N1)[:, None] & (offs_d < D)[None, :]
    x = tl.load(x_ptr + (i0 * stride_x0 + i1 * stride_x1)[:, None] + offs_d[None, :], mask=mask, other=0.0)
    x = x.to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, 1) + eps)[:, None]
    tl.store(out_ptr + (i0 * stride_o0 + i1 * stride_o1)[:, None] + offs_d[None, :],
             y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def deltanet_gates_kernel(a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, T, H,
                          stride_at, stride_bt, stride_gt, stride_betat,
                          BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    offs_t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    mask = (offs_t < T)[:, None] & mask_h[None, :]
    a = tl.load(a_ptr + offs_t[:, None] * stride_at + offs_h[None, :], mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs_t[:, None] * stride_bt + offs_h[None, :], mask=mask, other=0.0).to(tl.float32)
    neg_A = -tl.exp(tl.load(A_log_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + offs_h, mask=mask_h, other=0.0).to(tl.float32)
    g = neg_A[None, :] * _softplus(a + dt_bias[None, :])
    tl.store(g_ptr + offs_t[:, None] * stride_gt + offs_h[None, :], g, mask=mask)
    tl.store(beta_ptr + offs_t[:, None] * stride_betat + offs_h[None, :], tl.sigmoid(b), mask=mask)


# ---------------------------------------------------------------- recurrent form (decode)


# (BV, warps): decode is latency-bound, so these trade programs (Hv * Dv / BV) against work per program
_RECURRENT_CONFIGS = [triton.Config({"BV": bv}, num_warps=w, num_stages=1)
                      for bv, w in ((8, 1), (16, 2), (16, 4), (32, 4))]


def _prune_bv(configs, named_args, **kwargs):
    width = max(8, triton.next_power_of_2(named_args["Dv"]))
    kept = [c for c in configs if c.kwargs["BV"] <= width]
    return kept or configs[:1]


# T_CLASS (1: decode, 2: a few tokens, 3: long) only separates the tuning of decode from longer calls
@_tuned(_RECURRENT_CONFIGS, key=["Dk", "Dv", "Hv", "T_CLASS", "FUSED_GATES"], restore=("state_ptr",),
        prune=_prune_bv)
@triton.jit
def delta_rule_recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, state_ptr, out_ptr,
                                T, T_CLASS, Hv, Dk, Dv, REP, scale, eps,
                                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                                stride_gt, stride_gh, stride_bt, stride_bh,
                                stride_sh, stride_sk, stride_ot, stride_oh,
                                FUSED_GATES: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    h = tl.program_id(0)
    hk = h // REP
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    mask_k = offs_k < Dk
    mask_v = offs_v < Dv
    s_ptrs = state_ptr + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    s_mask = mask_k[:, None] & mask_v[None, :]
    S = tl.load(s_ptrs, mask=s_mask, other=0.0)
    if FUSED_GATES:
        neg_A = -tl.exp(tl.load(A_log_ptr + h).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    # the loop body is written inline (but for the gates' softplus): the interpreter pays milliseconds for every
    # call of a jit helper
    for t in range(T):
        tt = tl.cast(t, tl.int64)
        q = tl.load(q_ptr + tt * stride_qt + hk * stride_qh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + tt * stride_kt + hk * stride_kh + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + tt * stride_vt + h * stride_vh + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        # every program holds the whole q and k row, so it normalises them itself (Dk values: cheap)
        q = q * (tl.rsqrt(tl.sum(q * q, 0) + eps) * scale)
        k = k * tl.rsqrt(tl.sum(k * k, 0) + eps)
        g = tl.load(g_ptr + tt * stride_gt + h * stride_gh).to(tl.float32)
        beta = tl.load(beta_ptr + tt * stride_bt + h * stride_bh).to(tl.float32)
        if FUSED_GATES:  # g_ptr and beta_ptr hold the raw projections a and b
            g = neg_A * _softplus(g + dt_bias)
            beta = tl.sigmoid(beta)
        S = S * tl.exp(g)                                 # forget
        predicted = tl.sum(S * k[:, None], 0)             # S^T k: what the memory returns for k now
        S = S + k[:, None] * ((v - predicted) * beta)[None, :]
        o = tl.sum(S * q[:, None], 0)                     # read
        tl.store(out_ptr + tt * stride_ot + h * stride_oh + offs_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    tl.store(s_ptrs, S, mask=s_mask)


# ---------------------------------------------------------------- decode with the causal conv fused in
#
# At decode a Gated DeltaNet layer would launch causal_conv1d over its C = 2 Hk Dk + Hv Dv channels, then the
# decode step. conv_decode_step_kernel does both: a program (value head h, block of BV value columns) computes
# the conv + SiLU of exactly the channels it needs (the Dk q and Dk k channels of key head h // REP, its BV v
# channels) from the carried inputs conv_state [C, W-1] and this token's input, then the gates and the delta
# rule as delta_rule_recurrent_kernel does for one token.
#
# The conv state has to be shifted in place (drop the oldest input, append this one), and that is a write to
# the very entries the conv reads. Who writes what:
# - v channels: each is read by exactly one program, which writes it after its own reads (a barrier orders
#   the threads of the program).
# - q/k channels of key head hk: read by all R = REP * (Dv / BV) programs of the value heads sharing it (on
#   Qwen3.5-0.8B REP = 1 but Dv / BV = 4 to 16 column blocks). No fixed program can be the writer: CUDA does not
#   order the programs of a grid, so a fixed writer could shift the state before another reader has loaded
#   it, and every way of splitting the write among the readers overlaps what the others read (each reads the
#   whole row of a channel, and the shift rewrites all of it). So the LAST reader writes: after loading the
#   old state, each program takes a ticket (an atomic increment of tickets[hk], acquire-release, after a
#   barrier so the loads of all its threads are done); the program that draws ticket R - 1 knows that every
#   other reader has finished reading, stores the shifted q/k state and resets the counter to 0 for the next
#   launch. The counters live in a small int32 buffer kept per device (`_tickets`), zero between launches.
#   The alternative, one program per key head doing all its value heads and columns, needs no atomics but
#   runs Hk programs (16 on Qwen3.5-0.8B) on a GPU of 132 SMs.
#
# Under programmatic dependent launch (PDL) the kernel starts while the previous one (the in-projection) is
# still running, and only the weights may be read before its wait. A decode step of the model always has the
# in-projection between two steps of one layer, and that GEMV lets its dependents start only after its own wait,
# so the previous step's writes to the states are complete when this one starts: `state_settled=True` says so,
# and the two states (the step's largest loads) are then read before the wait, in the GEMV's shadow.


@_tuned(_RECURRENT_CONFIGS, key=["Dk", "Dv", "Hv", "W"], restore=("state_ptr", "conv_state_ptr"), prune=_prune_bv)
@triton.jit
def conv_decode_step_kernel(qkv_ptr, conv_w_ptr, conv_state_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr,
                            out_ptr, ticket_ptr, Hv, Dk, Dv, REP, KEY_DIM, scale, eps,
                            stride_cw, stride_cwj, stride_cs, stride_sh, stride_sk, stride_oh,
                            W: tl.constexpr, BW: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                            USE_PDL: tl.constexpr = False, STATE_SETTLED: tl.constexpr = False):
    h = tl.program_id(0)
    hk = h // REP
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    mask_k = offs_k < Dk
    mask_v = offs_v < Dv
    offs_w = tl.arange(0, BW)
    mask_w = offs_w < W - 1
    shift_w = offs_w + 1 < W - 1                 # columns whose new value is an old column (not the input)
    ch_q = hk * Dk + offs_k
    ch_k = KEY_DIM + hk * Dk + offs_k
    ch_v = 2 * KEY_DIM + h * Dv + offs_v
    m_qk = mask_k[:, None] & mask_w[None, :]
    m_v = mask_v[:, None] & mask_w[None, :]
    # the weights first: no kernel writes them, so under PDL they load while the previous kernel finishes
    w_q = tl.load(conv_w_ptr + ch_q[:, None] * stride_cw + offs_w[None, :] * stride_cwj, mask=m_qk,
                  other=0.0).to(tl.float32)
    w_k = tl.load(conv_w_ptr + ch_k[:, None] * stride_cw + offs_w[None, :] * stride_cwj, mask=m_qk,
                  other=0.0).to(tl.float32)
    w_v = tl.load(conv_w_ptr + ch_v[:, None] * stride_cw + offs_w[None, :] * stride_cwj, mask=m_v,
                  other=0.0).to(tl.float32)
    wl_q = tl.load(conv_w_ptr + ch_q * stride_cw + (W - 1) * stride_cwj, mask=mask_k, other=0.0).to(tl.float32)
    wl_k = tl.load(conv_w_ptr + ch_k * stride_cw + (W - 1) * stride_cwj, mask=mask_k, other=0.0).to(tl.float32)
    wl_v = tl.load(conv_w_ptr + ch_v * stride_cw + (W - 1) * stride_cwj, mask=mask_v, other=0.0).to(tl.float32)
    A_log = tl.load(A_log_ptr + h).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    if USE_PDL and not STATE_SETTLED:  # launched early (PDL): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # The recurrent state and the conv state: the largest loads, in flight while the rest is worked out. With
    # STATE_SETTLED the caller promises that the kernel launched just before this one neither writes them nor
    # lets this one start before its own wait (in the model: the layer's in-projection GEMV). The step that last
    # wrote them has then finished, and they are read before the wait, in the shadow of the in-projection.
    s_ptrs = state_ptr + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    s_mask = mask_k[:, None] & mask_v[None, :]
    S = tl.load(s_ptrs, mask=s_mask, other=0.0)
    # conv_state column j holds the input W-1-j steps back (oldest first) and meets weight column j; weight
    # column W-1 meets this step's input. The shifted state: column j <- column j + 1, the last <- the input.
    # Each channel's old state row [BW], and the same row read one column on (the shifted state's first W-2):
    old_q = tl.load(conv_state_ptr + ch_q[:, None] * stride_cs + offs_w[None, :], mask=m_qk, other=0.0)
    old_k = tl.load(conv_state_ptr + ch_k[:, None] * stride_cs + offs_w[None, :], mask=m_qk, other=0.0)
    old_v = tl.load(conv_state_ptr + ch_v[:, None] * stride_cs + offs_w[None, :], mask=m_v, other=0.0)
    nxt_q = tl.load(conv_state_ptr + ch_q[:, None] * stride_cs + 1 + offs_w[None, :],
                    mask=mask_k[:, None] & shift_w[None, :], other=0.0)
    nxt_k = tl.load(conv_state_ptr + ch_k[:, None] * stride_cs + 1 + offs_w[None, :],
                    mask=mask_k[:, None] & shift_w[None, :], other=0.0)
    nxt_v = tl.load(conv_state_ptr + ch_v[:, None] * stride_cs + 1 + offs_w[None, :],
                    mask=mask_v[:, None] & shift_w[None, :], other=0.0)
    if USE_PDL and STATE_SETTLED:  # this step's input comes from the in-projection: wait for it here
        gdc_wait()
        gdc_launch_dependents()
    x_q = tl.load(qkv_ptr + ch_q, mask=mask_k, other=0.0)
    x_k = tl.load(qkv_ptr + ch_k, mask=mask_k, other=0.0)
    x_v = tl.load(qkv_ptr + ch_v, mask=mask_v, other=0.0)
    a = tl.load(a_ptr + h).to(tl.float32)
    b = tl.load(b_ptr + h).to(tl.float32)
    # every thread's loads of the old conv state are done past this barrier: the writes below cannot overtake
    # them, and the ticket is drawn only once this whole program has read what it needs
    tl.debug_barrier()
    # q/k channels: the last of the R programs sharing key head hk to draw a ticket writes them (see above)
    ticket = tl.atomic_add(ticket_ptr + hk, 1, sem="acq_rel", scope="gpu")
    last = ticket == REP * tl.num_programs(1) - 1
    # v channels: read by this program only, so it shifts them itself. (Stored after the ticket: a store before it
    # would hold up the ticket's release until the store had reached memory.)
    new_v = tl.where(shift_w[None, :], nxt_v, x_v[:, None].to(nxt_v.dtype))
    tl.store(conv_state_ptr + ch_v[:, None] * stride_cs + offs_w[None, :], new_v, mask=m_v)

    # fp32 math; the conv output is rounded to the input dtype, as causal_conv1d returns it
    q = tl.sum(w_q * old_q.to(tl.float32), 1) + wl_q * x_q.to(tl.float32)
    k = tl.sum(w_k * old_k.to(tl.float32), 1) + wl_k * x_k.to(tl.float32)
    v = tl.sum(w_v * old_v.to(tl.float32), 1) + wl_v * x_v.to(tl.float32)
    IN_T = qkv_ptr.dtype.element_ty
    q = (q * tl.sigmoid(q)).to(IN_T).to(tl.float32)
    k = (k * tl.sigmoid(k)).to(IN_T).to(tl.float32)
    v = (v * tl.sigmoid(v)).to(IN_T).to(tl.float32)

    # ---- gates, l2norm and one step of the delta rule: delta_rule_recurrent_kernel's step, reassociated so that
    #      its five sums run side by side instead of as three rounds (norms, then S^T k, then S^T q). With
    #      d = exp(g), rq, rk the l2norm factors (rq with the scale) and q, k the raw vectors:
    #        S^T k_n = d rk (S^T k)     delta = beta (v - d rk S^T k)     S' = d S + rk k delta^T
    #        o = S'^T q_n = d rq (S^T q) + rk rq (k . q) delta
    #      (the same sums in another order: equal to the recurrent kernel within fp32 rounding)
    rq = tl.rsqrt(tl.sum(q * q, 0) + eps) * scale
    rk = tl.rsqrt(tl.sum(k * k, 0) + eps)
    kq = tl.sum(k * q, 0)
    Sk = tl.sum(S * k[:, None], 0)                    # S^T k and S^T q of the old state, together
    Sq = tl.sum(S * q[:, None], 0)
    d = tl.exp(-tl.exp(A_log) * _softplus(a + dt_bias))
    beta = tl.sigmoid(b)
    delta = (v - d * rk * Sk) * beta                  # the prediction error for the normalised key, scaled
    o = d * rq * Sq + (rk * rq * kq) * delta          # read (the updated memory, with the normalised query)
    tl.store(out_ptr + h * stride_oh + offs_v, o.to(out_ptr.dtype.element_ty), mask=mask_v)
    S = S * d + (k * rk)[:, None] * delta[None, :]    # forget, then write
    tl.store(s_ptrs, S, mask=s_mask)

    # ---- the last reader of key head hk's q/k channels shifts their state and resets the counter
    new_q = tl.where(shift_w[None, :], nxt_q, x_q[:, None].to(nxt_q.dtype))
    new_k = tl.where(shift_w[None, :], nxt_k, x_k[:, None].to(nxt_k.dtype))
    tl.store(conv_state_ptr + ch_q[:, None] * stride_cs + offs_w[None, :], new_q, mask=m_qk & last)
    tl.store(conv_state_ptr + ch_k[:, None] * stride_cs + offs_w[None, :], new_k, mask=m_qk & last)
    tl.store(ticket_ptr + hk, 0, mask=last)


# ---------------------------------------------------------------- chunked form (prefill)


@triton.jit
def _rows(ptr, rows, stride_t, col0, offs_d, mask_d, T):
    """x[rows, col0 + offs_d] as fp32, zero past T (the padded tail) and past the row width."""
    mask = (rows < T)[:, None] & mask_d[None, :]
    return tl.load(ptr + rows.to(tl.int64)[:, None] * stride_t + col0 + offs_d[None, :], mask=mask,
                   other=0.0).to(tl.float32)


@triton.jit
def _l2_rows(ptr, rows, stride_t, col0, offs_d, mask_d, T, eps):
    x = _rows(ptr, rows, stride_t, col0, offs_d, mask_d, T)
    return x * tl.rsqrt(tl.sum(x * x, 1) + eps)[:, None]


@triton.jit
def _vec(ptr, rows, stride_t, col, T):
    return tl.load(ptr + rows.to(tl.int64) * stride_t + col, mask=rows < T, other=0.0).to(tl.float32)


_PREP_CONFIGS = [triton.Config({}, num_warps=w, num_stages=1) for w in (4, 8)]   # the first: PREP_PERSISTENT's


def _prune_prep(configs, named_args, **kwargs):
    """Every config where Triton's products run on tensor cores; below sm_80 (a T4) the first alone. There each
    product is a loop of fp32 FMAs, and compiling this kernel for sm_75 took 224-270 s per config on a 2-core CPU
    (2.3 s for sm_90; docs/perf-log.md, 2026-12-03): a second config would double a learner's first prefill."""
    q = named_args.get("q_ptr")  # absent when a test or the offline compile asks for every config
    return configs if q is None or tensor_core_dots(q.device) else configs[:1]


# T and n_chunks are not specialised (see chunk_scan_kernel); N_CLASS is only the autotuner's key (chunk_class)
# ready_ptr restored: each of the autotuner's timing runs counts its chunks as ready. Left counted, they let the
# scan launched beside the real run (PDL) go on before that run has written its chunks, and the real run's own
# counts then land after the scan has cleared the counters, where they stay for the next call.
@_tuned(_PREP_CONFIGS, key=["Dk", "Dv", "BT", "BK", "BDV", "FUSED_GATES", "N_CLASS"], restore=("ready_ptr",),
        prune=_prune_prep)
@triton.jit(do_not_specialize=["T", "n_chunks", "N_CLASS"])
def chunk_prep_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
                      qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr, gcum_ptr, ready_ptr,
                      T, Tp, Dk, Dv, REP, Hv, n_chunks, N_CLASS, scale, eps,
                      stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                      stride_gt, stride_gh, stride_bt, stride_bh,
                      BT: tl.constexpr, BK: tl.constexpr, BDV: tl.constexpr, MERGES: tl.constexpr,
                      PREC: tl.constexpr, INV_PREC: tl.constexpr, GROUP: tl.constexpr,
                      FUSED_GATES: tl.constexpr = False, USE_PDL: tl.constexpr = False,
                      PERSIST: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    if PERSIST:
        # grid (P,): program p prepares the (head, chunk) items p, p + P, p + 2P, ... numbered heads fastest, so
        # the chunks still come out in the order the scan needs them. Every program is resident from the start,
        # so the dependent scan's programs are placed at once, in the room the P programs leave beside them.
        for item in range(tl.program_id(0), Hv * n_chunks, tl.num_programs(0)):
            _prep_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, qg_ptr, kd_ptr, w_ptr, u_ptr,
                        aqk_ptr, gcum_ptr, ready_ptr, item % Hv, item // Hv, T, Tp, Dk, Dv, REP, scale, eps,
                        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_gh,
                        stride_bt, stride_bh, BT, BK, BDV, MERGES, PREC, INV_PREC, GROUP, FUSED_GATES)
    else:
        # grid (Hv, chunks), heads fastest: the programs start chunk by chunk, in the order the scan needs them
        _prep_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, qg_ptr, kd_ptr, w_ptr, u_ptr,
                    aqk_ptr, gcum_ptr, ready_ptr, tl.program_id(0), tl.program_id(1), T, Tp, Dk, Dv, REP, scale, eps,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_gh,
                    stride_bt, stride_bh, BT, BK, BDV, MERGES, PREC, INV_PREC, GROUP, FUSED_GATES)


@triton.jit
def _prep_chunk(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr,
                gcum_ptr, ready_ptr, h, c, T, Tp, Dk, Dv, REP, scale, eps,
                stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_gh,
                stride_bt, stride_bh, BT: tl.constexpr, BK: tl.constexpr, BDV: tl.constexpr, MERGES: tl.constexpr,
                PREC: tl.constexpr, INV_PREC: tl.constexpr, GROUP: tl.constexpr, FUSED_GATES: tl.constexpr):
    """Chunk c of value head h: everything the scan reads of it, into the workspace, then counted as ready."""
    hk = h // REP
    rows_ws = h.to(tl.int64) * Tp + c * BT + tl.arange(0, BT)   # this chunk's rows of the workspace [Hv, Tp, .]
    DT = qg_ptr.dtype.element_ty                                 # the matmul operand dtype (the workspace's)
    i = tl.arange(0, BT)
    rows = c * BT + i
    offs_k = tl.arange(0, BK)
    mask_k = offs_k < Dk
    offs_v = tl.arange(0, BDV)
    mask_v = offs_v < Dv

    # ---- decays: G_i = g_1 + ... + g_i inside the chunk (g = 0 in the padded tail: the decay stops at T-1)
    g = _vec(g_ptr, rows, stride_gt, h * stride_gh, T)
    beta = _vec(beta_ptr, rows, stride_bt, h * stride_bh, T)
    if FUSED_GATES:  # g_ptr and beta_ptr hold the raw projections a and b: the gates of deltanet_gates, here
        neg_A = -tl.exp(tl.load(A_log_ptr + h).to(tl.float32))
        dt_bias = tl.load(dt_bias_ptr + h).to(tl.float32)
        g = tl.where(rows < T, neg_A * _softplus(g + dt_bias), 0.0)  # the padded tail keeps g = 0, beta = 0
        beta = tl.where(rows < T, tl.sigmoid(beta), 0.0)
    G = tl.cumsum(g, 0)
    G_last = tl.sum(tl.where(i == BT - 1, G, 0.0), 0)
    tl.store(gcum_ptr + rows_ws, G)
    causal = i[:, None] >= i[None, :]
    decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))  # exp(G_i - G_j), masked before exp

    # ---- what the scan reads: q exp(G), k exp(G_C - G), and the intra-chunk attention
    k_tile = rows_ws[:, None] * Dk + offs_k[None, :]
    k = _l2_rows(k_ptr, rows, stride_kt, hk * stride_kh, offs_k, mask_k, T, eps)
    tl.store(kd_ptr + k_tile, (k * tl.exp(G_last - G)[:, None]).to(DT), mask=mask_k[None, :])
    k = k.to(DT)  # from here on only a matmul operand: hold it in the narrow dtype
    q = _l2_rows(q_ptr, rows, stride_qt, hk * stride_qh, offs_k, mask_k, T, eps) * scale
    tl.store(qg_ptr + k_tile, (q * tl.exp(G)[:, None]).to(DT), mask=mask_k[None, :])
    qk = tl.dot(q.to(DT), tl.trans(k), input_precision=PREC)
    tl.store(aqk_ptr + rows_ws[:, None] * BT + i[None, :], tl.where(causal, qk * decay, 0.0).to(DT))

    # ---- A = I + L, L = strict_tril((beta k) k^T exp(G_i - G_j))
    kk = tl.dot((k.to(tl.float32) * beta[:, None]).to(DT), tl.trans(k), input_precision=PREC)
    L = tl.where(i[:, None] > i[None, :], kk * decay, 0.0)

    # ---- X = A^-1 by doubling: start from the inverses of the 2 x 2 diagonal blocks of A = I + L (exactly I - L
    #      there: one entry below the diagonal), then merge neighbouring blocks while their size doubles
    #      (2 -> 4 -> ... -> BT). For [[P, 0], [M, Q]] the inverse is [[P^-1, 0], [-Q^-1 M P^-1, Q^-1]], i.e.
    #      X <- X - X M X with M the link blocks of L: two [BT, BT] tensor-core products per level, MERGES levels.
    #      (Row-by-row forward substitution of 16 x 16 blocks was 15 dependent steps of small reductions, a third
    #      of this kernel's time; an error analysis of the doubling in tf32 is in docs/perf-log.md.)
    X = (i[:, None] == i[None, :]).to(tl.float32) - tl.where((i[:, None] == i[None, :] + 1) & (i[:, None] % 2 == 1),
                                                             L, 0.0)
    for level in tl.static_range(MERGES):
        s = 2 << level
        link = ((i // s) % 2 == 1)[:, None] & ((i[:, None] // s) == (i[None, :] // s) + 1)
        M = tl.where(link, L, 0.0)
        X = X - tl.dot(X, tl.dot(M, X, input_precision=INV_PREC), input_precision=INV_PREC)

    # ---- the UT transform: U = X (beta v), W = X (beta k exp(G))
    v = _rows(v_ptr, rows, stride_vt, h * stride_vh, offs_v, mask_v, T)
    X_op = X.to(DT)
    u = tl.dot(X_op, (v * beta[:, None]).to(DT), input_precision=PREC)
    tl.store(u_ptr + rows_ws[:, None] * Dv + offs_v[None, :], u.to(DT), mask=mask_v[None, :])
    w = tl.dot(X_op, (k.to(tl.float32) * (beta * tl.exp(G))[:, None]).to(DT), input_precision=PREC)
    tl.store(w_ptr + k_tile, w.to(DT), mask=mask_k[None, :])

    # ---- chunk c of head h is ready: count it in its group's counter, which the scan may already be polling
    #      (see chunk_scan_kernel). The barrier makes every thread's stores above happen before the one release
    #      that publishes them.
    tl.debug_barrier()
    tl.atomic_add(ready_ptr + h * (Tp // BT + 1) + 1 + c // GROUP, 1, sem="release", scope="gpu")


@triton.jit
def _scan_step(qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr, gcum_ptr, out_ptr, S, h, c, i, offs_k, offs_v, mask_k, mask_v,
               T, Tp, Dk, Dv, stride_ot, stride_oh, BT: tl.constexpr, PREC: tl.constexpr):
    """One chunk of the scan for head h and the value columns offs_v: writes chunk c's O, returns the state S
    leaving it (S: the [Dk, BV] fp32 slice entering it)."""
    ws = h.to(tl.int64) * Tp + c * BT + i                  # workspace rows of chunk c
    k_tile = ws[:, None] * Dk + offs_k[None, :]
    w = tl.load(w_ptr + k_tile, mask=mask_k[None, :], other=0.0)
    u = tl.load(u_ptr + ws[:, None] * Dv + offs_v[None, :], mask=mask_v[None, :], other=0.0).to(tl.float32)
    qg = tl.load(qg_ptr + k_tile, mask=mask_k[None, :], other=0.0)
    aqk = tl.load(aqk_ptr + ws[:, None] * BT + i[None, :])
    kd = tl.load(kd_ptr + k_tile, mask=mask_k[None, :], other=0.0)
    G_last = tl.load(gcum_ptr + h.to(tl.int64) * Tp + c * BT + BT - 1)
    S_op = S.to(w.dtype)
    v_new = u - tl.dot(w, S_op, input_precision=PREC)                 # V' = U - W S0
    o = tl.dot(qg, S_op, input_precision=PREC)                        # (q exp(G)) S0
    o = tl.dot(aqk, v_new.to(aqk.dtype), o, input_precision=PREC)     # + tril(q k^T exp(G_i - G_j)) V'
    rows = (c * BT + i).to(tl.int64)
    tl.store(out_ptr + rows[:, None] * stride_ot + h * stride_oh + offs_v[None, :],
             o.to(out_ptr.dtype.element_ty), mask=(rows < T)[:, None] & mask_v[None, :])
    # S1 = exp(G_C) S0 + (k exp(G_C - G))^T V'
    return tl.dot(tl.trans(kd), v_new.to(kd.dtype), S * tl.exp(G_last), input_precision=PREC)


# (BV, warps, stages): narrow BV gives more programs, wide BV reads each W, q, k tile fewer times
_SCAN_CONFIGS = [triton.Config({"BV": bv}, num_warps=w, num_stages=s)
                 for bv, w, s in ((16, 4, 2), (32, 4, 2), (32, 8, 2), (32, 4, 3), (64, 4, 2), (64, 8, 2))]


# Hv is in the key only: the best BV depends on how many programs Hv * Dv / BV fill the GPU
# T and n_chunks are not specialised. Triton turns an integer argument equal to 1 into a constant, so it
# compiled a separate scan for every prompt of at most 64 tokens (n_chunks == 1: the chunk loop is folded
# away and the loads, the transposed k tile and the dots are scheduled without the software pipeline) and for
# T == 1. Every failure seen on the H200 ran such a variant (a fault at T = 1, garbage at T = 64), while the
# looped kernel was right for 77, 300 and 2048 tokens; now every length runs the looped kernel.
# N_CLASS (chunk_class) is only the autotuner's key: one tuning per class of prompt length.
@_tuned(_SCAN_CONFIGS, key=["Hv", "Dk", "Dv", "BT", "BK", "N_CLASS"], restore=("state_ptr", "ready_ptr"),
        prune=_prune_bv)
@triton.jit(do_not_specialize=["T", "n_chunks", "N_CLASS"])
def chunk_scan_kernel(qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr, gcum_ptr, ready_ptr, state_ptr, out_ptr,
                      T, Tp, n_chunks, N_CLASS, Hv, Dk, Dv, stride_sh, stride_sk, stride_ot, stride_oh,
                      BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                      GROUP: tl.constexpr, USE_PDL: tl.constexpr = False):
    # Under PDL the scan starts once every prep program has started, not once they have all finished. So there
    # is no gdc_wait here (everything before the prep is complete by then: each prep program waited for it);
    # the scan waits for the prep's chunks through the `ready` counters instead, and runs beside the prep (its
    # last programs; all of it with PREP_PERSISTENT). Without PDL (and under the interpreter) the prep has
    # finished and the counters are already full.
    if USE_PDL:
        gdc_launch_dependents()
    h = tl.program_id(0)
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(1) * BV + tl.arange(0, BV)
    mask_k = offs_k < Dk
    mask_v = offs_v < Dv
    s_ptrs = state_ptr + h * stride_sh + offs_k[:, None] * stride_sk + offs_v[None, :]
    s_mask = mask_k[:, None] & mask_v[None, :]
    S = tl.load(s_ptrs, mask=s_mask, other=0.0)
    i = tl.arange(0, BT)
    counters = ready_ptr + h * (Tp // BT + 1)   # [programs done, chunks ready in group 0, in group 1, ...]
    for c0 in range(0, n_chunks, GROUP):
        c1 = tl.minimum(c0 + GROUP, n_chunks)
        # wait until the prep has published chunks c0 .. c1-1 (an acquire: their stores are visible after it)
        ready = tl.atomic_add(counters + 1 + c0 // GROUP, 0, sem="acquire", scope="gpu")
        while ready < c1 - c0:
            ready = tl.atomic_add(counters + 1 + c0 // GROUP, 0, sem="acquire", scope="gpu")
        # A group of chunks per wait: inside it the software pipeline (num_stages) loads the next chunks' tiles
        # while this chunk's matmuls run; only the step's state update depends on the previous chunk. (A wait
        # inside this loop would keep the pipeline from issuing any load before it.)
        for c in range(c0, c1):
            S = _scan_step(qg_ptr, kd_ptr, w_ptr, u_ptr, aqk_ptr, gcum_ptr, out_ptr, S, h, c, i, offs_k, offs_v,
                           mask_k, mask_v, T, Tp, Dk, Dv, stride_ot, stride_oh, BT, PREC)
    tl.store(s_ptrs, S, mask=s_mask)
    # the last of the head's Dv / BV programs to finish clears its counters for the next call (every program of
    # the head has passed every wait by then)
    done = tl.atomic_add(counters, 1, sem="relaxed", scope="gpu")
    last = done == tl.num_programs(1) - 1
    for g in range(0, tl.cdiv(n_chunks, GROUP) + 1):
        tl.store(counters + g, 0, mask=last)


# ---------------------------------------------------------------- launchers


def _shape(t):
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _check(name, t, ndim, what, device=None, dtype=None, float_only=True, any_strides=False):
    if not isinstance(t, torch.Tensor) or t.dim() != ndim:
        raise KernelError(f"{name}: expected a {ndim}-D tensor {what}, got {_shape(t)}")
    if float_only and not t.is_floating_point():
        raise KernelError(f"{name}: expected a floating-point tensor {what}, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise KernelError(f"{name}: dtype {t.dtype}, expected {dtype}")
    if device is not None and t.device != device:
        raise KernelError(f"{name}: on {t.device}, expected {device}")
    if not any_strides and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise KernelError(f"{name}: the last dim must be contiguous (stride 1), got strides {tuple(t.stride())}")


def _check_out(name, out, shape, dtype, device):
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    _check(name, out, len(shape), f"{list(shape)}", device=device, dtype=dtype)
    if tuple(out.shape) != tuple(shape):
        raise KernelError(f"{name}: shape {tuple(out.shape)}, expected {tuple(shape)}")
    return out


def _check_gate_params(A_log, dt_bias, Hv, device):
    """A_log and dt_bias must be [Hv] on `device` (Hv None: v itself was malformed, and its own check will say so)."""
    for name, p in (("A_log", A_log), ("dt_bias", dt_bias)):
        _check(name, p, 1, f"[Hv={Hv}]", device=device)
        if Hv is not None and p.shape[0] != Hv:
            raise KernelError(f"{name}: shape {tuple(p.shape)}, expected ({Hv},) (one per value head)")


def l2norm(x: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim, fp32 math; = reference.l2norm.

    x [D], [N, D] or [N0, N1, D] (any strides on the leading dims) -> same shape, x's dtype.
    """
    if not isinstance(x, torch.Tensor) or not 1 <= x.dim() <= 3:
        raise KernelError(f"x: expected a tensor [D], [N, D] or [N0, N1, D], got {_shape(x)}")
    _check("x", x, x.dim(), "[..., D]")
    out = _check_out("out", out, x.shape, x.dtype, x.device)
    x3, o3 = x, out
    while x3.dim() < 3:
        x3, o3 = x3.unsqueeze(0), o3.unsqueeze(0)
    N0, N1, D = x3.shape
    if x3.numel() == 0:
        return out
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_R = max(1, min(64 if INTERPRET else 16, 4096 // BLOCK_D, triton.next_power_of_2(N0 * N1)))
    grid = (triton.cdiv(N0 * N1, BLOCK_R),)
    l2norm_kernel[grid](x3, o3, N0, N1, D, x3.stride(0), x3.stride(1), o3.stride(0), o3.stride(1), float(eps),
                        BLOCK_R=BLOCK_R, BLOCK_D=BLOCK_D, num_warps=4)
    return out


def deltanet_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                   g_out: torch.Tensor | None = None, beta_out: torch.Tensor | None = None):
    """g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b), both fp32; = reference.deltanet_gates.

    a, b [T, Hv] (strided views allowed); A_log, dt_bias [Hv] -> (g [T, Hv], beta [T, Hv]).
    """
    _check("a", a, 2, "[T, Hv]")
    T, H = a.shape
    _check("b", b, 2, f"[T={T}, Hv={H}]", device=a.device)
    if tuple(b.shape) != (T, H):
        raise KernelError(f"b: shape {tuple(b.shape)}, expected {(T, H)} like a")
    _check_gate_params(A_log, dt_bias, H, a.device)
    g_out = _check_out("g_out", g_out, (T, H), torch.float32, a.device)
    beta_out = _check_out("beta_out", beta_out, (T, H), torch.float32, a.device)
    if T == 0 or H == 0:
        return g_out, beta_out
    BLOCK_H = triton.next_power_of_2(H)
    BLOCK_T = max(1, min(64, 2048 // BLOCK_H, triton.next_power_of_2(T)))
    grid = (triton.cdiv(T, BLOCK_T),)
    deltanet_gates_kernel[grid](a, b, A_log, dt_bias, g_out, beta_out, T, H,
                                a.stride(0), b.stride(0), g_out.stride(0), beta_out.stride(0),
                                BLOCK_T=BLOCK_T, BLOCK_H=BLOCK_H, num_warps=4)
    return g_out, beta_out


def _check_delta(q, k, v, g, beta, state, gate_names=("g", "beta")):
    """Validate the delta rule's inputs; -> (T, Hk, Dk, Hv, Dv)."""
    _check("q", q, 3, "[T, Hk, Dk]")
    T, Hk, Dk = q.shape
    dev = q.device
    _check("k", k, 3, f"[T={T}, Hk={Hk}, Dk={Dk}] like q", device=dev, dtype=q.dtype)
    if tuple(k.shape) != (T, Hk, Dk):
        raise KernelError(f"k: shape {tuple(k.shape)}, expected {(T, Hk, Dk)} like q")
    _check("v", v, 3, f"[T={T}, Hv, Dv]", device=dev, dtype=q.dtype)
    if v.shape[0] != T:
        raise KernelError(f"v: {v.shape[0]} tokens, expected {T} like q")
    Hv, Dv = v.shape[1], v.shape[2]
    if Hk == 0 or Hv % Hk:
        raise KernelError(f"v: {Hv} value heads, expected a multiple of the {Hk} q/k heads")
    for name, t in zip(gate_names, (g, beta)):
        _check(name, t, 2, f"[T={T}, Hv={Hv}]", device=dev, float_only=True)
        if tuple(t.shape) != (T, Hv):
            raise KernelError(f"{name}: shape {tuple(t.shape)}, expected {(T, Hv)}")
    _check("state", state, 3, f"[Hv={Hv}, Dk={Dk}, Dv={Dv}] float32", device=dev, dtype=torch.float32)
    if tuple(state.shape) != (Hv, Dk, Dv):
        raise KernelError(f"state: shape {tuple(state.shape)}, expected {(Hv, Dk, Dv)} = [Hv, Dk, Dv]")
    if Dk > 256 or Dv > 256:
        raise KernelError(f"head dims Dk={Dk}, Dv={Dv}: the kernels hold a whole head row, up to 256")
    return T, Hk, Dk, Hv, Dv


def _recurrent_launch(q, k, v, g, beta, A_log, dt_bias, state, scale, out, fused):
    T, Hk, Dk, Hv, Dv = _check_delta(q, k, v, g, beta, state, ("a", "b") if fused else ("g", "beta"))
    out = _check_out("out", out, (T, Hv, Dv), v.dtype, v.device)
    if T == 0:
        return out
    scale = Dk ** -0.5 if scale is None else float(scale)
    BK = triton.next_power_of_2(Dk)
    grid = lambda META: (Hv, triton.cdiv(Dv, META["BV"]))  # noqa: E731
    _launch(delta_rule_recurrent_kernel, grid, (
        q, k, v, g, beta, A_log, dt_bias, state, out, T, 1 if T == 1 else (2 if T <= 64 else 3),
        Hv, Dk, Dv, Hv // Hk, scale, EPS,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        state.stride(0), state.stride(1), out.stride(0), out.stride(1)),
        dict(FUSED_GATES=fused, BK=BK), dict(BV=min(32, triton.next_power_of_2(Dv)), num_warps=4))
    return out


def delta_rule_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                         state: torch.Tensor, scale: float | None = None,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """The gated delta rule token by token (decode form); = reference.delta_rule_recurrent.

    q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv]; state [Hv, Dk, Dv] fp32, updated in place.
    l2norm of q and k and the q scale (Dk^-0.5 unless given) happen inside. -> o [T, Hv, Dv] in v's dtype.
    """
    return _recurrent_launch(q, k, v, g, beta, g, g, state, scale, out, fused=False)


def deltanet_decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                         A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor,
                         scale: float | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """deltanet_gates and delta_rule_recurrent in one launch: the gates are computed inside the recurrence.

    a, b [T, Hv] are the raw gate projections (strided views allowed); A_log, dt_bias [Hv]. Same result as
    `delta_rule_recurrent(q, k, v, *reference.deltanet_gates(a, b, A_log, dt_bias), state, scale)`.
    """
    Hv = v.shape[1] if isinstance(v, torch.Tensor) and v.dim() == 3 else None
    _check_gate_params(A_log, dt_bias, Hv, getattr(q, "device", None))
    return _recurrent_launch(q, k, v, a, b, A_log, dt_bias, state, scale, out, fused=True)


_TICKETS: dict = {}  # device -> int32 counters (conv_decode_step_kernel, chunk_scan_kernel), zero between launches
_TICKETS_KEPT: list = []  # buffers outgrown, which a captured graph may still read


def _tickets(device, n: int) -> torch.Tensor:
    """At least n zeroed int32 counters on `device`, allocated once (each launch leaves them at zero again): the
    tickets of the fused decode step and the chunk scan's `ready` counters, which never run at the same time.

    Allocated on the first call, which must not be inside a CUDA Graph capture: memory allocated there would
    belong to the graph's pool (graph.capture warms every kernel up outside the capture first). A longer prompt
    may need a bigger buffer later; the smaller one is kept, since a captured graph may still use it. The
    counters are shared by every launch on the device, so two DeltaNet layers must not run concurrently on two
    streams.
    """
    key = device_key(device)
    buf = _TICKETS.get(key)
    if buf is None or buf.numel() < n:
        if key.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelError("deltanet: its counters are allocated on the first call of a length, which must come "
                              "before CUDA Graph capture (run the call once to warm it up)")
        if buf is not None:
            _TICKETS_KEPT.append(buf)
        # never an inference tensor (as one made by a first call under torch.inference_mode() would be): the scan's
        # autotuner restores the counters with copy_, which PyTorch refuses on such a tensor outside that mode
        with torch.inference_mode(False):
            buf = _TICKETS[key] = torch.zeros(max(n, 4096), dtype=torch.int32, device=key)
    return buf


def deltanet_conv_decode_step(qkv: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor,
                              a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                              state: torch.Tensor, num_k_heads: int, head_k_dim: int, num_v_heads: int,
                              head_v_dim: int, scale: float | None = None,
                              out: torch.Tensor | None = None, state_settled: bool = False) -> torch.Tensor:
    """causal_conv1d and deltanet_decode_step of one decode token in one launch; = reference.deltanet_conv_decode_step.

    qkv [1, C] with C = 2 Hk Dk + Hv Dv (q | k | v channels before the conv; a strided slice allowed), conv_weight
    [C, W] (any strides: the model's is a view of [W, C] storage), conv_state [C, W-1] (updated in place),
    a, b [1, Hv], A_log, dt_bias [Hv], state [Hv, Dk, Dv] fp32
    (updated in place). -> o [1, Hv, Dv] in qkv's dtype.

    state_settled=True: the caller promises that the kernel launched just before this one writes neither state and
    is one of the library's kernels (which let the next kernel start only after their own PDL wait), so the
    states may be read before this kernel's wait. True in the model's decode step (the in-projection comes
    between two steps of a layer); two steps launched back to back must leave it False.
    """
    Hk, Dk, Hv, Dv = num_k_heads, head_k_dim, num_v_heads, head_v_dim
    for name, n in (("num_k_heads", Hk), ("head_k_dim", Dk), ("num_v_heads", Hv), ("head_v_dim", Dv)):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise KernelError(f"{name}={n!r}: expected a positive int")
    if Hv % Hk:
        raise KernelError(f"num_v_heads={Hv}: expected a multiple of num_k_heads={Hk}")
    if Dk > 256 or Dv > 256:
        raise KernelError(f"head dims Dk={Dk}, Dv={Dv}: the kernel holds a whole head row, up to 256")
    C = 2 * Hk * Dk + Hv * Dv
    _check("qkv", qkv, 2, f"[1, C={C}] (2 Hk Dk + Hv Dv channels)")
    if tuple(qkv.shape) != (1, C):
        raise KernelError(f"qkv: shape {tuple(qkv.shape)}, expected (1, {C}): one token of 2*{Hk}*{Dk} + {Hv}*{Dv} "
                          f"channels (a decode step)")
    dev = qkv.device
    _check("conv_weight", conv_weight, 2, f"[C={C}, W]", device=dev, any_strides=True)  # the model's: [W, C] storage
    W = conv_weight.shape[1]
    if conv_weight.shape[0] != C or W < 1:
        raise KernelError(f"conv_weight: shape {tuple(conv_weight.shape)}, expected ({C}, W) with W >= 1")
    _check("conv_state", conv_state, 2, f"[C={C}, W-1={W - 1}]", device=dev)
    if tuple(conv_state.shape) != (C, W - 1):
        raise KernelError(f"conv_state: shape {tuple(conv_state.shape)}, expected ({C}, {W - 1}) = [C, W-1] "
                          f"(the last W-1 inputs of every channel)")
    for name, t in (("a", a), ("b", b)):
        _check(name, t, 2, f"[1, Hv={Hv}]", device=dev)
        if tuple(t.shape) != (1, Hv):
            raise KernelError(f"{name}: shape {tuple(t.shape)}, expected (1, {Hv})")
    _check_gate_params(A_log, dt_bias, Hv, dev)
    _check("state", state, 3, f"[Hv={Hv}, Dk={Dk}, Dv={Dv}] float32", device=dev, dtype=torch.float32)
    if tuple(state.shape) != (Hv, Dk, Dv):
        raise KernelError(f"state: shape {tuple(state.shape)}, expected {(Hv, Dk, Dv)} = [Hv, Dk, Dv]")
    out = _check_out("out", out, (1, Hv, Dv), qkv.dtype, dev)
    scale = Dk ** -0.5 if scale is None else float(scale)
    tickets = _tickets(dev, Hk)
    grid = lambda META: (Hv, triton.cdiv(Dv, META["BV"]))  # noqa: E731
    args = (qkv, conv_weight, conv_state, a, b, A_log, dt_bias, state, out, tickets,
            Hv, Dk, Dv, Hv // Hk, Hk * Dk, scale, EPS,
            conv_weight.stride(0), conv_weight.stride(1), conv_state.stride(0), state.stride(0), state.stride(1),
            out.stride(1))
    meta = dict(W=W, BW=triton.next_power_of_2(max(W - 1, 1)), BK=triton.next_power_of_2(Dk),
                STATE_SETTLED=bool(state_settled), **pdl_options(dev))

    def launch(config=None):
        _launch(conv_decode_step_kernel, grid, args, meta, dict(BV=min(32, triton.next_power_of_2(Dv)), num_warps=4),
                untuned=config)

    # the config, timed on the first call of this kind in a graph of 16 back-to-back steps (the step takes ~4 us:
    # fewer would time mostly the graph's own launch); the tickets reset themselves, the two states are put back
    key = (device_key(dev), qkv.dtype, Hk, Dk, Hv, Dv, W, bool(state_settled), bool(meta.get("USE_PDL")))
    launch(_pick_in_place("conv_decode_step_kernel", key, launch, (state, conv_state),
                          not INTERPRET and dev.type == "cuda", calls=16, Dv=Dv))
    return out


ChunkWorkspace = namedtuple("ChunkWorkspace", "qg kd w u aqk gcum")
ChunkWorkspace.__doc__ = """Scratch of delta_rule_chunked for T tokens padded to Tp = chunks * C:
qg, kd, w [Hv, Tp, Dk], u [Hv, Tp, Dv], aqk [Hv, Tp, C] in the matmul dtype; gcum [Hv, Tp] fp32."""


def _workspace_dtype(dtype: torch.dtype) -> torch.dtype:
    # the interpreter computes bf16 tl.dot wrongly, so it always works in fp32
    return dtype if dtype in (torch.bfloat16, torch.float16) and not INTERPRET else torch.float32


def chunk_workspace(T: int, Hv: int, Dk: int, Dv: int, dtype: torch.dtype, device, chunk_size: int = 64):
    """Allocate the scratch of delta_rule_chunked (pass it as `workspace=` to allocate nothing per call)."""
    Tp = triton.cdiv(max(T, 1), chunk_size) * chunk_size
    dt = _workspace_dtype(dtype)
    e = dict(device=device, dtype=dt)
    return ChunkWorkspace(torch.empty(Hv, Tp, Dk, **e), torch.empty(Hv, Tp, Dk, **e), torch.empty(Hv, Tp, Dk, **e),
                          torch.empty(Hv, Tp, Dv, **e), torch.empty(Hv, Tp, chunk_size, **e),
                          torch.empty(Hv, Tp, device=device, dtype=torch.float32))


def delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       state: torch.Tensor, scale: float | None = None, chunk_size: int = 64,
                       out: torch.Tensor | None = None, workspace: ChunkWorkspace | None = None) -> torch.Tensor:
    """The gated delta rule chunk by chunk (prefill form); = reference.delta_rule_chunked.

    Same arguments and result as `delta_rule_recurrent` (state [Hv, Dk, Dv] fp32 read as the initial state and
    overwritten with the final one); chunk_size 64 or 128. Two launches: the parallel intra-chunk work, then
    the sequential scan over chunks. On a GPU a head dim below CHUNKED_MIN_HEAD_DIM (test models only) runs the
    recurrent kernel instead, one launch, the same function.
    """
    return _chunked_launch(q, k, v, g, beta, g, g, state, scale, chunk_size, out, workspace, fused=False)


def deltanet_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, scale: float | None = None,
                     chunk_size: int = 64, out: torch.Tensor | None = None,
                     workspace: ChunkWorkspace | None = None) -> torch.Tensor:
    """deltanet_gates and delta_rule_chunked in two launches instead of three: the chunk prep computes the gates of
    its rows from the raw projections; = reference.deltanet_chunked. (A head dim below CHUNKED_MIN_HEAD_DIM on a
    GPU: the recurrent kernel with the gates inside, one launch.)

    a, b [T, Hv] (strided views allowed); A_log, dt_bias [Hv]; the rest as in `delta_rule_chunked`.
    """
    Hv = v.shape[1] if isinstance(v, torch.Tensor) and v.dim() == 3 else None
    _check_gate_params(A_log, dt_bias, Hv, getattr(q, "device", None))
    return _chunked_launch(q, k, v, a, b, A_log, dt_bias, state, scale, chunk_size, out, workspace, fused=True)


def chunk_class(n_chunks: int) -> int:
    """The chunked kernels' autotuning class of a prompt of `n_chunks` chunks: the count rounded up to a power of
    two. The scan's best block of value columns depends on the length of its chain (a one-chunk prompt is all
    latency, 32 chunks are mostly products), so a tuning made on a short prompt must not serve a long one. On the
    H200, 2048 tokens with the pick tuned on 150 took 90.5 us per layer against 84.6 with their own; notebook 09,
    whose checks run 133-150 tokens first, timed 127 us per layer before the class was keyed, 85 after
    (docs/perf-log.md, 2026-12-03)."""
    return triton.next_power_of_2(max(1, int(n_chunks)))


def _prep_programs(Hv: int, n_chunks: int, Dv: int, device) -> int | None:
    """The persistent prep's number of programs (PREP_PERSISTENT), or None for the grid (Hv, chunks).

    On a GPU it only pays where the scan is launched beside the prep (PDL): every SM slot but one per program of a
    BV = 32 scan (a 16-column scan has twice the programs and waits for room), never more programs than items. With
    P programs the prep publishes P / Hv chunks of every head per PREP_ITEM_SCAN_STEPS scan steps; where that is
    less than one chunk per step (the larger Qwen3.5s' 32 or 48 value heads leave 136 or 72 programs), the scan
    would wait on the prep, which then runs at a fraction of the grid's rate: the grid again. (Measured on an H200
    at 2048 tokens, benchmarks/probe_prep_heads.py: 85 us per layer against the grid's 91 at 16 value heads, 158
    against 128 at 32, 363 against 190 at 48.)"""
    if PREP_PERSISTENT is False:
        return None
    items = Hv * n_chunks
    if PREP_PERSISTENT is True:
        if INTERPRET or not (SCAN_BESIDE_PREP and pdl_options(device)):
            return None
        programs = PREP_PROGRAMS_PER_SM * gemm.sm_count(device) - Hv * triton.cdiv(Dv, 32)
        return min(items, programs) if programs >= PREP_ITEM_SCAN_STEPS * Hv else None
    return max(1, min(items, int(PREP_PERSISTENT)))


# Configs picked by their launchers, each timed where the kernel runs (_pick_in_place):
# kernel name -> {the kind of call (a tuple) -> triton.Config}
_PICKS: dict = {"chunk_scan_kernel": {}, "conv_decode_step_kernel": {}}
_time_in_graph = graph_time_us  # the timer of _pick_in_place (tests replace it on the CPU)


def _pick_in_place(kernel: str, key: tuple, launch, states, on_gpu: bool, calls: int, **named_args):
    """`kernel`'s config for the calls of `key`: on the first such call, each of its GPU configs (those
    `autotune_configs(kernel, **named_args)` lists) timed through launch(config), the launcher's own launch as the
    model makes it, `calls` times back to back in a CUDA Graph; `states` (the tensors the launch updates in place)
    are put back after each. The pick is recorded on disk, and a pick an earlier process recorded is taken without
    timing (`qwen_lab.tunings`). None: the launch takes its config as it would without this pick (Triton's
    autotuner on a GPU with QWEN_LAB_TUNE=0 or inside a capture, the forced config under `force_config`, the
    interpreter's fixed config).

    Two kernels are picked this way, because Triton's autotuner times a kernel alone, launched from Python:
    - the chunk scan runs beside the persistent prep, which leaves one SM slot per scan program of 32 value columns
      and 4 warps; a scan of 16 columns (twice the programs) or of 8 warps waits for room. On the H200 at 2048
      tokens the autotuner, timing the scan after the prep, picked 16 columns in one run (99.7 us per layer beside
      the prep) and 32 columns with 3 stages (84.7 us) in another (docs/perf-log.md, 2026-12-03);
    - the fused conv + delta-rule decode step runs for ~4 us, against 11-16 us of launch cost for each launch the
      autotuner times from Python: its ranking is mostly the host's noise. In the replayed decode step of
      Qwen3.5-0.8B its configs are 12-19 us per token apart (benchmarks/probe_decode_step_configs.py)."""
    picks = _PICKS[kernel]
    if key in picks:
        return picks[key]
    if (not on_gpu or kernel in _FORCED or not gemm.tuning_enabled()
            or any(s.is_cuda and torch.cuda.is_current_stream_capturing() for s in states)):
        return None
    candidates = autotune_configs(kernel, **named_args)

    def time_them():
        times = {}
        # uncounted: the timing runs are not this call's launches. Inference mode: a state allocated under it (as
        # the model's generation allocates its cache) may be put back in place only under it, and a normal one
        # either way.
        with uncounted(), torch.inference_mode():
            saved = [s.clone() for s in states]
            for config in candidates:
                try:
                    times[config] = _time_in_graph([lambda c=config: launch(c)] * calls, warmup=True, replays=5)
                except triton.runtime.errors.OutOfResources:
                    pass
                for s, v in zip(states, saved):
                    s.copy_(v)
        return (min(times, key=times.get) if times else None), times
    # what an earlier process timed, if it did (qwen_lab.tunings; the file changes with any kernel module, so the
    # scan's pick follows the prep it is timed beside), else timed here and recorded
    picks[key] = tunings.pick(states[0].device, tunings.kernel_id(globals()[kernel]), key, candidates, time_them)[0]
    return picks[key]


def _chunked_launch(q, k, v, g, beta, A_log, dt_bias, state, scale, chunk_size, out, workspace, fused):
    """delta_rule_chunked (fused=False: g, beta are the gates) or deltanet_chunked (fused: g, beta are a and b)."""
    T, Hk, Dk, Hv, Dv = _check_delta(q, k, v, g, beta, state, ("a", "b") if fused else ("g", "beta"))
    if chunk_size not in (64, 128):
        raise KernelError(f"chunk_size={chunk_size!r}: expected 64 or 128 (a power of two of at least "
                          f"16 rows, the smallest tl.dot)")
    out = _check_out("out", out, (T, Hv, Dv), v.dtype, v.device)
    if T == 0:
        return out
    n_chunks = triton.cdiv(T, chunk_size)
    n_class = chunk_class(n_chunks)
    Tp = n_chunks * chunk_size
    if workspace is not None:
        want = chunk_workspace(T, Hv, Dk, Dv, q.dtype, "meta", chunk_size)
        pitch = workspace[0].shape[1] if isinstance(workspace[0], torch.Tensor) and workspace[0].dim() > 1 else -1
        for name, t, w in zip(ChunkWorkspace._fields, workspace, want):
            shape = (w.shape[0], pitch) + tuple(w.shape[2:])
            if (not isinstance(t, torch.Tensor) or t.dtype != w.dtype or t.device != q.device
                    or not t.is_contiguous() or tuple(t.shape) != shape or pitch < Tp):
                raise KernelError(f"workspace.{name}: expected a contiguous {w.dtype} tensor {tuple(w.shape)} (or "
                                  f"longer in dim 1, like the others) on {q.device}, got {_shape(t)}; build it "
                                  f"with chunk_workspace(T, Hv, Dk, Dv, dtype, device, chunk_size)")
    if min(Dk, Dv) < CHUNKED_MIN_HEAD_DIM and not INTERPRET:
        # Compiled for sm_90 by Triton 3.6, the chunked kernels fault (or return garbage) when a head dim is below
        # 64, while 64 and 128 (every released Qwen3.5) are right: benchmarks/probe_deltanet.py, docs/perf-log.md.
        # Such small heads only occur in test models, where the recurrent kernel computes the same function.
        return _recurrent_launch(q, k, v, g, beta, A_log, dt_bias, state, scale, out, fused)
    if workspace is None:
        workspace = chunk_workspace(T, Hv, Dk, Dv, q.dtype, q.device, chunk_size)
    ws = workspace
    Tw = ws.qg.shape[1]  # the workspace row pitch (>= Tp)
    scale = Dk ** -0.5 if scale is None else float(scale)
    BK = max(16, triton.next_power_of_2(Dk))
    BDV = max(16, triton.next_power_of_2(Dv))
    # fp32 operands: exact fp32 products ("ieee"). bf16 operands ignore the setting, except in the inverse's
    # merges, whose fp32 tiles then use tf32 (10-bit mantissa; the result is rounded to bf16 right after).
    prec = dot_precision(ws.qg.dtype)
    # the counters through which the scan waits for the prep, [Hv, chunks + 1] at the workspace's pitch
    ready = _tickets(q.device, Hv * (Tw // chunk_size + 1))
    prep_args = (q, k, v, g, beta, A_log, dt_bias, ws.qg, ws.kd, ws.w, ws.u, ws.aqk, ws.gcum, ready, T, Tw, Dk, Dv,
                 Hv // Hk, Hv, n_chunks, n_class, scale, EPS,
                 q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                 g.stride(0), g.stride(1), beta.stride(0), beta.stride(1))
    prep_meta = dict(BT=chunk_size, BK=BK, BDV=BDV, MERGES=(chunk_size // 2).bit_length() - 1, PREC=prec,
                     INV_PREC=prec, GROUP=SCAN_GROUP, FUSED_GATES=fused, **pdl_options(q.device))
    programs = _prep_programs(Hv, n_chunks, Dv, q.device)
    scan_args = (ws.qg, ws.kd, ws.w, ws.u, ws.aqk, ws.gcum, ready, state, out, T, Tw, n_chunks, n_class,
                 Hv, Dk, Dv, state.stride(0), state.stride(1), out.stride(0), out.stride(1))
    scan_meta = dict(BT=chunk_size, BK=BK, PREC=prec, GROUP=SCAN_GROUP,
                     **(pdl_options(q.device) if SCAN_BESIDE_PREP else {}))
    grid = lambda META: (Hv, triton.cdiv(Dv, META["BV"]))  # noqa: E731

    def launch(scan_config=None):
        if programs is None:
            _launch(chunk_prep_kernel, (Hv, n_chunks), prep_args, prep_meta, dict(num_warps=4))
        else:
            # not autotuned: the count assumes the 4-warp config's programs per SM, and the autotuner, timing the
            # prep alone, could pick 8 warps (one program per SM) and leave programs waiting for room
            _launch(chunk_prep_kernel, (programs,), prep_args, dict(prep_meta, PERSIST=True), {},
                    untuned=_PREP_CONFIGS[0])
        _launch(chunk_scan_kernel, grid, scan_args, scan_meta, dict(BV=min(32, BDV), num_warps=4),
                untuned=scan_config)

    # the scan's config, timed beside the prep on the first call of this kind (three prep + scan pairs per graph).
    # The counters are put back with the state: a scan config that fails to compile (out of shared memory) does so
    # after its prep has counted its chunks, and a count left over would let the next scan run ahead of its prep.
    key = (device_key(q.device), ws.qg.dtype, Hv, Dk, Dv, chunk_size, n_class, fused, programs)
    launch(_pick_in_place("chunk_scan_kernel", key, launch, (state, ready), not INTERPRET and q.device.type == "cuda",
                          calls=3, Dv=Dv))
    return out


__all__ = ["ChunkWorkspace", "autotune_configs", "chunk_workspace", "delta_rule_chunked", "delta_rule_recurrent",
           "deltanet_chunked", "deltanet_conv_decode_step", "deltanet_decode_step", "deltanet_gates", "force_config",
           "l2norm"]
