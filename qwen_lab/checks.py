"""What the notebooks call to grade an exercise, and what the tests use to compare tensors.

A check draws fresh random inputs, poisons every output buffer first (NaN for floats, a sentinel for
integers) so that a kernel that writes nothing cannot pass, runs the learner's function, proves that
a Triton kernel really launched, and compares with the reference at a tolerance set by the dtype.
A failure says what is wrong in words: which output, how many elements, the worst one and where,
and a hint.

    from qwen_lab import checks, reference
    checks.check_kernel("rms_norm", my_rms_norm, reference.rms_norm,
                        cases=[lambda g: dict(x=torch.randn(5, 64, generator=g), ...)])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from .kernels import count_launches

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


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill t so that any element a kernel forgets to write stands out (NaN, or -7777 for integers)."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(INT_POISON)
    return t


def _fmt_index(flat: int, shape) -> tuple:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(shape))) if len(shape) else ()


def compare(name: str, out, ref, atol: float | None = None, rtol: float | None = None, hint: str = "") -> Comparison:
    """Assert that `out` matches `ref`; raise CheckFailed explaining the first thing wrong.

    Checks in order: it is a tensor, the shape, the dtype, unwritten (NaN) or infinite elements,
    then values within atol + rtol * |ref|. Integer tensors must match exactly.
    """
    tip = f"\n  hint: {hint}" if hint else ""
    if not isinstance(out, torch.Tensor):
        raise CheckFailed(f"{name}: expected a torch.Tensor, got {type(out).__name__}{tip}")
    if tuple(out.shape) != tuple(ref.shape):
        raise CheckFailed(f"{name}: shape {tuple(out.shape)}, expected {tuple(ref.shape)}{tip}")
    if out.dtype != ref.dtype:
        raise CheckFailed(f"{name}: dtype {out.dtype}, expected {ref.dtype}{tip}")
    o, r = out.detach().cpu(), ref.detach().cpu()
    numel = o.numel()
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
    o, r = o.double(), r.double()
    nan_out = torch.isnan(o) & ~torch.isnan(r)
    if nan_out.any():
        n = int(nan_out.sum())
        idx = _fmt_index(int(nan_out.flatten().nonzero()[0]), o.shape)
        why = ("the kernel never wrote them (outputs start as NaN: check the grid covers every block "
               "and the store mask)") if n < numel else "every element is NaN: nothing was written, or a NaN spread"
        raise CheckFailed(f"{name}: {n} of {numel} elements are NaN, first at {idx}; {why}{tip}")
    inf_out = torch.isinf(o) & ~torch.isinf(r)
    if inf_out.any():
        idx = _fmt_index(int(inf_out.flatten().nonzero()[0]), o.shape)
        raise CheckFailed(f"{name}: {int(inf_out.sum())} elements are infinite, first at {idx} (overflow?){tip}")
    diff = (o - r).abs()
    finite = torch.isfinite(r)
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
        raise CheckFailed(
            f"{name}: {cmp.n_bad} of {numel} elements differ from the reference beyond atol={atol:g}, "
            f"rtol={rtol:g}; worst at {idx}: got {o.flatten()[flat].item():.6g}, expected "
            f"{r.flatten()[flat].item():.6g} (abs error {max_abs:.3g}){tip}")
    return cmp


def _unfinished(e: BaseException) -> NotImplementedError | None:
    """The NotImplementedError of an unfinished exercise, found in e's cause chain or message, else None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NotImplementedError):
            return e
        e = e.__cause__ or e.__context__
    return None


def _is_output(name: str) -> bool:
    """Output buffers by name: `out`, `out_*`, `*_out` (e.g. `residual_out`): poisoned, and not given to the
    reference, which allocates its own results."""
    return name.startswith("out") or name.endswith("_out")


