"""What the notebooks call to grade an exercise, and what the tests use to compare tensors.

A check draws fresh random inputs, poisons every output buffer first (a tagged NaN for floats, a sentinel for
integers) so that a kernel that writes nothing cannot pass, runs the learner's function, proves that
a Triton kernel really launched, and compares with the reference at a tolerance set by the dtype.
The learner's function gets every tensor inside a larger guarded buffer with the case's own strides (NaN
around and between the rows of inputs, a sentinel around outputs): an out-of-bounds store is reported
instead of corrupting the process, and a load outside an input brings NaN into the output. Under the
interpreter every load's active lanes are watched too, so a read outside a tensor is named with its kernel's line
even where its values never reach an output (a passing check says so in a note; on a GPU such a read can fault).
A failure says what is wrong in words: which output, how many elements, the worst one and where, whether
NaN was never written or computed, outputs returned in each other's place, and a hint. An exercise left as its
stub reads as its own NotImplementedError, inside `check_kernel` and in a cell that calls the learner's function
itself within `with checks.learner_code():`.

    from qwen_lab import checks, reference
    checks.check_kernel("rms_norm", my_rms_norm, reference.rms_norm,
                        cases=[lambda g: dict(x=torch.randn(5, 64, generator=g), ...)])
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from .kernels import LaunchCounter, count_launches

# atol, rtol per dtype of the values compared. float32 kernels differ from torch only by the order of
# additions (and tf32 never runs: the CPU path is the interpreter, GPU checks use bf16/fp16).
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 5e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
INT_POISON = -7777


class CheckFailed(AssertionError):
    """An exercise or kernel check that did not pass; the message says why."""


@dataclass
class Comparison:
    name: str
    max_abs: float
    max_rel: float
    worst_index: tuple
    n_bad: int
    numel: int

    def __str__(self) -> str:
        return (f"{self.name}: max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g} "
                f"({self.numel} elements)")


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for outputs of this dtype."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64, the one-number summary used for whole-model parity."""
    o, r = out.double(), ref.double()
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


# The NaN that poisons output buffers, as bit patterns of one payload per width. A NaN a kernel computes (0/0, or a
# NaN read from around an input) has another payload, so `compare` can tell "never written" from "computed NaN".
POISON_BITS = {torch.float64: 0x7FF8DEADDEADDEAD, torch.float32: 0x7FC0DEAD, torch.float16: 0x7E5A,
               torch.bfloat16: 0x7FDA}
