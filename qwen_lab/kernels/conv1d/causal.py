"""Causal depthwise conv1d + SiLU, carrying the last W-1 inputs of every channel between calls.

Gated DeltaNet mixes each q, k and v channel with its own few predecessors before the delta rule.
For C channels (Qwen3.5-0.8B: C = 2 * 2048 + 2048 = 6144) and a width W = 4 filter weight [C, W]:

    xx = [state^T ; x]                                  ([W-1+T, C]: the carried inputs, then this step's)
    y[t, c] = silu( sum_{j<W} weight[c, j] * xx[t + j, c] )
    state  <- the last W-1 rows of xx, transposed       (state [C, W-1], oldest input first)

so a prompt fed in pieces (or one token at a time in decode) gives exactly the outputs of one long call.
The state holds *inputs* (before the conv and before SiLU). fp32 accumulation; y in x's dtype, the state
keeps its own dtype.

Shapes: x [T, C] with any row stride (it is a slice of the fused in-projection's output) and stride 1
between channels; weight [C, W] with any strides (the model stores it [W, C] and passes the transposed view:
each tap's weights are then one contiguous vector, which the prefill kernel loads once per program); state
[C, W-1] with stride 1 on the last dim.

Two kernels:
- `conv1d_step_kernel`: one program per block of channels walks the T tokens in order, then shifts the
  state. One launch serves decode (T = 1), where the grid is only C / BLOCK_C programs and every load of x
  is a row of contiguous channels (the state's loads are W-1 elements apart).
- `conv1d_prefill_kernel`: a segment of BLOCK_T tokens x BLOCK_C channels per program, every segment in
  parallel. The program loads its BLOCK_T + W - 1 input rows once each, as separate vectors of channels, and
  forms each output row from W of them: the taps' shifts cost no loads and no data movement, so the kernel runs
  close to a copy of x and y. Only the first segment reads the old state, so its programs also write the new
  one (the last W-1 inputs), each for its own channels and only after all of its threads have read the old: no
  other program reads the state, so nothing races and no second launch is needed. (When the first segment could
  not hold W-1 tokens, `conv1d_step_kernel` shifts the state afterwards, with no outputs.)

The segments the GPU autotuner tries, and the block sizes of each mode: tuning.py. Notebook 08's own kernel (one
program per block of channels walking the tokens, as conv1d_step_kernel does): teach.py.
"""

from __future__ import annotations

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ... import runtime
from ...errors import KernelError
from ...switches import switches
from .. import pdl_options
from . import tuning


