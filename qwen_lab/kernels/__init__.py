"""The course's Triton kernels, one folder per operator family.

Each module reads top-down: the math in a docstring, the `@triton.jit` kernels, then the Python
launchers. A launcher takes the arguments of the function of the same name in `qwen_lab.reference`, in its
order, and returns the same thing; its extras (`out=` buffers, workspaces, so that a CUDA Graph can own every
allocation) come after them (`tests/test_model.py` checks the order).

Modules are imported lazily (after `qwen_lab.runtime` has chosen interpreter or GPU), never here.

`count_launches()` counts Triton kernel launches made from Python inside a `with` block: the checks
use it to prove that a learner's Triton kernel really ran, the benchmark (`qwen_lab.bench`) to count launches
per step.

`dot_precision(dtype)`: the `input_precision` every launcher passes to `tl.dot` ("ieee" for fp32 operands, which
must not drop to tf32 on the GPU; "tf32" otherwise).

`pdl_options(device)`: the launch options of programmatic dependent launch (Hopper and newer, unless the `pdl`
switch is off: qwen_lab.switches).
A kernel launched with them may start while the kernel before it in the stream is still
running, so it calls `gdc_wait()` before it touches any memory that kernel may write (or read) and
`gdc_launch_dependents()` to let the next one start early in turn. The decode step is a chain of a
hundred-odd short kernels: this hides most of the gap between one kernel's end and the next one's start.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter

from ..switches import switches

_state = threading.local()


def _python_function(kernel):
    """The Python function under a launched kernel (a JITFunction, or an Autotuner around one), or None."""
    fn = getattr(kernel, "fn", None)
    while fn is not None and not hasattr(fn, "__name__"):
        fn = getattr(fn, "fn", None)
    return fn


class LaunchCounter(Counter):
    """Launches per kernel name (a Counter), and `functions`: each launched kernel's Python function by name (for
    the checks, which read a failing kernel's source). A subclass that overrides `observe` sees each launch's grid
    and arguments too (syncguard.record_shapes)."""

    def __init__(self):
        super().__init__()
        self.functions = {}

    def observe(self, name: str, grid, args: tuple, kwargs: dict) -> None:
        """Called at each launch counted here, before the kernel runs."""


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
            fn = _python_function(self)
            name = getattr(fn, "__name__", type(self).__name__)
            for c in counters:
                c[name] += 1
                c.functions.setdefault(name, fn)
                c.observe(name, grid, args, kwargs)
            return launch(*args, **kwargs)

        return counted

    KernelInterface.__getitem__ = getitem
    _patched = True


@contextlib.contextmanager
def uncounted():
    """Launches inside this block are not counted by an enclosing `count_launches`: a launcher that times its
    candidate plans on a shape's first call runs them here, since they are not the call's own launches."""
    saved = getattr(_state, "counters", None)
    _state.counters = []
    try:
        yield
    finally:
        _state.counters = saved


@contextlib.contextmanager
def count_launches(counter: LaunchCounter | None = None):
    """`with count_launches() as c: ...` then `sum(c.values())`, `c["rms_norm_kernel"]`; `c.functions[name]` is the
    launched kernel's Python function. `counter`: a LaunchCounter (subclass) of the caller's to fill instead."""
    _install_hook()
    counter = LaunchCounter() if counter is None else counter
    stack = getattr(_state, "counters", None)
    if stack is None:
        stack = _state.counters = []
    stack.append(counter)
    try:
        yield counter
    finally:
        # by identity: two counters holding equal counts compare equal, and list.remove compares by value
        del stack[next(i for i, c in enumerate(stack) if c is counter)]


def dot_precision(dtype) -> str:
    """tl.dot's input_precision for operands of `dtype`, the rule of every launcher: "ieee" for fp32 (exact
    products; on the GPU tf32's 10-bit mantissa would cost about 1e-3), "tf32" otherwise. 16-bit operands ignore
    it; a bf16 model's fp32 tiles (the chunk prep's inverse merges) then run on the tensor cores in tf32."""
    import torch

    return "ieee" if dtype == torch.float32 else "tf32"


def device_key(device):
    """`device` as a torch.device with its index filled in: "cuda" and "cuda:0" are one GPU, and whatever a
    launcher keeps per device (workspaces, counters, tuned plans) must be found under either name. A CUDA
    tensor's own device always carries its index, so launchers pay for the lookup only when given a name."""
    import torch

    if isinstance(device, torch.device) and (device.index is not None or device.type != "cuda"):
        return device
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple:
    import torch

    return torch.cuda.get_device_capability(index)


