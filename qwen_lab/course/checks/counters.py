"""The check of Exercise 14.1 (notebook 14): two dependent GEMVs in one launch, ordered by a counter.

    check_two_gemvs(two_gemvs_kernel)

The learner's kernel has the signature of qwen_lab/kernels/persistent/teach.py's:

    two_gemvs_kernel[(P,)](x, w1, h, w2, y, counter, error, N1, N2, K, spin_limit, BLOCK_N=.., BLOCK_K=..)

h = W1 x, then y = W2 h; each of the T1 = cdiv(N1, BLOCK_N) tiles of h adds 1 to `counter` once its rows are stored,
and each tile of y waits until the counter reaches T1, for at most `spin_limit` polls; when it gives up it writes
the waiting item + 1 into `error` (0: no error) and its program does nothing more.

Each case launches the kernel twice:

1. A plain launch (counter 0): h, the counter read after the launch, `error` and y are compared with what they must
   be, in that order, since a wrong h explains a wrong y and a miscounted counter explains a wait that gave up.
2. A launch whose counter starts at -1000, so it can never reach T1: a bounded wait must give up and name item T1
   (the first tile of y, under one program) in `error`; y stays unwritten.

A wait with no bound would spin for ever in the second launch, and the check must not hang. What it does:
- under the Triton interpreter (a CPU), a watch on the interpreter's loads and atomics counts the kernel's accesses
  to the counter and stops the launch after MAX_POLLS of them, with a message naming the unbounded wait: the
  behaviour is tested, whatever form the bound takes;
- on a GPU nothing can stop a kernel once launched, so before that launch the check reads the kernel's source: every
  `while` loop's condition must be `(...) & (... spin_limit ...)` (or `and`). A wait written as a `for` loop over
  range(spin_limit) needs no such test. Only then does it launch.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import textwrap

import torch
import triton

from ... import runtime
from .comparison import CheckFailed, compare, poison_
from .runner import _not_done

MAX_POLLS = 2000            # the interpreter's watch: accesses to the counter before a launch is called a hang
NEVER = -1000               # the counter's start in the bounded-wait launch: T1 bumps never bring it to T1
# (N1, K, N2, BLOCK_N, BLOCK_K): a ragged last tile of h and of y; K longer than one BLOCK_K; more tiles of y than of
# h (a wait for T2 instead of T1 gives up there); N1 one tile of y's K
CASES = [(40, 24, 30, 16, 32), (33, 70, 17, 16, 32), (20, 40, 70, 16, 32), (64, 64, 16, 16, 64)]


class _Runaway(Exception):
    """Raised inside the interpreter by the watch when a launch touched the counter MAX_POLLS times."""


@contextlib.contextmanager
def _watching_counter(counter: torch.Tensor):
    """Under the interpreter: count the loads and atomics that touch `counter`'s address; past MAX_POLLS, raise
    _Runaway from inside the launch. Yields a dict {"polls": n}. Elsewhere it watches nothing."""
    seen = {"polls": 0}
    builder = None
    if runtime.interpreter_active():
        from triton.runtime import interpreter
        builder = getattr(interpreter, "InterpreterBuilder", None)
    names = ("create_masked_load", "create_atomic_rmw", "create_atomic_cas")
    originals = {n: getattr(builder, n, None) for n in names} if builder is not None else {}
    address = counter.data_ptr()

    def watched(original):
        def call(self, ptrs, *args, **kwargs):
            try:
                import numpy as np
                hit = bool((np.asarray(ptrs.data) == address).any())
            except Exception:   # never let the watch change what the kernel does
                hit = False
            if hit:
                seen["polls"] += 1
                if seen["polls"] > MAX_POLLS:
                    raise _Runaway()
            return original(self, ptrs, *args, **kwargs)
        return call

    for n, original in originals.items():
        if original is not None:
            setattr(builder, n, watched(original))
    try:
        yield seen
    finally:
        for n, original in originals.items():
            if original is not None:
                setattr(builder, n, original)


def _source(kernel) -> str:
    fn = getattr(kernel, "fn", kernel)
    src = getattr(kernel, "src", None) or inspect.getsource(fn)
    return textwrap.dedent(src)


def unbounded_loops(kernel, bound: str = "spin_limit") -> list[str]:
    """The `while` loops of the kernel's source whose condition is not `(...) & (... bound ...)` (or `and`): each
    as its first line. A GPU cannot stop a kernel that spins for ever, so the check reads this before it launches a
    wait that can never be met."""
    tree = ast.parse(_source(kernel))
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.While):
            continue
        test = node.test
        sides = (test.left, test.right) if isinstance(test, ast.BinOp) and isinstance(test.op, ast.BitAnd) else \
            test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else ()
        if not any(isinstance(n, ast.Name) and n.id == bound for side in sides for n in ast.walk(side)):
            bad.append(f"while {ast.unparse(test)}:")
    return bad


def _launch(kernel, case, dev, dtype, g, counter_start: int, spin_limit: int, programs: int):
    N1, K, N2, BLOCK_N, BLOCK_K = case
    x = torch.randn(K, generator=g).to(device=dev, dtype=dtype)
    w1 = (torch.randn(N1, K, generator=g) / K ** 0.5).to(device=dev, dtype=dtype)
    w2 = (torch.randn(N2, N1, generator=g) / N1 ** 0.5).to(device=dev, dtype=dtype)
    h = poison_(torch.empty(N1, device=dev, dtype=dtype))
    y = poison_(torch.empty(N2, device=dev, dtype=dtype))
    counter = torch.full((1,), counter_start, dtype=torch.int32, device=dev)
    error = torch.zeros(1, dtype=torch.int32, device=dev)
    runaway = False
    with _watching_counter(counter) as seen:
        try:
            kernel[(programs,)](x, w1, h, w2, y, counter, error, N1, N2, K, spin_limit, BLOCK_N=BLOCK_N,
                                BLOCK_K=BLOCK_K)
        except Exception as e:
            runaway = _is_runaway(e)
            if not runaway:
                raise
    if dev.type == "cuda":
        torch.cuda.synchronize()
    h_want = (w1.float() @ x.float()).to(dtype)
    y_want = (w2.float() @ h_want.float()).to(dtype)
    return dict(h=h, y=y, counter=int(counter.item()), error=int(error.item()), h_want=h_want, y_want=y_want,
                runaway=runaway, polls=seen["polls"])


def _is_runaway(e: BaseException) -> bool:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, _Runaway) or "_Runaway" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def check_two_gemvs(kernel, device=None, dtype=None, quiet: bool = False) -> None:
    """Exercise 14.1's check: raises CheckFailed naming the first thing wrong (see the module's docstring), or
    ExerciseNotDone for a kernel still left as its stub; prints PASS otherwise."""
    interp = runtime.interpreter_active()
    dev = torch.device(device) if device is not None else \
        torch.device("cuda" if torch.cuda.is_available() and not interp else "cpu")
    dtype = dtype or (torch.float32 if interp or dev.type != "cuda" else torch.bfloat16)
    gpu = dev.type == "cuda" and not interp
    # under the interpreter programs run one after another: one program walks the whole list in order
    programs = torch.cuda.get_device_properties(dev).multi_processor_count if gpu else 1
    for i, case in enumerate(CASES):
        N1, K, N2, BLOCK_N, BLOCK_K = case
        T1, T2 = triton.cdiv(N1, BLOCK_N), triton.cdiv(N2, BLOCK_N)
        where = f"two_gemvs_kernel (case {i}: N1={N1}, K={K}, N2={N2}, BLOCK_N={BLOCK_N}, BLOCK_K={BLOCK_K}: " \
                f"T1={T1} tiles of h, then T2={T2} tiles of y, {programs} program{'s' if programs > 1 else ''})"
        g = torch.Generator().manual_seed(14 + i)
        try:
            got = _launch(kernel, case, dev, dtype, g, 0, 1 << 22 if gpu else 2, programs)   # (one program: no wait)
        except Exception as e:
            stub = _not_done(e)
            if stub is not None:
                raise stub from None
            raise CheckFailed(f"{where}: your kernel raised {type(e).__name__}: {e}") from e
        if got["runaway"]:
            raise CheckFailed(f"{where}: with the counter starting at 0, your kernel read or updated the counter "
                              f"more than {MAX_POLLS} times and was stopped: does a tile of y wait while "
                              f"counter < T1, for at most spin_limit polls?")
        findings = []
        try:
            compare("h = W1 x", got["h"], got["h_want"])
        except CheckFailed as e:
            findings.append(f"the first GEMV is wrong (each tile of h is W1[rows] @ x, item t < T1 at rows "
                            f"t * BLOCK_N ...): {e}")
        c = got["counter"]
        if c != T1:
            why = ("the tiles of y bump it too: only the tiles of h do" if c == T1 + T2 else
                   "it is bumped once per K step: bump it once per tile, after the tile is stored"
                   if c == T1 * triton.cdiv(K, BLOCK_K) and c != T1 else
                   "nothing bumps it: each tile of h adds 1 after its stores, with tl.atomic_add(counter_ptr, 1, "
                   "sem=\"release\", scope=\"gpu\")" if c == 0 else
                   "each tile of h must add exactly 1, once its rows of h are stored")
            findings.append(f"the counter reads {c} after the launch, expected {T1} (one bump per tile of h): {why}")
        if got["error"] != 0:
            reached = f"although the counter reached {c}" if c >= T1 else f"(the counter reached only {c})"
            findings.append(f"error holds {got['error']} after the launch {reached}: a tile of y gave up. It waits "
                            f"while counter < T1 (T1 = cdiv(N1, BLOCK_N) = {T1}), reading the counter again at each "
                            f"poll, and gives up only after spin_limit polls")
        try:
            compare("y = W2 h", got["y"], got["y_want"])
        except CheckFailed as e:
            findings.append(f"the second GEMV is wrong (each tile of y is W2[rows] @ h, item t >= T1 at rows "
                            f"(t - T1) * BLOCK_N, over K = N1 columns): {e}")
        if findings:
            raise CheckFailed(f"{where}: {findings[0]}" + "".join(f"\n  also: {f}" for f in findings[1:]))

        # the bounded wait: a counter that never reaches T1
        if gpu:
            loops = unbounded_loops(kernel)
            if loops:
                raise CheckFailed(f"{where}: `{loops[0]}` is a wait with no bound: on a GPU a counter that never "
                                  f"reaches T1 would keep it spinning for ever (the check does not launch that). "
                                  f"Stop after spin_limit polls: while (seen < T1) & (polls < spin_limit)")
        g = torch.Generator().manual_seed(14 + i)
        got = _launch(kernel, case, dev, dtype, g, NEVER, 3, 1)
        if got["runaway"]:
            raise CheckFailed(f"{where}: the wait has no bound. With the counter starting at {NEVER} (it can never "
                              f"reach T1) and spin_limit=3, your kernel read the counter {got['polls'] - 1} times "
                              f"and was stopped by the check; on a GPU it would spin for ever. Count the polls and "
                              f"stop at spin_limit: while (seen < T1) & (polls < spin_limit)")
        if got["error"] != T1 + 1:
            said = ("still holds 0: when the wait gives up, store item + 1 into error (0 means no error)"
                    if got["error"] == 0 else
                    f"holds {got['error']}, written by item {got['error'] - 1}, a later tile of y: the program went "
                    f"on after item {T1} gave up. A program that gave up does nothing more (its inputs are not "
                    f"known to be ready): keep a flag, e.g. ok = 0, and test it before each item"
                    if T1 + 1 < got["error"] <= T1 + T2 else
                    f"holds {got['error']}: it should name the item that gave up, item + 1 = {T1 + 1} (under one "
                    f"program the first tile of y, item T1 = {T1}, is the first to wait)")
            raise CheckFailed(f"{where}, the counter starting at {NEVER} (never reaching T1), spin_limit=3: the "
                              f"error {said}")
        written = int((~torch.isnan(got["y"].float())).sum())
        if written:
            raise CheckFailed(f"{where}, the counter starting at {NEVER}: the wait gave up and named item {T1}, but "
                              f"{written} of y's {N2} values were written after it: a program that gave up does "
                              f"nothing more (its inputs are not known to be ready): keep a flag, e.g. ok = 0")
        if not quiet:
            print(f"  ok  case {i}: N1={N1}, K={K}, N2={N2}: h, y, the counter ({T1}) and the bounded wait "
                  f"(item {T1} named after 3 polls)")
    print(f"PASS two_gemvs_kernel: {len(CASES)} cases, h and y within tolerance, one bump per tile of h, and a "
          f"wait that gives up and names its item")
