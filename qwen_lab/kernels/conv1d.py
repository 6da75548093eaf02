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
between channels; weight [C, W]; state [C, W-1], both with stride 1 on the last dim.

Two kernels:
- `conv1d_step_kernel`: one program per block of channels walks the T tokens in order, then shifts the
  state. One launch serves decode (T = 1), where the grid is only C / BLOCK_C programs and every load of x
  is a row of contiguous channels (the state's loads are W-1 elements apart).
- `conv1d_prefill_kernel`: a [BLOCK_T, BLOCK_C] tile per program, every token in parallel. Only the first
  tile of tokens reads the old state, so its programs also write the new one (the last W-1 inputs), each
  for its own channels and only after all of its threads have read the old: no other program reads the
  state, so nothing races and no second launch is needed. (When the first tile could not hold W-1 tokens,
  `conv1d_step_kernel` shifts the state afterwards, with no outputs.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .. import runtime
from ..errors import KernelError
from . import pdl_options


@triton.jit
def conv1d_step_kernel(x_ptr, w_ptr, state_ptr, out_ptr, T, C,
                       stride_xt, stride_wc, stride_sc, stride_ot,
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
                wj = tl.load(w_ptr + offs_c * stride_wc + j, mask=mask_c, other=0.0)
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
                          stride_xt, stride_wc, stride_sc, stride_ot, T_BUCKET,
                          W: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                          USE_PDL: tl.constexpr = False, WRITE_STATE: tl.constexpr = False):
    if USE_PDL:  # launched early (programmatic dependent launch): wait for the previous kernel's writes first
        gdc_wait()
        gdc_launch_dependents()
    # T_BUCKET (T rounded up to a power of two) is only the GPU autotuner's key: one tuning per length bucket
    t0 = tl.program_id(0) * BLOCK_T
    offs_i = tl.arange(0, BLOCK_T)        # token index inside the tile
    offs_t = t0 + offs_i
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_t = offs_t < T
    mask_c = offs_c < C
    # 64-bit base of the tile, 32-bit offsets inside it (a tile spans a few rows)
    x_tile = x_ptr + t0.to(tl.int64) * stride_xt
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(W):
        p = offs_t + j                    # row of xx
        from_x = p >= W - 1               # else one of the W-1 carried inputs (state column p)
        xv = tl.load(x_tile + (offs_i + j - (W - 1))[:, None] * stride_xt + offs_c[None, :],
                     mask=(mask_t & from_x)[:, None] & mask_c[None, :], other=0.0)
        wj = tl.load(w_ptr + offs_c * stride_wc + j, mask=mask_c, other=0.0).to(tl.float32)
        acc += wj[None, :] * xv.to(tl.float32)
        if t0 < W - 1:
            # Only the first tile reaches back into the carried state. The state's channels are W-1 apart in
            # memory, so its loads cannot be vectorised: issued (even masked off) by every tile they would cost
            # more instructions than the tile's own loads.
            sv = tl.load(state_ptr + offs_c[None, :] * stride_sc + p[:, None],
                         mask=(mask_t & ~from_x)[:, None] & mask_c[None, :], other=0.0)
            acc += wj[None, :] * sv.to(tl.float32)
    y = acc * tl.sigmoid(acc)
    out_tile = out_ptr + t0.to(tl.int64) * stride_ot
    tl.store(out_tile + offs_i[:, None] * stride_ot + offs_c[None, :], y.to(out_ptr.dtype.element_ty),
             mask=mask_t[:, None] & mask_c[None, :])
    if WRITE_STATE:
        # The new state is the last W-1 inputs (the launcher asks for this only when T >= W-1). The first tile's
        # programs are the only readers of the old state (BLOCK_T >= W-1), so they may replace it, once every
        # thread of the program has read it.
        tl.static_assert(BLOCK_T >= W - 1, "WRITE_STATE needs the old state read by the first tile alone")
        if t0 == 0:
            offs_s = tl.arange(0, BLOCK_S)
            keep = offs_s < W - 1
            last = x_ptr + (T - (W - 1) + offs_s).to(tl.int64)[None, :] * stride_xt + offs_c[:, None]
            new = tl.load(last, mask=mask_c[:, None] & keep[None, :], other=0.0)
            tl.debug_barrier()
            tl.store(state_ptr + offs_c[:, None] * stride_sc + offs_s[None, :], new.to(state_ptr.dtype.element_ty),
                     mask=mask_c[:, None] & keep[None, :])


# ---------------------------------------------------------------- launchers

# Tiles of the prefill kernel the GPU autotuner times (per channel count and prompt-length bucket): the kernel
# only streams x once and y once, and which tile keeps enough bytes in flight depends on the GPU.
PREFILL_CONFIGS = [triton.Config({"BLOCK_T": bt, "BLOCK_C": bc}, num_warps=w)
                   for bt, bc, w in ((8, 256, 4), (16, 256, 4), (32, 128, 4), (32, 256, 8), (64, 128, 8),
                                     (64, 64, 4), (16, 512, 8), (128, 64, 8))]
# Tests set this to a triton.Config to run the prefill kernel with that tile (on the GPU or the interpreter).
FORCE_PREFILL_CONFIG = None
_tuned: dict = {}


def _tuned_prefill():
    if "prefill" not in _tuned:
        # restore_value: a timed run may replace the state (WRITE_STATE), and the next must read the same one
        _tuned["prefill"] = triton.autotune(PREFILL_CONFIGS, key=["C", "T_BUCKET", "W"],
                                            restore_value=["state_ptr"])(conv1d_prefill_kernel)
    return _tuned["prefill"]


# Up to this many tokens the sequential kernel (one launch) beats the tiled one plus the state shift.
STEP_MAX_TOKENS = 4


def block_sizes(C: int, interpreter: bool) -> tuple[int, int, int]:
    """(BLOCK_C of the step kernel, BLOCK_T and BLOCK_C of the tiled prefill kernel) for C channels.

    On a GPU the prefill tile is autotuned over PREFILL_CONFIGS and these BLOCK_T, BLOCK_C only serve a test that
    runs small tiles through the interpreter (interpreter=False: many programs, ragged edges); the interpreter's
    own prefill tile is taller (64 tokens), so that it runs few programs.
    """
    if interpreter:
        return min(256, triton.next_power_of_2(C)), 64, min(128, triton.next_power_of_2(C))
    return min(128, triton.next_power_of_2(C)), 8, 256


def _shape(t):
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _check_2d(name, t, rows=None, cols=None, what="", device=None):
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise KernelError(f"{name}: expected a 2-D tensor {what}, got {_shape(t)}")
    if not t.is_floating_point():
        raise KernelError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if rows is not None and t.shape[0] != rows or cols is not None and t.shape[1] != cols:
        raise KernelError(f"{name}: shape {tuple(t.shape)}, expected {what}")
    if t.shape[1] > 1 and t.stride(1) != 1:
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
    _check_2d("weight", weight, rows=C, what=f"[C={C}, W]", device=x.device)
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
    args = (x, weight, state, out, T, C, x.stride(0), weight.stride(0), state.stride(0), out.stride(0))
    step_block, BLOCK_T, BLOCK_C = block_sizes(C, runtime.interpreter_active())
    step_grid = (triton.cdiv(C, step_block),)
    pdl = pdl_options(x.device)
    if T <= STEP_MAX_TOKENS:
        conv1d_step_kernel[step_grid](*args, W=W, BLOCK_S=BLOCK_S, BLOCK_C=step_block, WRITE_OUT=True,
                                      num_warps=2, **pdl)
        return out
    t_bucket = triton.next_power_of_2(T)
    # The tiled kernel also writes the new state (the last W-1 inputs, all inside x since T > STEP_MAX_TOKENS)
    # when its first tile alone reads the old one; otherwise the step kernel shifts the state afterwards.
    fuse = T >= W - 1 and all(c.kwargs["BLOCK_T"] >= W - 1 for c in PREFILL_CONFIGS)
    if FORCE_PREFILL_CONFIG is not None:
        c = FORCE_PREFILL_CONFIG
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
        _tuned_prefill()[grid](*args, t_bucket, W=W, BLOCK_S=BLOCK_S, WRITE_STATE=fuse, **pdl)
    if not fuse:
        conv1d_step_kernel[step_grid](*args, W=W, BLOCK_S=BLOCK_S, BLOCK_C=step_block, WRITE_OUT=False,
                                      num_warps=2, **pdl)
    return out


__all__ = ["PREFILL_CONFIGS", "STEP_MAX_TOKENS", "block_sizes", "causal_conv1d"]
