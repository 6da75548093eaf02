"""The GEMM family against qwen_lab.reference.linear: the tiled GEMM, the GEMV / split-K path in both
reduction modes, the dispatching `linear`, the SPLIT_K heuristic, and the errors."""

import pytest
import torch

from qwen_lab import checks, reference
from qwen_lab.config import QWEN35_0_8B as C
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels import gemm


def _x(M, K, g, rt):
    return checks.randn(M, K, g=g, dtype=rt.dtype, device=rt.device)


def _w(N, K, g, rt):
    # scaled like a trained projection so that y stays O(1) and tolerances mean the same for every K
    return checks.randn(N, K, g=g, dtype=rt.dtype, device=rt.device, scale=K ** -0.5)


def _case(M, K, N, rt, with_out=True):
    def make(g):
        d = dict(x=_x(M, K, g, rt), weight=_w(N, K, g, rt))
        if with_out:
            d["out"] = torch.empty(M, N, dtype=rt.dtype, device=rt.device)
        return d
    return make


# ---------------------------------------------------------------- CPU and GPU: small ragged shapes

# K and N are not multiples of any block size (interpreter: BLOCK_K 32/64, BLOCK_N 32)
RAGGED = [(1, 100, 50), (3, 100, 50), (17, 70, 45), (1, 200, 97)]


@pytest.mark.parametrize("M,K,N", RAGGED)
def test_linear_matches_reference(rt, M, K, N):
    checks.check_kernel("linear", gemm.linear, reference.linear, [_case(M, K, N, rt), _case(M, K, N, rt, False)],
                        seed=M * 1000 + K, quiet=True)


@pytest.mark.parametrize("M,K,N", [(1, 70, 45), (17, 70, 45), (40, 100, 75)])
def test_matmul_matches_reference(rt, M, K, N):
    # (40, 100, 75): several blocks in M and N, so the grouped program order and the wrapped rows run
    checks.check_kernel("matmul", gemm.matmul, reference.linear, [_case(M, K, N, rt)], seed=K + N, quiet=True)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("M,split_k", [(1, 2), (1, 3), (3, 4), (17, 2)])
def test_splitk_matches_reference(rt, deterministic, M, split_k):
    K, N = 200, 50  # K / split_k is not a multiple of the block: every slice ends ragged
    fn = lambda x, weight, out: gemm.linear_splitk(x, weight, split_k=split_k, deterministic=deterministic, out=out)
    checks.check_kernel("linear_splitk", fn, reference.linear, [_case(M, K, N, rt)], seed=split_k, quiet=True)


def test_splitk_is_one_launch_in_both_modes(rt, gen):
    x, w = _x(1, 150, gen, rt), _w(40, 150, gen, rt)
    for deterministic in (False, True):
        with count_launches() as launches:
            gemm.linear_splitk(x, w, split_k=3, deterministic=deterministic)
        assert dict(launches) == {"gemv_splitk_kernel": 1}


def test_deterministic_mode_is_bitwise_repeatable(rt, gen):
    x, w = _x(3, 300, gen, rt), _w(60, 300, gen, rt)
    first = gemm.linear_splitk(x, w, split_k=5, deterministic=True)
    second = gemm.linear_splitk(x, w, split_k=5, deterministic=True)
    assert torch.equal(first, second)


def test_atomic_and_deterministic_agree(rt, gen):
    x, w = _x(2, 300, gen, rt), _w(60, 300, gen, rt)
    atomic = gemm.linear_splitk(x, w, split_k=4, deterministic=False)
    fixed = gemm.linear_splitk(x, w, split_k=4, deterministic=True)
    checks.compare("atomic vs deterministic", atomic, fixed)


def test_environment_variable_selects_the_mode(monkeypatch, rt, gen):
    for value, expected in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", value)
        assert gemm.deterministic_mode() is expected
    monkeypatch.delenv("QWEN_LAB_DETERMINISTIC")
    assert gemm.deterministic_mode() is False
    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "1")
    x, w = _x(1, 200, gen, rt), _w(30, 200, gen, rt)
    assert torch.equal(gemm.linear_splitk(x, w, split_k=4), gemm.linear_splitk(x, w, split_k=4, deterministic=True))


