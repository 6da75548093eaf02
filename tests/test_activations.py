"""SwiGLU: silu_mul against qwen_lab.reference.silu_mul, swiglu_down against
linear(silu_mul(gate_up), down) (the fused decode kernel and the prefill path), and linear_silu_mul against
reference.linear_silu_mul (the gate/up GEMM with SwiGLU in its epilogue, and the short-input path)."""

import pytest
import torch

from qwen_lab import reference
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B as C
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels import activations, gemm
from qwen_lab.kernels.gemm import gemv, tiled, tuning


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
    got = gemv._gemv("swiglu_down", gu, w, 3, deterministic, None, swiglu=True)
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


def _x(M, K, g, rt, pad=0):
    """x [M, K]; with pad > 0 a column slice of a wider tensor (row stride K + 2 pad)."""
    return checks.randn(M, K + 2 * pad, g=g, dtype=rt.dtype, device=rt.device)[:, pad:pad + K]


def _gate_up_weight(I, K, g, rt):
    # [W_gate; W_up] scaled like a trained projection: gate and up values O(1) for every K
    return checks.randn(2 * I, K, g=g, dtype=rt.dtype, device=rt.device, scale=K ** -0.5)


# Under the interpreter the tile is 16 x 32 x 32: K = 70 and 100 end in a partial K step, I = 45 and 70 in a
# partial column block, M = 17 and 40 in a partial row block; M = 5 takes the short-input path.
@pytest.mark.parametrize("M,K,I", [(17, 70, 45), (40, 100, 70), (5, 70, 45)])
def test_linear_silu_mul_matches_reference(rt, M, K, I):
    def make(g, with_out):
        d = dict(x=_x(M, K, g, rt), weight=_gate_up_weight(I, K, g, rt))
        if with_out:
            d["out"] = torch.empty(M, I, dtype=rt.dtype, device=rt.device)
        return d
    checks.check_kernel("linear_silu_mul", activations.linear_silu_mul, reference.linear_silu_mul,
                        [lambda g: make(g, True), lambda g: make(g, False)], seed=M + K + I, quiet=True)


@pytest.mark.parametrize("M,launches", [(17, {"matmul_kernel": 1}),
                                        (16, {"gemv_splitk_kernel": 1, "silu_mul_kernel": 1})])
def test_linear_silu_mul_launches(rt, gen, M, launches):
    # above GEMV_MAX_M one launch: the GEMM's epilogue does SwiGLU; at or below it the GEMV, then silu_mul
    assert gemm.GEMV_MAX_M == 16
    x, w = _x(M, 40, gen, rt), _gate_up_weight(20, 40, gen, rt)
    with count_launches() as counted:
        got = activations.linear_silu_mul(x, w)
    assert dict(counted) == launches
    checks.compare(f"linear_silu_mul M={M}", got, reference.linear_silu_mul(x, w))


def test_linear_silu_mul_strided_rows_and_out(rt, gen):
    # x and weight with rows farther apart than their width, out a column slice of a wider buffer: only
    # its own columns are written
    x = _x(20, 50, gen, rt, pad=3)
    w = checks.randn(60, 54, g=gen, dtype=rt.dtype, device=rt.device, scale=50 ** -0.5)[:, 1:51]
    out_big = checks.poison_(torch.empty(20, 40, dtype=rt.dtype, device=rt.device))
    got = activations.linear_silu_mul(x, w, out=out_big[:, 4:34])
    assert got.data_ptr() == out_big[:, 4:34].data_ptr()
    checks.compare("linear_silu_mul into a strided out", out_big[:, 4:34], reference.linear_silu_mul(x, w))
    assert torch.isnan(out_big[:, :4]).all() and torch.isnan(out_big[:, 34:]).all()


def test_linear_silu_mul_epilogue_rounds_once(rt, gen):
    # the fused kernel matches silu(g) * u computed from the unrounded fp32 products (tighter than the
    # reference, which rounds gate_up to x's dtype first, as two kernels would)
    x, w = _x(33, 64, gen, rt), _gate_up_weight(40, 64, gen, rt)
    gu = x.double() @ w.double().t()
    g, u = gu.chunk(2, dim=-1)
    exact = (g * torch.sigmoid(g) * u).to(rt.dtype)
    checks.compare("linear_silu_mul against the unrounded product", activations.linear_silu_mul(x, w), exact)


def test_linear_silu_mul_empty(rt, gen):
    w = _gate_up_weight(8, 16, gen, rt)
    assert activations.linear_silu_mul(_x(0, 16, gen, rt), w).shape == (0, 8)
    assert activations.linear_silu_mul(_x(20, 16, gen, rt), w[:0]).shape == (20, 0)


