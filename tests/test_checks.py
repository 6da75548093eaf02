"""qwen_lab.course.checks: what a learner's mistake looks like to check_kernel (Triton interpreter on a CPU, a real
launch on a GPU). Each mistake must fail with a message that names it, never pass and never take the process down."""

import re

import pytest
import torch
import triton
import triton.language as tl

from qwen_lab import runtime
from qwen_lab.course import checks

# the cases' tensors live where the kernels run: the CPU under the interpreter, the GPU otherwise (a real launch
# cannot read a CPU tensor)
DEV = runtime.choose().device


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, stride_x, BLOCK: tl.constexpr, STORE_MASK: tl.constexpr,
                 ROWS_APART: tl.constexpr):
    # out[i] = x[i] for a 1-D x, or row 0 of a 2-D x read at stride_x (ROWS_APART) or assumed contiguous
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if ROWS_APART:
        v = tl.load(x_ptr + (offs // 8) * stride_x + offs % 8, mask=mask)
    else:
        v = tl.load(x_ptr + offs, mask=mask)
    if STORE_MASK:
        tl.store(out_ptr + offs, v, mask=mask)
    else:
        tl.store(out_ptr + offs, v)  # the classic mistake: lanes past n write past the end of out


def _copy(x, out=None, store_mask=True, rows_apart=True, grid_blocks=None):
    n = x.numel()
    out = torch.empty(n, dtype=x.dtype, device=x.device) if out is None else out
    blocks = triton.cdiv(n, 32) if grid_blocks is None else grid_blocks
    _copy_kernel[(blocks,)](x, out, n, x.stride(0) if x.dim() == 2 else 1, BLOCK=32, STORE_MASK=store_mask,
                            ROWS_APART=rows_apart and x.dim() == 2)
    return out


def _flat(x, out=None):
    return x.reshape(-1).clone()


def _case_1d(g):
    return dict(x=checks.randn(50, g=g, device=DEV), out=torch.empty(50, device=DEV))


def _case_strided(g):
    return dict(x=checks.randn(5, 20, g=g, device=DEV)[:, 4:12], out=torch.empty(40, device=DEV))


@triton.jit
def _unfinished_copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    raise NotImplementedError("Exercise 99.1: the copy")   # what the exercise notebooks' kernel stubs hold


def _unfinished_copy(x, out):
    _unfinished_copy_kernel[(1,)](x, out, x.numel(), BLOCK=64)
    return out


def test_an_unfinished_kernel_reads_as_not_done_yet():
    """A kernel whose body is still the exercise's stub: under the interpreter the `raise` runs; compiled for a GPU,
    Triton refuses the statement (its error quotes the stub). Both must read as the exercise not done yet, not as
    "your function raised UnsupportedLanguageConstruct"."""
    import traceback

    with pytest.raises(NotImplementedError, match="Exercise 99.1: the copy") as got:
        checks.check_kernel("copy", _unfinished_copy, _flat, [_case_1d], quiet=True)
    # one exception, not the interpreter's chain behind it; IPython and Jupyter show its message alone
    shown = "".join(traceback.format_exception(got.value))
    assert "During handling" not in shown and "direct cause" not in shown, shown
    assert got.value._render_traceback_() == [f"NotImplementedError: {got.value}"]
    assert "`_unfinished_copy_kernel` still raises NotImplementedError" in str(got.value)


_STUB_SCRIPT = """
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def add_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)                       # which block of the vectors this program owns
    raise NotImplementedError("Exercise 01.1: vector add")

try:
    triton.compile(ASTSource(add_kernel, {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                             constexprs={"BLOCK": 256}), target=GPUTarget("cuda", 90, 32))
except Exception as e:
    sys.path.insert(0, sys.argv[1])
    from qwen_lab.course.checks.runner import _not_done, _unfinished
    print(type(e).__name__, "->", repr(_unfinished(e)))
    print("shown:", _not_done(e)._render_traceback_()[0])
"""


def test_a_kernel_stub_compiled_for_a_gpu_reads_as_not_done_yet(tmp_path):
    """The same stub compiled for an H100/H200 (sm_90) on any machine, as a GPU run compiles it: the compiler's
    error must be recognised as the unfinished exercise, with its title."""
    import os
    import subprocess
    import sys

    script = tmp_path / "stub_kernel.py"   # (Triton reads a kernel's source from its file)
    script.write_text(_STUB_SCRIPT)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, str(script), root], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""})
    assert "-> NotImplementedError('Exercise 01.1: vector add')" in done.stdout, done.stdout + done.stderr[-2000:]
    assert ("shown: NotImplementedError: Exercise 01.1: vector add: `add_kernel` still raises NotImplementedError"
            in done.stdout), done.stdout + done.stderr[-2000:]


