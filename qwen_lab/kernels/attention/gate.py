"""The output gate of Qwen3.5's attention: y = o * sigmoid(gate), in fp32, stored in o's dtype.

o, gate, out [T, H, D]; gate is a strided view of the fused q projection ([q_h | gate_h] per head). One program
per (token, block of heads). The prefill kernel also applies it in its epilogue (prefill.py); from
switches.gate_apart_from_tokens query tokens `attention` runs this kernel in place over its output instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .. import pdl_options
from .validate import _check_3d, _check_like


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


# ---------------------------------------------------------------- launcher


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