# the signed integer type of each float width: float bit patterns are written and compared through such a view
_INT_OF = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _poison_int(t: torch.Tensor) -> int | None:
    """t's poison pattern as a value of its same-width signed integer view (None: no poison pattern)."""
    bits = POISON_BITS.get(t.dtype)
    if bits is None:
        return None
    width = 8 * t.element_size()
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def _poison_mask(t: torch.Tensor) -> torch.Tensor | None:
    """Where t still holds the float poison (None for dtypes without a poison pattern)."""
    signed = _poison_int(t)
    return None if signed is None else t.view(_INT_OF[t.element_size()]) == signed


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill t so that any element a kernel forgets to write stands out (a tagged NaN, or -7777 for integers)."""
    signed = _poison_int(t)
    if signed is not None:  # (a same-width integer view works for any strides)
        t.view(_INT_OF[t.element_size()]).fill_(signed)
    elif t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(INT_POISON)
    return t


def _fmt_index(flat: int, shape) -> tuple:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape))) if len(shape) else ()


def compare(name: str, out, ref, atol: float | None = None, rtol: float | None = None, hint: str = "") -> Comparison:
    """Assert that `out` matches `ref`; raise CheckFailed explaining the first thing wrong.

    Checks in order: it is a tensor, the shape, the dtype, unwritten (NaN) or infinite elements,
    then values within atol + rtol * |ref|. Integer tensors must match exactly.
    """
    tip = _tip(hint)
    if not isinstance(out, torch.Tensor):
        raise CheckFailed(f"{name}: expected a torch.Tensor, got {type(out).__name__}{tip}")
    if tuple(out.shape) != tuple(ref.shape):
        raise CheckFailed(f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}{tip}")
    if out.dtype != ref.dtype:
        raise CheckFailed(f"{name}: dtype {out.dtype}, expected {ref.dtype}{tip}")
    o, r = out.detach().cpu(), ref.detach().cpu()
    numel = o.numel()
    if not o.is_floating_point():
        bad = o != r
        n_bad = int(bad.sum())
        if n_bad:
            flat = int(bad.flatten().nonzero()[0])
            idx = _fmt_index(flat, o.shape)
            unwritten = int((o == INT_POISON).sum())
            extra = f"; {unwritten} still hold the poison value {INT_POISON} (never written)" if unwritten else ""
            raise CheckFailed(f"{name}: {n_bad} of {numel} values differ{extra}; first at {idx}: got "
                              f"{o.flatten()[flat].item()}, expected {r.flatten()[flat].item()}{tip}")
        return Comparison(name, 0.0, 0.0, (), 0, numel)
    default_atol, default_rtol = tolerance(ref.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    poisoned = _poison_mask(o)
    o, r = o.double(), r.double()
    nan_out = torch.isnan(o) & ~torch.isnan(r)
    if nan_out.any():
        n = int(nan_out.sum())
        idx = _fmt_index(int(nan_out.flatten().nonzero()[0]), o.shape)
        unwritten = int((poisoned & nan_out).sum()) if poisoned is not None else None
        never = ("never written, or computed from an output element before it was written (outputs start as "
                 "NaN: check that the grid covers every block and the store mask; an atomic_add into an output "
                 "adds to its NaN, and a load from an output before its store reads the NaN)")
        computed = _computed_nan(o, r, nan_out if poisoned is None else nan_out & ~poisoned)
        if unwritten is None:  # an output the check did not poison itself
            why = ("the kernel never wrote them (outputs start as NaN: check the grid covers every block "
                   "and the store mask), or computed NaN") if n < numel else \
                "every element is NaN: nothing was written, or a NaN spread"
        elif unwritten == n:
            why = f"all {never}"
        elif unwritten == 0:
            why = f"none holds the check's poison: {computed}"
        else:
            why = f"{unwritten} still hold the poison, {never}; {n - unwritten} were {computed}"
        raise CheckFailed(f"{name}: {n} of {numel} elements are NaN, first at {idx}; {why}{tip}")
    inf_out = torch.isinf(o) & ~torch.isinf(r)
    if inf_out.any():
        idx = _fmt_index(int(inf_out.flatten().nonzero()[0]), o.shape)
        raise CheckFailed(f"{name}: {int(inf_out.sum())} elements are infinite, first at {idx} (an overflow, or a "
                          f"load that read memory outside the inputs: check the load masks and the pointer "
                          f"arithmetic){tip}")
    diff = (o - r).abs()
    finite = torch.isfinite(r)
    diff = torch.where(finite, diff, torch.zeros_like(diff))
    limit = atol + rtol * r.abs()
    bad = diff > limit
    flat = int(diff.flatten().argmax()) if numel else 0
    max_abs = float(diff.max()) if numel else 0.0
    rel = diff / r.abs().clamp_min(atol if atol > 0 else 1e-30)
    max_rel = float(rel.max()) if numel else 0.0
    idx = _fmt_index(flat, o.shape)
    cmp = Comparison(name, max_abs, max_rel, idx, int(bad.sum()), numel)
    if cmp.n_bad:
        huge = (" Values this large usually come from memory outside the inputs: check the load masks."
                if numel and float(o.abs().max()) > 1e6 * max(float(r.abs().max()), 1e-30) else "")
        factor = _common_factor(o, r, atol, rtol)
        if factor is not None:
            huge += f" Every element is the reference times {factor:.6g}: a missing or extra scale factor."
        else:
            huge += _where_wrong(bad) + _misplaced(o, r, bad, atol, rtol)
        raise CheckFailed(
            f"{name}: {cmp.n_bad} of {numel} elements differ from the reference beyond atol={atol:g}, "
            f"rtol={rtol:g}; worst at {idx}: got {o.flatten()[flat].item():.6g}, expected "
            f"{r.flatten()[flat].item():.6g} (abs error {max_abs:.3g}).{huge}{tip}")
    return cmp


_NAN_CAUSES = ("a load outside an input: strided inputs hold NaN between and around their rows; or 0/0, e.g. a "
               "missing eps; or exp(-inf - (-inf)) in a row whose every entry is masked; or inf/inf, an exp that "
               "overflowed where the row's max was not subtracted first")


def _computed_nan(o: torch.Tensor, r: torch.Tensor, computed: torch.Tensor) -> str:
    """'computed as NaN (...)': why a kernel computed NaN where the reference has a number, told from the rows (along
    the last dim) that hold them. Rows whose expected values are all 0: a row with nothing to normalise (a softmax
    row whose every key is masked). Rows whose other elements came out 0: a sum that overflowed to inf. Whole rows
    otherwise: a NaN spread through the row's reduction, or 0/0. Scattered elements: the list of usual causes."""
    if o.dim() < 2 or o.shape[-1] < 2 or not bool(computed.any()):   # no rows to tell apart
        return f"computed as NaN ({_NAN_CAUSES})"
    lead = tuple(o.shape[:-1])
    o2, r2, c2 = o.reshape(-1, o.shape[-1]), r.reshape(-1, o.shape[-1]), computed.reshape(-1, o.shape[-1])
    has = c2.any(1)
    nan_row = torch.isnan(o2)
    ref_zero = (r2 == 0).all(1)
    whole = nan_row.all(1)
    # the finite elements of the row are all 0 although the reference's are not: x / inf beside inf / inf
    zero_rest = torch.where(nan_row, torch.zeros_like(o2), o2).eq(0).all(1) & ~whole & (r2 != 0).any(1)
    kinds = {
        "empty": has & ref_zero,
        "overflow": has & ~ref_zero & zero_rest,
        "whole": has & ~ref_zero & whole,
    }
    kinds["scattered"] = has & ~kinds["empty"] & ~kinds["overflow"] & ~kinds["whole"]

    def rows(mask: torch.Tensor) -> str:
        where = _where_wrong(mask.reshape(lead)).removeprefix(" The wrong elements lie only in ").rstrip(".")
        return f"{int(mask.sum())} of {mask.numel()} rows{f' ({where})' if where else ''}"

    explained = {
        "empty": ("whose expected values are all 0: a row with nothing to normalise, such as a softmax row whose "
                  "every key is masked: exp(-inf - (-inf)) = NaN when the row's max is -inf (subtract 0 there "
                  "instead), or 0/0 when its sum is 0 (divide by 1 there instead); such a row must come out as zeros"),
        "overflow": ("whose other elements came out 0: the row's sum overflowed to inf (inf/inf = NaN where an exp "
                     "overflowed, x/inf = 0 elsewhere); subtract the row's max before the exp"),
        "whole": ("entirely NaN, whose expected values are not 0: a NaN spread through a reduction over the row (a "
                  "load outside an input, which holds NaN between and around its rows, reaching a sum or a max), or "
                  "0/0 from a sum or a norm that came out 0 (a missing eps; every exp of the row underflowed: was the "
                  "max taken over the row's own visible entries?)"),
    }
    why = [f"{rows(kinds[kind])} {text}" for kind, text in explained.items() if kinds[kind].any()]
    if kinds["scattered"].any():
        why.append(_NAN_CAUSES if len(why) == 0 else f"{rows(kinds['scattered'])}: {_NAN_CAUSES}")
    if len(why) == 1 and kinds["scattered"].any():
        return f"computed as NaN ({why[0]})"
    return "computed as NaN, in " + "; and in ".join(why)


