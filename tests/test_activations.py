"""SwiGLU: silu_mul against qwen_lab.reference.silu_mul, and swiglu_down against
linear(silu_mul(gate_up), down) (the fused decode kernel and the prefill path)."""

import pytest
import torch

from qwen_lab import checks, reference
from qwen_lab.config import QWEN35_0_8B as C
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels import activations, gemm


def _gate_up(M, I, g, rt, pad=0):
    """gate_up [M, 2I]; with pad > 0 a column slice of a wider tensor (row stride 2I + 2 pad)."""
    full = checks.randn(M, 2 * I + 2 * pad, g=g, dtype=rt.dtype, device=rt.device, scale=2.0)
    return full[:, pad:pad + 2 * I]


def _down(N, I, g, rt):
    return checks.randn(N, I, g=g, dtype=rt.dtype, device=rt.device, scale=I ** -0.5)


def _swiglu_ref(gate_up, down_weight):
    return reference.linear(reference.silu_mul(gate_up), down_weight)


# ---------------------------------------------------------------- CPU and GPU: small ragged shapes


@pytest.mark.parametrize("M,I,pad", [(1, 100, 0), (3, 300, 5), (17, 70, 0)])
def test_silu_mul_matches_reference(rt, M, I, pad):
    # I = 300 spans two column blocks under the interpreter (256), ragged in the second
    def make(g):
        return dict(gate_up=_gate_up(M, I, g, rt, pad), out=torch.empty(M, I, dtype=rt.dtype, device=rt.device))
    checks.check_kernel("silu_mul", activations.silu_mul, reference.silu_mul, [make], seed=I, quiet=True)


def test_silu_mul_allocates_and_writes_only_its_rows(rt, gen):
    gu = _gate_up(4, 50, gen, rt, pad=3)
    got = activations.silu_mul(gu)
    assert got.shape == (4, 50) and got.is_contiguous()
    checks.compare("silu_mul", got, reference.silu_mul(gu))
    out_big = checks.poison_(torch.empty(4, 60, dtype=rt.dtype, device=rt.device))
    activations.silu_mul(gu, out=out_big[:, 5:55])
    checks.compare("silu_mul into a strided out", out_big[:, 5:55], reference.silu_mul(gu))
    assert torch.isnan(out_big[:, :5]).all() and torch.isnan(out_big[:, 55:]).all()


@pytest.mark.parametrize("M,I,N", [(1, 100, 45), (3, 70, 33), (20, 90, 40)])
def test_swiglu_down_matches_linear_of_silu_mul(rt, M, I, N):
    def make(g):
        return dict(gate_up=_gate_up(M, I, g, rt, pad=2), down_weight=_down(N, I, g, rt),
                    out=torch.empty(M, N, dtype=rt.dtype, device=rt.device))
    checks.check_kernel("swiglu_down", activations.swiglu_down, _swiglu_ref, [make], seed=M + I, quiet=True)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_swiglu_prologue_with_split_k(rt, gen, deterministic):
    # the fused prologue in every slice of K: each split must read gate at k and up at I + k
    gu, w = _gate_up(2, 150, gen, rt, pad=1), _down(40, 150, gen, rt)
    got = gemm._gemv("swiglu_down", gu, w, 3, deterministic, None, swiglu=True)
    checks.compare("swiglu_down split 3", got, _swiglu_ref(gu, w))


def test_swiglu_down_is_one_launch_at_decode(rt, gen):
    gu, w = _gate_up(1, 64, gen, rt), _down(32, 64, gen, rt)
    with count_launches() as launches:
        activations.swiglu_down(gu, w)
    assert dict(launches) == {"gemv_splitk_kernel": 1}


def test_empty_rows(rt, gen):
    gu = _gate_up(0, 8, gen, rt)
    assert activations.silu_mul(gu).shape == (0, 8)


def test_bad_arguments_are_named(rt, gen):
    gu = _gate_up(2, 16, gen, rt)
    cases = [
        (lambda: activations.silu_mul(gu[:, :31]), "even number"),
        (lambda: activations.silu_mul(gu[0]), "2-D"),
        (lambda: activations.silu_mul(gu.t()), "contiguous"),
        (lambda: activations.silu_mul(gu.long()), "dtype"),
        (lambda: activations.silu_mul(gu, out=torch.empty(2, 15, dtype=rt.dtype, device=rt.device)), "out"),
        (lambda: activations.silu_mul([1.0, 2.0]), "torch.Tensor"),
        (lambda: activations.swiglu_down(gu, _down(8, 15, gen, rt)), "gate_up has 32 columns"),
        (lambda: activations.swiglu_down(gu[:, :31], _down(8, 16, gen, rt)), "even number"),
    ]
    for call, message in cases:
        with pytest.raises(KernelError, match=message):
            call()


# ---------------------------------------------------------------- GPU: bf16, the real shapes


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 7, 2048])
def test_gpu_silu_mul_real_shape(rt, gen, M):
    gu = _gate_up(M, C.intermediate_size, gen, rt)
    checks.compare(f"silu_mul M={M}", activations.silu_mul(gu), reference.silu_mul(gu))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 5, 2048])
def test_gpu_swiglu_down_real_shape(rt, gen, M):
    I, N = C.intermediate_size, C.hidden_size
    gu, w = _gate_up(M, I, gen, rt), _down(N, I, gen, rt)
    checks.compare(f"swiglu_down M={M}", activations.swiglu_down(gu, w), _swiglu_ref(gu, w))


@pytest.mark.gpu
def test_gpu_swiglu_down_deterministic_split(rt, gen):
    I, N = C.intermediate_size, C.hidden_size
    gu, w = _gate_up(1, I, gen, rt), _down(N, I, gen, rt)
    first = gemm._gemv("swiglu_down", gu, w, 8, True, None, swiglu=True)
    for _ in range(10):
        assert torch.equal(gemm._gemv("swiglu_down", gu, w, 8, True, None, swiglu=True), first)
    checks.compare("swiglu_down split 8", first, _swiglu_ref(gu, w))
