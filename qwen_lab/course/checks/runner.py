"""check_kernel: run the learner's function and the reference on fresh cases, with guarded inputs and poisoned
outputs, and say what is wrong, the most specific finding first; learner_code: an exercise still left as its stub
reads as its own NotImplementedError, one short message (ExerciseNotDone).
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Callable, Iterable

import torch

from ...kernels import LaunchCounter, count_launches
from .. import kept   # (a module, not its names: kept.py imports checks too)
from .comparison import CheckFailed, Comparison, _tip, compare, poison_
from .guards import _guard, _guardable, _guarded_allocations
from .learner import _learner_code
from .pitfalls import exercise_of, matched_pitfalls
from .read_watch import _watching_reads
from .source_notes import store_notes, unfilled_masked_loads, unordered_inplace_updates

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


# the kernel a compiler's error quotes: "def add_kernel(x_ptr, ...)"
_QUOTED_DEF = re.compile(r"^def (\w+)\(", re.M)


class ExerciseNotDone(NotImplementedError):
    """An exercise still left as its stub. IPython and Jupyter show it as its message alone, with no traceback: the
    frames of the check and of Triton's interpreter would only hide the one thing to do."""

    def _render_traceback_(self) -> list[str]:
        return [f"NotImplementedError: {self}"]


def _not_done(e: BaseException) -> ExerciseNotDone | None:
    """An ExerciseNotDone naming the exercise, the function that still raises its stub and what to do, when e is
    (or wraps) an exercise's stub; else None."""
    if isinstance(e, ExerciseNotDone):
        return e
    stub = _unfinished(e)
    if stub is None or not str(stub).startswith("Exercise "):   # a NotImplementedError of the learner's own
        return None
    where = None
    tb = stub.__traceback__
    while tb is not None:   # the innermost frame: the kernel or the function that holds the stub
        where, tb = tb.tb_frame.f_code.co_name, tb.tb_next
    seen = set()
    while where is None and e is not None and id(e) not in seen:   # compiled for a GPU: the compiler's message
        seen.add(id(e))                                            # quotes the kernel's source, its def line too
        quoted = _QUOTED_DEF.search(str(e)) if _STUB_IN_KERNEL.search(str(e)) else None
        where = quoted.group(1) if quoted else None
        e = e.__cause__ or e.__context__
    who = f"`{where}`" if where else "your function"
    return ExerciseNotDone(f"{stub}: {who} still raises NotImplementedError (the exercise's stub): fill in the "
                           f"exercise's cell above, run it, then run this cell again")


@contextlib.contextmanager
def learner_code():
    """A block that calls the learner's functions directly (not through `check_kernel`): an exercise still left as
    its stub stops the block with one short ExerciseNotDone (a NotImplementedError) that names the exercise and the
    function still to write, e.g. "Exercise 06.1: the RoPE kernel: `rope_kernel` still raises NotImplementedError...".

    A stub inside a @triton.jit kernel does not reach the caller as one: the interpreter wraps it in an
    InterpreterError, and compiled for a GPU, Triton's compiler refuses the `raise` statement itself
    ("unsupported AST node type: Raise"). Any other error leaves the block unchanged.

        with checks.learner_code():
            out = my_rope(x, positions, cfg.rotary_dim, cfg.rope_theta)
    """
    try:
        yield
    except Exception as e:
        stub = _not_done(e)
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


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _shape_of(k: str, v) -> str:
    if not isinstance(v, torch.Tensor):
        return f"{k}={_describe(v)}"
    return f"{k}={tuple(v.shape)}" + (" float16" if v.dtype == torch.float16 else "")


