"""Argument checks the attention launchers share: each error names the tensor and what was expected.
"""

from __future__ import annotations

import torch

from ...errors import KernelError


def _check_3d(name, x, expect=None):
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise KernelError(f"{name}: expected a 3-D tensor {expect}, got {got}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise KernelError(f"{name}: the last dim must be contiguous (stride 1), got strides {tuple(x.stride())}")


def _check_positions(positions, T, device):
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.shape[0] != T:
        got = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise KernelError(f"positions: expected an integer tensor [{T}] (one per token), got {got}")
    if positions.dtype not in (torch.int64, torch.int32):
        raise KernelError(f"positions: expected int64 or int32, got {positions.dtype}")
    if positions.device != device:
        raise KernelError(f"positions: on {positions.device}, expected {device} (read inside the kernel)")
    if T > 1 and positions.stride(0) != 1:
        raise KernelError("positions: must be contiguous")


def _check_like(name, x, shape, dtype, device):
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(shape) or x.device != device:
        got = f"{x.dtype} {tuple(x.shape)} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise KernelError(f"{name}: expected shape {tuple(shape)} on {device}, got {got}")
    if dtype is not None and x.dtype != dtype:
        raise KernelError(f"{name}: expected dtype {dtype}, got {x.dtype}")
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        raise KernelError(f"{name}: the last dim must be contiguous (stride 1)")


def _check_qkv(q, k, v, positions):
    _check_3d("q", q, "[T, Hq, D]")
    _check_3d("k", k, "[L, Hkv, D]")
    T, Hq, D = q.shape
    L, Hkv, Dk = k.shape
    if Dk != D:
        raise KernelError(f"k: head_dim {Dk}, expected {D} (q's head_dim)")
    if Hkv == 0 or Hq % Hkv:
        raise KernelError(f"k: {Hkv} KV heads; expected a divisor of the {Hq} query heads")
    _check_like("v", v, k.shape, k.dtype, k.device)
    if k.dtype != q.dtype or k.device != q.device:
        raise KernelError(f"k: expected {q.dtype} on {q.device} like q, got {k.dtype} on {k.device}")
    if not q.is_floating_point():
        raise KernelError(f"q: expected a floating-point tensor, got {q.dtype}")
    _check_positions(positions, T, q.device)
    return T, Hq, D, L, Hkv


def _out_and_gate(q, out, gate):
    """Check `out` and `gate` against q ([T, Hq, D]: out of q's dtype, gate any float dtype) -> out, allocated
    when None."""
    if gate is not None:
        _check_like("gate", gate, q.shape, None, q.device)
    if out is None:
        return torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _check_like("out", out, q.shape, q.dtype, q.device)
    return out