class _CompilationError(Exception):
    """Stands for triton.compiler.errors.CompilationError, whose message quotes the refused line under the kernel's
    source, a caret below it (the form a GPU run shows; the test above compiles a real one)."""


_COMPILER_MESSAGE = """at 2:4:
def add_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)                       # which block of the vectors this program owns
    raise NotImplementedError("Exercise 01.1: vector add")
    ^
unsupported AST node type: Raise"""


def test_learner_code_shows_an_unfinished_kernel_as_its_exercise():
    """Cells that call the learner's function directly run it inside `checks.learner_code()`: a stub refused by
    Triton's compiler (on a GPU) or wrapped by the interpreter (on a CPU) must come out as the exercise's own
    NotImplementedError, with its title and nothing of the wrapper."""
    def compiled_for_a_gpu():
        try:
            raise KeyError("the launcher's own frame")       # an error that only precedes the compiler's
        except KeyError as inner:
            raise _CompilationError(_COMPILER_MESSAGE) from inner

    todo = ("still raises NotImplementedError (the exercise's stub): fill in the exercise's cell above, run it, then "
            "run this cell again")
    with pytest.raises(NotImplementedError) as got:
        with checks.learner_code():
            compiled_for_a_gpu()
    assert str(got.value) == f"Exercise 01.1: vector add: `add_kernel` {todo}" and got.value.__suppress_context__

    x = checks.randn(50, g=torch.Generator().manual_seed(0), device=DEV)
    stub = f"Exercise 99.1: the copy: `_unfinished_copy_kernel` {todo}"
    with pytest.raises(NotImplementedError, match="^" + re.escape(stub) + "$"):
        with checks.learner_code():
            _unfinished_copy(x, torch.empty_like(x))


def test_learner_code_leaves_everything_else_alone():
    """A finished call returns as it is; any other error, even a compiler error that quotes no stub, and a
    NotImplementedError of the learner's own, go through unchanged."""
    x = checks.randn(50, g=torch.Generator().manual_seed(0), device=DEV)
    with checks.learner_code():
        out = _copy(x)
    assert torch.equal(out, x)
    other = _CompilationError(_COMPILER_MESSAGE.replace('raise NotImplementedError("Exercise 01.1: vector add")',
                                                        "x = tl.load(x_ptr + offs)"))
    for error in (other, ValueError("a shape mismatch"), NotImplementedError("a branch I left for later")):
        with pytest.raises(type(error)) as got:
            with checks.learner_code():
                raise error
        assert got.value is error


def test_a_correct_kernel_passes():
    assert len(checks.check_kernel("copy", _copy, _flat, [_case_1d, _case_strided], quiet=True)) == 2


def test_an_unmasked_store_past_the_end_is_reported_not_a_crash():
    with pytest.raises(checks.CheckFailed, match="wrote 14 element\\(s\\) outside 'out' \\(50,\\) \\(in 14 past its end\\)"):
        checks.check_kernel("copy", lambda x, out: _copy(x, out, store_mask=False), _flat, [_case_1d], quiet=True)


def test_unwritten_elements_are_told_apart_from_computed_nan():
    # one block too few: the tail keeps the poison
    with pytest.raises(checks.CheckFailed, match="18 of 50 elements are NaN, first at \\(32,\\); all never written"):
        checks.check_kernel("copy", lambda x, out: _copy(x, out, grid_blocks=1), _flat, [_case_1d], quiet=True)
    # a strided input read as if its rows were contiguous: the kernel reads the NaN between the rows
    with pytest.raises(checks.CheckFailed, match="elements are NaN.*computed as NaN \\(a load outside an input"):
        checks.check_kernel("copy", lambda x, out: _copy(x, out, rows_apart=False), _flat, [_case_strided],
                            quiet=True)


