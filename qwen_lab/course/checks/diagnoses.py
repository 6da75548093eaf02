"""What a wrong output tells about the mistake behind it: why elements came out NaN (never written, or computed
from a row with nothing to normalise, an overflow, a load outside an input), where the wrong elements lie (a second
tile, some heads, the last columns), right values at the wrong index, and a missing or extra scale factor.
`compare` (comparison.py) adds these sentences to its failure message.
"""

from __future__ import annotations

import torch

# Why a kernel computes NaN, each cause with the operators it belongs to (None: any operator). A check that knows its
# exercise's operator names only that operator's causes: a norm is never told about a softmax row's max.
_SOFTMAX = frozenset({"softmax"})
_ZERO_DIV = frozenset({"norm", "recurrence", "softmax"})
_NAN_CAUSES = (
    (None, "a load outside an input: strided inputs hold NaN between and around their rows"),
    (_ZERO_DIV, "0/0, e.g. a missing eps"),
    (_SOFTMAX, "exp(-inf - (-inf)) in a row whose every entry is masked"),
    (_SOFTMAX, "inf/inf, an exp that overflowed where the row's max was not subtracted first"),
)


def _applies(kinds, operator: str | None) -> bool:
    return operator is None or kinds is None or operator in kinds


def _nan_causes(operator: str | None) -> str:
    return "; or ".join(text for kinds, text in _NAN_CAUSES if _applies(kinds, operator))


def _computed_nan(o: torch.Tensor, r: torch.Tensor, computed: torch.Tensor, operator: str | None = None) -> str:
    """'computed as NaN (...)': why a kernel computed NaN where the reference has a number, told from the rows (along
    the last dim) that hold them. Rows whose expected values are all 0: a row with nothing to normalise (a softmax
    row whose every key is masked). Rows whose other elements came out 0: a sum that overflowed to inf. Whole rows
    otherwise: a NaN spread through the row's reduction, or 0/0. Scattered elements: the list of usual causes.
    `operator` (the exercise's, e.g. "norm" or "softmax"; None: any) keeps the causes that belong to it."""
    causes = _nan_causes(operator)
    if o.dim() < 2 or o.shape[-1] < 2 or not bool(computed.any()):   # no rows to tell apart
        return f"computed as NaN ({causes})"
    lead = tuple(o.shape[:-1])
    o2, r2, c2 = o.reshape(-1, o.shape[-1]), r.reshape(-1, o.shape[-1]), computed.reshape(-1, o.shape[-1])
    has = c2.any(1)
    nan_row = torch.isnan(o2)
    ref_zero = (r2 == 0).all(1)
    whole = nan_row.all(1)
    # the finite elements of the row are all 0 although the reference's are not: x / inf beside inf / inf
    zero_rest = torch.where(nan_row, torch.zeros_like(o2), o2).eq(0).all(1) & ~whole & (r2 != 0).any(1)
    softmax = _applies(_SOFTMAX, operator)
    kinds = {
        "empty": has & ref_zero,
        "overflow": has & ~ref_zero & zero_rest if softmax else torch.zeros_like(has),
        "whole": has & ~ref_zero & whole,
    }
    kinds["scattered"] = has & ~kinds["empty"] & ~kinds["overflow"] & ~kinds["whole"]

    def rows(mask: torch.Tensor) -> str:
        where = _where_wrong(mask.reshape(lead)).removeprefix(" The wrong elements lie only in ").rstrip(".")
        return f"{int(mask.sum())} of {mask.numel()} rows{f' ({where})' if where else ''}"

    empty = ("whose expected values are all 0: a row with nothing to normalise, such as a softmax row whose "
             "every key is masked: exp(-inf - (-inf)) = NaN when the row's max is -inf (subtract 0 there "
             "instead), or 0/0 when its sum is 0 (divide by 1 there instead); such a row must come out as zeros"
             if softmax else
             "whose expected values are all 0: a row of zeros, whose sum of squares is 0: without eps, "
             "rsqrt(0) = inf and 0 * inf = NaN" if _applies(_ZERO_DIV, operator) else
             "whose expected values are all 0: 0/0 or 0 * inf where the row is all zeros")
    whole_why = ["a NaN spread through a reduction over the row (a load outside an input, which holds NaN between "
                 "and around its rows, reaching a sum or a max)"]
    if _applies(_ZERO_DIV, operator):
        whole_why.append("0/0 from a sum or a norm that came out 0 (a missing eps"
                         + ("; every exp of the row underflowed: was the max taken over the row's own visible "
                            "entries?)" if softmax else ")"))
    explained = {
        "empty": empty,
        "overflow": ("whose other elements came out 0: the row's sum overflowed to inf (inf/inf = NaN where an exp "
                     "overflowed, x/inf = 0 elsewhere); subtract the row's max before the exp"),
        "whole": "entirely NaN, whose expected values are not 0: " + ", or ".join(whole_why),
    }
    why = [f"{rows(kinds[kind])} {text}" for kind, text in explained.items() if kinds[kind].any()]
    if kinds["scattered"].any():
        why.append(causes if len(why) == 0 else f"{rows(kinds['scattered'])}: {causes}")
    if len(why) == 1 and kinds["scattered"].any():
        return f"computed as NaN ({why[0]})"
    return "computed as NaN, in " + "; and in ".join(why)


