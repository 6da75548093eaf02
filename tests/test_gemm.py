"""The GEMM family against qwen_lab.reference.linear: the tiled GEMM, the GEMV / split-K path in both
reduction modes, the dispatching `linear`, the SPLIT_K heuristic, and the errors."""

import pytest
import torch
import triton

from qwen_lab import reference
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B as C
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels import gemm
from qwen_lab.kernels.gemm import fused_norm, gemv, tiled, tuning


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

# K and N are not multiples of any block size (interpreter: the GEMM's tiles are 32 x 64 x 32, the decode GEMV's,
# which the rows up to 16 take, 512 x 64: N = 650 and 597 give it a full block and a ragged one)
RAGGED = [(1, 100, 50), (3, 100, 650), (17, 70, 45), (1, 200, 597)]


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
        buf = gemv._workspaces[(kind, x.device)]
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


def test_plan_times_are_empty_without_the_first_call_timing(rt, gen, monkeypatch):
    """The interpreter (and a GPU with QWEN_LAB_TUNE=0) takes the first fitting plan untimed: nothing is recorded."""
    monkeypatch.setattr(tuning, "_plans", {})
    monkeypatch.setattr(tuning, "plan_times", {})
    monkeypatch.setenv("QWEN_LAB_TUNE", "0")
    x, w = _x(1, 100, gen, rt), _w(50, 100, gen, rt)
    checks.compare("untimed plan", gemm.linear(x, w), reference.linear(x, w))
    assert gemm.tuning.last_plan is not None
    assert gemm.gemv_plan(1, 50, 100, dtype=rt.dtype, device=rt.device) is None  # an untimed plan is not kept
    assert gemm.gemv_plan_times(1, 50, 100, dtype=rt.dtype, device=rt.device) == {}


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
@pytest.mark.parametrize("M", [2, 4, 16])
def test_gpu_few_rows_atomic_split_k_with_every_tile(rt, gen, monkeypatch, M, switch):
    """A few prompt rows (the tl.dot path) split 8 ways with atomic adds, each block shape the first-call timing may
    pick, forced, ten calls in a row. With 4 rows, BLOCK_N 64 and BLOCK_K 128 (the H200's pick for the narrow
    projections), the last program once cleared sums other threads of it had yet to read: 4-token prefill pieces
    came out about 50% off."""
    K, N = REAL["out_proj"]
    x, w = _x(M, K, gen, rt), _w(N, K, gen, rt)
    ref = reference.linear(x, w)
    tiles = [c for c in tuning._gemv_configs(gpu=True) if not c.kwargs.get("PERSIST") and c.kwargs["BLOCK_N"] >= 16]
    assert tiles
    monkeypatch.setattr(tuning, "_plans", {})  # a forced configuration is used only where no plan was chosen yet
    for config in tiles:
        switch.force("gemv_splitk_kernel", config)
        for call in range(10):
            got = gemm.linear_splitk(x, w, split_k=8, deterministic=False)
            checks.compare(f"M={M} {config} call {call}", got, ref)
            assert gemm.tuning.last_plan == (8, config)


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


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", ["1", "0"], ids=["pdl", "no-pdl"])
def test_gpu_chained_gemvs_in_a_graph(rt, gen, monkeypatch, pdl):
    """Each GEMV reads the previous one's output. With programmatic dependent launch a GEMV starts reading its
    weights before the previous kernel has finished: it must still read x only after that kernel's writes."""
    monkeypatch.setenv("QWEN_LAB_PDL", pdl)
    assert gemv.pdl_enabled(rt.device) == (pdl == "1" and torch.cuda.get_device_capability()[0] >= 9)
    H, I = C.hidden_size, C.intermediate_size
    ws = [_w(I, H, gen, rt), _w(H, I, gen, rt), _w(2 * I, H, gen, rt), _w(H, 2 * I, gen, rt)]
    nw = _norm_w(H, gen, rt)
    x = torch.zeros(1, H, dtype=rt.dtype, device=rt.device)

    def chain():
        h = gemm.linear(x, ws[0])                      # 1024 -> 3584
        h = gemm.linear(h, ws[1])                      # 3584 -> 1024 (narrow: split-K candidates)
        h = gemm.rms_norm_linear(h, nw, 1e-6, ws[2])   # norm prologue, 1024 -> 7168
        return gemm.linear(h, ws[3])                   # 7168 -> 1024

    def expected():
        h = reference.linear(reference.linear(x, ws[0]), ws[1])
        return reference.linear(reference.rms_norm_linear(h, nw, 1e-6, ws[2]), ws[3])

    for _ in range(2):
        chain()  # compile, time the plans, allocate workspaces
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for step in range(3):
        x.copy_(_x(1, H, gen, rt))
        checks.compare(f"eager chain {step}", chain(), expected())
        graph.replay()
        torch.cuda.synchronize()
        checks.compare(f"graph replay {step}", out, expected())


@pytest.mark.gpu
def test_gpu_first_call_times_and_keeps_a_plan(rt, gen, monkeypatch):
    """The first call of a shape times its candidate plans inside a CUDA Graph and keeps the fastest; a later call
    reuses it. A narrow shape (N = 1024) also times SPLIT_K values."""
    monkeypatch.setattr(tuning, "_plans", {})
    monkeypatch.setattr(tuning, "plan_times", {})
    K, N = REAL["mlp_down"]
    w, x = _w(N, K, gen, rt), _x(1, K, gen, rt)
    assert gemm.gemv_plan(1, N, K, dtype=rt.dtype, device=rt.device) is None
    assert gemm.gemv_plan_times(1, N, K, dtype=rt.dtype, device=rt.device) == {}
    checks.compare("first call", gemm.linear(x, w), reference.linear(x, w))
    plan = gemm.gemv_plan(1, N, K, dtype=rt.dtype, device=rt.device)
    times = gemm.gemv_plan_times(1, N, K, dtype=rt.dtype, device=rt.device)
    assert len(times) > 1 and min(times, key=times.get) == plan, "the kept plan is the fastest one timed"
    assert all(t > 0 for t in times.values())
    heuristic = gemm.choose_split_k(1, N, K, gemm.sm_count(rt.device))
    assert plan is not None and plan[0] in (*gemm.SPLIT_CANDIDATES, heuristic)
    assert plan[1] in tuning._gemv_configs()
    assert gemm.chosen_split_k(1, N, K, dtype=rt.dtype, device=rt.device) == plan[0]
    checks.compare("second call", gemm.linear(x, w), reference.linear(x, w))
    assert gemm.tuning.last_plan == plan


# ---------------------------------------------------------------- norms fused into the GEMV prologue


def _norm_w(D, g, rt, dtype=None):
    return checks.randn(D, g=g, dtype=dtype or rt.dtype, device=rt.device, scale=0.3)