def test_swapped_outputs_are_named():
    def ref(x):
        return x * 2, x + 1

    def swapped(x):
        a, b = ref(x)
        return _copy(b), _copy(a)
    with pytest.raises(checks.CheckFailed, match="output 0: matches the reference's output 1 instead"):
        checks.check_kernel("pair", swapped, ref, [lambda g: dict(x=checks.randn(40, g=g, device=DEV))], quiet=True)


def test_poison_survives_any_strides_and_compare_recognises_it():
    out = checks.poison_(torch.empty(4, 9)[:, :5])
    assert torch.isnan(out).all()
    ref = torch.zeros(4, 5)
    with pytest.raises(checks.CheckFailed, match="all never written"):
        checks.compare("out", out, ref)
    with pytest.raises(checks.CheckFailed, match="none holds the check's poison"):
        checks.compare("out", torch.full((4, 5), float("nan")), ref)


def test_a_store_past_a_buffer_the_function_allocated_is_reported_too():
    # the exercises' wrappers allocate their outputs with torch.empty: those are guarded (and poisoned) as well
    with pytest.raises(checks.CheckFailed, match="outside a buffer your function allocated \\(\\(50,\\), 14 past its end\\)"):
        checks.check_kernel("copy", lambda x: _copy(x, store_mask=False), lambda x: x.clone(),
                            [lambda g: dict(x=checks.randn(50, g=g, device=DEV))], quiet=True)
    with pytest.raises(checks.CheckFailed, match="all never written"):
        checks.check_kernel("copy", lambda x: _copy(x, grid_blocks=1), lambda x: x.clone(),
                            [lambda g: dict(x=checks.randn(50, g=g, device=DEV))], quiet=True)
    assert torch.empty(3).numel() == 3  # and torch.empty is itself again after the check


def test_a_missing_scale_factor_is_named_and_the_case_shows_its_numbers():
    def ref(x, scale):
        return x * scale

    def forgets_the_scale(x, scale):
        return _copy(x)
    with pytest.raises(checks.CheckFailed, match="case 0: x=\\(40,\\), scale=0.125\\).*reference times 8: a missing"):
        checks.check_kernel("scaled", forgets_the_scale, ref,
                            [lambda g: dict(x=checks.randn(40, g=g, device=DEV), scale=0.125)], quiet=True)


@triton.jit
def _head_copy_kernel(x_ptr, out_ptr, D: tl.constexpr, GROUP: tl.constexpr, N_KV: tl.constexpr,
                      WRONG_MAP: tl.constexpr):
    # out[h] = x[h // GROUP]: each query head reads its KV head (grouped-query attention's mapping)
    h = tl.program_id(0)
    kv = h % N_KV if WRONG_MAP else h // GROUP  # the classic mistake: the KV heads taken in turn
    offs = tl.arange(0, D)
    tl.store(out_ptr + h * D + offs, tl.load(x_ptr + kv * D + offs))


def _heads(x, wrong_map=False, group=4):
    out = torch.empty(x.shape[0] * group, x.shape[1], dtype=x.dtype, device=x.device)
    _head_copy_kernel[(out.shape[0],)](x, out, D=x.shape[1], GROUP=group, N_KV=x.shape[0], WRONG_MAP=wrong_map)
    return out


def test_a_wrong_head_mapping_is_located_and_named():
    # 2 KV heads, 8 query heads: with h % 2 the heads 1, 3, 4 and 6 read the wrong KV head; the check says which
    # heads are wrong and that their values are another head's
    case = [lambda g: dict(x=checks.randn(2, 16, g=g, device=DEV))]
    ref = lambda x: x.repeat_interleave(4, dim=0)  # noqa: E731
    assert len(checks.check_kernel("heads", _heads, ref, case, quiet=True)) == 1
    with pytest.raises(checks.CheckFailed, match="only in dim 0 at 1, 3-4, 6 \\(of 8\\).*the output's indices 1, "
                                                 "3, 4, 6 hold the reference's 4, 4, 0, 0: right values at the wrong"):
        checks.check_kernel("heads", lambda x: _heads(x, wrong_map=True), ref, case, quiet=True)