def _clone_keeping_strides(v):
    """A copy of v with v's strides. `clone()` would make a strided view (a slice of a wider projection, rows farther
    apart than their length) contiguous, and a kernel that ignores the row stride would then pass. The gaps
    between the rows hold NaN (zeros for integers), so a kernel that reads them shows it in its output."""
    if not isinstance(v, torch.Tensor):
        return v
    if v.numel() == 0 or v.is_contiguous() or 0 in v.stride():
        return v.clone()
    c = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
    whole = torch.as_strided(c, (c.untyped_storage().nbytes() // c.element_size(),), (1,), 0)
    whole.fill_(float("nan") if c.is_floating_point() else 0)
    return c.copy_(v)


def _clone_inputs(kwargs: dict) -> dict:
    return {k: _clone_keeping_strides(v) for k, v in kwargs.items()}


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_kernel(name: str, fn: Callable, ref: Callable, cases: Iterable[Callable[[torch.Generator], dict]],
                 *, seed: int | None = None, atol: float | None = None, rtol: float | None = None,
                 hint: str = "", require_triton: bool = True, inplace: Iterable[str] = (),
                 quiet: bool = False) -> list[Comparison]:
    """Run `fn` and `ref` on each case and compare every output (and every in-place argument).

    cases: callables taking a torch.Generator and returning the keyword arguments of one call, so each
    check draws fresh inputs. Arguments named `out...` or `..._out` are output buffers: poisoned with NaN
    first and left out of the reference's call. `inplace` names arguments that both functions update in place (a cache,
    a state): they are compared after the call too. With `require_triton`, a `fn` that launched no
    Triton kernel fails (the exercise is to write one). Prints one line per case unless `quiet`.
    """
    seed = torch.randint(0, 2**31 - 1, ()).item() if seed is None else seed
    results = []
    for i, make in enumerate(cases):
        g = torch.Generator().manual_seed(seed + i)
        inputs = make(g)
        ref_in, fn_in = _clone_inputs(inputs), _clone_inputs(inputs)
        for key, value in fn_in.items():
            if _is_output(key) and isinstance(value, torch.Tensor):
                poison_(value)
        shapes = ", ".join(f"{k}={tuple(v.shape)}" for k, v in inputs.items() if isinstance(v, torch.Tensor))
        where = f"{name} (case {i}: {shapes})"
        expected = _as_tuple(ref(**{k: v for k, v in ref_in.items() if not _is_output(k)}))
        try:
            with count_launches() as launches:
                got = fn(**fn_in)
        except CheckFailed:
            raise
        except Exception as e:  # show the learner's own error, with the case that caused it
            stub = _unfinished(e)
            if stub is not None:  # an exercise stub, possibly wrapped by the Triton interpreter or compiler
                raise stub
            raise CheckFailed(f"{where}: your function raised {type(e).__name__}: {e}") from e
        if require_triton and sum(launches.values()) == 0:
            raise CheckFailed(f"{where}: no Triton kernel was launched; the exercise is to compute this with "
                              f"a @triton.jit kernel launched as kernel[grid](...)")
        got = _as_tuple(got) if got is not None else ()
        if len(got) != len(expected):
            raise CheckFailed(f"{where}: returned {len(got)} value(s), expected {len(expected)}")
        for j, (o, r) in enumerate(zip(got, expected)):
            label = where if len(expected) == 1 else f"{where}, output {j}"
            results.append(compare(label, o, r, atol=atol, rtol=rtol, hint=hint))
        for key in inplace:
            results.append(compare(f"{where}, in-place '{key}'", fn_in[key], ref_in[key], atol=atol, rtol=rtol,
                                   hint=hint))
        if not quiet:
            worst = max((c.max_abs for c in results[-len(expected):]), default=0.0)
            kernels = ", ".join(sorted(launches)) or "none"
            print(f"  ok  case {i}: {shapes}  max abs error {worst:.2e}  (kernels: {kernels})")
    if not quiet:
        print(f"PASS {name}: {len(results)} comparisons within tolerance")
    return results


def randn(*shape, g: torch.Generator, dtype=torch.float32, device="cpu", scale: float = 1.0) -> torch.Tensor:
    """Seeded normal values drawn on the CPU (reproducible everywhere), then moved."""
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def finite_or_raise(name: str, t: torch.Tensor) -> None:
    """Raise CheckFailed if t holds NaN or inf (used to find the first operator that breaks)."""
    if not torch.isfinite(t).all():
        n = int((~torch.isfinite(t)).sum())
        raise CheckFailed(f"{name}: {n} of {t.numel()} values are NaN or infinite")


# ---------------------------------------------------------------- guard regions

GUARD_NAN, GUARD_SENTINEL = float("nan"), -7777.0
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_tags = iter(range(1, 1 << 30))


def _tagged_nan_(buf):
    """Fill buf with a NaN whose payload no other guard uses: a NaN copied from another tensor's margin
    (a load past one end, then a store past another) then shows as a changed bit pattern."""
    tag = next(_tags) % 63 + 1
    pattern = {2: 0x7FC0 | tag, 4: 0x7FC00000 | (tag << 8), 8: 0x7FF8000000000000 | (tag << 20)}
    buf.view(_BITS[buf.element_size()]).fill_(pattern[buf.element_size()])


class GuardedTensor:
    """A copy of `src` as a view into a bigger buffer filled with `fill`: every leading dim gets `pad` extra
    elements of pitch, and a margin of at least 64 more rows lies on both sides.

    The Triton interpreter runs kernels on CPU memory, where a load or store past a tensor's end lands in a
    neighbouring allocation unnoticed while a GPU faults. Guarded tensors make such accesses visible on a CPU:
    NaN around inputs (read, it reaches an output), a sentinel around outputs, and `touched()` counts every
    element outside the view whose bits changed."""

    def __init__(self, src, fill, pad=3):
        shape = tuple(src.shape)
        strides = [1] * len(shape)
        for d in range(len(shape) - 2, -1, -1):
            strides[d] = shape[d + 1] * strides[d + 1] + pad
        span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        margin = (span + min(64 * strides[0], 1 << 16) + 256 + 15) // 16 * 16  # views stay 16-byte aligned
        self.buf = torch.full((2 * margin + span,), fill, dtype=src.dtype, device=src.device)
        if fill != fill:
            _tagged_nan_(self.buf)
        self.view = self.buf.as_strided(shape, strides, margin)
        self.view.copy_(src)
        inside = torch.zeros(self.buf.shape, dtype=torch.bool, device=src.device)
        inside.as_strided(shape, strides, margin).fill_(True)
        self.outside = ~inside
        self.before = self.buf.clone()

    def touched(self) -> int:
        """How many elements outside the view changed (compared as bit patterns, so NaN == NaN)."""
        bits = _BITS[self.buf.element_size()]
        return int((self.buf.view(bits) != self.before.view(bits))[self.outside].sum())


def guarded_call(fn, args: dict, outputs=(), **kwargs) -> dict:
    """fn(**args) with every tensor argument guarded; outputs start as NaN inside and a sentinel around.
    Asserts that nothing outside the tensors changed; -> the argument views (outputs and in-place state)."""
    guards = {}
    for name, t in args.items():
        if isinstance(t, torch.Tensor):
            guards[name] = GuardedTensor(torch.full_like(t, GUARD_NAN) if name in outputs else t,
                                         GUARD_SENTINEL if name in outputs else GUARD_NAN)
    fn(**{name: guards[name].view if name in guards else t for name, t in args.items()}, **kwargs)
    for name, g in guards.items():
        n = g.touched()
        assert n == 0, (f"{getattr(fn, '__name__', fn)}: {n} elements around '{name}' {tuple(g.view.shape)} changed: "
                        f"a store went outside the tensor")
    return {name: g.view for name, g in guards.items()}


__all__ = ["CheckFailed", "Comparison", "TOLERANCES", "check_kernel", "compare", "finite_or_raise", "poison_",
           "randn", "relative_error", "tolerance", "GuardedTensor", "guarded_call",
           "GUARD_NAN", "GUARD_SENTINEL"]
