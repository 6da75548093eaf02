"""Comparing an output with the reference: the tolerance by dtype, the poison that marks what a kernel never
wrote, and `compare`, which says in words what is wrong (the failure diagnoses it calls live in diagnoses.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .diagnoses import _common_factor, _computed_nan, _misplaced, _where_wrong

# atol, rtol per dtype of the values compared. float32 kernels differ from torch only by the order of
# additions (and tf32 never runs: the CPU path is the interpreter, GPU checks use bf16/fp16).
TOLERANCES = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 5e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
INT_POISON = -7777


class CheckFailed(AssertionError):
    """An exercise or kernel check that did not pass; the message says why."""


@dataclass
class Comparison:
    name: str
    max_abs: float
    max_rel: float
    worst_index: tuple
    n_bad: int
    numel: int

    def __str__(self) -> str:
        return (f"{self.name}: max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g} "
                f"({self.numel} elements)")


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for outputs of this dtype."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64, the one-number summary used for whole-model parity."""
    o, r = out.double(), ref.double()
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


# The NaN that poisons output buffers, as bit patterns of one payload per width. A NaN a kernel computes (0/0, or a
# NaN read from around an input) has another payload, so `compare` can tell "never written" from "computed NaN".
POISON_BITS = {torch.float64: 0x7FF8DEADDEADDEAD, torch.float32: 0x7FC0DEAD, torch.float16: 0x7E5A,
               torch.bfloat16: 0x7FDA}