def test_workspace_is_left_zeroed_for_the_next_call(rt, gen):
    # the atomic mode relies on an all-zero fp32 workspace and zero counters at every launch
    x, w = _x(3, 160, gen, rt), _w(40, 160, gen, rt)
    for _ in range(2):  # the second call would be wrong if the first left sums or counts behind
        y = gemm.linear_splitk(x, w, split_k=3, deterministic=False)
        checks.compare("linear_splitk", y, reference.linear(x, w))
    for kind in ("sums", "counts"):
        buf = gemm._workspaces[(kind, x.device)]
        assert int(torch.count_nonzero(buf)) == 0, f"workspace '{kind}' not reset"


def test_strided_input_rows_and_out_buffer(rt, gen):
    K, N = 90, 33
    big = _x(4, 3 * K, gen, rt)
    x = big[:, K:2 * K]  # a column slice: row stride 3K, last dim contiguous
    w_big = _w(N, 2 * K, gen, rt)
    w = w_big[:, :K]     # weight rows farther apart than K
    for fn in (gemm.linear, gemm.matmul, lambda a, b, out: gemm.linear_splitk(a, b, split_k=2, out=out)):
        out_big = checks.poison_(torch.empty(4, N + 7, dtype=rt.dtype, device=rt.device))
        out = out_big[:, 3:3 + N]
        got = fn(x, w, out=out)
        assert got.data_ptr() == out.data_ptr()
        checks.compare("strided linear", got, reference.linear(x, w))
        assert torch.isnan(out_big[:, :3]).all() and torch.isnan(out_big[:, 3 + N:]).all(), "wrote outside out"


def test_linear_dispatches_on_m(rt, gen):
    w = _w(40, 64, gen, rt)
    with count_launches() as small:
        gemm.linear(_x(gemm.GEMV_MAX_M, 64, gen, rt), w)
    with count_launches() as large:
        gemm.linear(_x(gemm.GEMV_MAX_M + 1, 64, gen, rt), w)
    assert dict(small) == {"gemv_splitk_kernel": 1}
    assert dict(large) == {"matmul_kernel": 1}


def test_empty_rows(rt, gen):
    w = _w(8, 16, gen, rt)
    for fn in (gemm.linear, gemm.matmul, gemm.linear_splitk):
        assert fn(_x(0, 16, gen, rt), w).shape == (0, 8)


def test_bad_arguments_are_named(rt, gen):
    x, w = _x(2, 32, gen, rt), _w(8, 32, gen, rt)
    cases = [
        (lambda: gemm.linear(x[0], w), "x .*2-D"),
        (lambda: gemm.linear(x, w[0]), "weight .*2-D"),
        (lambda: gemm.linear(x, _w(8, 31, gen, rt)), "x has 32 columns"),
        (lambda: gemm.matmul(x, w.to(torch.float16 if rt.dtype != torch.float16 else torch.float32)), "dtype"),
        (lambda: gemm.linear(x.long(), w), "x has dtype"),
        (lambda: gemm.matmul(x, _w(32, 8, gen, rt).t()), "weight must be contiguous"),
        (lambda: gemm.linear(_x(32, 2, gen, rt).t(), w), "x must be contiguous"),
        (lambda: gemm.linear(x, w, out=torch.empty(2, 9, dtype=rt.dtype, device=rt.device)), "out"),
        (lambda: gemm.matmul(x, w, out=torch.empty(2, 8, dtype=torch.int32, device=rt.device)), "out"),
        (lambda: gemm.linear_splitk(x, w, split_k=0), "split_k"),
        (lambda: gemm.linear_splitk(x, w, split_k=2.0), "split_k"),
        (lambda: gemm.linear_splitk(x, w, split_k=3), "split_k is 3, too many for K=32"),
        (lambda: gemm.linear_splitk(x, w, split_k=gemm.MAX_SPLIT_K + 1), "split_k"),
        (lambda: gemm.linear("x", w), "x must be a torch.Tensor"),
    ]
    for call, message in cases:
        with pytest.raises(KernelError, match=message):
            call()