def _ranges(indices: list[int], most: int = 4) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (the first `most` runs, then '...')."""
    runs = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most]]
    return ", ".join(text) + (", ..." if len(runs) > most else "")


def _hit(bad: torch.Tensor, d: int) -> torch.Tensor:
    """[bad.shape[d]] bool: which indices of dim d hold at least one wrong element."""
    return bad.movedim(d, 0).reshape(bad.shape[d], -1).any(1)


def _where_wrong(bad: torch.Tensor) -> str:
    """Where the wrong elements lie, for each dim along which they are confined to some of its indices: rows
    from 64 on point at a second tile, heads 4-7 at a head mapping, the last columns at a mask."""
    parts = []
    for d in range(bad.dim()):
        n = bad.shape[d]
        hit = _hit(bad, d)
        k = int(hit.sum())
        if n > 1 and 0 < k < n:
            parts.append(f"dim {d} at {_ranges(hit.nonzero().flatten().tolist())} (of {n})")
    return f" The wrong elements lie only in {'; '.join(parts)}." if parts else ""


def _misplaced(o: torch.Tensor, r: torch.Tensor, bad: torch.Tensor, atol: float, rtol: float,
               most_slices: int = 64) -> str:
    """Slices of the output (along a dim of at most `most_slices` indices) that hold another index's reference:
    the right values at the wrong place, e.g. a query head reading the wrong KV head, or rows swapped."""
    if o.numel() > 1 << 22:
        return ""
    for d in range(o.dim()):
        n = o.shape[d]
        if not 1 < n <= most_slices:
            continue
        wrong = _hit(bad, d).nonzero().flatten().tolist()
        found = {}
        for i in wrong:
            oi = o.select(d, i)
            for j in range(n):
                rj = r.select(d, j)
                if j != i and bool(((oi - rj).abs() <= atol + rtol * rj.abs()).all()):
                    found[i] = j
                    break
        if found and len(found) == len(wrong):
            more = ", ..." if len(found) > 6 else ""
            return (f" Along dim {d} the output's indices {', '.join(str(i) for i in list(found)[:6])}{more} hold "
                    f"the reference's {', '.join(str(j) for j in list(found.values())[:6])}{more}: right values at "
                    f"the wrong index (which head, row or block does each program read or write?).")
    return ""


def _common_factor(o: torch.Tensor, r: torch.Tensor, atol: float, rtol: float) -> float | None:
    """c when o = c * r everywhere (c != 1), within the tolerance: a scale left out or applied twice."""
    big = r.abs() > 10 * atol
    if int(big.sum()) < 2:  # one value is always some multiple of another: a factor says something from two on
        return None
    c = float((o[big] / r[big]).median())
    if not torch.isfinite(torch.tensor(c)) or abs(c - 1) < 10 * rtol or c == 0:
        return None
    scaled = c * r
    if bool(((o - scaled).abs() <= atol + rtol * scaled.abs()).all()):
        return c
    return None


# A stub inside a @triton.jit kernel never runs on a GPU: Triton's compiler refuses the `raise` statement
# ("unsupported AST node type: Raise") and quotes the line, with a caret under it, in its message.
_STUB_IN_KERNEL = re.compile(r'raise NotImplementedError\(("(?:[^"\\]|\\.)*")\)[^\n]*\n\s*\^')


def _unfinished(e: BaseException) -> NotImplementedError | None:
    """The NotImplementedError of an unfinished exercise, found in e's cause chain or message, else None. (Under
    the interpreter a kernel's stub raises it; compiled for a GPU, the compiler's error quotes the stub instead.)"""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NotImplementedError):
            return e
        quoted = _STUB_IN_KERNEL.search(str(e))
        if quoted:
            return NotImplementedError(json.loads(quoted.group(1)))
        e = e.__cause__ or e.__context__
    return None


@contextlib.contextmanager
def learner_code():
    """A block that calls the learner's functions directly (not through `check_kernel`): an exercise still left as
    its stub stops the block with that exercise's own NotImplementedError, e.g. `Exercise 06.1: the RoPE kernel`.

    A stub inside a @triton.jit kernel does not reach the caller as one: the interpreter wraps it in an
    InterpreterError, and compiled for a GPU, Triton's compiler refuses the `raise` statement itself
    ("unsupported AST node type: Raise"). Any other error leaves the block unchanged.

        with checks.learner_code():
            out = my_rope(x, positions, cfg.rotary_dim, cfg.rope_theta)
    """
    try:
        yield
    except NotImplementedError:
        raise
    except Exception as e:
        stub = _unfinished(e)
        if stub is None:
            raise
        raise stub from None


def _is_output(name: str) -> bool:
    """Output buffers by name: `out`, `out_*`, `*_out` (e.g. `residual_out`): poisoned, and not given to the
    reference, which allocates its own results."""
    return name.startswith("out") or name.endswith("_out")


def _clone_keeping_strides(v):
    """A copy of v with v's strides. `clone()` would make a strided view (a slice of a wider projection, rows farther
    apart than their length) contiguous, and a kernel that ignores the row stride would then pass. The gaps
    between the rows hold NaN (zeros for integers), so a kernel that reads them shows it in its output."""
    if not isinstance(v, torch.Tensor):
        return v
    if v.numel() == 0 or v.is_contiguous() or 0 in v.stride():
        return v.clone()
    c = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
    whole = torch.as_strided(c, (c.untyped_storage().nbytes() // c.element_size(),), (1,), 0)
    whole.fill_(float("nan") if c.is_floating_point() else 0)
    return c.copy_(v)


def _clone_inputs(kwargs: dict) -> dict:
    return {k: _clone_keeping_strides(v) for k, v in kwargs.items()}


def _describe(v) -> str:
    """A non-tensor case argument, short: a number, a string, or a config by its name."""
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (int, str, bool)) or v is None:
        return repr(v)
    return getattr(v, "name", type(v).__name__)


def _tip(hint: str) -> str:
    """The hint line that ends a failure message (nothing without a hint)."""
    return f"\n  hint: {hint}" if hint else ""


def _matching_output(o, expected, j: int, atol, rtol) -> int | None:
    """The index of another expected output that `o` matches, if any (a swap of two outputs)."""
    for k, r in enumerate(expected):
        if k == j or not isinstance(o, torch.Tensor) or not isinstance(r, torch.Tensor):
            continue
        if tuple(o.shape) == tuple(r.shape) and o.dtype == r.dtype:
            try:
                compare("", o, r, atol=atol, rtol=rtol)
                return k
            except CheckFailed:
                pass
    return None


def _guardable(t: torch.Tensor) -> bool:
    """Whether check_kernel hands `t` over inside a GuardedTensor (expanded, empty and other tensors go as copies)."""
    return (t.numel() > 0 and t.dtype in _GUARDABLE and t.layout == torch.strided
            and t.device.type in ("cpu", "cuda") and all(st > 0 for st, n in zip(t.stride(), t.shape) if n > 1))


def _guard(t: torch.Tensor, output: bool, accumulator: bool = False) -> "GuardedTensor":
    """t inside a GuardedTensor with its own strides: NaN (0 for integers) around an input, the sentinel
    (INT_POISON) around an output. Around a floating accumulator (a zeroed buffer that tl.atomic_add adds into),
    -0.0: a stray add of 0.0, what a masked-off lane contributes, leaves the sentinel's bits as they were but turns
    -0.0 into +0.0, so even that add past the edge shows."""
    if t.is_floating_point():
        fill = -0.0 if accumulator else GUARD_SENTINEL if output else GUARD_NAN
    else:
        fill = INT_POISON if output else 0
    return GuardedTensor(t, fill, strides=t.stride())


# qwen_lab's own files and Python's standard library (site-packages lies below it too)
_LIBRARY_DIRS = tuple(os.path.join(d, "") for d in {os.path.dirname(os.path.abspath(__file__)),
                                                     os.path.dirname(os.path.abspath(os.__file__))})


def _learner_code(filename: str) -> bool:
    """Whether a frame's file is the learner's (a notebook cell, a script, a test), not a library's."""
    if filename.startswith("<frozen") or "site-packages" in filename or "dist-packages" in filename:
        return False
    if filename.startswith("<"):  # a notebook cell, or code given to exec
        return True
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS)


