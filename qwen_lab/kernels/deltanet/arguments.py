"""The argument checks every DeltaNet launcher shares. Each error names the tensor or argument and what was expected
(a kernel given a wrong shape would read or write outside its tensors instead of failing)."""

from __future__ import annotations

import torch

from ...errors import KernelError


def _shape(t):
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


def _check(name, t, ndim, what, device=None, dtype=None, float_only=True, any_strides=False):
    if not isinstance(t, torch.Tensor) or t.dim() != ndim:
        raise KernelError(f"{name}: expected a {ndim}-D tensor {what}, got {_shape(t)}")
    if float_only and not t.is_floating_point():
        raise KernelError(f"{name}: expected a floating-point tensor {what}, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise KernelError(f"{name}: dtype {t.dtype}, expected {dtype}")
    if device is not None and t.device != device:
        raise KernelError(f"{name}: on {t.device}, expected {device}")
    if not any_strides and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise KernelError(f"{name}: the last dim must be contiguous (stride 1), got strides {tuple(t.stride())}")


def _check_out(name, out, shape, dtype, device):
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    _check(name, out, len(shape), f"{list(shape)}", device=device, dtype=dtype)
    if tuple(out.shape) != tuple(shape):
        raise KernelError(f"{name}: shape {tuple(out.shape)}, expected {tuple(shape)}")
    return out


def _check_gate_params(A_log, dt_bias, Hv, device):
    """A_log and dt_bias must be [Hv] on `device` (Hv None: v itself was malformed, and its own check will say so)."""
    for name, p in (("A_log", A_log), ("dt_bias", dt_bias)):
        _check(name, p, 1, f"[Hv={Hv}]", device=device)
        if Hv is not None and p.shape[0] != Hv:
            raise KernelError(f"{name}: shape {tuple(p.shape)}, expected ({Hv},) (one per value head)")


def _check_delta(q, k, v, g, beta, state, gate_names=("g", "beta")):
    """Validate the delta rule's inputs; -> (T, Hk, Dk, Hv, Dv)."""
    _check("q", q, 3, "[T, Hk, Dk]")
    T, Hk, Dk = q.shape
    dev = q.device
    _check("k", k, 3, f"[T={T}, Hk={Hk}, Dk={Dk}] like q", device=dev, dtype=q.dtype)
    if tuple(k.shape) != (T, Hk, Dk):
        raise KernelError(f"k: shape {tuple(k.shape)}, expected {(T, Hk, Dk)} like q")
    _check("v", v, 3, f"[T={T}, Hv, Dv]", device=dev, dtype=q.dtype)
    if v.shape[0] != T:
        raise KernelError(f"v: {v.shape[0]} tokens, expected {T} like q")
    Hv, Dv = v.shape[1], v.shape[2]
    if Hk == 0 or Hv % Hk:
        raise KernelError(f"v: {Hv} value heads, expected a multiple of the {Hk} q/k heads")
    for name, t in zip(gate_names, (g, beta)):
        _check(name, t, 2, f"[T={T}, Hv={Hv}]", device=dev, float_only=True)
        if tuple(t.shape) != (T, Hv):
            raise KernelError(f"{name}: shape {tuple(t.shape)}, expected {(T, Hv)}")
    _check("state", state, 3, f"[Hv={Hv}, Dk={Dk}, Dv={Dv}] float32", device=dev, dtype=torch.float32)
    if tuple(state.shape) != (Hv, Dk, Dv):
        raise KernelError(f"state: shape {tuple(state.shape)}, expected {(Hv, Dk, Dv)} = [Hv, Dk, Dv]")
    if Dk > 256 or Dv > 256:
        raise KernelError(f"head dims Dk={Dk}, Dv={Dv}: the kernels hold a whole head row, up to 256")
    return T, Hk, Dk, Hv, Dv
