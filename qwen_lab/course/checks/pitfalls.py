"""The known pitfalls of each exercise, named before the generic counts when the learner's result matches one.

Each exercise that `check_kernel` knows by its check's name (the first argument the notebook passes) has:
- its operator's kind, which picks the causes a failure may name (softmax causes for softmax rows only);
- the pitfalls its notebook warns about, each a function computing what a kernel with that mistake returns, from
  the reference's own keyword arguments (None where the mistake cannot show in that case);
- for the exercises whose notebooks teach the fp32 upcast, a float16 case (added after the notebook's own), where
  a row's sum of squares overflows in float16 (max 65504) while its fp32 sum does not. The interpreter computes
  float16 arithmetic with NumPy float16, as a GPU does in half precision, so a missing upcast shows on a CPU too.

A pitfall matches when every output (and every in-place tensor) is within the check's tolerance of what the
pitfall computes, NaN where it has NaN, while the reference's result is not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .comparison import randn


@dataclass(frozen=True)
class Pitfall:
    says: str                      # one plain sentence: the mistake, then its fix
    computes: Callable[..., object]  # the reference's keyword arguments -> what the kernel with it returns, or None


@dataclass(frozen=True)
class Exercise:
    number: str                    # "02.1"
    operator: str                  # "norm", "softmax", "elementwise", "gather", "matmul", "recurrence"
    pitfalls: tuple = ()
    half_case: Callable | None = None   # (a case of the notebook, a generator) -> the float16 case


# ---------------------------------------------------------------- the norms (02.1, 02.2, 02.3)

def _rms(xf: torch.Tensor, eps: float, over: int | None = None) -> torch.Tensor:
    """xf * rsqrt(sum(xf^2) / over + eps), fp32 (over: the row length by default)."""
    return xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / (over or xf.shape[-1]) + eps)


def _eps_after(xf: torch.Tensor, eps: float) -> torch.Tensor:
    return xf * (torch.rsqrt(xf.pow(2).mean(-1, keepdim=True)) + eps)


def _half_rms(x: torch.Tensor, eps: float) -> np.ndarray:
    """x / rms(x) computed in NumPy float16 throughout, as a kernel that never converts to fp32 does: x * x
    overflows to inf above 256, the sum with it, and 1 / sqrt(inf) = 0."""
    xs = x.detach().cpu().numpy().astype(np.float16)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ss = (xs * xs).sum(-1, dtype=np.float16, keepdims=True)
        inv = np.float16(1) / np.sqrt(ss / np.float16(xs.shape[-1]) + np.float16(eps))
        return xs * inv


def _from_half(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(device=like.device, dtype=like.dtype)


def _norm(formula):
    """A rms_norm pitfall from formula(xf, w (fp32), eps) -> y (fp32), cast as the reference casts."""
    return lambda x, weight, eps: formula(x.float(), weight.float(), eps).to(x.dtype)


def _no_upcast_norm(x, weight, eps):
    if x.dtype != torch.float16:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        # (the weight may be bf16, which NumPy lacks: through float32, then float16 as the kernel reads it)
        w16 = weight.detach().float().cpu().numpy().astype(np.float16)
        return _from_half(_half_rms(x, eps) * (np.float16(1) + w16), x)


def _half_case(large: tuple):
    """(a case of the notebook, a generator) -> the same arguments as 5 rows in float16: the rows of the arguments
    named in `large` drawn up to about 1000 (their squares overflow float16: |v| > 256), the other rows standard
    normal, output buffers empty; weights (1-D) and scalars as they were."""
    def make(case: dict, g: torch.Generator) -> dict:
        x = case["x"]
        shape = (5, x.shape[-1])
        half = {}
        for k, v in case.items():
            if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.dim() < 2:
                half[k] = v
            elif k.startswith("out") or k.endswith("_out"):
                half[k] = torch.empty(shape, dtype=torch.float16, device=v.device)
            else:
                half[k] = randn(*shape, g=g, dtype=torch.float16, device=v.device, scale=300.0 if k in large else 1.0)
        return half
    return make


_EPS_DROPPED = "eps is missing: add it to the mean square inside the root, rsqrt(sum(x * x) / D + eps)"
_EPS_AFTER = ("eps is added after the rsqrt: it belongs inside the root, rsqrt(sum(x * x) / D + eps), not "
              "rsqrt(...) + eps")
_NO_UPCAST = ("this is what float16 arithmetic gives: x * x overflows float16 (max 65504) and the row comes out 0; "
              "the fp32 upcast is missing: convert each load with .to(tl.float32) and cast once at the store")

_RMS_NORM = (
    Pitfall("the result is x / rms(x) * w, the usual RMSNorm: Qwen3.5's norm multiplies by (1 + w) (the `+1` "
            "pitfall): use `* (1.0 + w)`",
            _norm(lambda xf, w, eps: _rms(xf, eps) * w)),
    Pitfall(_EPS_DROPPED, _norm(lambda xf, w, eps: _rms(xf, 0.0) * (1.0 + w))),
    Pitfall(_EPS_AFTER, _norm(lambda xf, w, eps: _eps_after(xf, eps) * (1.0 + w))),
    Pitfall("the mean square is divided by BLOCK_D, the tile's width: divide by D, the real length of the row "
            "(the masked lanes add 0 to the sum but do not count)",
            lambda x, weight, eps: None if x.shape[-1] & (x.shape[-1] - 1) == 0 else
            (_rms(x.float(), eps, over=1 << (x.shape[-1] - 1).bit_length()) * (1.0 + weight.float())).to(x.dtype)),
    Pitfall(_NO_UPCAST, _no_upcast_norm),
)


def _add_norm(formula):
    """An add_rms_norm pitfall: (formula(s, w, eps), s) with s = x + residual rounded to the stream's dtype."""
    def computes(x, residual, weight, eps):
        s = (x.float() + residual.float()).to(x.dtype)
        y = formula(s.float(), weight.float(), eps, x.float() + residual.float())
        return None if y is None else (y.to(x.dtype), s)
    return computes


