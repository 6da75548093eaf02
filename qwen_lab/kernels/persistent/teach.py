"""The notebook's persistent kernel: two dependent GEMVs in one launch, ordered by a counter in global memory.

    h = W1 x      W1 [N1, K]          y = W2 h      W2 [N2, N1]

The work is a list of items: the T1 = cdiv(N1, BLOCK_N) row tiles of the first GEMV, then the T2 row tiles of the
second. Program p takes items p, p + P, p + 2P, ... (P programs), in that order. A tile of the second GEMV reads
all of h, so it waits until the counter says that all T1 tiles of the first are done; each first tile adds 1 to
the counter once its rows of h are stored.

- release: the tile's threads meet at a barrier after their stores, then one atomic add with release semantics
  publishes the stores with the count;
- acquire: the waiting tile polls the counter (a volatile load), reads it once more with acquire semantics (one
  read for the program, shared by its threads), and meets a barrier; its loads of h come after, so they see every
  first tile's rows;
- bounded: after `spin_limit` polls it gives up, writes which item waited into `error`, and the launcher raises.

Why no deadlock on a GPU: every program is resident (P at most the SMs), and every program does its first-GEMV
tiles before any second-GEMV tile (the list puts them first), so the first tiles all finish. Under the interpreter
programs run one after another, so the launcher uses one program, which walks the whole list in order.
The counter is cleared by the launcher before each launch (the engine's step counts epochs instead: decode.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ...errors import KernelError


@triton.jit
def _tile(w_ptr, x_ptr, out_ptr, row0, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[row0 : row0 + BLOCK_N] = W[row0 : row0 + BLOCK_N] @ x, fp32 sums, stored in out's dtype."""
    rows = row0 + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None] * K + ks[None, :], mask=(rows < N)[:, None] & (ks < K)[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
    tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=rows < N)


# Exercise 14.1: two dependent GEMVs in one launch
@triton.jit
def two_gemvs_kernel(x_ptr, w1_ptr, h_ptr, w2_ptr, y_ptr, counter_ptr, error_ptr, N1, N2, K, spin_limit,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    P = tl.num_programs(0)
    T1 = tl.cdiv(N1, BLOCK_N)
    T2 = tl.cdiv(N2, BLOCK_N)
    ok = 1
    for item in range(tl.program_id(0), T1 + T2, P):
        if ok:
            if item < T1:                                   # a tile of h = W1 x
                _tile(w1_ptr, x_ptr, h_ptr, item * BLOCK_N, N1, K, BLOCK_N, BLOCK_K)
                tl.debug_barrier()                          # all threads' rows of h stored ...
                tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")   # ... then published
            else:                                           # a tile of y = W2 h: needs every tile of h
                seen = tl.load(counter_ptr, volatile=True)
                polls = 0
                while (seen < T1) & (polls < spin_limit):
                    seen = tl.load(counter_ptr, volatile=True)
                    polls += 1
                # Each thread polled on its own and may have left the loop at another count; the acquire read is
                # made once for the program and shared, so all its threads take the same branch below.
                seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
                tl.debug_barrier()
                if seen < T1:
                    tl.store(error_ptr, item + 1)           # gave up: say which item waited
                    ok = 0
                else:
                    _tile(w2_ptr, h_ptr, y_ptr, (item - T1) * BLOCK_N, N2, N1, BLOCK_N, BLOCK_K)


def two_gemvs(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, programs: int | None = None,
              block_n: int = 16, block_k: int = 64, spin_limit: int | None = None,
              counter: torch.Tensor | None = None) -> torch.Tensor:
    """y = w2 @ (w1 @ x) in one launch. x [K]; w1 [N1, K]; w2 [N2, N1], contiguous, one dtype. -> y [N2].

    programs: default the SM count on a GPU, 1 under the interpreter. counter: an int32 [1] to use (default a new
    one; the notebook passes one to show what happens when it is not cleared)."""
    if x.dim() != 1 or w1.dim() != 2 or w2.dim() != 2 or w1.shape[1] != x.shape[0] or w2.shape[1] != w1.shape[0]:
        raise KernelError(f"two_gemvs: x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w2 {tuple(w2.shape)}; expected "
                          f"x [K], w1 [N1, K], w2 [N2, N1]")
    if not (x.is_contiguous() and w1.is_contiguous() and w2.is_contiguous()):
        raise KernelError("two_gemvs: x, w1 and w2 must be contiguous")
    interp = runtime.interpreter_active()
    if programs is None:
        programs = 1 if interp else torch.cuda.get_device_properties(x.device).multi_processor_count
    if interp and programs != 1:
        raise KernelError(f"programs={programs}: under the interpreter programs run one after another, and a program "
                          f"waiting on a later one would wait forever; use programs=1")
    N1, K = w1.shape
    N2 = w2.shape[0]
    h = torch.empty(N1, device=x.device, dtype=x.dtype)
    y = torch.empty(N2, device=x.device, dtype=x.dtype)
    counter = torch.zeros(1, dtype=torch.int32, device=x.device) if counter is None else counter
    error = torch.zeros(1, dtype=torch.int32, device=x.device)
    limit = (2 if interp else 1 << 22) if spin_limit is None else int(spin_limit)
    two_gemvs_kernel[(programs,)](x, w1, h, w2, y, counter, error, N1, N2, K, limit, BLOCK_N=block_n,
                                  BLOCK_K=block_k)
    item = int(error.item())
    if item:
        raise KernelError(f"two_gemvs: item {item - 1} (a tile of the second GEMV) waited for the counter to reach "
                          f"{triton.cdiv(N1, block_n)} (every tile of the first GEMV) and gave up after {limit} polls")
    return y