def test_split_heuristic_on_an_h200():
    sms = 132
    H, I, V = C.hidden_size, C.intermediate_size, C.vocab_size
    # N alone fills the GPU: no split, no reduction
    for N in (V, C.linear_in_proj_dim, C.attn_in_proj_dim, 2 * I):
        assert gemm.choose_split_k(1, N, H, sms) == 1, N
    # the narrow projections (N = 1024) need more programs: split K
    down = gemm.choose_split_k(1, H, I, sms)
    out_proj = gemm.choose_split_k(1, H, C.linear_value_dim, sms)
    assert 2 <= down <= 16 and 2 <= out_proj <= 16
    assert I // down >= 256 and C.linear_value_dim // out_proj >= 256
    # a short K is never split below 256 columns per slice; a bigger GPU never asks for fewer splits
    assert gemm.choose_split_k(1, 64, 300, sms) == 1
    for K in (512, 2048, 8192):
        assert gemm.choose_split_k(1, 1024, K, 264) >= gemm.choose_split_k(1, 1024, K, 132)


# ---------------------------------------------------------------- GPU: bf16, the real shapes

# (K, N) of every decode GEMV of Qwen3.5-0.8B
REAL = {
    "deltanet_in_proj": (C.hidden_size, C.linear_in_proj_dim),     # 1024 -> 8224
    "attention_qkv": (C.hidden_size, C.attn_in_proj_dim),          # 1024 -> 5120
    "mlp_gate_up": (C.hidden_size, 2 * C.intermediate_size),       # 1024 -> 7168
    "mlp_down": (C.intermediate_size, C.hidden_size),              # 3584 -> 1024
    "out_proj": (C.linear_value_dim, C.hidden_size),               # 2048 -> 1024
    "lm_head": (C.hidden_size, C.vocab_size),                      # 1024 -> 248320
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(REAL))
def test_gpu_decode_shapes(rt, gen, name):
    K, N = REAL[name]
    x, w = _x(1, K, gen, rt), _w(N, K, gen, rt)
    ref = reference.linear(x, w)
    checks.compare(f"linear {name} M=1", gemm.linear(x, w), ref)
    for deterministic in (False, True):
        for split_k in (2, 8):
            got = gemm.linear_splitk(x, w, split_k=split_k, deterministic=deterministic)
            checks.compare(f"linear_splitk {name} split {split_k} det {deterministic}", got, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(REAL))
def test_gpu_prefill_shapes(rt, gen, name):
    K, N = REAL[name]
    M = 256 if name == "lm_head" else 2048  # the LM head at 2048 rows would need a 2 GB fp32 reference
    x, w = _x(M, K, gen, rt), _w(N, K, gen, rt)
    checks.compare(f"linear {name} M={M}", gemm.linear(x, w), reference.linear(x, w))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [2, 7, 16])
def test_gpu_short_prompts_use_the_gemv_path(rt, gen, M):
    K, N = REAL["mlp_down"]
    x, w = _x(M, K, gen, rt), _w(N, K, gen, rt)
    ref = reference.linear(x, w)
    for deterministic in (False, True):
        checks.compare(f"linear_splitk M={M}", gemm.linear_splitk(x, w, deterministic=deterministic), ref)


@pytest.mark.gpu
def test_gpu_deterministic_bitwise_and_atomic_close(rt, gen):
    K, N = REAL["mlp_down"]
    x, w = _x(1, K, gen, rt), _w(N, K, gen, rt)
    first = gemm.linear_splitk(x, w, split_k=16, deterministic=True)
    for _ in range(20):
        assert torch.equal(gemm.linear_splitk(x, w, split_k=16, deterministic=True), first)
    for _ in range(5):
        checks.compare("atomic vs deterministic", gemm.linear_splitk(x, w, split_k=16, deterministic=False), first)


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_gpu_splitk_inside_a_cuda_graph(rt, gen, deterministic):
    # replays reuse the workspace: each launch must leave it zeroed (atomic) and the counters reset
    K, N = REAL["out_proj"]
    w = _w(N, K, gen, rt)
    x = torch.zeros(1, K, dtype=rt.dtype, device=rt.device)
    out = torch.empty(1, N, dtype=rt.dtype, device=rt.device)
    for _ in range(2):  # warm-up: compile, autotune, allocate the workspace
        gemm.linear_splitk(x, w, split_k=4, deterministic=deterministic, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):  # several launches in one replay share the workspace back to back
            gemm.linear_splitk(x, w, split_k=4, deterministic=deterministic, out=out)
    for step in range(4):
        x.copy_(_x(1, K, gen, rt))
        graph.replay()
        torch.cuda.synchronize()
        checks.compare(f"graph replay {step}", out, reference.linear(x, w))
