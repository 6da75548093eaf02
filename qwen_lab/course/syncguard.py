"""Find what would break a CUDA Graph capture, on any machine, before capturing.

A CUDA Graph records the kernels a step launches and replays them without Python. Two things in the
step's Python code make that impossible, and a CPU can detect both:

1. A host synchronisation: the CPU waits for the GPU to hand it a value (`.item()`, `.cpu()`, `.tolist()`,
   `.numpy()`, `int(t)`, `if t:`, `print(t)`, `torch.cuda.synchronize()`), or an operation whose output
   *shape* depends on the data (`nonzero`, boolean-mask indexing, `unique`: the host must read the count
   before it can allocate). During capture the GPU has run nothing yet, so CUDA refuses: "operation not
   permitted when stream is capturing". Host data copied into a new tensor inside the step
   (`torch.tensor([pos])`) is refused too (a pageable copy), or frozen at its capture-time value.
2. A shape that changes between calls: a graph replays the exact launches, grids and addresses it
   recorded, so every tensor of the step must have the same shape at every step (a fixed set of sizes, as
   graph.PrefillGraphs splits a prompt into buckets).

    from qwen_lab.course.syncguard import forbid_host_sync, find_host_syncs, record_shapes, assert_same_shapes
    with forbid_host_sync():          # raises HostSyncError at the first synchronising call, naming it
        step()
    with find_host_syncs() as found:  # or: list every one without stopping
        step()
    with record_shapes() as a: step()
    with record_shapes() as b: step()
    assert_same_shapes(a, b)          # raises ShapeChangeError at the first operation whose shapes differ

`forbid_host_sync` is a `torch.overrides.TorchFunctionMode`: every torch function and tensor method called
from Python passes through it, and the ones that synchronise by what they are raise. Below it, a
`TorchDispatchMode` sees every ATen operation those calls run, and raises where one reads a tensor's value into
a number (`x[:i]` or `torch.arange(t)` with a tensor `i` or `t`: ATen's `_local_scalar_dense`, what `.item()`
does). `torch.cuda.synchronize` and the `synchronize` methods of streams and events are not torch functions;
they are patched for the duration, as are `torch.accelerator.synchronize` and the streams' and events' `query`.
A copy between devices by `copy_` is named by the devices of its two tensors. What a C++ extension does
internally, a copy inside another call (`x[:] = cpu_tensor`), and names imported before the guard (`from
torch.cuda import synchronize`), are not seen. Where the step runs on a GPU, reading a CPU tensor's value waits for
nothing but is still named: a graph would replay the number it read during the capture. The Triton interpreter's
own copies (it runs kernels on the CPU in NumPy) are exempt: on a GPU they do not exist.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
import threading
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import QwenLabError


class HostSyncError(QwenLabError, RuntimeError):
    """Code that must be capturable synchronised with the host; the message names the call and the line."""


class ShapeChangeError(QwenLabError, AssertionError):
    """Two calls of a step that must be capturable did not produce the same operations with the same shapes."""


_FETCH = ("the host waits until the GPU has finished everything queued, then copies the value; during capture "
          "nothing has run yet, so CUDA refuses (\"operation not permitted when stream is capturing\")")
_DEVICE_VALUE = ("keep the value in a device tensor and let the next operation read it there (a position or a "
                 "token id as a LongTensor [1], a count as a 0-d tensor)")
_SHAPE = ("the output's size depends on the data, so the host must read a count from the GPU before it can "
          "allocate the output, which capture refuses")
_FIXED_SHAPE = ("use a fixed-shape form: torch.where(mask, x, 0) instead of x[mask], a masked reduction or an "
                "argmax instead of nonzero")

# torch function or tensor method -> (what the learner wrote, why it synchronises, what to do instead)
_CALLS = {
    torch.Tensor.item: ("tensor.item()", _FETCH, _DEVICE_VALUE),
    torch.Tensor.tolist: ("tensor.tolist()", _FETCH, _DEVICE_VALUE),
    torch.Tensor.numpy: ("tensor.numpy()", _FETCH, _DEVICE_VALUE),
    torch.Tensor.__array__: ("numpy.asarray(tensor)", _FETCH, _DEVICE_VALUE),
    torch.Tensor.__int__: ("int(tensor)", _FETCH, _DEVICE_VALUE),
    torch.Tensor.__float__: ("float(tensor)", _FETCH, _DEVICE_VALUE),
    torch.Tensor.__complex__: ("complex(tensor)", _FETCH, _DEVICE_VALUE),
    torch.Tensor.__index__: ("a tensor used as a Python index or range bound (tensor.__index__)", _FETCH,
                             _DEVICE_VALUE),
    torch.Tensor.__bool__: ("bool(tensor), e.g. `if tensor:` or `while tensor:`", _FETCH,
                            "decide on the device: torch.where(cond, a, b) instead of a Python branch"),
    torch.Tensor.is_nonzero: ("tensor.is_nonzero()", _FETCH, "decide on the device: torch.where(cond, a, b)"),
    torch.Tensor.__repr__: ("print(tensor) / str(tensor) / repr(tensor)", _FETCH,
                            "print outside the captured step (after replay, from the static output buffer)"),
    torch.Tensor.__format__: ("formatting a tensor (an f-string or format())", _FETCH,
                              "print outside the captured step (after replay, from the static output buffer)"),
    torch.equal: ("torch.equal(a, b)", _FETCH, "compare outside the step, or keep the result on the device"),
    torch.Tensor.equal: ("tensor.equal(other)", _FETCH, "compare outside the step, or keep the result on the device"),
    torch.allclose: ("torch.allclose(a, b)", _FETCH, "compare outside the step"),
    torch.Tensor.allclose: ("tensor.allclose(other)", _FETCH, "compare outside the step"),
    torch.nonzero: ("torch.nonzero(x)", _SHAPE, _FIXED_SHAPE),
    torch.Tensor.nonzero: ("tensor.nonzero()", _SHAPE, _FIXED_SHAPE),
    torch.argwhere: ("torch.argwhere(x)", _SHAPE, _FIXED_SHAPE),
    torch.Tensor.argwhere: ("tensor.argwhere()", _SHAPE, _FIXED_SHAPE),
    torch.masked_select: ("torch.masked_select(x, mask)", _SHAPE, _FIXED_SHAPE),
    torch.Tensor.masked_select: ("tensor.masked_select(mask)", _SHAPE, _FIXED_SHAPE),
    torch.unique: ("torch.unique(x)", _SHAPE, _FIXED_SHAPE),
    torch.Tensor.unique: ("tensor.unique()", _SHAPE, _FIXED_SHAPE),
    torch.unique_consecutive: ("torch.unique_consecutive(x)", _SHAPE, _FIXED_SHAPE),
    torch.Tensor.unique_consecutive: ("tensor.unique_consecutive()", _SHAPE, _FIXED_SHAPE),
    torch.bincount: ("torch.bincount(x)", _SHAPE, "a fixed number of bins: zeros(n).index_add_(0, x, ones) or "
                                                   "scatter_add_"),
    torch.Tensor.bincount: ("tensor.bincount()", _SHAPE, "a fixed number of bins: zeros(n).index_add_(0, x, ones) "
                                                          "or scatter_add_"),
}

# a tensor's value read into a number below the Python call (in C++): a 0-d tensor as an index or a slice bound,
# or given where a size or a count goes (torch.arange(t), torch.topk(x, t), torch.full(shape, t))
_SCALAR_READ = ("a tensor read as a number inside {call} (a tensor given as an index, a slice bound, a size, a "
                "count or a fill value)", _FETCH,
                "keep indices on the device (x.index_select(0, i) or x[i] with a 1-element LongTensor i, "
                "x.narrow with a Python int fixed outside the step), and pass sizes as Python ints")
_REPEATS = ("repeat_interleave with a tensor of repeats and no output_size", _SHAPE,
            "pass output_size= (the total, known outside the step), or repeat a fixed number of times")
_HOST_DATA = ("it copies host memory into a new tensor at every call: a capture either refuses the copy or "
              "freezes the value it had at capture time",
              "allocate a static device buffer once, outside the step, and update it with .copy_() or .fill_() "
              "before each replay")
_TO_HOST = ("tensor.to('cpu')", _FETCH, _DEVICE_VALUE)
_TENSOR_CPU = ("tensor.cpu()", _FETCH, _DEVICE_VALUE)


def _gpu_in_use() -> bool:
    """Whether the code under test can run on a GPU here (then only GPU tensors are fetched from it)."""
    try:
        return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
    except Exception:
        return False
_TO_DEVICE = ("copying a CPU tensor to the GPU inside the step (.cuda() / .to('cuda'))",) + _HOST_DATA
_BOOL_INDEX = ("boolean-mask indexing x[mask]", _SHAPE, _FIXED_SHAPE)
_BOOL_ASSIGN = ("boolean-mask assignment x[mask] = v", _SHAPE,
                "x.masked_fill_(mask, v) or torch.where(mask, v, x) keep the shape fixed")


def _device_of(args, kwargs):
    """The target device of a Tensor.to(...) call, or None when it only changes the dtype."""
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, (str, torch.device)):
            try:
                return torch.device(a)
            except RuntimeError:
                continue
        if isinstance(a, torch.Tensor):  # .to(other): other's device
            return a.device
    return None


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.dim() > 0 for i in items)


_FROZEN = ("it reads a CPU tensor, so nothing waits for the GPU; but a graph records only the GPU's work: every "
           "replay runs with the number this read gave during the capture")
_FROZEN_FIX = ("keep the value in a device tensor that the step reads on the device, or, if it never changes, a "
               "Python number fixed outside the step")


def _on_host(tensor) -> bool:
    """A CPU tensor read where the code under test runs on a GPU: a read that waits for nothing but is frozen in a
    graph (where no GPU is in use, the CPU tensors stand for the GPU's, and their reads are fetches)."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu" and _gpu_in_use()


def _classify(func, args, kwargs):
    """(label, why, fix) when this call synchronises with the host, else None."""
    hit = _CALLS.get(func)
    if hit is not None:
        if hit[1] is _FETCH and args and _on_host(args[0]):
            return (hit[0], _FROZEN, _FROZEN_FIX)
        return hit
    if func is torch.Tensor.to or func is torch.Tensor.cuda or func is torch.Tensor.cpu:
        src = args[0] if args and isinstance(args[0], torch.Tensor) else None
        dst = (torch.device("cuda") if func is torch.Tensor.cuda else torch.device("cpu") if func is torch.Tensor.cpu
               else _device_of(args, kwargs))
        if src is None or dst is None:
            return None
        # a move to the host: from a GPU tensor; or, where no GPU is in use and the CPU stands in for the device,
        # one the line names itself (.cpu(), .to("cpu")), which fetches from the GPU when the course runs there.
        # (.to(other) or .to(other.device) follows its argument: on a GPU it moves nothing either.)
        named = func is torch.Tensor.cpu or any(isinstance(a, str) and a.strip().lower().startswith("cpu")
                                                for a in list(args[1:]) + [kwargs.get("device")])
        if dst.type == "cpu" and (src.device.type != "cpu" or (named and not _gpu_in_use())):
            return _TENSOR_CPU if func is torch.Tensor.cpu else _TO_HOST
        if dst.type != "cpu" and src.device.type == "cpu":
            return _TO_DEVICE
        return None
    if func is torch.Tensor.copy_ and len(args) > 1 and isinstance(args[1], torch.Tensor):
        dst, src = args[0].device.type, args[1].device.type
        if dst == "cpu" and src != "cpu":
            return ("cpu_tensor.copy_(gpu_tensor)", _FETCH, _DEVICE_VALUE)
        if dst != "cpu" and src == "cpu":
            return ("gpu_tensor.copy_(cpu_tensor)",) + _HOST_DATA[:1] + (
                "fill the static device buffer before the replay, outside the step",)
        return None
    if func is torch.Tensor.__getitem__ and len(args) > 1 and _has_bool_index(args[1]):
        return _BOOL_INDEX
    if func is torch.Tensor.__setitem__ and len(args) > 1 and _has_bool_index(args[1]):
        return _BOOL_ASSIGN
    if func is torch.where and len(args) + len(kwargs) == 1:
        return ("torch.where(cond) with one argument (it is nonzero)", _SHAPE, _FIXED_SHAPE)
    if func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor):
        return (f"torch.{func.__name__}(python data)",) + _HOST_DATA
    if func in (torch.repeat_interleave, torch.Tensor.repeat_interleave) and kwargs.get("output_size") is None \
            and len(args) < 4 and any(isinstance(a, torch.Tensor) and a.numel() > 1 for a in args[1:2]):
        return _REPEATS
    if func in (torch.Tensor.index_put_, torch.Tensor.index_put, torch.index_put) and len(args) > 1 \
            and _has_bool_index(tuple(args[1])):
        return _BOOL_ASSIGN
    return None