def test_linear_silu_mul_bad_arguments_are_named(rt, gen):
    x, w = _x(20, 16, gen, rt), _gate_up_weight(8, 16, gen, rt)
    out = lambda *s, dtype=rt.dtype: torch.empty(*s, dtype=dtype, device=rt.device)  # noqa: E731
    for M in (20, 3):  # both paths validate the same way
        xm = x[:M]
        cases = [
            (lambda: activations.linear_silu_mul(xm, w[:15]), "weight has 15 rows; expected an even number"),
            (lambda: activations.linear_silu_mul(xm, w[:, :12]), "x has 16 columns"),
            (lambda: activations.linear_silu_mul(xm.t(), w), "x must be contiguous in its last dim"),
            (lambda: activations.linear_silu_mul(xm, w.t()), "weight must be contiguous in its last dim"),
            (lambda: activations.linear_silu_mul(xm[0], w), "x must be 2-D"),
            (lambda: activations.linear_silu_mul(xm, w.long()), "weight has dtype"),
            (lambda: activations.linear_silu_mul([1.0], w), "x must be a torch.Tensor"),
            (lambda: activations.linear_silu_mul(xm, w, out=out(M, 16)), r"out must be a tensor of shape \(%d, 8\)" % M),
            (lambda: activations.linear_silu_mul(xm, w, out=out(M, 8, dtype=torch.float16)), "out must be"),
        ]
        if rt.dtype != torch.float32:
            cases.append((lambda: activations.linear_silu_mul(xm, w.float()), "weight has dtype"))
        else:
            cases.append((lambda: activations.linear_silu_mul(xm, w.double()), "weight has dtype"))
        for call, message in cases:
            with pytest.raises(KernelError, match=message):
                call()
        with pytest.raises(KernelError, match="^linear_silu_mul: "):
            activations.linear_silu_mul(xm, w[:15])


def test_swiglu_gpu_tiles_fit_a_hopper_sm(monkeypatch):
    """The SWIGLU tile shapes the GPU autotuner may pick: two fp32 accumulators within 128 registers a thread,
    the pipelined x, gate and up tiles within the 227 KB of shared memory (tests/sm90_compile.py compiles them)."""
    monkeypatch.setattr(tuning, "interpreter_active", lambda: False)
    plain, swiglu = tuning._matmul_configs(False), tuning._matmul_configs(True)
    assert swiglu and plain
    for c in swiglu:
        bm, bn, bk = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
        assert 2 * bm * bn // (32 * c.num_warps) <= 128, c
        assert (bm + 2 * bn) * bk * 2 * c.num_stages <= 232448, c


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
    first = gemv._gemv("swiglu_down", gu, w, 8, True, None, swiglu=True)
    for _ in range(10):
        assert torch.equal(gemv._gemv("swiglu_down", gu, w, 8, True, None, swiglu=True), first)
    checks.compare("swiglu_down split 8", first, _swiglu_ref(gu, w))


def _gpu_gate_up_case(M, gen, rt):
    K, I = C.hidden_size, C.intermediate_size  # 1024, 3584: weight [7168, 1024]
    return _x(M, K, gen, rt), _gate_up_weight(I, K, gen, rt)


@pytest.mark.gpu
@pytest.mark.parametrize("M", [17, 2048])
def test_gpu_linear_silu_mul_real_shape(rt, gen, M):
    x, w = _gpu_gate_up_case(M, gen, rt)
    with count_launches() as counted:
        got = activations.linear_silu_mul(x, w)
    assert dict(counted) == {"matmul_kernel": 1}
    checks.compare(f"linear_silu_mul M={M}", got, reference.linear_silu_mul(x, w))
    # the autotuner chose among the SWIGLU tile shapes only
    best = gemm.matmul_kernel.best_config
    assert tuning._config_id(best) in {tuning._config_id(c) for c in tuning._matmul_configs(True)}, best


@pytest.mark.gpu
@pytest.mark.parametrize("M", [17, 2048])
def test_gpu_every_swiglu_config_computes_the_same(rt, gen, M):
    """Each SWIGLU configuration the autotuner may pick (the TMA ones on sm_90+), launched past the autotuner on the
    model's grid (a persistent configuration gets one program per SM, which then walks several tiles) and with
    programmatic dependent launch where the model uses it."""
    x, w = _gpu_gate_up_case(M, gen, rt)
    I = w.shape[0] // 2
    ref = reference.linear_silu_mul(x, w)
    configs = tuning._matmul_configs(True)
    assert len(configs) > 1
    if not tiled._tma_ok(x, w):  # the TMA candidates only on sm_90+ with aligned operands
        configs = [c for c in configs if not c.kwargs.get("TMA")]
    for c in configs:
        out = checks.poison_(torch.empty(M, I, dtype=rt.dtype, device=rt.device))
        gemm.matmul_with_config(x, w, out, c, swiglu=True)
        checks.compare(f"linear_silu_mul M={M} {c}", out, ref)


# ---------------------------------------------------------------- the teaching kernel (notebook 05)


def test_the_teaching_kernel_is_the_notebooks_solution():
    """activations/teach.py holds exercise 05.1 as solutions/05_swiglu_mlp.ipynb writes it."""
    from notebook_source import assert_teaches

    assert_teaches("05_swiglu_mlp.ipynb", "qwen_lab/kernels/activations/teach.py")


@pytest.mark.parametrize("M, I", [(1, 24), (5, 200), (3, 300)])
def test_the_teaching_kernel_matches_the_reference(rt, gen, M, I):
    """my_silu_mul as library code: ragged widths (I not a power of two; 300 spans several blocks under the
    interpreter), a strided gate_up (a view of wider rows), with and without `out`."""
    from qwen_lab.kernels.activations import teach

    wide = checks.randn(M, 2 * I + 6, g=gen, dtype=rt.dtype, device=rt.device, scale=3.0)
    gu = wide[:, : 2 * I]
    checks.compare("my_silu_mul", teach.my_silu_mul(gu), reference.silu_mul(gu))
    out = torch.full((M, I), float("nan"), dtype=rt.dtype, device=rt.device)
    assert teach.my_silu_mul(gu, out=out) is out
    checks.compare("my_silu_mul(out=)", out, reference.silu_mul(gu))