def test_wrong_elements_confined_to_some_rows_or_columns_are_located():
    ref = torch.randn(16, 8)
    tail = ref.clone()
    tail[8:] += 1.0  # a second tile of rows computed wrongly
    with pytest.raises(checks.CheckFailed, match="lie only in dim 0 at 8-15 \\(of 16\\)\\.$"):
        checks.compare("out", tail, ref)
    cols = ref.clone()
    cols[:, [1, 2, 6]] = 0.0  # some columns masked off
    with pytest.raises(checks.CheckFailed, match="lie only in dim 1 at 1-2, 6 \\(of 8\\)"):
        checks.compare("out", cols, ref)
    with pytest.raises(checks.CheckFailed) as everywhere:
        checks.compare("out", ref + 1.0 + ref.abs(), ref)
    assert "lie only" not in str(everywhere.value) and "wrong index" not in str(everywhere.value)


@triton.jit
def _row_max_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, FILL: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if FILL:
        x = tl.load(x_ptr + offs, mask=offs < n, other=float("-inf"))
    else:
        x = tl.load(x_ptr + offs, mask=offs < n)  # the lanes past n are undefined, and the max reads them
    tl.store(out_ptr, tl.max(x, 0))


def _row_max(x, fill):
    out = torch.empty(1, dtype=x.dtype, device=x.device)
    _row_max_kernel[(1,)](x, out, x.numel(), BLOCK=64, FILL=fill)
    return out


def test_a_failing_kernel_with_a_masked_load_and_no_other_is_told_about_it():
    # all-negative values: lanes past n that read as 0 win the max
    case = [lambda g: dict(x=-1.0 - checks.randn(40, g=g, device=DEV).abs())]
    ref = lambda x: x.max().reshape(1)  # noqa: E731
    assert len(checks.check_kernel("row max", lambda x: _row_max(x, True), ref, case, quiet=True)) == 1
    with pytest.raises(checks.CheckFailed, match="_row_max_kernel \\(line \\d+ of its file\\) loads "
                                                 "`tl.load\\(x_ptr \\+ offs, mask=offs < n\\)` with a mask and no "
                                                 "`other=`.*other=float\\('-inf'\\) for a max"):
        checks.check_kernel("row max", lambda x: _row_max(x, False), ref, case, quiet=True)


def test_a_passing_kernel_with_a_masked_load_and_no_other_still_hears_of_it(capsys):
    """Positive values: the lanes past n read as 0 under the interpreter and never win the max, so the check passes;
    Triton promises nothing for those lanes, and the note says so."""
    case = [lambda g: dict(x=1.0 + checks.randn(40, g=g, device=DEV).abs())]
    ref = lambda x: x.max().reshape(1)  # noqa: E731
    checks.check_kernel("row max", lambda x: _row_max(x, False), ref, case)
    out = capsys.readouterr().out
    assert "PASS row max" in out and "note: the results are right here, but _row_max_kernel" in out

    def filled(x):   # the same max with every masked lane given -inf: nothing to note
        out = torch.empty(1, dtype=x.dtype, device=x.device)
        _filled_row_max_kernel[(1,)](x, out, x.numel(), BLOCK=64)
        return out
    checks.check_kernel("row max", filled, ref, case)
    out = capsys.readouterr().out
    assert "PASS row max" in out and "note:" not in out


@triton.jit
def _filled_row_max_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr, tl.max(tl.load(x_ptr + offs, mask=offs < n, other=float("-inf")), 0))


def test_the_masked_load_note_names_only_loads_without_other_in_kernels_that_reduce():
    found = checks.unfilled_masked_loads({"_row_max_kernel": _row_max_kernel.fn, "_copy_kernel": _copy_kernel.fn})
    # the row max's load reaches tl.max; _copy_kernel's two masked loads reach nothing but a store
    assert len(found) == 1 and found[0].startswith("_row_max_kernel")
    assert not checks.unfilled_masked_loads({"_head_copy_kernel": _head_copy_kernel.fn})


def test_a_failing_kernel_without_a_reduction_is_not_told_about_its_masked_loads():
    """A vector add's masked lanes are dropped by its masked store: the note would send a learner after a mistake
    that is not there (the model solution of Exercise 01.1 loads with a mask and no `other=`)."""
    with pytest.raises(checks.CheckFailed) as failed:
        checks.check_kernel("copy", lambda x, out: _copy(x, out, grid_blocks=1), _flat, [_case_1d], quiet=True)
    assert "never written" in str(failed.value) and "other=" not in str(failed.value)