@contextlib.contextmanager
def _guarded_allocations():
    """While the block runs, `torch.empty`, `torch.zeros` and their `_like` forms called from the learner's own code
    return a guarded buffer (as the check's own outputs are): a store past the end of a buffer the learner's wrapper
    made is then reported (on a CPU it would corrupt the process, or abort it with no message). An empty buffer is
    poisoned, so an element never written shows as the poison; a zeroed one (an accumulator for tl.atomic_add)
    stays zero inside. Yields the list of guards, filled as the block allocates."""
    real = {name: getattr(torch, name) for name in ("empty", "empty_like", "zeros", "zeros_like")}
    allocated: list[GuardedTensor] = []

    def guard(t, poison: bool):
        if not _guardable(t):
            return t
        g = _guard(t, output=True, accumulator=not poison)
        if poison:
            poison_(g.view)
        else:
            g.view.zero_()
        allocated.append(g)
        return g.view

    def guarded(name):
        make, poison = real[name], name.startswith("empty")

        def allocate(*args, **kwargs):
            t = make(*args, **kwargs)
            mine = kwargs.get("out") is None and _learner_code(sys._getframe(1).f_code.co_filename)
            return guard(t, poison) if mine else t
        return allocate

    for name in real:
        setattr(torch, name, guarded(name))
    try:
        yield allocated
    finally:
        for name, fn in real.items():
            setattr(torch, name, fn)


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
    from .runtime import interpreter_active

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


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_kernel(name: str, fn: Callable, ref: Callable, cases: Iterable[Callable[[torch.Generator], dict]],
                 *, seed: int | None = None, atol: float | None = None, rtol: float | None = None,
                 hint: str = "", require_triton: bool = True, inplace: Iterable[str] = (),
                 quiet: bool = False) -> list[Comparison]:
    """Run `fn` and `ref` on each case and compare every output (and every in-place argument).

    cases: callables taking a torch.Generator and returning the keyword arguments of one call, so each
    check draws fresh inputs. Arguments named `out...` or `..._out` are output buffers: poisoned with NaN
    first and left out of the reference's call. `inplace` names arguments that both functions update in place (a cache,
    a state): they are compared after the call too. With `require_triton`, a `fn` that launched no
    Triton kernel fails (the exercise is to write one). Prints one line per case unless `quiet`.
    """
    seed = torch.randint(0, 2**31 - 1, ()).item() if seed is None else seed
    results = []
    kernels_run: dict = {}       # every kernel the cases launched (name -> its Python function), for the note below
    stray_reads: list[str] = []  # loads outside a tensor whose values reached no output (the interpreter only)
    for i, make in enumerate(cases):
        g = torch.Generator().manual_seed(seed + i)
        inputs = make(g)
        ref_in = _clone_inputs(inputs)
        # the learner's function gets every tensor inside a guarded buffer (its strides kept): NaN around the
        # inputs, a sentinel around the outputs, and any element outside a tensor that changes is reported
        guards = {k: _guard(v, output=_is_output(k)) for k, v in inputs.items()
                  if isinstance(v, torch.Tensor) and _guardable(v)}
        fn_in = {k: guards[k].view if k in guards else _clone_keeping_strides(v) for k, v in inputs.items()}
        for key, value in fn_in.items():
            if _is_output(key) and isinstance(value, torch.Tensor):
                poison_(value)
        shapes = ", ".join(f"{k}={tuple(v.shape)}" if isinstance(v, torch.Tensor) else f"{k}={_describe(v)}"
                           for k, v in inputs.items() if not callable(v))
        where = f"{name} (case {i}: {shapes})"
        expected = _as_tuple(ref(**{k: v for k, v in ref_in.items() if not _is_output(k)}))
        try:
            with _guarded_allocations() as allocated, count_launches(_GridRecorder()) as launches, \
                    _watching_reads(guards, allocated) as reads:
                got = fn(**fn_in)
        except CheckFailed:
            raise
        except Exception as e:  # show the learner's own error, with the case that caused it
            stub = _unfinished(e)
            if stub is not None:  # an exercise stub, possibly wrapped by the Triton interpreter or compiler
                raise stub
            shapes_hint = ("; two tiles of different shapes met in one operation: compare each [:, None] with "
                           "[None, :] and the axis of each tl.sum / tl.max (axis=1 reduces each row)"
                           if "incompatible dimensions" in str(e) else "")
            raise CheckFailed(f"{where}: your function raised {type(e).__name__}: {e}{shapes_hint}") from e
        # stray stores: into the margins of a buffer the learner's wrapper allocated, or of a case's tensor
        strays = [(f"a buffer your function allocated ({tuple(g.view.shape)}, ", g) for g in allocated]
        strays += [(f"'{key}' {tuple(g.view.shape)} (in ", g) for key, g in guards.items()]
        for what, guard in strays:
            n = guard.touched()
            if n:
                places, past_rows = guard.stray_places()
                notes = "".join(f"\n  {note}" for note in store_notes(launches.functions, launches.grids, past_rows))
                raise CheckFailed(
                    f"{where}: the kernel wrote {n} element(s) outside {what}{guard.where_touched()}): a tl.store "
                    f"whose mask lets lanes past the edge through, or a wrong stride (every store needs a mask that "
                    f"covers each dim).{places}{notes}{_tip(hint)}")
        if require_triton and sum(launches.values()) == 0:
            raise CheckFailed(f"{where}: no Triton kernel was launched; the exercise is to compute this with "
                              f"a @triton.jit kernel launched as kernel[grid](...)")
        got = _as_tuple(got) if got is not None else ()
        if len(got) != len(expected):
            raise CheckFailed(f"{where}: returned {len(got)} value(s), expected {len(expected)}")
        try:
            # the in-place arguments first: a wrong cache or state explains a wrong output, not the other way round
            for key in inplace:
                results.append(compare(f"{where}, in-place '{key}'", fn_in[key], ref_in[key], atol=atol, rtol=rtol,
                                       hint=hint))
            for j, (o, r) in enumerate(zip(got, expected)):
                label = where if len(expected) == 1 else f"{where}, output {j}"
                try:
                    results.append(compare(label, o, r, atol=atol, rtol=rtol, hint=hint))
                except CheckFailed as failed:
                    other = _matching_output(o, expected, j, atol, rtol)
                    if other is None:
                        raise
                    raise CheckFailed(f"{label}: matches the reference's output {other} instead: the outputs are "
                                      f"swapped (returned, or stored into each other's buffer){_tip(hint)}") from failed
        except CheckFailed as failed:
            suspects = (reads.notes() + unfilled_masked_loads(launches.functions)
                        + unordered_inplace_updates(launches.functions))
            if not suspects:
                raise
            raise CheckFailed(f"{failed}\n  also: {suspects[0]}" + (f" (and {len(suspects) - 1} more such notes)"
                                                                     if len(suspects) > 1 else "")) from failed
        kernels_run.update(launches.functions)
        stray_reads += [note for note in reads.notes() if note not in stray_reads]
        if not quiet:
            worst = max((c.max_abs for c in results[-len(expected):]), default=0.0)
            kernels = ", ".join(sorted(launches)) or "none"
            print(f"  ok  case {i}: {shapes}  max abs error {worst:.2e}  (kernels: {kernels})")
    if not quiet:
        print(f"PASS {name}: {len(results)} comparisons within tolerance")
        # the interpreter (and most GPUs) return 0 in masked-off lanes, so a sum over them passes here; Triton
        # promises nothing for them
        suspects = stray_reads + unfilled_masked_loads(kernels_run) + unordered_inplace_updates(kernels_run)
        if stray_reads:   # (the values read reached no output here; on a GPU a read past an allocation faults)
            suspects[0] += (": their values reached no output here, but on a GPU a read past the end of an "
                            "allocation faults (an illegal memory access, which ends the session)")
        if suspects:
            print(f"  note: the results are right here, but {suspects[0]}" +
                  (f" (and {len(suspects) - 1} more such notes)" if len(suspects) > 1 else ""))
    return results