@triton.jit
def conv1d_step_kernel(x_ptr, w_ptr, state_ptr, out_ptr, T, C,
                       stride_xt, stride_wc, stride_wj, stride_sc, stride_ot,
                       W: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, WRITE_OUT: tl.constexpr,
                       USE_PDL: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    if WRITE_OUT:
        for t in range(T):
            acc = tl.zeros([BLOCK_C], dtype=tl.float32)
            for j in tl.static_range(W):
                # xx row p = t + j is state column p while p < W-1, else x row p - (W-1)
                p = t + j
                r = p - (W - 1)
                xv = tl.load(x_ptr + tl.cast(r, tl.int64) * stride_xt + offs_c, mask=mask_c & (r >= 0), other=0.0)
                sv = tl.load(state_ptr + offs_c * stride_sc + p, mask=mask_c & (p < W - 1), other=0.0)
                wj = tl.load(w_ptr + offs_c * stride_wc + j * stride_wj, mask=mask_c, other=0.0)
                acc += wj.to(tl.float32) * (xv.to(tl.float32) + sv.to(tl.float32))
            y = acc * tl.sigmoid(acc)
            tl.store(out_ptr + tl.cast(t, tl.int64) * stride_ot + offs_c, y.to(out_ptr.dtype.element_ty), mask=mask_c)
    # New state column s = xx row T + s: an old state column (when T < W-1) or one of the last inputs.
    offs_s = tl.arange(0, BLOCK_S)
    p = T + offs_s
    r = p - (W - 1)
    keep = offs_s < W - 1
    m2 = mask_c[:, None] & keep[None, :]
    xv = tl.load(x_ptr + r.to(tl.int64)[None, :] * stride_xt + offs_c[:, None],
                 mask=m2 & (r >= 0)[None, :], other=0.0)
    sv = tl.load(state_ptr + offs_c[:, None] * stride_sc + p[None, :], mask=m2 & (p < W - 1)[None, :], other=0.0)
    new = tl.where((r >= 0)[None, :], xv.to(state_ptr.dtype.element_ty), sv)
    # Other threads of this program may still be reading the columns about to be overwritten.
    tl.debug_barrier()
    tl.store(state_ptr + offs_c[:, None] * stride_sc + offs_s[None, :], new, mask=m2)


@triton.jit
def conv1d_prefill_kernel(x_ptr, w_ptr, state_ptr, out_ptr, T, C,
                          stride_xt, stride_wc, stride_wj, stride_sc, stride_ot, T_BUCKET,
                          W: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                          USE_PDL: tl.constexpr = False, WRITE_STATE: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # T_BUCKET (T rounded up to a power of two) is only the GPU autotuner's key: one tuning per length bucket
    t0 = tl.program_id(0) * BLOCK_T
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    # The W taps' weights, loaded once per program: W vectors of BLOCK_C channels (contiguous ones when the weight
    # is stored [W, C], as the model stores it: stride_wc = 1).
    wts = ()
    for j in tl.static_range(W):
        wts = wts + (tl.load(w_ptr + offs_c * stride_wc + j * stride_wj, mask=mask_c, other=0.0).to(tl.float32),)
    # The program's inputs as separate row vectors: x rows t0 - (W-1) .. t0 + BLOCK_T - 1 (xx rows t0 ..
    # t0 + BLOCK_T + W - 2), each loaded once and all requested before any is used. A tap's shift is then only a
    # choice among these registers: no row is loaded once per tap, and nothing passes through shared memory.
    # Rows are kept in x's dtype (half the registers in bf16) until they are multiplied.
    x_seg = x_ptr + t0.to(tl.int64) * stride_xt        # 64-bit base of the segment, 32-bit offsets from it
    xs = ()
    for r in tl.static_range(BLOCK_T + W - 1):
        t = t0 + (r - (W - 1))                          # the input's token; t < 0: state column t + W - 1
        xv = tl.load(x_seg + (r - (W - 1)) * stride_xt + offs_c, mask=mask_c & (t >= 0) & (t < T), other=0.0)
        if r < W - 1:
            # Only the first segment reaches back into the carried state (in its own dtype: added in fp32); every
            # program issues these W-1 loads, masked off past the first. Behind a branch on t0 instead, the
            # loads after it waited for the branch: 8 x 1024 segments took 21.7 us instead of 19.3 on the H200.
            sv = tl.load(state_ptr + offs_c * stride_sc + (t + W - 1), mask=mask_c & (t < 0), other=0.0)
            xv = xv.to(tl.float32) + sv.to(tl.float32)
        xs = xs + (xv,)
    out_seg = out_ptr + t0.to(tl.int64) * stride_ot
    for i in tl.static_range(BLOCK_T):
        acc = wts[0] * xs[i].to(tl.float32)             # y[t0 + i] = silu(sum_j w[:, j] * xx[t0 + i + j])
        for j in tl.static_range(1, W):
            acc += wts[j] * xs[i + j].to(tl.float32)
        y = acc * tl.sigmoid(acc)
        tl.store(out_seg + i * stride_ot + offs_c, y.to(out_ptr.dtype.element_ty), mask=mask_c & (t0 + i < T))
    if WRITE_STATE:
        # The new state is the last W-1 inputs (the launcher asks for this only when T >= W-1). The first
        # segment's programs are the only readers of the old state (BLOCK_T >= W-1), so they may replace it, once
        # every thread of the program has read it.
        tl.static_assert(BLOCK_T >= W - 1, "WRITE_STATE needs the old state read by the first segment alone")
        if t0 == 0:
            offs_s = tl.arange(0, BLOCK_S)
            keep = offs_s < W - 1
            last = x_ptr + (T - (W - 1) + offs_s).to(tl.int64)[None, :] * stride_xt + offs_c[:, None]
            new = tl.load(last, mask=mask_c[:, None] & keep[None, :], other=0.0)
            tl.debug_barrier()
            tl.store(state_ptr + offs_c[:, None] * stride_sc + offs_s[None, :], new.to(state_ptr.dtype.element_ty),
                     mask=mask_c[:, None] & keep[None, :])


# ---------------------------------------------------------------- launchers


def _shape(t):
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _check_2d(name, t, rows=None, cols=None, what="", device=None, any_strides=False):
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise KernelError(f"{name}: expected a 2-D tensor {what}, got {_shape(t)}")
    if not t.is_floating_point():
        raise KernelError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if rows is not None and t.shape[0] != rows or cols is not None and t.shape[1] != cols:
        raise KernelError(f"{name}: shape {tuple(t.shape)}, expected {what}")
    if not any_strides and t.shape[1] > 1 and t.stride(1) != 1:
        raise KernelError(f"{name}: the last dim must be contiguous (stride 1), got strides {tuple(t.stride())}")
    if device is not None and t.device != device:
        raise KernelError(f"{name}: on {t.device}, expected {device} like x")


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(causal depthwise conv of width W) over x [T, C], carrying state [C, W-1]; = reference.causal_conv1d.

    weight [C, W]; `state` (the last W-1 inputs, oldest first) is read and updated in place. -> y [T, C].
    """
    _check_2d("x", x, what="[T, C]")
    T, C = x.shape
    _check_2d("weight", weight, rows=C, what=f"[C={C}, W]", device=x.device, any_strides=True)
    W = weight.shape[1]
    if W < 1:
        raise KernelError("weight: the filter width W = weight.shape[1] must be at least 1")
    if not isinstance(state, torch.Tensor) or state.dim() != 2 or tuple(state.shape) != (C, W - 1):
        raise KernelError(f"state: expected [C={C}, W-1={W - 1}] (the last W-1 inputs), got {_shape(state)}")
    _check_2d("state", state, device=x.device, what=f"[{C}, {W - 1}]")
    if out is not None:
        _check_2d("out", out, rows=T, cols=C, what=f"[{T}, {C}]", device=x.device)
        if out.dtype != x.dtype:
            raise KernelError(f"out: dtype {out.dtype}, expected {x.dtype} (x's dtype)")
    else:
        out = torch.empty((T, C), dtype=x.dtype, device=x.device)
    if T == 0 or C == 0:
        return out
    BLOCK_S = triton.next_power_of_2(max(W - 1, 1))
    args = (x, weight, state, out, T, C, x.stride(0), weight.stride(0), weight.stride(1), state.stride(0),
            out.stride(0))
    step_block, BLOCK_T, BLOCK_C = tuning.block_sizes(C, runtime.interpreter_active())
    step_grid = (triton.cdiv(C, step_block),)
    pdl = pdl_options(x.device)
    if T <= tuning.STEP_MAX_TOKENS:
        conv1d_step_kernel[step_grid](*args, W=W, BLOCK_S=BLOCK_S, BLOCK_C=step_block, WRITE_OUT=True,
                                      num_warps=2, **pdl)
        return out
    t_bucket = triton.next_power_of_2(T)
    # The segmented kernel also writes the new state (the last W-1 inputs, all inside x since T > STEP_MAX_TOKENS)
    # when its first segment alone reads the old one; otherwise the step kernel shifts the state afterwards.
    fuse = T >= W - 1 and all(c.kwargs["BLOCK_T"] >= W - 1 for c in tuning.PREFILL_CONFIGS)
    forced = switches.forced("conv1d_prefill_kernel")   # a config forced by a test or a timing script
    if forced is not None:
        c = forced
        fuse = fuse and c.kwargs["BLOCK_T"] >= W - 1
        grid = (triton.cdiv(T, c.kwargs["BLOCK_T"]), triton.cdiv(C, c.kwargs["BLOCK_C"]))
        conv1d_prefill_kernel[grid](*args, t_bucket, W=W, BLOCK_S=BLOCK_S, WRITE_STATE=fuse, num_warps=c.num_warps,
                                    **c.kwargs, **pdl)
    elif runtime.interpreter_active():
        fuse = fuse and BLOCK_T >= W - 1
        grid = (triton.cdiv(T, BLOCK_T), triton.cdiv(C, BLOCK_C))
        conv1d_prefill_kernel[grid](*args, t_bucket, W=W, BLOCK_S=BLOCK_S, WRITE_STATE=fuse, BLOCK_T=BLOCK_T,
                                    BLOCK_C=BLOCK_C, num_warps=4)
    else:
        grid = lambda meta: (triton.cdiv(T, meta["BLOCK_T"]), triton.cdiv(C, meta["BLOCK_C"]))  # noqa: E731
        tuning._tuned_prefill(conv1d_prefill_kernel)[grid](*args, t_bucket, W=W, BLOCK_S=BLOCK_S, WRITE_STATE=fuse,
                                                           **pdl)
    if not fuse:
        conv1d_step_kernel[step_grid](*args, W=W, BLOCK_S=BLOCK_S, BLOCK_C=step_block, WRITE_OUT=False,
                                      num_warps=2, **pdl)
    return out