def _no_upcast_add_norm(x, residual, weight, eps):
    if x.dtype != torch.float16:
        return None
    s = (x.float() + residual.float()).to(x.dtype)
    return _no_upcast_norm(s, weight, eps), s


_ADD_RMS_NORM = (
    Pitfall("the normed output is s / rms(s) * w: Qwen3.5's norm multiplies by (1 + w): use `* (1.0 + w)`",
            _add_norm(lambda s, w, eps, exact: _rms(s, eps) * w)),
    Pitfall(_EPS_DROPPED.replace("x * x", "s * s"), _add_norm(lambda s, w, eps, exact: _rms(s, 0.0) * (1.0 + w))),
    Pitfall(_EPS_AFTER.replace("x * x", "s * s"), _add_norm(lambda s, w, eps, exact: _eps_after(s, eps) * (1.0 + w))),
    Pitfall("the norm is taken of the sum before it was rounded: round s to the stream's dtype "
            "(`.to(rout_ptr.dtype.element_ty)`), then normalise that rounded s, as the next layer will read it",
            _add_norm(lambda s, w, eps, exact: None if torch.equal(s, exact) else _rms(exact, eps) * (1.0 + w))),
    Pitfall("this is what float16 arithmetic gives: s * s overflows float16 (max 65504) and the row comes out 0; "
            "the fp32 upcast is missing: load in fp32, and convert the rounded s back with s.to(tl.float32) before "
            "the norm", _no_upcast_add_norm),
)


def _gated(formula):
    return lambda x, z, weight, eps: formula(x.float(), z.float(), weight.float(), eps).to(x.dtype)


def _no_upcast_gated(x, z, weight, eps):
    if x.dtype != torch.float16:
        return None
    y = torch.from_numpy(_half_rms(x, eps).astype(np.float32)).to(x.device)
    return (y * weight.float() * F.silu(z.float())).to(x.dtype)


_GATED_RMS_NORM = (
    Pitfall("the result is multiplied by (1 + w): the gated norm takes plain w (no +1, unlike 02.1): use `* w`",
            _gated(lambda xf, zf, w, eps: _rms(xf, eps) * (1.0 + w) * F.silu(zf))),
    Pitfall("the gate is sigmoid(z): it is silu(z) = z * sigmoid(z)",
            _gated(lambda xf, zf, w, eps: _rms(xf, eps) * w * torch.sigmoid(zf))),
    Pitfall(_EPS_DROPPED, _gated(lambda xf, zf, w, eps: _rms(xf, 0.0) * w * F.silu(zf))),
    Pitfall(_EPS_AFTER, _gated(lambda xf, zf, w, eps: _eps_after(xf, eps) * w * F.silu(zf))),
    Pitfall(_NO_UPCAST, _no_upcast_gated),
)