class _GridRecorder(LaunchCounter):
    """count_launches' counter that also keeps each kernel's last grid (a tuple, or None where a callable grid could
    not be evaluated here), for a failure that says where a program's row came from."""

    def __init__(self):
        super().__init__()
        self.grids = {}

    def observe(self, name, grid, args, kwargs):
        code = getattr(self.functions.get(name), "__code__", None)
        if code is None or not _learner_code(code.co_filename):
            return   # qwen_lab's own kernels: no grid of theirs is ever shown
        if callable(grid):
            try:
                grid = grid(dict(kwargs))
            except Exception:  # a grid that reads the kernel's bound arguments: unknown here
                grid = None
        grid = _as_tuple(grid) if grid is not None else ()
        # plain numbers only (a tensor's value would cost a host synchronisation)
        self.grids[name] = grid if grid and all(isinstance(n, int) for n in grid) else None


def _kernel_tree(fn):
    """(the kernel's FunctionDef, the line of its file where its source starts), or None without source."""
    import ast
    import inspect
    import textwrap

    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)
    return None if node is None else (node, first)


def _learner_kernels(functions: dict):
    """(name, the kernel's FunctionDef, the line of its file where its source starts, its `_bindings`) for each of
    the learner's kernels among functions (name -> Python function) whose source can be read; qwen_lab's own kernels,
    launched beside the learner's, are left out (not the learner's to fix)."""
    for name, fn in functions.items():
        code = getattr(fn, "__code__", None)
        if code is not None and not _learner_code(code.co_filename):
            continue
        parsed = _kernel_tree(fn)
        if parsed is not None:
            yield name, parsed[0], parsed[1], _bindings(parsed[0])