def _add_case(M, H, N, rt, row_pad=0):
    def make(g):
        xb = _x(M, H + row_pad, g, rt)  # with row_pad, x rows are farther apart than H
        return dict(x=xb[:, :H], residual=_x(M, H, g, rt), norm_weight=_norm_w(H, g, rt), eps=1e-6,
                    weight=_w(N, H, g, rt), out=torch.empty(M, N, dtype=rt.dtype, device=rt.device))
    return make


def _ohz(M, Hv, Dv, g, rt):
    """o [M, Hv, Dv] contiguous, and z a strided view of a wider projection output (as the model slices it)."""
    o = checks.randn(M, Hv, Dv, g=g, dtype=rt.dtype, device=rt.device)
    proj = checks.randn(M, 3 * Hv * Dv + 5, g=g, dtype=rt.dtype, device=rt.device, scale=2.0)
    z = proj[:, Hv * Dv + 5:2 * Hv * Dv + 5].unflatten(1, (Hv, Dv))
    return o, z


def _gated_case(M, Hv, Dv, N, rt):
    def make(g):
        o, z = _ohz(M, Hv, Dv, g, rt)
        return dict(o=o, z=z, norm_weight=_norm_w(Dv, g, rt, torch.float32) + 1.0, eps=1e-6,
                    weight=_w(N, Hv * Dv, g, rt), out=torch.empty(M, N, dtype=rt.dtype, device=rt.device))
    return make


# H = 100: not a multiple of BLOCK_K (64 under the interpreter); M = 17 takes the norm kernel + GEMM path
@pytest.mark.parametrize("M", [1, 3, 17])
def test_add_rms_norm_linear_matches_reference(rt, M):
    checks.check_kernel("add_rms_norm_linear", gemm.add_rms_norm_linear, reference.add_rms_norm_linear,
                        [_add_case(M, 100, 45, rt, row_pad=7)], seed=M, quiet=True)


@pytest.mark.parametrize("M", [1, 3, 17])
def test_rms_norm_linear_matches_reference(rt, M):
    def make(g):
        return dict(x=_x(M, 100, g, rt), norm_weight=_norm_w(100, g, rt), eps=1e-6, weight=_w(45, 100, g, rt),
                    out=torch.empty(M, 45, dtype=rt.dtype, device=rt.device))
    checks.check_kernel("rms_norm_linear", gemm.rms_norm_linear, reference.rms_norm_linear, [make], seed=M,
                        quiet=True)


@pytest.mark.parametrize("M", [1, 3, 17])
def test_gated_rms_norm_linear_matches_reference(rt, M):
    # Hv * Dv = 80: five heads of 16, not a multiple of BLOCK_K = 64; z a strided view
    checks.check_kernel("gated_rms_norm_linear", gemm.gated_rms_norm_linear, reference.gated_rms_norm_linear,
                        [_gated_case(M, 5, 16, 45, rt)], seed=M, quiet=True)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("M,split_k", [(1, 1), (1, 4), (3, 4)])
def test_fused_prologues_with_split_k(rt, gen, deterministic, M, split_k):
    # with split-K every slice uses the rstd of the whole row (RMSNorm) or of its own whole heads (gated)
    H, N = 150, 40
    x, r, nw, w = _x(M, H, gen, rt), _x(M, H, gen, rt), _norm_w(H, gen, rt), _w(N, H, gen, rt)
    y, s = fused_norm._rms_linear("add_rms_norm_linear", x, r, nw, 1e-6, w, None, None, split_k, deterministic)
    y_ref, s_ref = reference.add_rms_norm_linear(x, r, nw, 1e-6, w)
    checks.compare(f"add_rms_norm_linear split {split_k}", y, y_ref)
    assert torch.equal(s, s_ref), "s = x + residual must be the reference's rounding exactly"
    y = fused_norm._rms_linear("rms_norm_linear", x, None, nw, 1e-6, w, None, None, split_k, deterministic)
    checks.compare(f"rms_norm_linear split {split_k}", y, reference.rms_norm_linear(x, nw, 1e-6, w))
    o, z = _ohz(M, 6, 16, gen, rt)  # K = 96: split 4 -> slices of 32 (two heads), each split on a head boundary
    gw, gnw = _w(N, 96, gen, rt), _norm_w(16, gen, rt)
    y = fused_norm._gated_linear(o, z, gnw, 1e-6, gw, None, split_k, deterministic)
    checks.compare(f"gated_rms_norm_linear split {split_k}", y, reference.gated_rms_norm_linear(o, z, gnw, 1e-6, gw))


def _tiny_rows(t, rt):
    """t with its rows scaled by 0, 1e-4, 1, 0, 1e-4, ...: rows of zeros and rows whose mean square is far below
    eps, where eps decides the norm (a norm that dropped it gives NaN or 100 times the reference)."""
    scales = torch.tensor([0.0, 1e-4, 1.0], device=rt.device, dtype=rt.dtype).repeat(t.shape[0])[:t.shape[0]]
    return t * scales.view(-1, *([1] * (t.dim() - 1)))


@pytest.mark.parametrize("M", [3, 17])
def test_fused_norms_on_tiny_rows(rt, gen, M):
    """The decode GEMV's norm prologues (M = 3) and the prompt route (M = 17) on rows where eps matters."""
    H, N, eps = 100, 45, 1e-5
    x, r = _tiny_rows(_x(M, H, gen, rt), rt), _tiny_rows(_x(M, H, gen, rt), rt)
    nw, w = _norm_w(H, gen, rt), _w(N, H, gen, rt)
    y, s = gemm.add_rms_norm_linear(x, r, nw, eps, w)
    y_ref, s_ref = reference.add_rms_norm_linear(x, r, nw, eps, w)
    assert y_ref[1].abs().max() < 0.1 * y_ref[2].abs().max(), "eps dominates the tiny row's norm"
    checks.compare("add_rms_norm_linear (tiny rows)", y, y_ref)
    assert torch.equal(s, s_ref)
    checks.compare("rms_norm_linear (tiny rows)", gemm.rms_norm_linear(x, nw, eps, w),
                   reference.rms_norm_linear(x, nw, eps, w))
    o, z = _ohz(M, 5, 16, gen, rt)
    o, gnw, gw = _tiny_rows(o, rt), _norm_w(16, gen, rt), _w(N, 80, gen, rt)
    checks.compare("gated_rms_norm_linear (tiny rows)", gemm.gated_rms_norm_linear(o, z, gnw, eps, gw),
                   reference.gated_rms_norm_linear(o, z, gnw, eps, gw))


