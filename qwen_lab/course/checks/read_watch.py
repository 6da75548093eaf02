"""The interpreter read watch: under the Triton interpreter, every element a learner's kernel's tl.load reads outside
the tensors of a check's case (in their guard margins or between their rows) is counted with the kernel's line, even
where its value never reaches an output.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from .learner import _learner_code

class _StrayReads:
    """Under the Triton interpreter, while the block runs: every element that a learner's kernel's tl.load reads
    (its active lanes) outside the tensors of the case and the buffers its wrapper allocated, inside their guard
    margins or between their rows. A stray read whose value reaches an output shows as a wrong number; one that
    reaches none (a lane whose result is masked off at the store) shows nothing on a CPU, while on a GPU a read past
    the end of an allocation faults. `found`: (kernel, line, what it read past) -> elements."""

    def __init__(self, guards: dict, allocated: list):
        self.guards, self.allocated, self.found = guards, allocated, {}

    def _spans(self):
        named = [(f"'{k}'", g) for k, g in self.guards.items()]
        named += [(f"a buffer your function allocated {tuple(g.view.shape)}", g) for g in self.allocated]
        for what, g in named:
            lo = g.buf.data_ptr()
            yield what, lo, lo + g.buf.numel() * g.buf.element_size(), g.buf.element_size(), g.outside

    def _kernel_line(self):
        """(kernel, line) of the learner's kernel whose tl.load runs now, or None when it is the library's."""
        f = sys._getframe(1)
        while f is not None and (f.f_code.co_filename == __file__ or "site-packages" in f.f_code.co_filename
                                 or "dist-packages" in f.f_code.co_filename):   # this file, then Triton's
            f = f.f_back
        if f is None or not _learner_code(f.f_code.co_filename):
            return None
        return f.f_code.co_name, f.f_lineno

    def record(self, ptrs, mask) -> None:
        import numpy as np

        addr = np.asarray(ptrs.data).astype(np.int64, copy=False)
        active = np.broadcast_to(np.asarray(mask.data).astype(bool), addr.shape)
        addr = addr[active]
        if addr.size == 0:
            return
        for what, lo, hi, size, outside in self._spans():
            inside = (addr >= lo) & (addr < hi)
            if not inside.any():
                continue
            index = torch.from_numpy((addr[inside] - lo) // size)
            n = int(outside[index].sum())
            if n:
                at = self._kernel_line()
                if at is not None:
                    self.found[(*at, what)] = self.found.get((*at, what), 0) + n

    def notes(self) -> list[str]:
        """One sentence per (kernel, line of its file or notebook cell, what it read past)."""
        return [f"{kernel} (line {line} of its file) read {n} element(s) outside {what} (a tl.load with no mask, or "
                f"one whose mask lets lanes past the tensor's edge or between its rows through, or a wrong stride)"
                for (kernel, line, what), n in self.found.items()]


@contextlib.contextmanager
def _watching_reads(guards: dict, allocated: list):
    """Yields a _StrayReads filled while the block runs, where the Triton interpreter runs the kernels (elsewhere,
    or with an interpreter whose loads go another way, it stays empty)."""
    from ...runtime import interpreter_active

    watch = _StrayReads(guards, allocated)
    builder = None
    if interpreter_active():
        from triton.runtime import interpreter
        builder = getattr(interpreter, "InterpreterBuilder", None)
    original = getattr(builder, "create_masked_load", None)
    if original is None:
        yield watch
        return

    def load(self, ptrs, mask, *args, **kwargs):
        try:
            watch.record(ptrs, mask)
        except Exception:   # never let the watch change what the kernel does
            pass
        return original(self, ptrs, mask, *args, **kwargs)

    builder.create_masked_load = load
    try:
        yield watch
    finally:
        builder.create_masked_load = original