def _is_tl(node, *names) -> bool:
    """node is a call tl.<name>(...) for one of names."""
    import ast

    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "tl")


def _bindings(func) -> dict:
    """name -> the expressions assigned to it anywhere in the kernel (x = ..., x += ..., a, b = c, d)."""
    import ast

    found: dict = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node.value)
                elif isinstance(target, ast.Tuple):
                    values = node.value.elts if isinstance(node.value, ast.Tuple) and \
                        len(node.value.elts) == len(target.elts) else [node.value] * len(target.elts)
                    for t, v in zip(target.elts, values):
                        if isinstance(t, ast.Name):
                            found.setdefault(t.id, []).append(v)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) and node.value:
            found.setdefault(node.target.id, []).append(node.value)
    return found


def _per_lane(expr, bindings: dict, seen: frozenset = frozenset()):
    """Whether expr varies across a block's lanes: True when it reaches a tl.arange (through the names it uses),
    False when it is built from program ids, scalars and constants only, None when a call to another function hides
    it."""
    import ast

    unknown = False
    for node in ast.walk(expr):
        if _is_tl(node, "arange"):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in ("min", "max"):
            unknown = True   # a helper function: what it returns is not read here
        if isinstance(node, ast.Name) and node.id in bindings and node.id not in seen:
            for value in bindings[node.id]:
                lane = _per_lane(value, bindings, seen | {node.id})
                if lane:
                    return True
                unknown |= lane is None
    return None if unknown else False


def store_notes(functions: dict, grids: dict | None = None, past_rows: bool = False) -> list[str]:
    """Sentences on the learner's kernels (name -> Python function) for a store that went outside a tensor: each
    tl.store of a block without a mask, or with a mask that holds one value for the whole block (no tl.arange in
    it: built from program ids and scalars, it lets every lane through or none); and, when the strays lie past a
    tensor's last row (`past_rows`), which program axis each index comes from, beside the grid of the launch."""
    import ast

    notes = []
    for name, func, first, bindings in _learner_kernels(functions):
        for node in ast.walk(func):
            if not _is_tl(node, "store", "atomic_add") or not node.args:
                continue
            line = f"{name} (line {first + node.lineno - 1} of its file)"
            mask = next((k.value for k in node.keywords if k.arg == "mask"), node.args[2] if len(node.args) > 2
                        else None)
            if any(k.arg == "boundary_check" for k in node.keywords) or not _per_lane(node.args[0], bindings):
                continue   # a block pointer's store, or one element per program: no lanes to mask
            lanes = sorted({n.id for n in ast.walk(node.args[0]) if isinstance(n, ast.Name) and n.id in bindings
                            and _per_lane(n, bindings)})
            offsets = f" (`{'`, `'.join(lanes)}`)" if lanes else ""
            if mask is None:
                notes.append(f"{line} stores `{ast.unparse(node)}` with no mask: every lane of the block writes, "
                             f"also those past the tensor's end; mask it with a comparison of the lanes' offsets"
                             f"{offsets} and the length")
                continue
            if _per_lane(mask, bindings) is False:
                shown = ast.unparse(mask)
                if isinstance(mask, ast.Name) and len(bindings.get(mask.id, ())) == 1:
                    shown += f"` (= `{ast.unparse(bindings[mask.id][0])}`)"
                else:
                    shown += "`"
                notes.append(f"{line}: the mask `{shown} of its tl.{node.func.attr} holds one value for the whole "
                             f"block: it uses no tl.arange (only program ids and scalars), so it lets every lane "
                             f"through or none. Build it from the lanes' offsets in the store's address{offsets}, e.g. "
                             f"`offsets < n`")
        if past_rows and not any(note.startswith(f"{name} (line") and "one value for the whole block" in note
                                 for note in notes):   # (a mask with no lanes explains the strays already)
            axes = []
            for var, values in bindings.items():
                for v in values:
                    if _is_tl(v, "program_id"):
                        arg = v.args[0] if v.args else next((k.value for k in v.keywords if k.arg == "axis"), None)
                        axes.append(f"`{var} = tl.program_id({ast.unparse(arg) if arg is not None else ''})`")
            if len(axes) > 1:
                grid = (grids or {}).get(name)
                along = ", ".join(f"{n} along axis {a}" for a, n in enumerate(grid or ()))
                ran = f"ran on the grid {grid} ({along.replace(' along', ' program(s) along', 1)}) and " if grid else ""
                notes.append(f"{name} {ran}takes {', '.join(axes)}: does each index come from the axis the launcher "
                             f"sized for it? tl.program_id(0) counts along the grid's first entry, tl.program_id(1) "
                             f"along its second")
    return notes


# the calls through which a masked-off lane can reach a result that is stored (tl.sum(x) or x.sum(), and so on)
_REDUCTIONS = frozenset({"sum", "max", "min", "argmax", "argmin", "dot", "reduce", "cumsum", "cumprod",
                         "associative_scan", "xor_sum", "dot_scaled"})