@triton.jit
def _accumulate_kernel(x_ptr, acc_ptr, n, row_width, BLOCK: tl.constexpr):
    # acc[i * row_width] += x[i]: the accumulator's index scaled by another size than its own, the mistake of an
    # atomic_add into acc[m * K + n] where acc is [M, N]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.atomic_add(acc_ptr + offs * row_width, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def test_a_stray_atomic_add_into_a_zeroed_buffer_is_reported_not_a_crash():
    """An accumulator made with torch.zeros was not guarded: an atomic_add past its end corrupted the CPU process's
    heap (it died with "double free or corruption", no message). Zeroed buffers are guarded now, and stay zero."""
    def accumulate(x, row_width):
        acc = torch.zeros(x.numel(), dtype=torch.float32, device=x.device)
        _accumulate_kernel[(triton.cdiv(x.numel(), 32),)](x, acc, x.numel(), row_width, BLOCK=32)
        return acc
    case = [lambda g: dict(x=checks.randn(40, g=g, device=DEV))]
    assert len(checks.check_kernel("accumulate", lambda x: accumulate(x, 1), lambda x: x.clone(), case,
                                   quiet=True)) == 1
    with pytest.raises(checks.CheckFailed, match="outside a buffer your function allocated \\(\\(40,\\), "):
        checks.check_kernel("accumulate", lambda x: accumulate(x, 3), lambda x: x.clone(), case, quiet=True)
    assert torch.zeros(3).sum() == 0 and torch.zeros_like(torch.ones(2)).sum() == 0  # itself again after the check