def test_fused_deterministic_is_bitwise_repeatable(rt, gen):
    x, r, nw, w = _x(2, 300, gen, rt), _x(2, 300, gen, rt), _norm_w(300, gen, rt), _w(50, 300, gen, rt)
    runs = [fused_norm._rms_linear("add_rms_norm_linear", x, r, nw, 1e-6, w, None, None, 5, True) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    o, z = _ohz(2, 8, 16, gen, rt)
    gw, gnw = _w(50, 128, gen, rt), _norm_w(16, gen, rt)
    a, b = (fused_norm._gated_linear(o, z, gnw, 1e-6, gw, None, 4, True) for _ in range(2))
    assert torch.equal(a, b)


def test_fused_ops_are_one_launch_at_decode(rt, gen):
    H, N = 64, 40
    x, r, nw, w = _x(1, H, gen, rt), _x(1, H, gen, rt), _norm_w(H, gen, rt), _w(N, H, gen, rt)
    o, z = _ohz(1, 4, 16, gen, rt)
    for call in (lambda: gemm.add_rms_norm_linear(x, r, nw, 1e-6, w),
                 lambda: gemm.rms_norm_linear(x, nw, 1e-6, w),
                 lambda: gemm.gated_rms_norm_linear(o, z, _norm_w(16, gen, rt), 1e-6, w)):
        with count_launches() as launches:
            call()
        assert dict(launches) == {"gemv_splitk_kernel": 1}
    # beyond GEMV_MAX_M rows: the norm kernel, then the tiled GEMM
    X, R = _x(17, H, gen, rt), _x(17, H, gen, rt)
    with count_launches() as launches:
        gemm.add_rms_norm_linear(X, R, nw, 1e-6, w)
    assert dict(launches) == {"add_rms_norm_kernel": 1, "matmul_kernel": 1}


def test_fused_writes_into_the_given_buffers(rt, gen):
    M, H, N = 3, 70, 33
    x, r, nw, w = _x(M, H, gen, rt), _x(M, H, gen, rt), _norm_w(H, gen, rt), _w(N, H, gen, rt)
    out_big = checks.poison_(torch.empty(M, N + 6, dtype=rt.dtype, device=rt.device))
    res_big = checks.poison_(torch.empty(M, H + 4, dtype=rt.dtype, device=rt.device))
    out, res = out_big[:, 2:2 + N], res_big[:, 1:1 + H]
    y, s = gemm.add_rms_norm_linear(x, r, nw, 1e-6, w, out=out, residual_out=res)
    assert y.data_ptr() == out.data_ptr() and s.data_ptr() == res.data_ptr()
    y_ref, s_ref = reference.add_rms_norm_linear(x, r, nw, 1e-6, w)
    checks.compare("add_rms_norm_linear into strided buffers", y, y_ref)
    assert torch.equal(s, s_ref)
    assert torch.isnan(out_big[:, :2]).all() and torch.isnan(out_big[:, 2 + N:]).all(), "wrote outside out"
    assert torch.isnan(res_big[:, :1]).all() and torch.isnan(res_big[:, 1 + H:]).all(), "wrote outside residual_out"


@pytest.mark.parametrize("M", [1, 17])
def test_residual_out_must_not_alias_the_inputs(rt, gen, M):
    # every decode program reads x and residual while one program writes residual_out: in place would race
    H, N = 64, 16
    x, r, nw, w = _x(M, H, gen, rt), _x(M, H, gen, rt), _norm_w(H, gen, rt), _w(N, H, gen, rt)
    both = _x(M, 2 * H, gen, rt)
    for res_out, inputs, what in ((r, (x, r), "overlaps residual"), (x, (x, r), "overlaps x"),
                                  (both[:, H // 2:H // 2 + H], (x, both[:, :H]), "overlaps residual")):
        with pytest.raises(KernelError, match=f"residual_out {what}"):
            gemm.add_rms_norm_linear(*inputs, nw, 1e-6, w, residual_out=res_out)
    # a separate buffer (e.g. the other of two alternating residual buffers) is fine
    y, s = gemm.add_rms_norm_linear(x, r, nw, 1e-6, w, residual_out=torch.empty_like(x))
    assert torch.equal(s, reference.add_rms_norm(x, r, nw, 1e-6)[1])


def test_gated_falls_back_when_heads_do_not_tile(rt, gen):
    # Dv = 24 is not a power of two: gated_rms_norm, then linear (two launches), same result
    o, z = _ohz(1, 3, 24, gen, rt)
    nw, w = _norm_w(24, gen, rt), _w(20, 72, gen, rt)
    with count_launches() as launches:
        y = gemm.gated_rms_norm_linear(o, z, nw, 1e-6, w)
    assert sum(launches.values()) == 2
    checks.compare("gated_rms_norm_linear Dv=24", y, reference.gated_rms_norm_linear(o, z, nw, 1e-6, w))


def test_fused_bad_arguments_are_named(rt, gen):
    x, r, nw, w = _x(2, 32, gen, rt), _x(2, 32, gen, rt), _norm_w(32, gen, rt), _w(8, 32, gen, rt)
    o, z = _ohz(2, 2, 16, gen, rt)
    cases = [
        (lambda: gemm.add_rms_norm_linear(x, r[:1], nw, 1e-6, w), "residual must have x's shape"),
        (lambda: gemm.add_rms_norm_linear(x, r, nw[:16], 1e-6, w), "norm_weight must be"),
        (lambda: gemm.add_rms_norm_linear(x, r, nw, 1e-6, _w(8, 16, gen, rt)), "x has 32 columns"),
        (lambda: gemm.add_rms_norm_linear(x, r, nw, 1e-6, w, residual_out=torch.empty(2, 31)), "residual_out"),
        (lambda: gemm.rms_norm_linear(x[0], nw, 1e-6, w), "x must be 2-D"),
        (lambda: gemm.rms_norm_linear(x, nw, 1e-6, w, out=torch.empty(2, 9, dtype=rt.dtype)), "out"),
        (lambda: gemm.gated_rms_norm_linear(o[0], z[0], nw[:16], 1e-6, w), "o must be a 3-D"),
        (lambda: gemm.gated_rms_norm_linear(o, z[:1], nw[:16], 1e-6, w), "z must have x's shape"),
        (lambda: gemm.gated_rms_norm_linear(o, z, nw, 1e-6, w), r"norm_weight must be \[16\]"),
        (lambda: gemm.gated_rms_norm_linear(o, z, nw[:16], 1e-6, _w(8, 48, gen, rt)), "o has 32 columns"),
    ]
    for call, message in cases:
        with pytest.raises(KernelError, match=message):
            call()


# ---------------------------------------------------------------- GPU: the fused decode shapes, bf16

# (N, H) of each projection that follows a zero-centred RMSNorm of the hidden state
NORMED = {name: REAL[name] for name in ("deltanet_in_proj", "attention_qkv", "mlp_gate_up", "lm_head")}


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 5, 64])
@pytest.mark.parametrize("name", list(NORMED))
def test_gpu_add_rms_norm_linear_real_shapes(rt, gen, name, M):
    H, N = NORMED[name]
    if name == "lm_head" and M > 1:
        pytest.skip("the LM head runs on one row at decode")
    x, r, nw, w = _x(M, H, gen, rt), _x(M, H, gen, rt), _norm_w(H, gen, rt), _w(N, H, gen, rt)
    y_ref, s_ref = reference.add_rms_norm_linear(x, r, nw, C.rms_norm_eps, w)
    y, s = gemm.add_rms_norm_linear(x, r, nw, C.rms_norm_eps, w)
    checks.compare(f"add_rms_norm_linear {name} M={M}", y, y_ref)
    assert torch.equal(s, s_ref)
    checks.compare(f"rms_norm_linear {name} M={M}", gemm.rms_norm_linear(x, nw, C.rms_norm_eps, w),
                   reference.rms_norm_linear(x, nw, C.rms_norm_eps, w))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 5, 64])