# ---------------------------------------------------------------- 01.2, 05.1, 06.1

def _rows_h_apart(ids, weight):
    """out[t] = the H elements at ids[t] * H from the table's start: its rows read as if contiguous."""
    V, H = weight.shape
    if weight.stride(0) == H:
        return None
    flat = torch.as_strided(weight, (V, H), (H, 1), weight.storage_offset())
    return flat[ids.long()].clone()


def _swapped_silu(gate_up):
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(up) * gate).to(gate_up.dtype)


def _rope_interleaved(x, positions, rotary_dim, theta):
    """Pairs (2i, 2i + 1) rotated instead of (i, i + rotary_dim / 2)."""
    from ... import reference

    cos, sin = reference.rope_cos_sin(positions, rotary_dim, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    xf = x.float().clone()
    even, odd = xf[..., 0:rotary_dim:2].clone(), xf[..., 1:rotary_dim:2].clone()
    xf[..., 0:rotary_dim:2] = even * cos - odd * sin
    xf[..., 1:rotary_dim:2] = odd * cos + even * sin
    return xf.to(x.dtype)


def _rope_signs(first: float, second: float):
    """Rotate-half RoPE with out1 = x1 cos + first * x2 sin, out2 = x2 cos + second * x1 sin (right: -1, +1)."""
    def computes(x, positions, rotary_dim, theta):
        from ... import reference

        cos, sin = reference.rope_cos_sin(positions, rotary_dim, theta)
        cos, sin = cos[:, None, :], sin[:, None, :]
        xf, half = x.float(), rotary_dim // 2
        x1, x2, rest = xf[..., :half], xf[..., half:rotary_dim], xf[..., rotary_dim:]
        return torch.cat([x1 * cos + first * x2 * sin, x2 * cos + second * x1 * sin, rest], dim=-1).to(x.dtype)
    return computes


def _rope_rest_unwritten(x, positions, rotary_dim, theta):
    from ... import reference

    if rotary_dim == x.shape[-1]:
        return None
    out = reference.rope(x, positions, rotary_dim, theta).clone()
    out[..., rotary_dim:] = float("nan")
    return out


# ---------------------------------------------------------------- 07.1, 07.2

def _scores_unscaled(q, k, scale):
    kf = k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return None if scale == 1 else torch.einsum("thd,lhd->htl", q.float(), kf)


def _softmax_unmasked(scores, positions):
    return torch.softmax(scores.float(), dim=-1)


# ---------------------------------------------------------------- 08.2, 08.3

def _gates_minus_bias(a, b, A_log, dt_bias):
    from ... import reference

    return reference.deltanet_gates(a, b, A_log, -dt_bias)


def _gates_positive(a, b, A_log, dt_bias):
    from ... import reference

    g, beta = reference.deltanet_gates(a, b, A_log, dt_bias)
    return -g, beta


def _gates_softplus_overflow(a, b, A_log, dt_bias):
    from ... import reference

    xf = a.float() + dt_bias.float()
    if not bool((xf > 88).any()):
        return None
    g = -A_log.float().exp() * torch.log1p(torch.exp(xf))
    return g, reference.deltanet_gates(a, b, A_log, dt_bias)[1]


def _recurrent_no_decay(q, k, v, g, beta, state, scale=None):
    from ... import reference

    return reference.delta_rule_recurrent(q, k, v, torch.zeros_like(g), beta, state, scale)


EXERCISES = {
    "embedding": Exercise("01.2", "gather", (
        Pitfall("the table's rows are read H apart: they lie stride_w apart (a row of a wider table); start row "
                "id at weight_ptr + id * stride_w", _rows_h_apart),)),
    "rms_norm": Exercise("02.1", "norm", _RMS_NORM, _half_case(("x",))),
    "add_rms_norm": Exercise("02.2", "norm", _ADD_RMS_NORM, _half_case(("x", "residual"))),
    "gated_rms_norm": Exercise("02.3", "norm", _GATED_RMS_NORM, _half_case(("x",))),
    "matmul": Exercise("03.1", "matmul"),
    "split-K linear": Exercise("04.1", "matmul"),
    "deterministic split-K linear": Exercise("04.2", "matmul"),
    "silu_mul": Exercise("05.1", "elementwise", (
        Pitfall("gate and up are swapped: the result is silu(up) * gate; gate is the first I columns of the row, "
                "up the next I", _swapped_silu),)),
    "rope": Exercise("06.1", "elementwise", (
        Pitfall("the first half adds x_partner * sin: it subtracts it (x1 cos - x2 sin); only the second half "
                "adds it (x2 cos + x1 sin)", _rope_signs(1.0, 1.0)),
        Pitfall("the rotation runs backwards (the sin terms' signs swapped): the first half subtracts "
                "x_partner * sin, the second half adds it", _rope_signs(1.0, -1.0)),
        Pitfall("the pairs are interleaved (2i, 2i + 1): Qwen3.5 rotates half, pairing i with i + rotary_dim / 2",
                _rope_interleaved),
        Pitfall("the dims past rotary_dim were never written: they pass through unchanged, so copy them",
                _rope_rest_unwritten))),
    "scores": Exercise("07.1", "matmul", (
        Pitfall("the scale is missing: multiply q k^T by scale (1 / sqrt(D))", _scores_unscaled),)),
    "masked softmax": Exercise("07.2", "softmax", (
        Pitfall("no key is masked: query t sees key j only when j <= positions[t]; mask the others to -inf "
                "before the max", _softmax_unmasked),)),
    "weighted sum": Exercise("07.3", "matmul"),
    "three-kernel attention": Exercise("07", "softmax"),
    "causal_conv1d": Exercise("08.1", "elementwise"),
    "deltanet_gates": Exercise("08.2", "elementwise", (
        Pitfall("dt_bias is subtracted: softplus takes a + dt_bias", _gates_minus_bias),
        Pitfall("g has the wrong sign: g = -exp(A_log) * softplus(a + dt_bias) is <= 0 (a decay exp(g) <= 1)",
                _gates_positive),
        Pitfall("softplus overflows: log(1 + exp(x)) is inf in fp32 above x = 88; use softplus(x) = x above 20",
                _gates_softplus_overflow))),
    "delta_rule_recurrent": Exercise("08.3", "recurrence", (
        Pitfall("the state never forgets: multiply S by exp(g) before each token's prediction", _recurrent_no_decay),)),
    "attention_block": Exercise("10.1", "softmax"),
    "sample_on_device": Exercise("11.1", "softmax"),
}


def exercise_of(name: str) -> Exercise | None:
    """The exercise a check's name belongs to (None: a check the course does not know, such as a test's)."""
    return EXERCISES.get(name)


def _same(got, want, atol: float, rtol: float) -> bool:
    if not isinstance(got, torch.Tensor) or not isinstance(want, torch.Tensor):
        return False
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return False
    if not got.is_floating_point():
        return bool(torch.equal(got.cpu(), want.cpu()))
    o, w = got.detach().cpu().double(), want.detach().cpu().double()
    return bool(torch.isclose(o, w, atol=atol, rtol=rtol, equal_nan=True).all())


def matched_pitfalls(exercise: Exercise | None, inputs: Callable[[], dict], got: list, expected: list,
                     inplace, atol: float | None, rtol: float | None) -> list[str]:
    """The sentences of the exercise's pitfalls whose result the learner's matches (got: the in-place tensors,
    then the outputs; expected: the reference's, the same way) while the reference's does not. `inputs()`: a fresh
    copy of the case's arguments (strides kept, outputs left out) for each pitfall to run on."""
    from .comparison import tolerance

    found = []
    for pitfall in exercise.pitfalls if exercise else ():
        args = inputs()
        try:
            result = pitfall.computes(**args)
        except Exception:   # a pitfall that does not fit this case's arguments says nothing
            continue
        if result is None:
            continue
        want = [args[k] for k in inplace] + list(result if isinstance(result, (tuple, list)) else (result,))
        if len(want) != len(got):
            continue

        def close(a, b):
            a_tol, r_tol = tolerance(b.dtype) if isinstance(b, torch.Tensor) else (0.0, 0.0)
            return _same(a, b, a_tol if atol is None else atol, r_tol if rtol is None else rtol)

        if all(close(o, w) for o, w in zip(got, want)) and not all(close(e, w) for e, w in zip(expected, want)):
            found.append(pitfall.says)
    return found