@triton.jit
def _add_one_past_kernel(x_ptr, acc_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.atomic_add(acc_ptr + offs, v, mask=offs <= n)   # one lane past the end, adding the 0.0 of a masked load


def test_a_stray_atomic_add_of_zero_past_a_zeroed_buffer_is_reported():
    """The lane past the edge of an off-by-one mask adds 0.0, the value its masked load gave it: added to a sentinel
    that left no trace. Around a zeroed buffer the guard is -0.0, which the add turns into +0.0."""
    def accumulate(x):
        acc = torch.zeros(x.numel(), dtype=torch.float32, device=x.device)
        _add_one_past_kernel[(1,)](x, acc, x.numel(), BLOCK=64)
        return acc
    case = [lambda g: dict(x=checks.randn(40, g=g, device=DEV))]
    with pytest.raises(checks.CheckFailed, match="1 element\\(s\\) outside a buffer your function allocated"):
        checks.check_kernel("accumulate", accumulate, lambda x: x.clone(), case, quiet=True)


def test_the_masked_load_note_leaves_the_librarys_kernels_alone():
    """A learner's step launches qwen_lab's own kernels beside theirs: a masked load without `other` in one of those
    is not theirs to fix, and the note must not send them there."""
    from qwen_lab.kernels import rope

    library = {name: getattr(rope, name).fn for name in dir(rope) if name.endswith("_kernel")}
    assert library and not checks.unfilled_masked_loads(library)
    assert len(checks.unfilled_masked_loads({**library, "_row_max_kernel": _row_max_kernel.fn})) == 1


def test_a_scalar_output_is_not_said_to_miss_a_scale_factor():
    """One value is always some multiple of the reference's: the scale-factor sentence needs two values to say
    anything (it misled the checks of counted bytes and FLOPs)."""
    with pytest.raises(checks.CheckFailed) as one:
        checks.compare("bytes per token", torch.tensor([1.25e6]), torch.tensor([1.0e6]))
    assert "scale factor" not in str(one.value)
    with pytest.raises(checks.CheckFailed, match="reference times 1.25: a missing or extra scale factor"):
        checks.compare("bytes", torch.tensor([1.25e6, 2.5e6]), torch.tensor([1.0e6, 2.0e6]))


@triton.jit
def _row_sums_kernel(x_ptr, out_ptr, D: tl.constexpr, WRONG_AXIS: tl.constexpr):
    rows, cols = tl.arange(0, 4), tl.arange(0, D)
    x = tl.load(x_ptr + rows[:, None] * D + cols[None, :])
    s = tl.sum(x, axis=0 if WRONG_AXIS else 1)   # axis 0 sums each column: D values where 4 are wanted
    tl.store(out_ptr + rows, s * 1.0 + tl.zeros([4], dtype=tl.float32))


def test_a_shape_mismatch_inside_the_kernel_gets_a_hint():
    def row_sums(x, wrong_axis):
        out = torch.empty(4, dtype=x.dtype, device=x.device)
        _row_sums_kernel[(1,)](x, out, D=16, WRONG_AXIS=wrong_axis)
        return out
    case = [lambda g: dict(x=checks.randn(4, 16, g=g, device=DEV))]
    assert len(checks.check_kernel("row sums", lambda x: row_sums(x, False), lambda x: x.sum(1), case,
                                   quiet=True)) == 1
    with pytest.raises(checks.CheckFailed, match="two tiles of different shapes met in one operation"):
        checks.check_kernel("row sums", lambda x: row_sums(x, True), lambda x: x.sum(1), case, quiet=True)


def test_computed_nan_is_explained_by_the_rows_that_hold_it():
    """Where a kernel computed NaN tells why: rows whose reference is all zeros are rows with nothing to normalise
    (a softmax row that sees no key), not a missing eps; NaN beside zeros in a row is an overflowed sum; whole rows
    elsewhere a NaN spread through the row's reduction or a 0/0."""
    ref = torch.softmax(torch.randn(2, 5, 8), -1)
    ref[:, 3] = 0.0                           # the rows that see no key
    empty = ref.clone()
    empty[:, 3] = float("nan")
    with pytest.raises(checks.CheckFailed, match="computed as NaN, in 2 of 10 rows \\(dim 1 at 3 \\(of 5\\)\\) whose "
                                                 "expected values are all 0: a row with nothing to normalise") as e:
        checks.compare("p", empty, ref)
    assert "missing eps" not in str(e.value)
    overflow = ref.clone()
    overflow[1, 2] = 0.0                      # x / inf beside inf / inf
    overflow[1, 2, [1, 5]] = float("nan")
    with pytest.raises(checks.CheckFailed, match="in 1 of 10 rows .*whose other elements came out 0: the row's sum "
                                                 "overflowed to inf"):
        checks.compare("p", overflow, ref)
    whole = ref.clone()
    whole[0, 1] = float("nan")
    with pytest.raises(checks.CheckFailed, match="1 of 10 rows .*entirely NaN, whose expected values are not 0.*"
                                                 "a missing eps"):
        checks.compare("p", whole, ref)
    scattered = ref.clone()
    scattered[0, 1, 2] = float("nan")
    with pytest.raises(checks.CheckFailed, match="none holds the check's poison: computed as NaN \\(a load outside"):
        checks.compare("p", scattered, ref)


def test_computed_nan_names_only_the_causes_of_the_exercises_operator():
    """A norm's NaN rows are told with a norm's causes (a missing eps, a load outside an input), never a softmax's
    (a masked row's max, an exp that overflowed); a softmax keeps its own; no operator given: every cause."""
    ref = torch.randn(2, 5, 8)
    ref[:, 3] = 0.0                           # a row of zeros: without eps, 0 * rsqrt(0) = NaN
    got = ref.clone()
    got[:, 3] = float("nan")
    got[0, 1] = float("nan")                  # a whole row
    got[1, 2, 4] = float("nan")               # one element
    softmax_words = ("exp(", "softmax", "the row's max", "every key is masked", "underflowed")
    with pytest.raises(checks.CheckFailed) as norm:
        checks.compare("y", got, ref, operator="norm")
    said = str(norm.value)
    assert "a row of zeros, whose sum of squares is 0: without eps, rsqrt(0) = inf" in said, said
    assert "a missing eps" in said and "a load outside an input" in said, said
    assert not any(word in said for word in softmax_words), said
    with pytest.raises(checks.CheckFailed) as elementwise:
        checks.compare("y", got, ref, operator="elementwise")
    assert "eps" not in str(elementwise.value) and not any(w in str(elementwise.value) for w in softmax_words)
    for operator in ("softmax", None):
        with pytest.raises(checks.CheckFailed) as softmax:
            checks.compare("p", got, ref, operator=operator)
        assert "a softmax row whose every key is masked" in str(softmax.value), str(softmax.value)
        assert "every exp of the row underflowed" in str(softmax.value), str(softmax.value)


@triton.jit
def _rows_scalar_mask_kernel(x_ptr, out_ptr, N, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    pid = tl.program_id(1)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    ok = pid < N                              # the mistake: one value for the whole block
    v = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
    tl.store(out_ptr + row * stride_o + cols, v, mask=ok)


@triton.jit
def _rows_swapped_axes_kernel(x_ptr, out_ptr, N, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(1)                    # the mistake: the grid's axis 0 has one program per row
    pid = tl.program_id(0)
    cols = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row * N + cols, mask=cols < N, other=0.0)
    tl.store(out_ptr + row * stride_o + cols, v, mask=cols < N)


def _rows_copy(kernel, x, out):
    M, N = x.shape
    kernel[(M, triton.cdiv(N, 32))](x, out, N, out.stride(0), BLOCK=32)
    return out


def _rows_case(g):
    return dict(x=checks.randn(2, 100, g=g, device=DEV), out=torch.empty(2, 110, device=DEV)[:, :100])


def test_a_store_mask_with_no_lanes_is_named():
    with pytest.raises(checks.CheckFailed) as e:
        checks.check_kernel("rows", lambda x, out: _rows_copy(_rows_scalar_mask_kernel, x, out), lambda x: x.clone(),
                            [_rows_case], quiet=True)
    assert "The stray elements lie at columns 100-127 (of 100)" in str(e.value)
    assert ("_rows_scalar_mask_kernel (line" in str(e.value) and "the mask `ok` (= `pid < N`) of its tl.store holds "
            "one value for the whole block" in str(e.value) and "address (`cols`)" in str(e.value))
    assert "program_id" not in str(e.value)   # the mask explains it: no note about the axes


def test_program_ids_from_the_wrong_grid_axis_are_shown_beside_the_grid():
    with pytest.raises(checks.CheckFailed) as e:
        checks.check_kernel("rows", lambda x, out: _rows_copy(_rows_swapped_axes_kernel, x, out), lambda x: x.clone(),
                            [_rows_case], quiet=True)
    assert "rows 2-3 (of 2)" in str(e.value), str(e.value)
    assert ("_rows_swapped_axes_kernel ran on the grid (2, 4) (2 program(s) along axis 0, 4 along axis 1) and takes "
            "`row = tl.program_id(1)`, `pid = tl.program_id(0)`") in str(e.value)
    assert "one value for the whole block" not in str(e.value)


@triton.jit
def _copy_one_past_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, v, mask=offs <= n)   # the mistake: one lane past the end


def test_a_store_one_past_the_end_is_called_an_off_by_one():
    def copy(x, out):
        _copy_one_past_kernel[(triton.cdiv(x.numel(), 32),)](x, out, x.numel(), BLOCK=32)
        return out
    with pytest.raises(checks.CheckFailed, match="The stray elements lie at offset 50 \\(of 50\\) only, just past the "
                                                 "end of it: an off-by-one in the store's mask"):
        checks.check_kernel("copy", copy, _flat, [_case_1d], quiet=True)


@triton.jit
def _shift_kernel(x_ptr, n, BLOCK: tl.constexpr):
    # x[i] = x[i + 1] in place, with no barrier: a lane may store over an element another lane has not read yet
    offs = tl.arange(0, BLOCK)
    ahead = x_ptr + offs + 1
    v = tl.load(ahead, mask=offs < n - 1)
    tl.store(x_ptr + offs, v, mask=offs < n - 1)


@triton.jit
def _shift_barrier_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs + 1, mask=offs < n - 1)
    tl.debug_barrier()   # every lane has read before any stores
    tl.store(x_ptr + offs, v, mask=offs < n - 1)