def test_gpu_gated_rms_norm_linear_real_shape(rt, gen, M):
    Hv, Dv, H = C.linear_num_value_heads, C.linear_value_head_dim, C.hidden_size
    o = _x(M, Hv * Dv, gen, rt).view(M, Hv, Dv)
    proj = _x(M, C.linear_in_proj_dim, gen, rt)  # z is a strided slice of the in-projection, as in the model
    cd = C.linear_conv_dim
    z = proj[:, cd:cd + Hv * Dv].unflatten(1, (Hv, Dv))
    nw = _norm_w(Dv, gen, rt, torch.float32) + 1.0
    w = _w(H, Hv * Dv, gen, rt)
    ref = reference.gated_rms_norm_linear(o, z, nw, C.rms_norm_eps, w)
    checks.compare(f"gated_rms_norm_linear M={M}", gemm.gated_rms_norm_linear(o, z, nw, C.rms_norm_eps, w), ref)
    for deterministic in (False, True):
        for split_k in (1, 2, 4, 8):
            got = fused_norm._gated_linear(o, z, nw, C.rms_norm_eps, w, None, split_k, deterministic)
            checks.compare(f"gated split {split_k} det {deterministic}", got, ref)


@pytest.mark.gpu
def test_gpu_fused_deterministic_bitwise(rt, gen):
    H, N = C.hidden_size, C.attn_in_proj_dim
    x, r, nw, w = _x(1, H, gen, rt), _x(1, H, gen, rt), _norm_w(H, gen, rt), _w(N, H, gen, rt)
    first = fused_norm._rms_linear("add_rms_norm_linear", x, r, nw, 1e-6, w, None, None, 4, True)
    for _ in range(10):
        y, s = fused_norm._rms_linear("add_rms_norm_linear", x, r, nw, 1e-6, w, None, None, 4, True)
        assert torch.equal(y, first[0]) and torch.equal(s, first[1])


@pytest.mark.gpu
def test_gpu_fused_inside_a_cuda_graph(rt, gen):
    # the model's decode pattern: two alternating residual buffers, the fused ops captured once, replayed
    H, N = C.hidden_size, C.linear_in_proj_dim
    Hv, Dv = C.linear_num_value_heads, C.linear_value_head_dim
    x = torch.zeros(1, H, dtype=rt.dtype, device=rt.device)
    res_a, res_b = torch.zeros_like(x), torch.empty_like(x)
    nw, w = _norm_w(H, gen, rt), _w(N, H, gen, rt)
    o = torch.zeros(1, Hv, Dv, dtype=rt.dtype, device=rt.device)
    z = torch.zeros(1, Hv, Dv, dtype=rt.dtype, device=rt.device)
    gnw, gw = _norm_w(Dv, gen, rt, torch.float32), _w(H, Hv * Dv, gen, rt)
    y = torch.empty(1, N, dtype=rt.dtype, device=rt.device)
    y2 = torch.empty(1, H, dtype=rt.dtype, device=rt.device)

    def step():
        gemm.add_rms_norm_linear(x, res_a, nw, 1e-6, w, out=y, residual_out=res_b)
        gemm.gated_rms_norm_linear(o, z, gnw, 1e-6, gw, out=y2)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: compile, autotune, time the splits, allocate the workspaces
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for i in range(3):
        x.copy_(_x(1, H, gen, rt))
        res_a.copy_(_x(1, H, gen, rt))
        o.copy_(_x(1, Hv * Dv, gen, rt).view(1, Hv, Dv))
        z.copy_(_x(1, Hv * Dv, gen, rt).view(1, Hv, Dv))
        graph.replay()
        torch.cuda.synchronize()
        y_ref, s_ref = reference.add_rms_norm_linear(x, res_a, nw, 1e-6, w)
        checks.compare(f"graph replay {i}: add_rms_norm_linear", y, y_ref)
        assert torch.equal(res_b, s_ref)
        checks.compare(f"graph replay {i}: gated_rms_norm_linear", y2,
                       reference.gated_rms_norm_linear(o, z, gnw, 1e-6, gw))


def test_lm_head_sized_outputs_keep_the_norm_apart(monkeypatch, rt, gen):
    """Above FUSED_NORM_MAX_N outputs (the LM head) the norm runs as its own kernel before a plain GEMV: fusing it
    there was measured slower on the H200. Same result either way."""
    from qwen_lab import reference
    from qwen_lab.kernels import count_launches, gemm

    monkeypatch.setattr(fused_norm, "FUSED_NORM_MAX_N", 8)
    x = torch.randn(1, 48, generator=gen).to(rt.device, rt.dtype)
    res = torch.randn(1, 48, generator=gen).to(rt.device, rt.dtype)
    w_norm = (torch.randn(48, generator=gen) * 0.1).to(rt.device)
    weight = (torch.randn(20, 48, generator=gen) * 0.1).to(rt.device, rt.dtype)
    with count_launches() as launches:
        y, s = gemm.add_rms_norm_linear(x, res, w_norm, 1e-6, weight)
    assert sum(launches.values()) == 2 and launches["gemv_splitk_kernel"] == 1
    y_ref, s_ref = reference.add_rms_norm_linear(x, res, w_norm, 1e-6, weight)
    checks.compare("y", y, y_ref)
    checks.compare("s", s, s_ref)


@pytest.mark.parametrize("prefetch", [0, 1])
def test_gemv_with_and_without_the_hand_written_prefetch(prefetch, monkeypatch, rt, gen, switch):
    """Both bodies of the decode GEMV (the first-call tuning chooses per shape on the GPU) compute the same products,
    with every prologue: plain, SwiGLU, RMSNorm, residual add + RMSNorm, gated norm."""
    import triton

    from qwen_lab.kernels import activations

    forced = triton.Config({"BLOCK_N": 16, "BLOCK_K": 32, "PREFETCH": prefetch}, num_warps=4, num_stages=1)
    switch.force("gemv_splitk_kernel", forced)
    monkeypatch.setattr(tuning, "_plans", {})
    f = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(rt.device, rt.dtype)  # noqa: E731
    x, res, w = f(1, 100), f(1, 100), f(37, 100, scale=0.1)
    nw = (torch.randn(100, generator=gen) * 0.1).to(rt.device)
    checks.compare("linear", gemm.linear(x, w), reference.linear(x, w))
    assert gemm.tuning.last_plan[1].kwargs["PREFETCH"] == prefetch
    gu, down = f(1, 2 * 70), f(37, 70, scale=0.1)
    checks.compare("swiglu_down", activations.swiglu_down(gu, down), reference.swiglu_down(gu, down))
    checks.compare("rms_norm_linear", gemm.rms_norm_linear(x, nw, 1e-6, w), reference.rms_norm_linear(x, nw, 1e-6, w))
    y, s = gemm.add_rms_norm_linear(x, res, nw, 1e-6, w)
    y_ref, s_ref = reference.add_rms_norm_linear(x, res, nw, 1e-6, w)
    checks.compare("add_rms_norm_linear", y, y_ref)
    checks.compare("residual", s, s_ref)
    o, z = f(1, 4, 32), f(1, 4, 32)
    w_out, gw = f(37, 128, scale=0.1), (1 + torch.randn(32, generator=gen) * 0.1).to(rt.device)
    checks.compare("gated_rms_norm_linear", gemm.gated_rms_norm_linear(o, z, gw, 1e-6, w_out),
                   reference.gated_rms_norm_linear(o, z, gw, 1e-6, w_out))


