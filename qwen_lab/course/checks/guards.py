"""Guarded buffers: every tensor a check hands to the learner's function lies inside a bigger buffer whose margins
(and the gaps between its rows) hold NaN around an input and a sentinel around an output, so that a load or a store
outside the tensor shows; the buffers the learner's own wrapper allocates are guarded the same way.
"""

from __future__ import annotations

import contextlib
import sys

import torch

from .comparison import _INT_OF, INT_POISON, poison_
from .diagnoses import _ranges
from .learner import _learner_code

GUARD_NAN, GUARD_SENTINEL = float("nan"), -7777.0
_GUARDABLE = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16)
_tags = iter(range(1, 1 << 30))


def _tagged_nan_(buf):
    """Fill buf with a NaN whose payload no other guard uses: a NaN copied from another tensor's margin
    (a load past one end, then a store past another) then shows as a changed bit pattern."""
    tag = next(_tags) % 63 + 1
    pattern = {2: 0x7FC0 | tag, 4: 0x7FC00000 | (tag << 8), 8: 0x7FF8000000000000 | (tag << 20)}
    buf.view(_INT_OF[buf.element_size()]).fill_(pattern[buf.element_size()])


class GuardedTensor:
    """A copy of `src` as a view into a bigger buffer filled with `fill`, with a margin on both sides of the tensor
    again plus 128 rows (at most 2**17 elements of them) and 256 elements (a store with no row mask writes a whole
    block of rows past the last one).
    The view has `strides` (check_kernel keeps a case's own), or by default contiguous rows with every leading dim
    `pad` extra elements of pitch, so the gaps between rows are guarded too.

    The Triton interpreter runs kernels on CPU memory, where a load or store past a tensor's end lands in a
    neighbouring allocation unnoticed (or corrupts the process) while a GPU faults. Guarded tensors make such
    accesses visible: NaN around inputs (read, it reaches an output), a sentinel around outputs, and `touched()`
    counts every element outside the view whose bits changed."""

    def __init__(self, src, fill, pad=3, strides=None):
        shape = tuple(src.shape)
        if strides is None:
            strides = [1] * len(shape)
            for d in range(len(shape) - 2, -1, -1):
                strides[d] = shape[d + 1] * strides[d + 1] + pad
        strides = tuple(strides)
        span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
        margin = (span + min(128 * max(strides, default=1), 1 << 17) + 256 + 15) // 16 * 16  # 16-byte aligned views
        self.buf = torch.full((2 * margin + span,), fill, dtype=src.dtype, device=src.device)
        if fill != fill:
            _tagged_nan_(self.buf)
        self.margin, self.span = margin, span
        self.view = self.buf.as_strided(shape, strides, margin)
        self.view.copy_(src)
        inside = torch.zeros(self.buf.shape, dtype=torch.bool, device=src.device)
        inside.as_strided(shape, strides, margin).fill_(True)
        self.outside = ~inside
        self.before = self.buf.clone()

    def _changed(self) -> torch.Tensor:
        bits = _INT_OF[self.buf.element_size()]  # compared as bit patterns, so NaN == NaN
        return (self.buf.view(bits) != self.before.view(bits)) & self.outside

    def touched(self) -> int:
        """How many elements outside the view changed."""
        return int(self._changed().sum())

    def where_touched(self) -> str:
        """Where the changed elements lie: before the view, past it, or between its rows."""
        at = self._changed().nonzero().flatten()
        before, after = int((at < self.margin).sum()), int((at >= self.margin + self.span).sum())
        parts = [f"{before} before its start" if before else "", f"{after} past its end" if after else "",
                 f"{len(at) - before - after} between its rows" if len(at) - before - after else ""]
        return ", ".join(p for p in parts if p)

    def stray_places(self) -> tuple[str, bool]:
        """Where the changed elements lie in the view's own index space (' The stray elements lie at columns 160-255
        (of 160)...'), and whether they may lie past a leading dim (a row, a head) rather than only past the last one
        (a column). Past the end of a tensor, a column past the last row's end and a row past the last one can be the
        same memory: both readings are then given. ('', False) for a view whose strides are not of rows one after
        another."""
        shape, strides = tuple(self.view.shape), tuple(self.view.stride())
        nd = len(shape)
        if nd == 0 or strides[-1] != 1 or any(strides[d] < shape[d + 1] * strides[d + 1] for d in range(nd - 1)):
            return "", False
        offsets = self._changed().nonzero().flatten() - self.margin   # from the view's first element
        if offsets.numel() == 0:
            return "", False
        rest, parts, lead, column = offsets, [], False, offsets
        for d in range(nd):
            idx = torch.div(rest, strides[d], rounding_mode="floor") if d < nd - 1 else rest
            rest = rest - idx * strides[d]
            column = idx   # (after the loop: the index along the last dim)
            off = (idx < 0) | (idx >= shape[d])
            if not bool(off.any()):
                continue
            lead |= d < nd - 1
            what = "offsets" if nd == 1 else "columns" if d == nd - 1 else "rows" if nd == 2 else f"dim {d} indices"
            parts.append(f"{what} {_ranges(torch.unique(idx[off]).tolist())} (of {shape[d]})")
        if not parts:
            return "", False
        row_end = f"lanes past the end of {'a row' if nd > 1 else 'it'}, which the store's mask let through"
        row_past = ("a program whose row lies past the tensor's last one (a row index computed wrong, a program id "
                    "taken from the wrong axis of the grid, or rows without a mask)")
        last_row = sum((n - 1) * st for n, st in zip(shape[:-1], strides[:-1])) if nd > 1 else 0
        beyond = offsets >= last_row + shape[-1]
        # past the end, a row past the last one may also be columns past the last row's end: where the rows follow
        # one another with no gap, or where the gap after the last row was written too (a row past it would skip it)
        in_gap = bool((beyond & (offsets < last_row + (strides[-2] if nd > 1 else 0))).any())
        columns = torch.where(beyond, offsets - last_row, column)
        if bool((offsets >= 0).all()) and bool((columns == shape[-1]).all()):
            return (f" The stray elements lie at {'offset' if nd == 1 else 'column'} {shape[-1]} (of {shape[-1]}) "
                    f"only, just past the end of {'a row' if nd > 1 else 'it'}: an off-by-one in the store's mask "
                    f"(a <= where < belongs?)."), False
        if lead and bool((offsets >= 0).all()) and (strides[-2] == shape[-1] or in_gap):
            return (f" The stray elements lie at columns {_ranges(torch.unique(columns).tolist())} (of {shape[-1]}"
                    f"{', of its last row' if bool(beyond.all()) else ''}), or, the memory being the same past its "
                    f"end, at {' and '.join(parts)}: {row_end}, or {row_past}."), True
        return f" The stray elements lie at {' and '.join(parts)}: {row_past if lead else row_end}.", lead


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