@triton.jit
def _double_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)   # each lane its own element


def test_an_update_in_place_at_other_addresses_without_a_barrier_is_noted(capsys):
    """Chapter 8's conv shifts its state in place: each lane reads a column that another lane stores. Under the
    interpreter a program is one thread, so a missing tl.debug_barrier() cannot show in the results; the note names
    it, on a passing check too. With the barrier, or where each lane writes only what it read, nothing is noted."""
    found = checks.unordered_inplace_updates({"_shift_kernel": _shift_kernel.fn})
    assert len(found) == 1 and found[0].startswith("_shift_kernel (line ") and "through `x_ptr`" in found[0], found
    assert "no tl.debug_barrier() between them" in found[0]
    assert not checks.unordered_inplace_updates({"_shift_barrier_kernel": _shift_barrier_kernel.fn,
                                                 "_double_kernel": _double_kernel.fn})

    def shift(x):
        _shift_kernel[(1,)](x, x.numel(), BLOCK=32, num_warps=1)   # one warp: its lanes load before they store
        return x

    case = [lambda g: dict(x=checks.randn(20, g=g, device=DEV))]
    checks.check_kernel("shift", shift, lambda x: torch.cat([x[1:], x[-1:]]), case)
    out = capsys.readouterr().out
    assert "PASS shift" in out and "note: the results are right here, but _shift_kernel (line" in out, out