@pytest.mark.parametrize("index", [i for i, c in enumerate(tuning._gemv_configs(gpu=True))
                                   if not c.kwargs.get("PERSIST")])
def test_every_gpu_gemv_config_computes_the_same(index, monkeypatch, rt, gen, switch):
    """Each block shape of the one-program-per-block GEMV the GPU's first-call timing may pick, forced here (through
    the interpreter on a CPU): plain, split in two, and with the residual-add + norm prologue, on ragged shapes.
    (The persistent form has its own test below.)"""
    config = tuning._gemv_configs(gpu=True)[index]
    switch.force("gemv_splitk_kernel", config)
    f = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(rt.device, rt.dtype)  # noqa: E731
    x, res, w = f(1, 300), f(1, 300), f(37, 300, scale=0.1)
    nw = (torch.randn(300, generator=gen) * 0.1).to(rt.device)
    checks.compare(f"linear {config}", gemm.linear(x, w), reference.linear(x, w))
    checks.compare(f"linear_splitk 2 {config}", gemm.linear_splitk(x, w, split_k=2), reference.linear(x, w))
    y, s = gemm.add_rms_norm_linear(x, res, nw, 1e-6, w)
    y_ref, s_ref = reference.add_rms_norm_linear(x, res, nw, 1e-6, w)
    checks.compare(f"add_rms_norm_linear {config}", y, y_ref)
    checks.compare(f"residual {config}", s, s_ref)
    assert gemm.tuning.last_plan[1] is config


# ---------------------------------------------------------------- the TMA (tensor-descriptor) candidates