def unfilled_masked_loads(functions: dict) -> list[str]:
    """For each kernel (name -> its Python function) that reduces (a sum, max, dot, scan...), the `tl.load` calls
    with a `mask` and no `other`: what lanes it masks off hold is not defined (whatever the GPU returns; zeros under
    the interpreter), harmless when those lanes are never used, wrong once they reach a max, a sum or a dot. A
    kernel without a reduction is left out: its masked lanes reach no stored value (a masked store drops them),
    and pointing at them would send a learner after a mistake that is not there. -> one sentence per such load."""
    import ast

    found = []
    for name, tree, first, _ in _learner_kernels(functions):
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
        if not any(c.func.attr in _REDUCTIONS for c in calls):
            continue
        for node in calls:
            if not (node.func.attr == "load"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "tl"):
                continue
            keywords = {k.arg for k in node.keywords}
            if "mask" in keywords and "other" not in keywords and len(node.args) < 3:
                found.append(f"{name} (line {first + node.lineno - 1} of its file) loads `{ast.unparse(node)}` with a "
                             f"mask and no `other=`: the lanes it masks off hold undefined values (zeros under the "
                             f"interpreter). If they reach a max, a sum or a dot, give them the value that leaves "
                             f"them out: other=float('-inf') for a max, other=0.0 for a sum.")
    return found


def _base_pointer(expr, bindings: dict, seen: frozenset = frozenset()):
    """The name of the pointer an address expression starts from (`state_ptr` in `state_ptr + rows * stride + c`,
    through names bound to such sums), or None where it cannot be told."""
    import ast

    while isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Sub)):
        expr = expr.left
    if isinstance(expr, ast.Name):
        values = bindings.get(expr.id, [])
        if len(values) == 1 and expr.id not in seen:
            return _base_pointer(values[0], bindings, seen | {expr.id}) or expr.id
        return expr.id
    return None


def unordered_inplace_updates(functions: dict) -> list[str]:
    """For each learner's kernel (name -> its Python function), a `tl.store` through a pointer that a `tl.load` of
    the same kernel read earlier (by line) at other addresses, with no `tl.debug_barrier()` between the two: an
    update in place, such as a state shifted by some columns. The threads of one program run at their own pace, so
    one may overwrite an element that another has not read yet. The interpreter runs each program as one thread,
    in order, so the results are right there; on a GPU they may be wrong now and then. -> one sentence per store."""
    import ast

    found = []
    for name, func, first, bindings in _learner_kernels(functions):
        loads, stores, barriers = [], [], []
        for node in ast.walk(func):
            if _is_tl(node, "debug_barrier"):
                barriers.append(node.lineno)
            elif _is_tl(node, "load", "store") and node.args:
                base = _base_pointer(node.args[0], bindings)
                if base is not None:
                    (loads if node.func.attr == "load" else stores).append((node.lineno, base, node))
        for line, base, store in sorted(stores, key=lambda x: x[0]):
            earlier = [(ln, ld) for ln, b, ld in loads if b == base and ln < line
                       and ast.dump(ld.args[0]) != ast.dump(store.args[0])]   # (the same address: each lane its own)
            if not earlier:
                continue
            last = max(ln for ln, _ in earlier)
            if any(last < b < line for b in barriers):
                continue
            found.append(f"{name} (line {first + line - 1} of its file) stores through `{base}` at other addresses "
                         f"than its tl.load on line {first + last - 1} read, with no tl.debug_barrier() between them: "
                         f"the threads of one program run at their own pace, so one may overwrite an element another "
                         f"has not read yet (the interpreter runs a program as one thread, so it cannot show here; a "
                         f"GPU may, now and then). Call tl.debug_barrier() after the last load and before the store.")
    return found


def randn(*shape, g: torch.Generator, dtype=torch.float32, device="cpu", scale: float = 1.0) -> torch.Tensor:
    """Seeded normal values drawn on the CPU (reproducible everywhere), then moved."""
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def finite_or_raise(name: str, t: torch.Tensor) -> None:
    """Raise CheckFailed if t holds NaN or inf (used to find the first operator that breaks)."""
    if not torch.isfinite(t).all():
        n = int((~torch.isfinite(t)).sum())
        raise CheckFailed(f"{name}: {n} of {t.numel()} values are NaN or infinite")


# ---------------------------------------------------------------- guard regions

GUARD_NAN, GUARD_SENTINEL = float("nan"), -7777.0
_GUARDABLE = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16)
_tags = iter(range(1, 1 << 30))


def _tagged_nan_(buf):
    """Fill buf with a NaN whose payload no other guard uses: a NaN copied from another tensor's margin
    (a load past one end, then a store past another) then shows as a changed bit pattern."""
    tag = next(_tags) % 63 + 1
    pattern = {2: 0x7FC0 | tag, 4: 0x7FC00000 | (tag << 8), 8: 0x7FF8000000000000 | (tag << 20)}
    buf.view(_INT_OF[buf.element_size()]).fill_(pattern[buf.element_size()])