# ---------------------------------------------------------------- a case's tensors and the learner's allocations

def _guardable(t: torch.Tensor) -> bool:
    """Whether check_kernel hands `t` over inside a GuardedTensor (expanded, empty and other tensors go as copies)."""
    return (t.numel() > 0 and t.dtype in _GUARDABLE and t.layout == torch.strided
            and t.device.type in ("cpu", "cuda") and all(st > 0 for st, n in zip(t.stride(), t.shape) if n > 1))


def _guard(t: torch.Tensor, output: bool, accumulator: bool = False) -> "GuardedTensor":
    """t inside a GuardedTensor with its own strides: NaN (0 for integers) around an input, the sentinel
    (INT_POISON) around an output. Around a floating accumulator (a zeroed buffer that tl.atomic_add adds into),
    -0.0: a stray add of 0.0, what a masked-off lane contributes, leaves the sentinel's bits as they were but turns
    -0.0 into +0.0, so even that add past the edge shows."""
    if t.is_floating_point():
        fill = -0.0 if accumulator else GUARD_SENTINEL if output else GUARD_NAN
    else:
        fill = INT_POISON if output else 0
    return GuardedTensor(t, fill, strides=t.stride())


@contextlib.contextmanager
def _guarded_allocations():
    """While the block runs, `torch.empty`, `torch.zeros` and their `_like` forms called from the learner's own code
    return a guarded buffer (as the check's own outputs are): a store past the end of a buffer the learner's wrapper
    made is then reported (on a CPU it would corrupt the process, or abort it with no message). An empty buffer is
    poisoned, so an element never written shows as the poison; a zeroed one (an accumulator for tl.atomic_add)
    stays zero inside. Yields the list of guards, filled as the block allocates."""
    real = {name: getattr(torch, name) for name in ("empty", "empty_like", "zeros", "zeros_like")}
    allocated: list[GuardedTensor] = []

    def guard(t, poison: bool):
        if not _guardable(t):
            return t
        g = _guard(t, output=True, accumulator=not poison)
        if poison:
            poison_(g.view)
        else:
            g.view.zero_()
        allocated.append(g)
        return g.view

    def guarded(name):
        make, poison = real[name], name.startswith("empty")

        def allocate(*args, **kwargs):
            t = make(*args, **kwargs)
            mine = kwargs.get("out") is None and _learner_code(sys._getframe(1).f_code.co_filename)
            return guard(t, poison) if mine else t
        return allocate

    for name in real:
        setattr(torch, name, guarded(name))
    try:
        yield allocated
    finally:
        for name, fn in real.items():
            setattr(torch, name, fn)
