"""What every form of the projection y = x W^T shares: the operand checks (each error names the launcher, the
argument and what was expected), the regime bound and the split limits, the decode GEMV's prologue and reduction
ids (the plans' keys and the reports name them too), and the GPU's count of multiprocessors (the grids).

    x [M, K] (activations, token-major), W [N, K] (the Hugging Face layout, read as is), y [M, N]
"""

from __future__ import annotations

import functools

import torch

from ...errors import KernelError

# M at or below this is served by the GEMV / split-K path (decode and very short prompts).
GEMV_MAX_M = 16
# SPLIT_K beyond this buys nothing on any shape of the model and only adds contention.
MAX_SPLIT_K = 64
# K columns per split are rounded up to this many, so every split starts 32-byte aligned.
K_GRANULE = 16

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# How a GEMV program delivers its sums (the kernel's REDUCE; it compares with these literal values).
REDUCE_NONE, REDUCE_ATOMIC, REDUCE_DETERMINISTIC = 0, 1, 2
# What the GEMV computes from its input before the product (the kernel's PROLOGUE): x as is; SwiGLU of
# gate_up; RMSNorm of x; residual add + RMSNorm; the DeltaNet's per-head gated RMSNorm of o with gate z.
PRO_NONE, PRO_SWIGLU, PRO_RMS, PRO_ADD_RMS, PRO_GATED = 0, 1, 2, 3, 4
PROLOGUE_NAMES = {PRO_NONE: "plain", PRO_SWIGLU: "swiglu", PRO_RMS: "rms", PRO_ADD_RMS: "add_rms",
                  PRO_GATED: "gated"}  # for reports


def _fail(name: str, arg: str, what: str):
    raise KernelError(f"{name}: {arg} {what}")


def _check_matrix(name: str, arg: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, arg, f"must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        _fail(name, arg, f"must be 2-D, got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        _fail(name, arg, f"has dtype {t.dtype}; expected bfloat16, float16 or float32")
    if t.shape[1] > 1 and t.stride(1) != 1:
        _fail(name, arg, f"must be contiguous in its last dim (stride 1), got strides {t.stride()}")


def _check_weight_out(name: str, x, weight, out, M: int, x_cols: int, x_name: str = "x", k_of_x=lambda k: k):
    """Validate weight [N, K] against an input of M rows and x_cols columns (= k_of_x(K)), and out [M, N]."""
    N, K = weight.shape[0], weight.shape[1]
    if x_cols != k_of_x(K):
        _fail(name, x_name, f"has {x_cols} columns; weight {tuple(weight.shape)} needs {k_of_x(K)}")
    if weight.dtype != x.dtype:
        _fail(name, "weight", f"has dtype {weight.dtype}, but {x_name} has {x.dtype}; cast one to the other")
    if weight.device != x.device:
        _fail(name, "weight", f"is on {weight.device}, but {x_name} is on {x.device}")
    if K == 0:
        _fail(name, "weight", "has K = 0 columns; expected at least one")
    if out is not None:
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N):
            _fail(name, "out", f"must be a tensor of shape {(M, N)}, got "
                  f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
        if out.dtype != x.dtype or out.device != x.device:
            _fail(name, "out", f"must be {x.dtype} on {x.device}, got {out.dtype} on {out.device}")
        if N > 1 and out.stride(1) != 1:
            _fail(name, "out", f"must be contiguous in its last dim (stride 1), got strides {out.stride()}")
    return N, K


def _check_operands(name: str, x, weight, out, x_name: str = "x", k_of_x=lambda k: k):
    """Validate x [M, K'] and weight [N, K] (K' = k_of_x(K)), and out [M, N]; return M, N, K."""
    _check_matrix(name, x_name, x)
    _check_matrix(name, "weight", weight)
    N, K = _check_weight_out(name, x, weight, out, x.shape[0], x.shape[1], x_name, k_of_x)
    return x.shape[0], N, K


def _check_swiglu_operands(name: str, x, weight, out):
    """Validate x [M, K], weight [2I, K] = [W_gate; W_up] and out [M, I]; return M, I, K."""
    _check_matrix(name, "x", x)
    _check_matrix(name, "weight", weight)
    if weight.shape[0] % 2:
        _fail(name, "weight", f"has {weight.shape[0]} rows; expected an even number 2I ([W_gate; W_up] stacked)")
    M = x.shape[0]
    _check_weight_out(name, x, weight, None, M, x.shape[1])  # K, dtype and device against the whole weight
    I, K = _check_weight_out(name, x, weight[: weight.shape[0] // 2], out, M, x.shape[1])  # out [M, I]
    return M, I, K


@functools.lru_cache(maxsize=None)
def _sm_count_cached(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device; a nominal 4 for the CPU interpreter."""
    device = torch.device(device)
    if device.type != "cuda":
        return 4
    return _sm_count_cached(device.index if device.index is not None else torch.cuda.current_device())