# the signed integer type of each float width: float bit patterns are written and compared through such a view
_INT_OF = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _poison_int(t: torch.Tensor) -> int | None:
    """t's poison pattern as a value of its same-width signed integer view (None: no poison pattern)."""
    bits = POISON_BITS.get(t.dtype)
    if bits is None:
        return None
    width = 8 * t.element_size()
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def _poison_mask(t: torch.Tensor) -> torch.Tensor | None:
    """Where t still holds the float poison (None for dtypes without a poison pattern)."""
    signed = _poison_int(t)
    return None if signed is None else t.view(_INT_OF[t.element_size()]) == signed


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill t so that any element a kernel forgets to write stands out (a tagged NaN, or -7777 for integers)."""
    signed = _poison_int(t)
    if signed is not None:  # (a same-width integer view works for any strides)
        t.view(_INT_OF[t.element_size()]).fill_(signed)
    elif t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(INT_POISON)
    return t


def _fmt_index(flat: int, shape) -> tuple:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape))) if len(shape) else ()


def compare(name: str, out, ref, atol: float | None = None, rtol: float | None = None, hint: str = "",
            operator: str | None = None) -> Comparison:
    """Assert that `out` matches `ref`; raise CheckFailed explaining the first thing wrong.

    Checks in order: it is a tensor, the shape, the dtype, unwritten (NaN) or infinite elements, the same NaN or
    infinity wherever the reference has one, then values within atol + rtol * |ref|. Integer tensors must match
    exactly. `operator` (an exercise's, e.g. "norm"; None: any) keeps the causes of NaN that belong to it.
    """
    tip = _tip(hint)
    if not isinstance(out, torch.Tensor):
        raise CheckFailed(f"{name}: expected a torch.Tensor, got {type(out).__name__}{tip}")
    if tuple(out.shape) != tuple(ref.shape):
        raise CheckFailed(f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}{tip}")
    if out.dtype != ref.dtype:
        raise CheckFailed(f"{name}: dtype {out.dtype}, expected {ref.dtype}{tip}")
    o, r = out.detach().cpu(), ref.detach().cpu()
    numel = o.numel()
    if numel == 0:   # nothing to compare once the shapes and dtypes agree
        return Comparison(name, 0.0, 0.0, (), 0, 0)
    if not o.is_floating_point():
        bad = o != r
        n_bad = int(bad.sum())
        if n_bad:
            flat = int(bad.flatten().nonzero()[0])
            idx = _fmt_index(flat, o.shape)
            unwritten = int((o == INT_POISON).sum())
            extra = f"; {unwritten} still hold the poison value {INT_POISON} (never written)" if unwritten else ""
            raise CheckFailed(f"{name}: {n_bad} of {numel} values differ{extra}; first at {idx}: got "
                              f"{o.flatten()[flat].item()}, expected {r.flatten()[flat].item()}{tip}")
        return Comparison(name, 0.0, 0.0, (), 0, numel)
    default_atol, default_rtol = tolerance(ref.dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    poisoned = _poison_mask(o)
    o, r = o.double(), r.double()
    nan_out = torch.isnan(o) & ~torch.isnan(r)
    if nan_out.any():
        n = int(nan_out.sum())
        idx = _fmt_index(int(nan_out.flatten().nonzero()[0]), o.shape)
        unwritten = int((poisoned & nan_out).sum()) if poisoned is not None else None
        never = ("never written, or computed from an output element before it was written (outputs start as "
                 "NaN: check that the grid covers every block and the store mask; an atomic_add into an output "
                 "adds to its NaN, and a load from an output before its store reads the NaN)")
        computed = _computed_nan(o, r, nan_out if poisoned is None else nan_out & ~poisoned, operator)
        if unwritten is None:  # an output the check did not poison itself
            why = ("the kernel never wrote them (outputs start as NaN: check the grid covers every block "
                   "and the store mask), or computed NaN") if n < numel else \
                "every element is NaN: nothing was written, or a NaN spread"
        elif unwritten == n:
            why = f"all {never}"
        elif unwritten == 0:
            why = f"none holds the check's poison: {computed}"
        else:
            why = f"{unwritten} still hold the poison, {never}; {n - unwritten} were {computed}"
        raise CheckFailed(f"{name}: {n} of {numel} elements are NaN, first at {idx}; {why}{tip}")
    inf_out = torch.isinf(o) & ~torch.isinf(r)
    if inf_out.any():
        idx = _fmt_index(int(inf_out.flatten().nonzero()[0]), o.shape)
        raise CheckFailed(f"{name}: {int(inf_out.sum())} elements are infinite, first at {idx} (an overflow, or a "
                          f"load that read memory outside the inputs: check the load masks and the pointer "
                          f"arithmetic){tip}")
    # where the reference is NaN or infinite the kernel must give the same: NaN where NaN, the same infinity
    finite = torch.isfinite(r)
    unlike = ~finite & ~(torch.isnan(r) & torch.isnan(o)) & (o != r)
    if unlike.any():
        flat = int(unlike.flatten().nonzero()[0])
        raise CheckFailed(f"{name}: {int(unlike.sum())} of {int((~finite).sum())} elements where the reference is NaN "
                          f"or infinite differ, first at {_fmt_index(flat, o.shape)}: got {o.flatten()[flat].item():.6g}, "
                          f"expected {r.flatten()[flat].item()} (where the reference is NaN or infinite the kernel "
                          f"must give the same: NaN where it is NaN, the same infinity where it is infinite){tip}")
    diff = (o - r).abs()
    diff = torch.where(finite, diff, torch.zeros_like(diff))
    limit = atol + rtol * r.abs()
    bad = diff > limit
    flat = int(diff.flatten().argmax()) if numel else 0
    max_abs = float(diff.max()) if numel else 0.0
    rel = diff / r.abs().clamp_min(atol if atol > 0 else 1e-30)
    max_rel = float(rel.max()) if numel else 0.0
    idx = _fmt_index(flat, o.shape)
    cmp = Comparison(name, max_abs, max_rel, idx, int(bad.sum()), numel)
    if cmp.n_bad:
        huge = (" Values this large usually come from memory outside the inputs: check the load masks."
                if numel and float(o.abs().max()) > 1e6 * max(float(r.abs().max()), 1e-30) else "")
        factor = _common_factor(o, r, atol, rtol)
        if factor is not None:
            huge += f" Every element is the reference times {factor:.6g}: a missing or extra scale factor."
        else:
            huge += _where_wrong(bad) + _misplaced(o, r, bad, atol, rtol)
        raise CheckFailed(
            f"{name}: {cmp.n_bad} of {numel} elements differ from the reference beyond atol={atol:g}, "
            f"rtol={rtol:g}; worst at {idx}: got {o.flatten()[flat].item():.6g}, expected "
            f"{r.flatten()[flat].item():.6g} (abs error {max_abs:.3g}).{huge}{tip}")
    return cmp


def _tip(hint: str) -> str:
    """The hint line that ends a failure message (nothing without a hint)."""
    return f"\n  hint: {hint}" if hint else ""


def randn(*shape, g: torch.Generator, dtype=torch.float32, device="cpu", scale: float = 1.0) -> torch.Tensor:
    """Seeded normal values drawn on the CPU (reproducible everywhere), then moved."""
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def finite_or_raise(name: str, t: torch.Tensor) -> None:
    """Raise CheckFailed if t holds NaN or inf (used to find the first operator that breaks)."""
    if not torch.isfinite(t).all():
        n = int((~torch.isfinite(t)).sum())
        raise CheckFailed(f"{name}: {n} of {t.numel()} values are NaN or infinite")