def _with_half_case(cases: list, exercise) -> list:
    """The cases, then the exercise's float16 case (built from the first case's device and row length) where its
    notebook teaches the fp32 upcast."""
    if exercise is None or exercise.half_case is None or not cases:
        return cases
    first, half = cases[0], exercise.half_case
    return cases + [lambda g: half(first(g), g)]


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
    A check whose name is an exercise's (pitfalls.py) also runs that exercise's float16 case, if it has one, names
    its pitfalls when the result matches one, and names only the causes of NaN that belong to its operator.
    A failure lists its findings most specific first: a read outside a tensor, a matched pitfall, what the
    comparison found, then notes read from the kernel's source.
    """
    seed = torch.randint(0, 2**31 - 1, ()).item() if seed is None else seed
    inplace = tuple(inplace)
    exercise = exercise_of(name)
    operator = exercise.operator if exercise else None
    results = []
    kernels_run: dict = {}       # every kernel the cases launched (name -> its Python function), for the note below
    stray_reads: list[str] = []  # loads outside a tensor whose values reached no output (the interpreter only)
    for i, make in enumerate(_with_half_case(list(cases), exercise)):
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
        shapes = ", ".join(_shape_of(k, v) for k, v in inputs.items() if not callable(v))
        where = f"{name} (case {i}: {shapes})"
        expected = _as_tuple(ref(**{k: v for k, v in ref_in.items() if not _is_output(k)}))
        try:
            with _guarded_allocations() as allocated, count_launches(_GridRecorder()) as launches, \
                    _watching_reads(guards, allocated) as reads:
                got = fn(**fn_in)
        except CheckFailed:
            raise
        except Exception as e:  # show the learner's own error, with the case that caused it
            stub = _not_done(e)
            if stub is not None:  # an exercise stub, possibly wrapped by the Triton interpreter or compiler
                raise stub from None
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
        # the in-place arguments first: a wrong cache or state explains a wrong output, not the other way round
        compared = [(f"{where}, in-place '{key}'", fn_in[key], ref_in[key]) for key in inplace]
        compared += [(where if len(expected) == 1 else f"{where}, output {j}", o, r)
                     for j, (o, r) in enumerate(zip(got, expected))]
        for j, (label, o, r) in enumerate(compared):
            try:
                results.append(compare(label, o, r, atol=atol, rtol=rtol, operator=operator))
                continue
            except CheckFailed as failed:
                found = str(failed).removeprefix(f"{label}: ")
                other = None if j < len(inplace) else _matching_output(o, expected, j - len(inplace), atol, rtol)
            if other is not None:
                found = (f"matches the reference's output {other} instead: the outputs are swapped (returned, or "
                         f"stored into each other's buffer)")
            pitfalls = matched_pitfalls(exercise, lambda: _clone_inputs({k: v for k, v in inputs.items()
                                                                        if not _is_output(k)}),
                                        [fn_in[k] for k in inplace] + list(got),
                                        [ref_in[k] for k in inplace] + list(expected), inplace, atol, rtol)
            # the most specific first: a read outside a tensor, a known pitfall, what the comparison found, then
            # what the kernel's source suggests; every note is printed
            notes = (reads.notes() + pitfalls + [found] + unfilled_masked_loads(launches.functions)
                     + unordered_inplace_updates(launches.functions))
            raise CheckFailed(f"{label}: {notes[0]}" + "".join(f"\n  also: {n}" for n in notes[1:]) + _tip(hint))
        kernels_run.update(launches.functions)
        stray_reads += [note for note in reads.notes() if note not in stray_reads]
        if not quiet:
            worst = max((c.max_abs for c in results[-len(expected):]), default=0.0)
            kernels = ", ".join(sorted(launches)) or "none"
            print(f"  ok  case {i}: {shapes}  max abs error {worst:.2e}  (kernels: {kernels})")
    # every case passed: the one place where a check ends in success
    if not quiet:
        _say_passed(name, results, stray_reads, kernels_run)
    kept.keep(name, fn, quiet)   # a passing exercise's kernel is kept in the learner's notebooks folder (course/kept.py)
    return results


def _say_passed(name: str, results: list, stray_reads: list, kernels_run: dict) -> None:
    """The PASS line, then every note on what the results do not show: reads outside a tensor, masked loads with
    no `other=` that reach a reduction, in-place updates with no barrier."""
    print(f"PASS {name}: {len(results)} comparisons within tolerance")
    # the interpreter (and most GPUs) return 0 in masked-off lanes, so a sum over them passes here; Triton
    # promises nothing for them
    suspects = stray_reads + unfilled_masked_loads(kernels_run) + unordered_inplace_updates(kernels_run)
    if stray_reads:   # (the values read reached no output here; on a GPU a read past the end of an allocation faults)
        suspects[0] += (": their values reached no output here, but on a GPU a read past the end of an "
                        "allocation faults (an illegal memory access, which ends the session)")
    for k, note in enumerate(suspects):
        print(f"  note: {'the results are right here, but ' if k == 0 else ''}{note}")


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
