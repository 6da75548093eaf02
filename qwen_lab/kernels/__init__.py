"""The course's Triton kernels, one module per operator family.

Each module reads top-down: the math in a docstring, the `@triton.jit` kernels, then the Python
launchers. A launcher has the same signature and returns the same thing as the function of the same
name in `qwen_lab.reference`, plus optional `out=` buffers so a CUDA Graph can own every allocation.

Modules are imported lazily (after `qwen_lab.runtime` has chosen interpreter or GPU), never here.

`count_launches()` counts Triton kernel launches made from Python inside a `with` block: the checks
use it to prove that a learner's Triton kernel really ran, the model to count launches per forward.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter

_state = threading.local()


def _kernel_name(kernel) -> str:
    fn = getattr(kernel, "fn", None)
    while fn is not None and not hasattr(fn, "__name__"):
        fn = getattr(fn, "fn", None)
    return getattr(fn, "__name__", type(kernel).__name__)


_patched = False


def _install_hook() -> None:
    """Wrap `KernelInterface.__getitem__` (the `kernel[grid]` in every launch) once, process-wide."""
    global _patched
    if _patched:
        return
    from triton.runtime.jit import KernelInterface

    original = KernelInterface.__getitem__

    def getitem(self, grid):
        launch = original(self, grid)
        counters = getattr(_state, "counters", None)
        if not counters:
            return launch

        def counted(*args, **kwargs):
            name = _kernel_name(self)
            for c in counters:
                c[name] += 1
            return launch(*args, **kwargs)

        return counted

    KernelInterface.__getitem__ = getitem
    _patched = True


@contextlib.contextmanager
def count_launches():
    """`with count_launches() as c: ...` then `sum(c.values())`, `c["rms_norm_kernel"]`."""
    _install_hook()
    counter: Counter = Counter()
    stack = getattr(_state, "counters", None)
    if stack is None:
        stack = _state.counters = []
    stack.append(counter)
    try:
        yield counter
    finally:
        # by identity: two counters holding equal counts compare equal, and list.remove compares by value
        del stack[next(i for i, c in enumerate(stack) if c is counter)]