class GuardedTensor:
    """A copy of `src` as a view into a bigger buffer filled with `fill`, with a margin on both sides of the tensor
    again plus 128 rows (at most 2**17 elements of them) and 256 elements (a store with no row mask writes a whole
    block of rows past the last one).
    The view has `strides` (check_kernel keeps a case's own), or by default contiguous rows with every leading dim
    `pad` extra elements of pitch, so the gaps between rows are guarded too.

    The Triton interpreter runs kernels on CPU memory, where a load or store past a tensor's end lands in a
    neighbouring allocation unnoticed (or corrupts the process) while a GPU faults. Guarded tensors make such
    accesses visible: NaN around inputs (read, it reaches an output), a sentinel around outputs, and `touched()`
    counts every element outside the view whose bits changed."""

    def __init__(self, src, fill, pad=3, strides=None):
        shape = tuple(src.shape)
        if strides is None:
            strides = [1] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                strides[d] = shape[d + 1] * strides[d + 1] + pad
        strides = tuple(strides)
        span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        margin = (span + min(128 * max(strides, default=1), 1 << 17) + 256 + 15) // 16 * 16  # 16-byte aligned views
        self.buf = torch.full((2 * margin + span,), fill, dtype=src.dtype, device=src.device)
        if fill != fill:
            _tagged_nan_(self.buf)
        self.margin, self.span = margin, span
        self.view = self.buf.as_strided(shape, strides, margin)
        self.view.copy_(src)
        inside = torch.zeros(self.buf.shape, dtype=torch.bool, device=src.device)
        inside.as_strided(shape, strides, margin).fill_(True)
        self.outside = ~inside
        self.before = self.buf.clone()

    def _changed(self) -> torch.Tensor:
        bits = _INT_OF[self.buf.element_size()]  # compared as bit patterns, so NaN == NaN
        return (self.buf.view(bits) != self.before.view(bits)) & self.outside

    def touched(self) -> int:
        """How many elements outside the view changed."""
        return int(self._changed().sum())

    def where_touched(self) -> str:
        """Where the changed elements lie: before the view, past it, or between its rows."""
        at = self._changed().nonzero().flatten()
        before, after = int((at < self.margin).sum()), int((at >= self.margin + self.span).sum())
        parts = [f"{before} before its start" if before else "", f"{after} past its end" if after else "",
                 f"{len(at) - before - after} between its rows" if len(at) - before - after else ""]
        return ", ".join(p for p in parts if p)

    def stray_places(self) -> tuple[str, bool]:
        """Where the changed elements lie in the view's own index space (' The stray elements lie at columns 160-255
        (of 160)...'), and whether they may lie past a leading dim (a row, a head) rather than only past the last one
        (a column). Past the end of a tensor, a column past the last row's end and a row past the last one can be the
        same memory: both readings are then given. ('', False) for a view whose strides are not of rows one after
        another."""
        shape, strides = tuple(self.view.shape), tuple(self.view.stride())
        nd = len(shape)
        if nd == 0 or strides[-1] != 1 or any(strides[d] < shape[d + 1] * strides[d + 1] for d in range(nd - 1)):
            return "", False
        offsets = self._changed().nonzero().flatten() - self.margin   # from the view's first element
        if offsets.numel() == 0:
            return "", False
        rest, parts, lead, column = offsets, [], False, offsets
        for d in range(nd):
            idx = torch.div(rest, strides[d], rounding_mode="floor") if d < nd - 1 else rest
            rest = rest - idx * strides[d]
            column = idx   # (after the loop: the index along the last dim)
            off = (idx < 0) | (idx >= shape[d])
            if not bool(off.any()):
                continue
            lead |= d < nd - 1
            what = "offsets" if nd == 1 else "columns" if d == nd - 1 else "rows" if nd == 2 else f"dim {d} indices"
            parts.append(f"{what} {_ranges(torch.unique(idx[off]).tolist())} (of {shape[d]})")
        if not parts:
            return "", False
        row_end = f"lanes past the end of {'a row' if nd > 1 else 'it'}, which the store's mask let through"
        row_past = ("a program whose row lies past the tensor's last one (a row index computed wrong, a program id "
                    "taken from the wrong axis of the grid, or rows without a mask)")
        last_row = sum((n - 1) * st for n, st in zip(shape[:-1], strides[:-1])) if nd > 1 else 0
        beyond = offsets >= last_row + shape[-1]
        # past the end, a row past the last one may also be columns past the last row's end: where the rows follow
        # one another with no gap, or where the gap after the last row was written too (a row past it would skip it)
        in_gap = bool((beyond & (offsets < last_row + (strides[-2] if nd > 1 else 0))).any())
        columns = torch.where(beyond, offsets - last_row, column)
        if bool((offsets >= 0).all()) and bool((columns == shape[-1]).all()):
            return (f" The stray elements lie at {'offset' if nd == 1 else 'column'} {shape[-1]} (of {shape[-1]}) "
                    f"only, just past the end of {'a row' if nd > 1 else 'it'}: an off-by-one in the store's mask "
                    f"(a <= where < belongs?)."), False
        if lead and bool((offsets >= 0).all()) and (strides[-2] == shape[-1] or in_gap):
            return (f" The stray elements lie at columns {_ranges(torch.unique(columns).tolist())} (of {shape[-1]}"
                    f"{', of its last row' if bool(beyond.all()) else ''}), or, the memory being the same past its "
                    f"end, at {' and '.join(parts)}: {row_end}, or {row_past}."), True
        return f" The stray elements lie at {' and '.join(parts)}: {row_past if lead else row_end}.", lead


def guarded_call(fn, args: dict, outputs=(), **kwargs) -> dict:
    """fn(**args) with every tensor argument guarded; outputs start as NaN inside and a sentinel around.
    Asserts that nothing outside the tensors changed; -> the argument views (outputs and in-place state)."""
    guards = {}
    for name, t in args.items():
        if isinstance(t, torch.Tensor):
            guards[name] = GuardedTensor(torch.full_like(t, GUARD_NAN) if name in outputs else t,
                                         GUARD_SENTINEL if name in outputs else GUARD_NAN)
    fn(**{name: guards[name].view if name in guards else t for name, t in args.items()}, **kwargs)
    for name, g in guards.items():
        n = g.touched()
        assert n == 0, (f"{getattr(fn, '__name__', fn)}: {n} elements around '{name}' {tuple(g.view.shape)} changed: "
                        f"a store went outside the tensor")
    return {name: g.view for name, g in guards.items()}


__all__ = ["CheckFailed", "Comparison", "TOLERANCES", "check_kernel", "compare", "finite_or_raise", "learner_code",
           "poison_", "randn", "relative_error", "tolerance", "GuardedTensor", "guarded_call",
           "GUARD_NAN", "GUARD_SENTINEL"]
