"""qwen_lab.runtime: what `import qwen_lab` sets up for the Triton interpreter, on whichever Triton is installed."""

import pytest
import torch
import triton
import triton.language as tl

import qwen_lab  # noqa: F401  (sets the interpreter up where there is no GPU)
from qwen_lab import runtime

DEV = "cuda" if torch.cuda.is_available() and not runtime.interpreter_active() else "cpu"


@triton.jit
def _window_kernel(x_ptr, out_ptr, n, start, BLOCK: tl.constexpr):
    # out = x where the program's row (a scalar) is in the window [start, n), else 0: a block mask and a scalar
    # comparison in one mask, as the prefill conv writes its rows
    offs = tl.arange(0, BLOCK)
    t = tl.program_id(0) + start
    v = tl.load(x_ptr + offs, mask=(offs < BLOCK) & (t >= 0) & (t < n), other=0.0)
    tl.store(out_ptr + tl.program_id(0) * BLOCK + offs, v)


def test_a_mask_of_a_block_and_a_scalar_comparison_loads():
    """Triton 3.9's interpreter widened such a mask to int32 and refused it ("mask has unsupported dtype"): the
    conv, and so every model forward on a CPU, stopped there."""
    x = torch.arange(1, 9, dtype=torch.float32, device=DEV)
    out = torch.full((4, 8), -1.0, device=DEV)
    _window_kernel[(4,)](x, out, 1, -2, BLOCK=8)          # rows t = -2, -1, 0, 1: only t = 0 is in [0, 1)
    want = torch.zeros(4, 8)
    want[2] = torch.arange(1, 9)
    assert torch.equal(out.cpu(), want)


@pytest.mark.skipif(not runtime.interpreter_active(), reason="the interpreter's own types (the GPU compiles)")
def test_the_interpreter_types_a_comparison_as_int1():
    import numpy as np
    from triton.runtime import interpreter

    one = interpreter.TensorHandle(np.array([1], dtype=np.int32), tl.int32)
    assert interpreter.InterpreterBuilder().create_icmpSLT(one, one).dtype == tl.int1