def max_shared_memory(device) -> int:
    """The shared memory one program may use on CUDA `device`, in bytes (227 KB on an H100/H200, 163 KB on an
    A100, 99 KB on an L4 or an RTX 30/40, 64 KB on a T4)."""
    import torch

    device = torch.device(device)
    return _max_shared(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _max_shared(index: int) -> int:
    from triton.runtime import driver

    return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])


def _major(device) -> int:
    """The compute capability's major number of `device` if it is a CUDA GPU, else 0."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return 0
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0]


def sm90_or_newer(device) -> bool:
    """Whether `device` is a CUDA GPU of compute capability 9.0 or newer (Hopper: programmatic dependent launch, the
    TMA unit) with the Triton interpreter off."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") != "1" and _major(device) >= 9


def tensor_core_dots(device) -> bool:
    """Whether Triton compiles `tl.dot` to tensor-core instructions on CUDA `device`: compute capability 8.0 or newer
    (A100, L4, RTX 30/40, H100/H200). Below it (a T4, sm_75) Triton 3.6 emits no `mma` instruction: every product
    becomes a loop of fp32 FMAs, slow to run and minutes to compile for the large kernels (compiled offline,
    docs/experiments.md, 2026-12-03)."""
    return _major(device) >= 8


def pdl_enabled(device) -> bool:
    """Whether kernels on `device` are launched with programmatic dependent launch: a CUDA GPU of compute
    capability 9.0 or newer, the Triton interpreter off, and the `pdl` switch on (qwen_lab.switches)."""
    return switches.pdl and sm90_or_newer(device)


def pdl_options(device) -> dict:
    """Keyword arguments for a kernel launch: `USE_PDL` for the kernel (a constexpr that turns its
    `gdc_wait()` on) and Triton's `launch_pdl` option; empty when PDL is off."""
    return {"USE_PDL": True, "launch_pdl": True} if pdl_enabled(device) else {}


def graph_bench(kernel_call, quantiles):
    """The timer of two prefill autotuners (matmul, flash attention): the candidate's calls captured in a CUDA Graph and
    replayed, as the model runs them. `do_bench` times calls launched one by one from Python, so a kernel shorter
    than its launch (a TMA candidate's launch also encodes its tensor descriptors on the host) is timed
    at the host's pace: on the H200, with the descriptors made on the device at every launch, it ranked the
    out-projection's persistent TMA tile at 54.7 us, which took 15.7 us in a graph, and picked a tile taking 21.5
    (docs/experiments.md, 2026-11-30).
    It also flushes L2 between calls, while in the model the input a prefill kernel reads was just written and sits
    in L2.

    do_bench_cudagraph runs on a stream of its own, unordered with the caller's, so the caller's work is finished
    first: the output the timed calls write may sit in memory that the caller's pending kernels still use (the
    caching allocator hands a block freed on the caller's stream straight to the next allocation there)."""
    import torch
    import triton

    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(kernel_call, rep=20, quantiles=quantiles)


def replay_us(graph, replays: int = 5) -> float:
    """Microseconds per replay of a captured CUDA Graph (after one untimed replay), timed with CUDA events."""
    import torch

    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def graph_time_us(calls, warmup: bool = False, replays: int = 5) -> float:
    """Microseconds per call of `calls` (callables), captured back to back in one CUDA Graph and replayed: what the
    GPU spends on them with no launch overhead from Python, as in the model's own replay. With `warmup`, each call
    first runs once on a side stream (compiling, tuning and allocating outside the capture)."""
    import torch

    if warmup:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for call in calls:
                call()
        torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    us = replay_us(graph, replays) / len(calls)
    del graph
    return us
