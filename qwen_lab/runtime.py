"""Where the kernels run, and in which dtype.

- An NVIDIA GPU: bfloat16, or float16 below compute capability 8.0 (no bf16 there; the norms,
  gates, recurrent state and softmax keep fp32 math inside the kernels).
- No GPU: float32 through the Triton interpreter (`TRITON_INTERPRET=1`). The interpreter runs each
  kernel program in NumPy on the CPU; it gets `tl.dot` on bf16 operands wrong, hence float32.

`TRITON_INTERPRET` is read when a `@triton.jit` function is *defined*, so it must be set before any
kernel module is imported. Importing `qwen_lab` does that (this module runs first); kernel modules
are imported only when a kernel is first used.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch

from .errors import DeviceError


def _cuda_ok() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:  # a broken driver should read as "no GPU", not crash the import
        return False


def ensure_interpreter() -> bool:
    """Turn the Triton interpreter on when there is no GPU. Returns whether it is on."""
    if not _cuda_ok() and os.environ.get("TRITON_INTERPRET") is None:
        os.environ["TRITON_INTERPRET"] = "1"
    if interpreter_active():
        _patch_interpreter_scalars()
        _patch_interpreter_comparisons()
        # NumPy warns where a kernel's math overflows or divides by zero (exp of a large gate, say); a GPU computes
        # the same inf or NaN silently, which the kernels expect (a tl.where then picks the finite branch). Without
        # this a learner's CPU notebook shows "RuntimeWarning: overflow encountered in exp" under correct kernels.
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
    return interpreter_active()


def _patch_interpreter_scalars() -> None:
    """Let runtime scalars serve as loop bounds in the interpreter, as they do on the GPU.

    The interpreter keeps a scalar such as `K` or a value loaded with `tl.load` as a one-element NumPy array,
    and `range(0, K, BLOCK)` calls `int()` on it; NumPy 2 refuses `int()` of a 1-D array ("only 0-dimensional
    arrays can be converted to Python scalars"). Converting through `.item()` keeps the same value.
    """
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_qwen_lab", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._qwen_lab = True
    interpreter._patch_lang_tensor = patched


def _patch_interpreter_comparisons() -> None:
    """Give a comparison's result the type int1 in the interpreter, as the compiler does.

    The interpreter types a comparison's NumPy result (bool values) after its left operand: `t < T` on int32
    scalars is held as int32. Triton 3.9 then widens such a scalar to a block of int32 when it meets a block, so a
    mask written `mask_c & (t < T)`, ordinary kernel code, reaches `tl.load` as int32 and the interpreter refuses it
    ("mask has unsupported dtype"). Results whose values are bool are int1 by definition, which is what this sets.
    Installed only where the interpreter is seen to type them otherwise.
    """
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    builder_cls = getattr(interpreter, "InterpreterBuilder", None)
    handle_cls = getattr(interpreter, "TensorHandle", None)
    original = getattr(builder_cls, "binary_op", None)
    if original is None or handle_cls is None or getattr(original, "_qwen_lab", False):
        return
    try:
        one = handle_cls(np.array([1], dtype=np.int32), tl.int32)
        if builder_cls().create_icmpSLT(one, one).dtype == tl.int1:
            return
    except Exception:  # another interpreter than the one described above: leave it as it is
        return

    def binary_op(self, lhs, rhs, op):
        out = original(self, lhs, rhs, op)
        if out.data.dtype == np.bool_ and out.dtype != tl.int1:
            return handle_cls(out.data, tl.int1)
        return out

    binary_op._qwen_lab = True
    builder_cls.binary_op = binary_op


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    dtype: torch.dtype
    interpreter: bool
    reason: str

    def __str__(self) -> str:
        return self.reason


def choose(device=None, dtype=None) -> Runtime:
    """Pick device and dtype (each may be forced) and explain the choice in one line."""
    interp = interpreter_active()
    if device is None:
        device = "cuda" if _cuda_ok() and not interp else "cpu"
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"device={device!r}: {e}") from None
    if device.type not in ("cpu", "cuda"):
        raise DeviceError(f"device={str(device)!r}: expected 'cpu' or 'cuda' (optionally 'cuda:N'); the course's "
                          "kernels run on NVIDIA GPUs through Triton, and on the CPU through its interpreter")
    if device.type == "cuda" and not _cuda_ok():
        raise DeviceError(f"device={str(device)!r} was asked for, but torch sees no CUDA GPU on this machine")
    if isinstance(dtype, str):
        names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                 "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
        if dtype not in names:
            raise DeviceError(f"dtype={dtype!r}; expected one of {', '.join(names)} (or a torch.dtype)")
        dtype = names[dtype]
    if dtype is not None and dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise DeviceError(f"dtype={dtype!r}; expected torch.bfloat16, torch.float16 or torch.float32")
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        if dtype is None:
            dtype = torch.bfloat16 if major >= 8 else torch.float16
            why = "bf16" if major >= 8 else "fp16 (no bf16 below compute capability 8.0)"
        else:
            why = f"{str(dtype).removeprefix('torch.')} (asked for)"
        reason = f"GPU {name} (sm_{major}{minor}): kernels compiled by Triton, {why}"
    else:
        if dtype is None:
            dtype = torch.float32
        if interp:
            reason = ("CPU: kernels run in the Triton interpreter (TRITON_INTERPRET=1), "
                      f"{str(dtype).removeprefix('torch.')} (the interpreter gets bf16 tl.dot wrong)")
        else:
            reason = "CPU without the Triton interpreter: only backend='torch' can run here"
        if dtype == torch.bfloat16 and interp:
            reason += "; warning: bf16 under the interpreter gives wrong tl.dot results"
    return Runtime(device=device, dtype=dtype, interpreter=interp, reason=reason)


def describe() -> str:
    """A short environment report for the first cell of every notebook."""
    import platform

    lines = [f"python {platform.python_version()}, torch {torch.__version__}"]
    try:
        import triton
        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton: not installed")
    rt = choose()
    lines.append(f"device {rt.device}, dtype {str(rt.dtype).removeprefix('torch.')}, "
                 f"interpreter {'on' if rt.interpreter else 'off'}")
    lines.append(rt.reason)
    return "\n".join(lines)