def _call_name(func) -> str:
    """How a learner wrote a torch function or tensor method: torch.arange, tensor.__getitem__ as x[...]."""
    name = getattr(func, "__name__", None) or str(func)
    if name == "__getitem__":
        return "x[...]"
    if name == "__setitem__":
        return "x[...] = ..."
    owner = "tensor" if getattr(func, "__qualname__", "").startswith("Tensor.") or \
        getattr(func, "__objclass__", None) is torch._C.TensorBase else "torch"
    return f"{owner}.{name}()"


# ---------------------------------------------------------------- where a call came from

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_HERE = os.path.abspath(__file__)
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))   # above qwen_lab/course/
_INTERPRETER = os.path.join("triton", "runtime", "interpreter.py")
_KERNELS_INIT = os.path.join("qwen_lab", "kernels", "__init__.py")  # the launch hook (count_launches)


def _caller():
    """(filename, line, function) of the first frame outside torch, this module, the launch hook and any
    `__torch_function__` handler (another mode watching the same calls, a check's, passes each call on: the call
    is its caller's), and whether the call comes from the Triton interpreter (which emulates the GPU with host
    copies of its own: not the code under test)."""
    f = sys._getframe(1)
    found = None
    while f is not None:
        name = f.f_code.co_filename
        if name.endswith(_INTERPRETER):
            return found, True
        if found is None and not name.startswith(_TORCH_DIR) and os.path.abspath(name) != _HERE \
                and not name.startswith("<frozen") and not name.endswith(_KERNELS_INIT) \
                and f.f_code.co_name != "__torch_function__":
            found = (name, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return found, False


@dataclass(frozen=True)
class HostSync:
    """One synchronising call: what it was, where, why it synchronises and what to do instead."""
    call: str
    filename: str
    line: int
    function: str
    why: str
    fix: str

    @property
    def where(self) -> str:
        return _place(self.filename, self.line, self.function)

    @property
    def source(self) -> str:
        return linecache.getline(self.filename, self.line).strip()

    def message(self) -> str:
        src = self.source
        return (f"host synchronisation in code that must be capturable: {self.call}\n"
                f"  at {self.where}" + (f":  {src}" if src else "") + "\n"
                f"  why: {self.why}.\n"
                f"  instead: {self.fix}.")

    def __str__(self) -> str:
        return f"{self.call} at {self.where}"


_NOTEBOOK_CELL = re.compile(r"ipykernel_\d+[/\\]\d+\.py$")


def _short(filename: str) -> str:
    """A path relative to the qwen_lab checkout or the working directory when it is under one of them; code typed
    in a Jupyter cell (compiled into a temporary file) reads "notebook cell"."""
    if _NOTEBOOK_CELL.search(filename):
        return "notebook cell"
    for root in (_CHECKOUT, os.getcwd()):
        if filename.startswith(root + os.sep):
            return os.path.relpath(filename, root)
    return filename


def _place(filename: str, line: int, function: str) -> str:
    short = _short(filename)
    at = f"{short}, line {line}" if short == "notebook cell" else f"{short}:{line}"
    return at if function == "<module>" else f"{at} in {function}()"


# ---------------------------------------------------------------- the guard

_local = threading.local()


def _allowed() -> bool:
    return getattr(_local, "allowed", 0) > 0


class _SyncMode(TorchFunctionMode):
    """Each torch function or tensor method called from Python: the ones that synchronise by what they are."""

    def __init__(self, on_sync):
        super().__init__()
        self.on_sync = on_sync

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        hit = None
        if not _allowed():
            hit = _classify(func, args, kwargs)
            if hit is not None:
                self.on_sync(hit)
        # what the call does below Python is _ScalarReadMode's to see, named after this call; once this call is
        # reported (an .item(), say), its own read of the value is not reported again
        outer = getattr(_local, "calling", None), getattr(_local, "reported", False)
        _local.calling, _local.reported = func, outer[1] or hit is not None
        try:
            return func(*args, **kwargs)
        finally:
            _local.calling, _local.reported = outer


class _ScalarReadMode(TorchDispatchMode):
    """Below the Python calls: a tensor's value read into a C++ number (ATen's `_local_scalar_dense`, what .item()
    does) while a torch function runs. `x[:i]`, `x[i]` with a 0-d tensor, `torch.arange(t)`, `torch.topk(x, t)`:
    none is a synchronising call by its name, but each fetches a value from the GPU to size or index its work."""

    def __init__(self, on_sync):
        super().__init__()
        self.on_sync = on_sync

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and not _allowed() \
                and not getattr(_local, "reported", False):
            outer = getattr(_local, "calling", None)
            label, why, fix = _SCALAR_READ
            if args and _on_host(args[0]):
                why, fix = _FROZEN, _FROZEN_FIX
            self.on_sync((label.format(call=_call_name(outer) if outer is not None else "a torch call"), why, fix))
        return func(*args, **(kwargs or {}))


_patch_lock = threading.Lock()
_patch_depth = 0
_patched: list[tuple[object, str, object]] = []      # (owner, attribute, original) to restore
_patched_originals: dict[str, object] = {}            # label -> the original function


def _handlers() -> list:
    """This thread's active guards' on_sync callbacks, innermost last (the patches below are process-wide, but a
    guard watches its own thread, as the torch function modes do)."""
    if not hasattr(_local, "handlers"):
        _local.handlers = []
    return _local.handlers


def _cuda_sync_called(label):
    def blocked(*args, **kwargs):
        handlers = _handlers()
        if not _allowed() and handlers:
            why = ("it asks the GPU whether its work is done, which capture refuses (nothing has run yet)"
                   if label.endswith("query()") else "it blocks the host until the GPU is idle, which capture refuses")
            for on_sync in reversed(list(handlers)):  # every guard of this thread, innermost first, as for .item()
                on_sync((label, why, "synchronise outside the step (before replay, or when reading the result)"))
        return _patched_originals[label](*args, **kwargs)
    return blocked


def _patch_cuda():
    global _patch_depth
    with _patch_lock:
        _patch_depth += 1
        if _patch_depth > 1:
            return
        targets = [(torch.cuda, "synchronize", "torch.cuda.synchronize()"),
                   (getattr(torch, "accelerator", None), "synchronize", "torch.accelerator.synchronize()"),
                   (torch.cuda.Stream, "synchronize", "stream.synchronize()"),
                   (torch.cuda.Stream, "query", "stream.query()"),
                   (torch.cuda.Event, "synchronize", "event.synchronize()"),
                   (torch.cuda.Event, "query", "event.query()")]
        for owner, attr, label in targets:
            original = getattr(owner, attr, None)
            if original is None:
                continue
            _patched_originals[label] = original
            _patched.append((owner, attr, original))
            setattr(owner, attr, _cuda_sync_called(label))


def _unpatch_cuda():
    global _patch_depth
    with _patch_lock:
        _patch_depth -= 1
        if _patch_depth:
            return
        while _patched:
            owner, attr, original = _patched.pop()
            setattr(owner, attr, original)
        _patched_originals.clear()


@contextlib.contextmanager
def _guard(on_hit):
    def on_sync(hit):
        where, from_interpreter = _caller()
        if from_interpreter:
            return
        filename, line, function = where or ("<unknown>", 0, "?")
        on_hit(HostSync(hit[0], filename, line, function, hit[1], hit[2]))

    _handlers().append(on_sync)
    _patch_cuda()
    try:
        with _SyncMode(on_sync), _ScalarReadMode(on_sync):
            yield
    finally:
        _unpatch_cuda()
        _handlers().remove(on_sync)


@contextlib.contextmanager
def forbid_host_sync():
    """Raise HostSyncError at the first call inside the block that would synchronise with the host."""
    def raise_it(sync: HostSync):
        raise HostSyncError(sync.message())

    with _guard(raise_it):
        yield


@contextlib.contextmanager
def find_host_syncs():
    """Run the block normally and collect every synchronising call in it: `with find_host_syncs() as found:`,
    then `found` is a list of HostSync (call, file, line, why, fix)."""
    found: list[HostSync] = []
    with _guard(found.append):
        yield found


@contextlib.contextmanager
def allow_host_sync():
    """Suspend the guards, and the shape recorder, inside this block (for code known to stay outside the captured
    step, or exempted on purpose, like an operator that still runs on the reference)."""
    _local.allowed = getattr(_local, "allowed", 0) + 1
    try:
        yield
    finally:
        _local.allowed -= 1


def allowing_host_sync(fn):
    """`fn` wrapped so that the guards ignore what it does (e.g. an operator that still runs on the reference)."""
    def wrapped(*args, **kwargs):
        with allow_host_sync():
            return fn(*args, **kwargs)
    wrapped.__name__ = getattr(fn, "__name__", "wrapped")
    wrapped.__wrapped__ = fn
    return wrapped


# ---------------------------------------------------------------- frozen shapes


@dataclass(frozen=True)
class OpRecord:
    op: str                      # the aten operator, e.g. "aten.slice.Tensor", or a Triton launch with its grid and
    #                              Python scalars, e.g. "triton rms_norm_kernel(4,)(1024, 1e-06, BLOCK=1024)"
    shapes: tuple                # the shapes of its tensor outputs (of a launch: of its tensor arguments)
    where: str                   # the first frame outside torch that called it

    def __str__(self) -> str:
        shapes = ", ".join(str(list(s)) for s in self.shapes)
        return f"{self.op} -> {shapes}  (at {self.where})"


class _ShapeMode(TorchDispatchMode):
    def __init__(self, records):
        super().__init__()
        self.records = records

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _allowed():
            return out
        where, from_interpreter = _caller()
        if not from_interpreter:
            leaves = out if isinstance(out, (tuple, list)) else (out,)
            shapes = tuple(tuple(t.shape) for t in leaves if isinstance(t, torch.Tensor))
            place = _place(*where) if where else "<unknown>"
            self.records.append(OpRecord(str(func), shapes, place))
        return out


def _launch_record(name, grid, args, kwargs) -> OpRecord:
    """A Triton launch as an OpRecord: its grid and Python scalars in `op` (a graph freezes them: the grid it was
    captured with, the numbers baked into the launch), the shapes of its tensor arguments in `shapes`."""
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    scalars = [repr(a) for a in args if isinstance(a, (bool, int, float, str))]
    scalars += [f"{k}={v!r}" for k, v in kwargs.items() if isinstance(v, (bool, int, float, str))]
    grid_text = str(tuple(grid)) if isinstance(grid, (tuple, list)) else "grid(meta)"
    site, _ = _caller()  # the code that launched it, above the launch hook
    return OpRecord(f"triton {name}{grid_text}({', '.join(scalars)})", tuple(tuple(t.shape) for t in tensors),
                    _place(*site) if site else "<unknown>")


@contextlib.contextmanager
def record_shapes():
    """Record every tensor operation of the block with its output shapes, and every Triton launch with its grid,
    its Python scalars and the shapes of its tensor arguments: `with record_shapes() as ops:`. Two calls of a
    capturable step must record the same list (compare with assert_same_shapes)."""
    from ..kernels import LaunchCounter, count_launches

    records: list[OpRecord] = []

    class Launches(LaunchCounter):
        def observe(self, name, grid, args, kwargs):
            if not _allowed():
                records.append(_launch_record(name, grid, args, kwargs))

    with _ShapeMode(records), count_launches(Launches()):
        yield records


def assert_same_shapes(first: list[OpRecord], second: list[OpRecord], what: str = "the step") -> None:
    """Raise ShapeChangeError naming the first operation whose output shapes differ between two recordings."""
    for i, (a, b) in enumerate(zip(first, second)):
        if a.op != b.op or a.shapes != b.shapes:
            raise ShapeChangeError(
                f"{what} does not have frozen shapes: operation {i} differs between two calls\n"
                f"  first call:  {a}\n  second call: {b}\n"
                f"  a CUDA Graph replays the shapes it recorded, and a kernel's grid and Python numbers with them; "
                f"make them independent of the step (read positions and lengths from device tensors inside the "
                f"kernel, run a fixed set of sizes)")
    if len(first) != len(second):
        longer = first if len(first) > len(second) else second
        extra = longer[min(len(first), len(second))]
        raise ShapeChangeError(
            f"{what} does not have frozen shapes: the calls ran {len(first)} and {len(second)} operations; "
            f"the first extra one is {extra}\n  a CUDA Graph replays the exact operations it recorded")


__all__ = ["HostSync", "HostSyncError", "OpRecord", "ShapeChangeError", "allow_host_sync", "allowing_host_sync",
           "assert_same_shapes", "find_host_syncs", "forbid_host_sync", "record_shapes"]