@triton.jit
def _unmasked_read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs)   # every lane reads, also the ones past n: a read outside x
    tl.store(out_ptr + offs, v, mask=offs < n)


@triton.jit
def _shifted_read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs + 1, mask=offs < n)   # the last lane reads x[n], one past the end
    tl.store(out_ptr + offs, v, mask=offs < n)


def test_a_read_outside_an_input_is_named_with_its_line_even_when_its_value_reaches_no_output(capsys):
    """Under the interpreter a load's active lanes are watched: one that reads outside a tensor of the case is named
    with the kernel's line, on a passing check (its values masked off at the store, so nothing else shows it; on a
    GPU such a read past an allocation faults) and in a failure (its NaN reached the output). On a GPU the loads are
    not watched: the check passes there with no such note."""
    ref = lambda x: x.clone()  # noqa: E731   (outputs are left out of the reference's call)
    case = [lambda g: dict(x=checks.randn(20, g=g, device=DEV), out=torch.empty(20, device=DEV))]

    def unmasked(x, out):
        _unmasked_read_kernel[(1,)](x, out, x.numel(), BLOCK=32)
        return out

    checks.check_kernel("copy", unmasked, ref, case)
    said = capsys.readouterr().out
    assert "PASS copy" in said, said
    line = _unmasked_read_kernel.fn.__code__.co_firstlineno + 3   # the tl.load, three lines below the def
    note = f"_unmasked_read_kernel (line {line} of its file) read 12 element(s) outside 'x'"
    assert (note in said and "faults (an illegal memory access" in said) == runtime.interpreter_active(), said

    def shifted(x, out):
        _shifted_read_kernel[(1,)](x, out, x.numel(), BLOCK=32)
        return out

    with pytest.raises(checks.CheckFailed) as failed:
        checks.check_kernel("copy", shifted, ref, case)
    if runtime.interpreter_active():
        line = _shifted_read_kernel.fn.__code__.co_firstlineno + 3
        # the most specific finding first: the read outside x, before the NaN it brought in
        assert str(failed.value).startswith(
            f"copy (case 0: x=(20,), out=(20,)): _shifted_read_kernel (line {line} of its file) read 1 element(s) "
            f"outside 'x'"), str(failed.value)


def test_compare_holds_the_kernel_to_a_non_finite_reference():
    """compare used to zero the difference wherever the reference was NaN or infinite, so a kernel could return
    anything there: compare('a', [1, 5], [nan, inf]) passed. Now NaN must be NaN and an infinity the same one."""
    nan, inf = float("nan"), float("inf")
    with pytest.raises(checks.CheckFailed, match=r"a: 2 of 2 elements where the reference is NaN or infinite differ, "
                                                 r"first at \(0,\): got 1, expected nan"):
        checks.compare("a", torch.tensor([1.0, 5.0]), torch.tensor([nan, inf]))
    with pytest.raises(checks.CheckFailed, match=r"1 of 1 elements where the reference is NaN or infinite differ, "
                                                 r"first at \(1,\): got inf, expected -inf"):
        checks.compare("b", torch.tensor([0.5, inf]), torch.tensor([0.5, -inf]))
    checks.compare("c", torch.tensor([nan, -inf, inf, 2.0]), torch.tensor([nan, -inf, inf, 2.0]))