def _ranges(indices: list[int], most: int = 4) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (the first `most` runs, then '...')."""
    runs = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:most]]
    return ", ".join(text) + (", ..." if len(runs) > most else "")


def _hit(bad: torch.Tensor, d: int) -> torch.Tensor:
    """[bad.shape[d]] bool: which indices of dim d hold at least one wrong element."""
    return bad.movedim(d, 0).reshape(bad.shape[d], -1).any(1)


def _where_wrong(bad: torch.Tensor) -> str:
    """Where the wrong elements lie, for each dim along which they are confined to some of its indices: rows
    from 64 on point at a second tile, heads 4-7 at a head mapping, the last columns at a mask."""
    parts = []
    for d in range(bad.dim()):
        n = bad.shape[d]
        hit = _hit(bad, d)
        k = int(hit.sum())
        if n > 1 and 0 < k < n:
            parts.append(f"dim {d} at {_ranges(hit.nonzero().flatten().tolist())} (of {n})")
    return f" The wrong elements lie only in {'; '.join(parts)}." if parts else ""


def _misplaced(o: torch.Tensor, r: torch.Tensor, bad: torch.Tensor, atol: float, rtol: float,
               most_slices: int = 64) -> str:
    """Slices of the output (along a dim of at most `most_slices` indices) that hold another index's reference:
    the right values at the wrong place, e.g. a query head reading the wrong KV head, or rows swapped."""
    if o.numel() > 1 << 22:
        return ""
    for d in range(o.dim()):
        n = o.shape[d]
        if not 1 < n <= most_slices:
            continue
        wrong = _hit(bad, d).nonzero().flatten().tolist()
        found = {}
        for i in wrong:
            oi = o.select(d, i)
            for j in range(n):
                rj = r.select(d, j)
                if j != i and bool(((oi - rj).abs() <= atol + rtol * rj.abs()).all()):
                    found[i] = j
                    break
        if found and len(found) == len(wrong):
            more = ", ..." if len(found) > 6 else ""
            return (f" Along dim {d} the output's indices {', '.join(str(i) for i in list(found)[:6])}{more} hold "
                    f"the reference's {', '.join(str(j) for j in list(found.values())[:6])}{more}: right values at "
                    f"the wrong index (which head, row or block does each program read or write?).")
    return ""


def _common_factor(o: torch.Tensor, r: torch.Tensor, atol: float, rtol: float) -> float | None:
    """c when o = c * r everywhere (c != 1), within the tolerance: a scale left out or applied twice."""
    big = r.abs() > 10 * atol
    if int(big.sum()) < 2:  # one value is always some multiple of another: a factor says something from two on
        return None
    c = float((o[big] / r[big]).median())
    if not torch.isfinite(torch.tensor(c)) or abs(c - 1) < 10 * rtol or c == 0:
        return None
    scaled = c * r
    if bool(((o - scaled).abs() <= atol + rtol * scaled.abs()).all()):
        return c
    return None
