"""Warming L2 with the next projections' weights while a latency-bound decode kernel runs.

A decode step alternates two kinds of kernel. The GEMVs stream their weights from HBM and are bound by its
bandwidth; a few MB each, they also pay a ramp-up of a microsecond or two before the memory system is busy.
Between them sit short kernels bound by latency, not bandwidth (the DeltaNet conv + recurrence step: a few
microseconds, a few MB of traffic): while they run, HBM is mostly idle.

`l2_prefetch` lets such a kernel use that idle time. Extra programs of its grid ask the L2 cache for the weights
of the projections that come next (the out-projection and the MLP's gate/up after a DeltaNet step: 19 MB on
Qwen3.5-0.8B, well inside the H200's 50 MB L2) and exit: `prefetch.global.L2` is a hint that needs no
register and no wait, so the kernel does not get longer. When the GEMV starts, its weight loads find the lines
in L2 or already on their way.

Nothing is computed from what is prefetched, so results are unchanged bit for bit; only timing moves. The
interpreter has no caches (the helper is never reached there); QWEN_LAB_L2_PREFETCH=0 turns it off on a GPU.

    l2_prefetch(ptr, nbytes, part, parts, LANES)   lines [part * n / parts, (part + 1) * n / parts) of the
                                                   n = ceil(nbytes / 128) cache lines from ptr, LANES at a time
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..runtime import interpreter_active

LINE_BYTES = 128  # an L2 cache line


@triton.jit
def l2_prefetch(ptr, nbytes, part, parts, LANES: tl.constexpr):
    # This program's share of the buffer's cache lines, LANES lines per step (one per thread of a 4-warp program).
    lines = tl.cdiv(nbytes, 128)
    per_part = tl.cdiv(lines, parts)
    lo = part * per_part
    hi = tl.minimum(lo + per_part, lines)
    base = ptr.to(tl.pointer_type(tl.int8))
    for l0 in range(lo, hi, LANES):
        line = tl.minimum(l0 + tl.arange(0, LANES), lines - 1)  # the last step's spare lanes repeat the last line
        addr = base + line.to(tl.int64) * 128
        # not pure: the result is unused, and a pure asm with an unused result would be dropped
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [addr],
                                  dtype=tl.int32, is_pure=False, pack=1)


def prefetch_enabled(device) -> bool:
    """Whether kernels on `device` warm L2 with the next weights: a CUDA GPU, the interpreter off, and
    QWEN_LAB_L2_PREFETCH not set to 0."""
    if torch.device(device).type != "cuda" or interpreter_active():
        return False
    return os.environ.get("QWEN_LAB_L2_PREFETCH", "1").strip().lower() in ("1", "true", "yes", "on")


def prefetch_regions(name: str, tensors, device, count: int) -> list:
    """Check `tensors` (a tuple of up to `count` weights to warm) and return exactly `count` (tensor, bytes) pairs,
    padded with (None, 0). Empty when prefetching is off on `device`."""
    from ..errors import KernelError

    tensors = tuple(tensors or ())
    if len(tensors) > count:
        raise KernelError(f"{name}: prefetch takes up to {count} tensors, got {len(tensors)}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"{name}: prefetch[{i}] is a {type(t).__name__}, expected a tensor")
        if t.device != torch.device(device):
            raise KernelError(f"{name}: prefetch[{i}] is on {t.device}, expected {device}")
        if not t.is_contiguous():
            raise KernelError(f"{name}: prefetch[{i}] of shape {tuple(t.shape)} is not contiguous; the prefetch "
                              f"walks one span of memory")
    if not prefetch_enabled(device):
        tensors = ()
    pairs = [(t, t.numel() * t.element_size()) for t in tensors if t.numel()]
    return pairs + [(None, 0)] * (count - len(pairs))


__all__ = ["LINE_BYTES", "l2_prefetch", "prefetch_enabled", "prefetch_regions"]
