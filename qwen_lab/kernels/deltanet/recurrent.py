"""The gated delta rule token by token (the decode form), and the decode step with the causal conv fused in.

Shapes (batch 1, token-major): T tokens; q, k [T, Hk, Dk]; v [T, Hv, Dv] with Hv a multiple of Hk (value head
h reads q/k head h // (Hv / Hk)); g, beta [T, Hv] fp32 (or the raw projections a, b, whose gates the kernel
computes: gates.py); state S [Hv, Dk, Dv] fp32, updated in place. q, k, v may be strided views of the conv
output (any strides on the leading dims, stride 1 on the last). Qwen3.5-0.8B: Hk = Hv = 16, Dk = Dv = 128.

The delta rule, per value head, one token at a time (q, k l2-normalised, q also scaled by Dk^-1/2):

    S <- exp(g_t) S                            forget a little of everything
    S <- S + k_t (x) beta_t (v_t - S^T k_t)    move the value stored under key k_t towards v_t
    o_t = S^T q_t                              read the memory with q_t

S^T k_t is what the memory currently returns for k_t, so each step is one step of online regression of v on
k with learning rate beta_t: the "delta" (v_t - S^T k_t) is the prediction error.

Recurrent kernel (`delta_rule_recurrent_kernel`): one program per (value head, block of BV value columns) keeps its
[Dk, BV] slice of S in registers for the T tokens and writes it back once. The columns of S are independent
(every update above acts on each column alone), so the programs need no communication.

Decode with the conv fused in (`conv_decode_step_kernel`, `deltanet_conv_decode_step`): the same grid and the same
step, each program first computing the causal conv + SiLU (see kernels/conv1d) of the q, k and v channels it
reads, straight from the in-projection output and the carried conv state [2 Hk Dk + Hv Dv, W-1], which it shifts
in place. The q/k channels of a key head are read by several programs; the last of them to finish reading (an
atomic ticket, counters.py) writes their shifted state. One launch per DeltaNet layer and token instead of two.

Precision: everything in fp32 (the conv output rounded to the input dtype, as causal_conv1d returns it). Configs:
tuning.py (the recurrent kernel autotuned, the fused step picked where it runs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ...errors import KernelError
from .. import device_key, pdl_options
from . import tuning
from .arguments import _check, _check_delta, _check_gate_params, _check_out
from .counters import _tickets
from .gates import EPS, _softplus
from .tuning import _RECURRENT_CONFIGS, INTERPRET, _prune_bv, _tuned


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


# ---------------------------------------------------------------- launchers


def _recurrent_launch(q, k, v, g, beta, A_log, dt_bias, state, scale, out, fused):
    T, Hk, Dk, Hv, Dv = _check_delta(q, k, v, g, beta, state, ("a", "b") if fused else ("g", "beta"))
    out = _check_out("out", out, (T, Hv, Dv), v.dtype, v.device)
    if T == 0:
        return out
    scale = Dk ** -0.5 if scale is None else float(scale)
    BK = triton.next_power_of_2(Dk)
    grid = lambda META: (Hv, triton.cdiv(Dv, META["BV"]))  # noqa: E731
    tuning._launch(delta_rule_recurrent_kernel, grid, (
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
        tuning._launch(conv_decode_step_kernel, grid, args, meta,
                       dict(BV=min(32, triton.next_power_of_2(Dv)), num_warps=4), untuned=config)

    # the config, timed on the first call of this kind in a graph of 16 back-to-back steps (the step takes ~4 us:
    # fewer would time mostly the graph's own launch); the tickets reset themselves, the two states are put back
    key = (device_key(dev), qkv.dtype, Hk, Dk, Hv, Dv, W, bool(state_settled), bool(meta.get("USE_PDL")))
    launch(tuning._pick_in_place("conv_decode_step_kernel", key, launch, (state, conv_state),
                                 not INTERPRET and dev.type == "cuda", calls=16, Dv=Dv))
    return out