def test_tma_candidates_only_where_the_call_allows_them(monkeypatch):
    """The autotuner's list holds both modes and the TMA candidates; each call times only its mode's, and the TMA
    ones only with TMA_OK (sm_90+, aligned 16-bit operands). The interpreter has none."""
    assert not any(c.kwargs.get("TMA") for c in tuning._matmul_all_configs() if tuning.interpreter_active())
    monkeypatch.setattr(tuning, "interpreter_active", lambda: False)  # the GPU's lists
    every = tuning._matmul_all_configs()
    for swiglu in (False, True):
        mode = {tuning._config_id(c) for c in tuning._matmul_configs(swiglu)}
        with_tma = tuning._prune_matmul_configs(every, {}, SWIGLU=swiglu, TMA_OK=True)
        without = tuning._prune_matmul_configs(every, {}, SWIGLU=swiglu, TMA_OK=False)
        assert {tuning._config_id(c) for c in with_tma} == mode
        assert any(c.kwargs.get("TMA") for c in with_tma)
        assert without and not any(c.kwargs.get("TMA") for c in without)
        assert {tuning._config_id(c) for c in without} == {i for i in mode if ("TMA", True) not in i[0]}
        # long prompts that allow TMA time only the TMA candidates; without TMA they keep every plain one
        long = gemm.TMA_ONLY_FROM_ROWS
        tma_long = tuning._prune_matmul_configs(every, {"M_BUCKET": long}, SWIGLU=swiglu, TMA_OK=True)
        assert tma_long and all(c.kwargs.get("TMA") for c in tma_long)
        assert {tuning._config_id(c) for c in tma_long} == {i for i in mode if ("TMA", True) in i[0]}
        assert len(tuning._prune_matmul_configs(every, {"M_BUCKET": long // 2}, SWIGLU=swiglu, TMA_OK=True)) == \
            len(mode)
        assert tuning._prune_matmul_configs(every, {"M_BUCKET": long}, SWIGLU=swiglu, TMA_OK=False) == without


@pytest.mark.parametrize("swiglu", [False, True])
def test_the_tuner_shapes_the_host_descriptors_for_each_config(monkeypatch, swiglu):
    """The launcher makes the TMA candidates' descriptors once per call; the kernel's pre-run hook must give them each
    configuration's tiles before it is timed or launched (a descriptor's tile is part of the kernel's signature; left
    as made, every TMA kernel failed to compile on the GPU). The autotuner runs here over the GPU's list, each
    launch replaced by what Triton's does first (the kernel's pre-run hooks) and a record of the descriptors."""
    monkeypatch.setattr(tuning, "interpreter_active", lambda: False)  # the GPU's lists
    tuner = gemm.matmul_kernel
    assert tiled._fit_descriptors in tuner.fn.pre_run_hooks
    seen = []

    def launch(*args, grid, warmup, **meta):
        for hook in tuner.fn.pre_run_hooks:
            hook(*args, **meta)
        x_desc, w_desc, xt_desc = args[3], args[4], args[5]
        xt_tile = None if xt_desc is None else list(xt_desc.block_shape)
        seen.append((meta, list(x_desc.block_shape), list(w_desc.block_shape), list(w_desc.shape), xt_tile))

    monkeypatch.setattr(tuner, "configs", tuning._matmul_all_configs())
    monkeypatch.setattr(tuner, "cache", {})
    monkeypatch.setattr(tuner, "do_bench", lambda call, quantiles: (call(), [1.0, 1.0, 1.0])[1])
    monkeypatch.setattr(tuner.fn, "run", launch)
    M, K, N = 2048, 256, 96
    x = torch.zeros(M, K, dtype=torch.bfloat16)
    w = torch.zeros(2 * N if swiglu else N, K, dtype=torch.bfloat16)
    out = torch.zeros(M, N, dtype=torch.bfloat16)
    # as `linear` makes them: with the slices' descriptor for SwiGLU, whose candidates are the ones with TAIL
    tails = {c.kwargs.get("TAIL", 1) for c in tuning._matmul_configs(swiglu)}
    assert (tails != {1}) == swiglu, tails
    x_desc, w_desc, xt_desc = tiled._tma_descriptors(x, w, tail=swiglu)
    tuner[lambda meta: (1,)](x, w, out, x_desc, w_desc, xt_desc, M, N, K, M, x.stride(0), w.stride(0),
                             out.stride(0), DOT_PRECISION="tf32", SWIGLU=swiglu, TMA_OK=True)
    timed = {tuning._config_id(c) for c in tuning._matmul_configs(swiglu) if c.kwargs.get("TMA")}
    assert len(seen) == len(timed) + 1  # each TMA candidate timed once, then the pick launched
    for meta, x_tile, w_tile, w_shape, xt_tile in seen:
        bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
        assert x_tile == [bm, bk], (meta, x_tile)
        assert xt_tile == ([bm // meta.get("TAIL", 1), bk] if swiglu else None), (meta, xt_tile)
        if meta.get("JOIN"):
            assert (w_tile, w_shape) == ([2, bn, bk], [2, N, K]), (meta, w_tile, w_shape)
        else:
            assert (w_tile, w_shape) == ([bn, bk], [w.shape[0], K]), (meta, w_tile, w_shape)
    # a TAIL configuration's slice descriptor (matmul_with_config makes one for it) gets the slices' tile
    x_desc, w_desc, xt_desc = tiled._tma_descriptors(x, w, tail=True)
    for tail in (1, 2, 4):
        meta = dict(seen[-1][0], TAIL=tail)
        tiled._fit_descriptors(x, w, out, x_desc, w_desc, xt_desc, M, N, K, M, x.stride(0), w.stride(0),
                              out.stride(0), **meta)
        assert xt_desc.block_shape == [meta["BLOCK_M"] // meta.get("TAIL", 1), meta["BLOCK_K"]]


def test_tma_not_used_off_hopper(rt, gen):
    x, w = _x(32, 64, gen, rt), _w(48, 64, gen, rt)
    if rt.device.type != "cuda" or tuning.interpreter_active():
        assert not tiled._tma_ok(x, w)
    else:  # rows whose byte stride is not a multiple of 16 cannot be described to the TMA unit
        x_odd = _x(32, 71, gen, rt)[:, :64]
        assert not tiled._tma_ok(x_odd, w)
        checks.compare("linear, unaligned rows", gemm.linear(x_odd, w), reference.linear(x_odd, w))


def test_tma_path_of_the_kernel_on_ragged_shapes(rt, gen):
    """The kernel's TMA branch on ragged shapes (zero fill past M, N, K instead of masks), plain and SWIGLU, run
    directly: on the CPU with a small tile (the interpreter emulates the tensor descriptors), on a GPU with every
    TMA candidate."""
    M, K, N = 40, 72, 45  # K: 2 full steps and a partial one (BLOCK_K 32); rows of 144 (bf16) / 288 (fp32) bytes
    x, w = _x(M, K, gen, rt), _w(2 * N, K, gen, rt)
    if tuning.interpreter_active():
        # the one-tile-per-program form and the persistent one (4 nominal SMs: each program walks several tiles), and
        # the persistent one whose last round of tiles runs in row slices (TAIL: 6 tiles, the last 2 in 4 slices)
        plain = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, "TMA": True,
                                "PERSIST": persist}, num_warps=4, num_stages=1) for persist in (False, True)]
        plain += [triton.Config(dict(plain[1].kwargs, TAIL=tail), num_warps=4, num_stages=1) for tail in (2, 4)]
        # and SWIGLU's gate and up rows in one [2, BLOCK_N, BLOCK_K] tile (JOIN): N = 45 leaves the last tile ragged
        swiglu = plain + [triton.Config(dict(c.kwargs, JOIN=True), num_warps=4, num_stages=1) for c in plain]
    elif tiled._tma_ok(x, w):
        plain, swiglu = ([c for c in tuning._matmul_configs(s) if c.kwargs.get("TMA")] for s in (False, True))
    else:
        pytest.skip("this GPU has no TMA unit (sm_90+)")
    for c in plain:
        out = checks.poison_(torch.empty(M, 2 * N, dtype=rt.dtype, device=rt.device))
        checks.compare(f"TMA matmul {c}", gemm.matmul_with_config(x, w, out, c), reference.linear(x, w))
    for c in swiglu:
        out = checks.poison_(torch.empty(M, N, dtype=rt.dtype, device=rt.device))
        checks.compare(f"TMA matmul SWIGLU {c}", gemm.matmul_with_config(x, w, out, c, swiglu=True),
                       reference.linear_silu_mul(x, w))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mlp_gate_up", "mlp_down", "deltanet_in_proj"])
def test_gpu_every_tma_config_matches_torch(rt, gen, name):
    """Each TMA candidate (plain and SWIGLU), launched past the autotuner, against torch on a 2048-token prefill."""
    K, N = REAL[name]
    M = 2048
    x, w = _x(M, K, gen, rt), _w(N, K, gen, rt)
    assert tiled._tma_ok(x, w), "the H200 should take the TMA candidates"
    ref = reference.linear(x, w)
    tma = [c for c in tuning._matmul_configs(False) if c.kwargs.get("TMA")]
    assert tma
    for c in tma:
        out = checks.poison_(torch.empty(M, N, dtype=rt.dtype, device=rt.device))
        checks.compare(f"TMA matmul {name} {c}", gemm.matmul_with_config(x, w, out, c), ref)
    if name == "mlp_gate_up":
        ref = reference.linear_silu_mul(x, w)
        for c in (c for c in tuning._matmul_configs(True) if c.kwargs.get("TMA")):
            out = checks.poison_(torch.empty(M, N // 2, dtype=rt.dtype, device=rt.device))
            checks.compare(f"TMA matmul SWIGLU {c}", gemm.matmul_with_config(x, w, out, c, swiglu=True), ref)


@pytest.mark.parametrize("index", [i for i, c in enumerate(tuning._gemv_configs(gpu=True)) if c.kwargs.get("PERSIST")])
def test_persistent_gemv_config_with_every_prologue(index, monkeypatch, rt, gen, switch):
    """The persistent GEMV (gemv_rows_kernel: a few programs per SM walking the row blocks of W, the activation row
    computed once per program) forced with each of its configurations, one split, every prologue, on ragged
    shapes; through the interpreter on a CPU (4 nominal SMs: each program walks several blocks)."""
    from qwen_lab.kernels import activations, count_launches

    config = tuning._gemv_configs(gpu=True)[index]
    switch.force("gemv_splitk_kernel", config)
    monkeypatch.setattr(tuning, "_plans", {})
    monkeypatch.setattr(gemv, "choose_split_k", lambda *a: 1)   # the persistent form serves one split
    f = lambda *s, scale=1.0: (torch.randn(*s, generator=gen) * scale).to(rt.device, rt.dtype)  # noqa: E731
    N = 8 * config.kwargs["BLOCK_N"] * 4 + 3                    # blocks for several rounds of 4 * PERSIST programs
    x, res, w = f(1, 300), f(1, 300), f(N, 300, scale=0.1)
    nw = (torch.randn(300, generator=gen) * 0.1).to(rt.device)
    with count_launches() as launches:
        checks.compare(f"linear {config}", gemm.linear(x, w), reference.linear(x, w))
    assert dict(launches) == {"gemv_rows_kernel": 1}, dict(launches)
    gu, down = f(1, 2 * 150), f(N, 150, scale=0.1)
    checks.compare(f"swiglu_down {config}", activations.swiglu_down(gu, down), reference.swiglu_down(gu, down))
    checks.compare(f"rms_norm_linear {config}", gemm.rms_norm_linear(x, nw, 1e-6, w),
                   reference.rms_norm_linear(x, nw, 1e-6, w))
    y, s = gemm.add_rms_norm_linear(x, res, nw, 1e-6, w)
    y_ref, s_ref = reference.add_rms_norm_linear(x, res, nw, 1e-6, w)
    checks.compare(f"add_rms_norm_linear {config}", y, y_ref)
    checks.compare(f"residual {config}", s, s_ref)
    o, z = f(1, 4, 32), f(1, 4, 32)
    w_out, gw = f(N, 128, scale=0.1), (1 + torch.randn(32, generator=gen) * 0.1).to(rt.device)
    checks.compare(f"gated_rms_norm_linear {config}", gemm.gated_rms_norm_linear(o, z, gw, 1e-6, w_out),
                   reference.gated_rms_norm_linear(o, z, gw, 1e-6, w_out))
    assert gemm.tuning.last_plan[1] is config


def test_forced_persistent_gemv_refuses_a_split(monkeypatch, rt, gen, switch):
    """A persistent config forced on the GEMV, on a call it cannot serve (two splits) says so, naming the call."""
    config = next(c for c in tuning._gemv_configs(gpu=True) if c.kwargs.get("PERSIST"))
    switch.force("gemv_splitk_kernel", config)
    monkeypatch.setattr(tuning, "_plans", {})
    x, w = _x(1, 300, gen, rt), _w(37, 300, gen, rt)
    with pytest.raises(KernelError, match="linear_splitk: the config forced on gemv_splitk_kernel .* persistent form"):
        gemm.linear_splitk(x, w, split_k=2)


def test_persistent_gemv_is_timed_only_where_it_fits(monkeypatch):
    """Its candidates join the first-call timing for one row, one split and K within the tile; never otherwise,
    nor with QWEN_LAB_GEMV_PERSIST=0."""
    persistent = lambda cs: [c for c in cs if c.kwargs.get("PERSIST")]  # noqa: E731
    gpu_configs = tuning._gemv_configs(gpu=True)
    monkeypatch.setattr(tuning, "_gemv_configs", lambda gpu=None: gpu_configs)   # the GPU's list, here too
    fits = tuning._fitting_configs(1, 8224, 1024, 1, K=1024)
    assert persistent(fits) and all(c.kwargs["BLOCK_K"] == 1024 for c in persistent(fits))
    assert not persistent(tuning._fitting_configs(1, 1024, 512, 1, K=1024))   # split in two
    assert not persistent(tuning._fitting_configs(16, 8224, 1024, 1, K=1024))  # a few rows: tl.dot
    monkeypatch.setenv("QWEN_LAB_GEMV_PERSIST", "0")
    assert not persistent(tuning._fitting_configs(1, 8224, 1024, 1, K=1024))


def test_every_launcher_takes_one_dot_precision_rule():
    """fp32 operands multiply exactly ("ieee": tf32 would cost ~1e-3 on the GPU, which the interpreter does not
    show), anything else takes "tf32" (the chunk prep's fp32 merges of a bf16 model run on the tensor cores). The
    GEMM, attention and DeltaNet launchers all read this one function."""
    from qwen_lab.kernels import attention, dot_precision
    from qwen_lab.kernels.deltanet import chunk_scan

    assert dot_precision(torch.float32) == "ieee"
    assert dot_precision(torch.bfloat16) == "tf32" and dot_precision(torch.float16) == "tf32"
    for module in (tiled, gemv, attention, chunk_scan):
        assert module.dot_precision is dot_precision, module.__name__
        assert not hasattr(module, "_dot_precision"), f"{module.__name__} keeps a rule of its own"


# ---------------------------------------------------------------- a residual add + RMSNorm split between two GEMMs


def _split_norm_case(M, K, H, g, rt):
    return _x(M, K, g, rt), _w(H, K, g, rt), _x(M, H, g, rt), _norm_w(H, g, rt, torch.float32)


@pytest.mark.parametrize("M,K,H", [(17, 70, 72), (33, 64, 100), (20, 40, 32)])
def test_linear_add_rms_norm_leaves_what_the_next_gemm_needs(rt, gen, M, K, H):
    """s = residual + x W^T rounded as add_rms_norm rounds it; h = s (1 + w); per-row sums of squares in slots that
    add up to sum(s^2), the slots past the column tiles zero even where the buffer held something else."""
    x, w, residual, nw = _split_norm_case(M, K, H, gen, rt)
    s, h, ss = gemm.linear_add_rms_norm(x, w, residual, nw, 1e-6)
    s_ref = (residual.float() + reference.linear(x, w).float()).to(rt.dtype)
    checks.compare("s", s, s_ref)
    checks.compare("h", h, (s_ref.float() * (1 + nw)).to(rt.dtype))
    assert ss.shape == (M, gemm.ss_slots(H)) and ss.dtype == torch.float32
    checks.compare("sum of the slots", ss.sum(1), (s.float() ** 2).sum(1), rtol=1e-4)
    s_r, h_r, ss_r = reference.linear_add_rms_norm(x, w, residual, nw, 1e-6)   # the table's oracle: one slot
    checks.compare("reference s", s_r, s_ref)
    checks.compare("reference h", h_r, h)
    checks.compare("reference slot", ss_r[:, 0], ss.sum(1), rtol=1e-4)
    # a buffer holding something else: every slot is written (those past the column tiles with zeros)
    again = torch.full_like(ss, 7.0)
    tiled._matmul("linear_add_rms_norm", x, w, torch.empty_like(s),
                 epilogue={"residual": residual, "norm_weight": nw, "h": torch.empty_like(h), "ss": again})
    assert torch.equal(again, ss), "the slots must not depend on what the buffer held"


def test_linear_add_rms_norm_in_place(rt, gen):
    x, w, residual, nw = _split_norm_case(17, 70, 72, gen, rt)
    want, _, _ = gemm.linear_add_rms_norm(x, w, residual, nw, 1e-6)
    stream = residual.clone()
    s, _, _ = gemm.linear_add_rms_norm(x, w, stream, nw, 1e-6, residual_out=stream)
    assert s.data_ptr() == stream.data_ptr() and torch.equal(s, want)


@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_rms_scaled_linear_equals_the_norm_then_the_projection(rt, gen, swiglu):
    """rms_norm(s) (1 + w) W^T = (s (1 + w) W^T) / rms(s): the row factor moved past the product."""
    M, K, H, N = 19, 70, 72, 45
    x, w, residual, nw = _split_norm_case(M, K, H, gen, rt)
    s, h, ss = gemm.linear_add_rms_norm(x, w, residual, nw, 1e-6)
    w2 = _w(2 * N if swiglu else N, H, gen, rt)
    y = gemm.rms_scaled_linear(h, ss, 1e-6, w2, swiglu=swiglu)
    normed = reference.rms_norm(s, nw, 1e-6)
    want = reference.linear_silu_mul(normed, w2) if swiglu else reference.linear(normed, w2)
    checks.compare("rms_scaled_linear", y, want)
    checks.compare("reference rms_scaled_linear", reference.rms_scaled_linear(h, ss, 1e-6, w2, swiglu=swiglu), want)


def test_split_norm_on_tiny_rows(rt, gen):
    """The prompt GEMM's fused norm (the row scale from the slots) on rows of zeros and rows whose mean square is
    far below eps."""
    M, K, H, N, eps = 19, 70, 72, 45, 1e-5
    x, w, residual, nw = _split_norm_case(M, K, H, gen, rt)
    x, residual = _tiny_rows(x, rt), _tiny_rows(residual, rt)
    s, h, ss = gemm.linear_add_rms_norm(x, w, residual, nw, eps)
    w2 = _w(N, H, gen, rt)
    want = reference.linear(reference.rms_norm(s, nw, eps), w2)
    assert want[1].abs().max() < 0.1 * want[2].abs().max(), "eps dominates the tiny row's norm"
    checks.compare("rms_scaled_linear (tiny rows)", gemm.rms_scaled_linear(h, ss, eps, w2), want)


def test_split_norm_arguments_are_named(rt, gen):
    x, w, residual, nw = _split_norm_case(17, 70, 72, gen, rt)
    with pytest.raises(KernelError, match="residual.*must be \\[17, 72\\]"):
        gemm.linear_add_rms_norm(x, w, residual[:, :70], nw, 1e-6)
    rows = torch.cat([residual, residual[:1]])   # two views one row apart
    with pytest.raises(KernelError, match="residual_out.*overlaps residual"):
        gemm.linear_add_rms_norm(x, w, rows[:17], nw, 1e-6, residual_out=rows[1:])
    _, h, ss = gemm.linear_add_rms_norm(x, w, residual, nw, 1e-6)
    with pytest.raises(KernelError, match="ss.*power of two"):   # (ss's own width depends on the tile configs)
        gemm.rms_scaled_linear(h, torch.zeros(17, 3, device=h.device), 1e-6, _w(45, 72, gen, rt))
    with pytest.raises(KernelError, match="ss.*float32"):
        gemm.rms_scaled_linear(h, ss.double(), 1e-6, _w(45, 72, gen, rt))


@pytest.mark.gpu
@pytest.mark.parametrize("first,second", [("out_proj", "mlp_gate_up"), ("mlp_down", "deltanet_in_proj")])
def test_gpu_split_norm_between_prompt_gemms(rt, gen, first, second):
    """The model's pairs at 2048 tokens, bf16: the out-projection into the MLP's gate/up (SwiGLU), the MLP's down
    projection into the next DeltaNet in-projection, against the norm kernel between two GEMMs."""
    from qwen_lab.kernels import activations, norms

    M = 2048
    (K, H), (_, N) = REAL[first], REAL[second]
    x, w, residual, nw = _split_norm_case(M, K, H, gen, rt)
    w2 = _w(N, H, gen, rt)
    swiglu = second == "mlp_gate_up"
    s, h, ss = gemm.linear_add_rms_norm(x, w, residual, nw, C.rms_norm_eps)
    y = gemm.rms_scaled_linear(h, ss, C.rms_norm_eps, w2, swiglu=swiglu)
    normed, s_ref = norms.add_rms_norm(gemm.matmul(x, w), residual, nw, C.rms_norm_eps)
    assert torch.equal(s, s_ref), "s must round as add_rms_norm rounds it"
    unsplit = activations.linear_silu_mul(normed, w2) if swiglu else gemm.matmul(normed, w2)
    # Both routes round once before the second product, at different places (h = s (1 + w) against the normed
    # row), so where a sum cancels the two land a few bf16 steps apart (on the GPU, 55 of 7.3M outputs beyond
    # 0.016 + 0.016 |y|). The split route must be as close to the fp32 truth as the norm kernel's route is: over
    # all outputs, and at its worst output.
    exact = reference.rms_norm(s.float(), nw, C.rms_norm_eps)
    truth = (reference.linear_silu_mul if swiglu else reference.linear)(exact, w2.float())
    err, err_unsplit = checks.relative_error(y.float(), truth), checks.relative_error(unsplit.float(), truth)
    assert err <= 1.1 * err_unsplit, f"{first} -> {second}: relative error {err:.3g}, unsplit {err_unsplit:.3g}"
    worst, worst_unsplit = ((t.float() - truth).abs().max().item() for t in (y, unsplit))
    assert worst <= 1.5 * worst_unsplit, f"{first} -> {second}: worst error {worst:.3g}, unsplit {worst_unsplit:.3g}"



# ---------------------------------------------------------------- the teaching kernels (notebooks 03 and 04)


def test_the_teaching_kernels_are_the_notebooks_solutions():
    """gemm/teach_tiled.py holds exercise 03.1 as solutions/03_gemm.ipynb writes it, gemm/teach_splitk.py exercises
    04.1 and 04.2 as solutions/04_split_k.ipynb writes them."""
    from notebook_source import assert_teaches

    assert_teaches("03_gemm.ipynb", "qwen_lab/kernels/gemm/teach_tiled.py")
    assert_teaches("04_split_k.ipynb", "qwen_lab/kernels/gemm/teach_splitk.py")


@pytest.mark.parametrize("M, K, N", [(1, 40, 24), (7, 72, 50), (37, 100, 33)])
def test_the_teaching_kernels_match_the_reference(rt, gen, M, K, N):
    """The teaching launchers as library code, on ragged shapes (no size a multiple of the tiles): the tiled GEMM,
    split-K with atomic adds and the deterministic split-K, each with and without `out`."""
    from qwen_lab.kernels.gemm import teach_splitk, teach_tiled

    x, w = _x(M, K, gen, rt), _w(N, K, gen, rt)
    ref = reference.linear(x, w)
    checks.compare("my_matmul", teach_tiled.my_matmul(x, w), ref)
    out = torch.empty(M, N, dtype=rt.dtype, device=rt.device)
    assert teach_tiled.my_matmul(x, w, out=out) is out
    checks.compare("my_matmul(out=)", out, ref)
    for split_k in (1, 3):
        for fn in (teach_splitk.my_linear_splitk, teach_splitk.my_linear_splitk_deterministic):
            checks.compare(f"{fn.__name__}(split_k={split_k})", fn(x, w, split_k=split_k), ref)
            out = torch.full((M, N), float("nan"), dtype=rt.dtype, device=rt.device)
            assert fn(x, w, split_k=split_k, out=out) is out
            checks.compare(f"{fn.__name__}(split_k={split_k}, out=)", out, ref)
    first = teach_splitk.my_linear_splitk_deterministic(x, w, split_k=3)
    assert torch.equal(teach_splitk.my_linear_splitk_deterministic(x, w, split_k=3), first), \
        "the deterministic split-K must give the same bits every run"
