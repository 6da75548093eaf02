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
NaN was never written or computed, outputs returned in each other's place, and a hint; the most specific finding
comes first (a read outside a tensor, then a pitfall the exercise's notebook warns about, then the counts). The
checks of the norm exercises add a float16 case, where a kernel that skips the fp32 upcast overflows. An exercise left
as its stub ends in one short message (ExerciseNotDone, a NotImplementedError naming the exercise and the function
still to write), inside `check_kernel` and in a cell that calls the learner's function itself within
`with checks.learner_code():`.

    from qwen_lab import reference
    from qwen_lab.course import checks
    checks.check_kernel("rms_norm", my_rms_norm, reference.rms_norm,
                        cases=[lambda g: dict(x=torch.randn(5, 64, generator=g), ...)])

The modules: comparison.py (compare, the tolerances, the poison), diagnoses.py (what a wrong output says about the
mistake), pitfalls.py (each exercise's known pitfalls, its operator, its float16 case), guards.py (guarded
buffers), read_watch.py (the interpreter's watch on loads), source_notes.py (notes read from the learner's kernels'
source), learner.py (whose code a frame is), runner.py (check_kernel, learner_code, ExerciseNotDone), counters.py
(Exercise 14.1's check of a kernel that orders its work with a counter: check_two_gemvs).
"""

from .counters import check_two_gemvs
from .comparison import (INT_POISON, POISON_BITS, TOLERANCES, CheckFailed, Comparison, compare, finite_or_raise,
                         poison_, randn, relative_error, tolerance)
from .guards import GUARD_NAN, GUARD_SENTINEL, GuardedTensor, guarded_call
from .runner import ExerciseNotDone, check_kernel, learner_code
from .source_notes import store_notes, unfilled_masked_loads, unordered_inplace_updates

__all__ = ["CheckFailed", "Comparison", "ExerciseNotDone", "TOLERANCES", "check_kernel", "check_two_gemvs", "compare", "finite_or_raise",
           "learner_code",
           "poison_", "randn", "relative_error", "tolerance", "GuardedTensor", "guarded_call",
           "GUARD_NAN", "GUARD_SENTINEL", "INT_POISON", "POISON_BITS", "store_notes", "unfilled_masked_loads",
           "unordered_inplace_updates"]
