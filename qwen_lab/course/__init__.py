"""The course's tooling, apart from the engine: what grades the notebooks' exercises and builds the learner's notebooks.

    from qwen_lab.course import checks      # check_kernel, compare, ...: grade a learner's kernel (checks/)
    from qwen_lab.course import exercises   # build notebooks/ from solutions/, check they are in sync (exercises/)
    from qwen_lab.course import syncguard   # what would break a CUDA Graph capture, found on any machine
    from qwen_lab.course import kept        # the learner's passing kernels, kept in my_kernels/ and loaded (kept.py)
    from qwen_lab.course import setup       # the notebooks' first cell: rt = setup()
    from qwen_lab.course import recorded    # a GPU cell's result: kept on a GPU (recording runs), shown on a CPU

    python -m qwen_lab.course build|check|list|nbgrader     (the same as python -m qwen_lab.exercises ...)

The engine (everything in qwen_lab/ outside this folder) never imports the course. Launch counting
(`count_launches`, `LaunchCounter`, `uncounted`) stays in qwen_lab.kernels, where the engine's benchmark uses it too;
the course imports it from there.
"""

from __future__ import annotations


def setup():
    """The notebooks' setup, once their install guard has made qwen_lab importable: prints the environment (Python,
    torch and Triton versions, the device, the dtype, whether the Triton interpreter runs the kernels) and returns the
    runtime the notebook runs on (`rt.device`, `rt.dtype`, `rt.interpreter`). Importing qwen_lab, which this module's
    import does, has already turned the interpreter on where there is no GPU."""
    from .. import runtime

    print(runtime.describe())
    return runtime.choose()
