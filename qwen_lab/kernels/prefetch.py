r"""Warming L2 with the next projections' weights while a decode step's latency-bound kernels run.

A decode token alternates two kinds of kernel. The GEMVs stream their weights from HBM and are bound by its
bandwidth. Between them sit kernels bound by latency (the DeltaNet conv + recurrence step, 4.4 us; attention's
q/k prep, split and combine, about 9 us): while they run, HBM is mostly idle. The weights they are followed by do
not depend on anything computed, so they could already be on their way:

    in-projection GEMV -> l2_prefetch(out-projection, gate/up) -> mixer kernels -> out-projection GEMV -> gate/up ...

`l2_prefetch` is one short kernel launched right after the in-projection. Each of its threads issues one
`cp.async.bulk.prefetch.L2` (sm_90 and newer: the Tensor Memory Accelerator fetches a whole chunk of CHUNK bytes
into L2 from one instruction, and the thread moves on without waiting), then the program exits. The out-projection
and gate/up of Qwen3.5-0.8B are 19 MB, well inside the H200's 50 MB of L2, and about what HBM moves in the 4-5 us
of a DeltaNet step.

Two earlier forms measured slower (docs/perf-log.md): one `prefetch.global.L2` per 128-byte line, issued by extra
programs of the DeltaNet step's grid (the step waited for its 150 thousand instructions: 2 us longer), and one
bulk prefetch per GEMV program of the NEXT GEMV's weights (issued while HBM was already busy with the current
one). Here the requests are few, and they are issued when HBM has nothing else to do.

Under programmatic dependent launch the kernel lets the next kernel start at once (so the mixer's first kernel still
loads its weights and states in the in-projection's shadow), then waits for the in-projection to finish before
issuing anything (its weights would otherwise compete with the in-projection's stream). Nothing is computed from
what is fetched: results are unchanged bit for bit. Under the interpreter, on a CPU, and on GPUs
before sm_90 the call does nothing (there is no L2 to warm, or no bulk prefetch).

    l2_prefetch(*tensors)        up to three tensors, each contiguous, its bytes a multiple of 16
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..errors import KernelError
from ..runtime import interpreter_active
from . import _capability, device_key, pdl_options

CHUNK = 16384      # bytes per prefetch instruction (a multiple of 16)
PROGRAMS = 64      # programs of one warp: 2048 requests in flight across 64 SMs' TMA units
MAX_TENSORS = 3


@triton.jit
def l2_prefetch_kernel(a_ptr, a_bytes, b_ptr, b_bytes, c_ptr, c_bytes, CHUNK: tl.constexpr,
                       USE_PDL: tl.constexpr = False):
    # One warp per program; thread t of program p takes chunks t + 32 p, t + 32 p + 32 P, ... of each span (a
    # [32] tensor over one warp is one element per thread: one instruction each, no duplicates).
    if USE_PDL:
        # The mixer's first kernel may start at once, as it would right after the in-projection: it reads its
        # weights and states before its own wait (this kernel itself started only after the in-projection's wait,
        # so whatever wrote those states is done), and its wait then covers this kernel and, through it, the
        # in-projection. The prefetches wait for the in-projection, which streams its own weights until it ends.
        gdc_launch_dependents()
        gdc_wait()
    lanes = tl.num_programs(0) * 32
    lane = tl.program_id(0) * 32 + tl.arange(0, 32)
    _prefetch_lanes(a_ptr, a_bytes, lane, lanes, CHUNK)   # in the order they will be read
    _prefetch_lanes(b_ptr, b_bytes, lane, lanes, CHUNK)
    _prefetch_lanes(c_ptr, c_bytes, lane, lanes, CHUNK)


@triton.jit
def _prefetch_lanes(ptr, nbytes, lane, lanes, CHUNK: tl.constexpr):
    """Thread-wise: each of the 32 lanes prefetches chunks lane, lane + lanes, ... of [ptr, ptr + nbytes)."""
    n_chunks = tl.cdiv(nbytes, CHUNK)
    base = ptr.to(tl.pointer_type(tl.int8))
    for step in range(0, tl.cdiv(n_chunks, lanes)):
        c = tl.minimum(lane + step * lanes, n_chunks - 1)   # past the end: the last chunk again (a repeat hint)
        off = c.to(tl.int64) * CHUNK
        size = tl.minimum(nbytes - off, CHUNK).to(tl.int32)
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                  [base + off, size], dtype=tl.int32, is_pure=False, pack=1)


def available(device) -> bool:
    """Whether l2_prefetch does anything on `device`: a CUDA GPU of compute capability 9.0 or newer, no interpreter."""
    device = torch.device(device)
    if device.type != "cuda" or interpreter_active():
        return False
    return _capability(device_key(device).index)[0] >= 9


def l2_prefetch(*tensors: torch.Tensor) -> None:
    """Ask L2 for the bytes of up to three contiguous tensors (the next projections' weights, in the order they will
    be read), in one short launch.

    A hint: it changes no result. Does nothing where `available` is False. Raises KernelError for a tensor that is
    not contiguous, whose size in bytes is not a multiple of 16, or that lies on another device than the first.
    """
    if not 1 <= len(tensors) <= MAX_TENSORS:
        raise KernelError(f"l2_prefetch (qwen_lab/kernels/prefetch.py): takes 1 to {MAX_TENSORS} tensors, "
                          f"got {len(tensors)}")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise KernelError(f"l2_prefetch: tensors[{i}] is a {type(t).__name__}, expected a tensor")
        if not t.is_contiguous():
            raise KernelError(f"l2_prefetch: tensors[{i}] of shape {tuple(t.shape)} is not contiguous; the "
                              f"prefetch walks one span of memory")
        nbytes = t.numel() * t.element_size()
        if nbytes % 16 or t.data_ptr() % 16:
            raise KernelError(f"l2_prefetch: tensors[{i}] spans {nbytes} bytes at an address {t.data_ptr() % 16} "
                              f"past a multiple of 16; the bulk prefetch needs both multiples of 16")
        if t.device != tensors[0].device:
            raise KernelError(f"l2_prefetch: tensors[{i}] is on {t.device}, tensors[0] on {tensors[0].device}")
    dev = tensors[0].device
    if not available(dev):
        return
    spans = [(t, t.numel() * t.element_size()) for t in tensors]
    spans += [(tensors[0], 0)] * (MAX_TENSORS - len(spans))   # absent spans: no bytes, nothing issued
    args = [x for span in spans for x in span]
    l2_prefetch_kernel[(PROGRAMS,)](*args, CHUNK=CHUNK, num_warps=1, **pdl_options(dev))


__all__ = ["CHUNK", "PROGRAMS", "available", "l2_prefetch", "l2_prefetch_kernel"]
