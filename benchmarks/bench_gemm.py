"""Every projection of Qwen3.5-0.8B (qwen_lab.kernels.gemm): the decode GEMV and the prefill GEMM, against PyTorch.

    python benchmarks/bench_gemm.py [--json FILE] [--rounds N] [--only NAME]

A decode token (M = 1) is bound by reading the weight, so its rows are read in GB/s against the copy rate; a prompt
(M = the prompt's tokens) is bound by the matmul, read in TFLOP/s. The cases, one per projection shape where it
applies (the DeltaNet and attention in-projections, the MLP's gate/up and down, the DeltaNet out-projection, the LM
head):
- `linear decode`: qwen_lab's `linear` (the plan its first call timed: form, block shape, SPLIT_K; the row's note
  names it, the runners-up and the bar of docs/performance.md) against torch's F.linear and torch.mv;
- `read W once`: a kernel that only streams the weight (each program sums its slice), timed like the GEMV: the
  least a GEMV can take. What is left between the two is the GEMV's own cost;
- `swiglu_down decode`: the down projection with SwiGLU in the GEMV's prologue, against silu_mul then linear;
- `add_rms_norm_linear decode` (the in-projections and the LM head) and `gated_rms_norm_linear decode` (the
  DeltaNet's out-projection): the norm in the GEMV's prologue, one launch, against the norm kernel then linear;
- `matmul prefill`: the tiled GEMM against F.linear (the note names the autotuner's pick);
- `linear_splitk sweep`: SPLIT_K = 1, 2, 4, 8, 16 forced through linear_splitk's argument, with atomic adds, and
  for the narrow shapes (N <= 8192) in the fixed order; left out once the benchmark has run SWEEP_LIMIT_S;
- `matmul configs`, on request only (--only "matmul configs"): every configuration the tiled GEMM's autotuner may
  pick for each prefill shape (and the gate/up projection with its SwiGLU epilogue), each launched past the
  autotuner with gemm.matmul_with_config.
Each implementation is checked against qwen_lab.reference first. On the harness of benchmarks/harness.py.
"""

import sys

import torch
import torch.nn.functional as F

from harness import Case, main   # first: it sets up the runtime (the interpreter on a CPU) before Triton is imported
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from qwen_lab import reference  # noqa: E402
from qwen_lab.kernels import activations, gemm, norms  # noqa: E402

SPLITS = (1, 2, 4, 8, 16)
DETERMINISTIC_MAX_N = 8192   # the sweep's fixed-order reduction: the narrow shapes only (its workspace is S x N)
SWEEP_LIMIT_S = 150.0        # the SPLIT_K sweep stops adding cases after this many seconds of the benchmark
READ_BLOCKS = (4096, 8192, 16384)   # values of W per program of the streaming kernel


CPU_SHAPES = ("deltanet_in_proj", "mlp_down")   # the interpreter's run: one shape reading the hidden size, one not


def shapes(env):
    """(name, K, N, the decode GEMV's bar: its share of the copy rate in docs/performance.md) per projection; on a
    CPU only CPU_SHAPES, so that the interpreter's run stays short."""
    c = env.config
    every = [("deltanet_in_proj", c.hidden_size, c.linear_in_proj_dim, 0.70),
             ("attention_qkv", c.hidden_size, c.attn_in_proj_dim, 0.70),
             ("mlp_gate_up", c.hidden_size, 2 * c.intermediate_size, 0.70),
             ("mlp_down", c.intermediate_size, c.hidden_size, 0.70),
             ("out_proj", c.linear_value_dim, c.hidden_size, 0.40),
             ("lm_head", c.hidden_size, c.vocab_size, 0.85)]
    return every if env.gpu else [s for s in every if s[0] in CPU_SHAPES]


# ---------------------------------------------------------------- the floor: read W once


@triton.jit
def stream_kernel(w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[p] = the sum of W's values p BLOCK .. (p + 1) BLOCK - 1 (flat): one read of W and nothing else."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    w = tl.load(w_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
    tl.store(out_ptr + tl.program_id(0), tl.sum(w.to(tl.float32)))


def stream(w: torch.Tensor, block: int) -> torch.Tensor:
    sums = torch.empty(triton.cdiv(w.numel(), block), dtype=torch.float32, device=w.device)
    stream_kernel[(sums.numel(),)](w, sums, w.numel(), BLOCK=block, num_warps=4)
    return sums


def block_sums(w: torch.Tensor, block: int) -> torch.Tensor:
    """W's flat values summed by `block` (the last block may be short), in float64: the streaming kernel's truth."""
    flat = w.flatten()
    whole = flat.numel() // block * block
    sums = flat[:whole].view(-1, block).sum(1, dtype=torch.float64)
    return torch.cat([sums, flat[whole:].sum(0, dtype=torch.float64).reshape(1)]) if whole < flat.numel() else sums


def same_sums(got: torch.Tensor, want: torch.Tensor) -> float:
    """The relative error of block sums against finer ones (`want`, by READ_BLOCKS[0]), summed to got's blocks
    (each a power of two of the finer ones; torch's one sum, all of them)."""
    ratio = 1
    while triton.cdiv(want.numel(), ratio) > got.numel():
        ratio *= 2
    coarse = torch.zeros(got.numel(), dtype=torch.float64, device=want.device)
    coarse.index_add_(0, torch.arange(want.numel(), device=want.device) // ratio, want)
    return float((got.double() - coarse).norm() / coarse.norm().clamp_min(1e-30))


# ---------------------------------------------------------------- what each row's note says


def plan_note(env, N: int, K: int, bar: float):
    """The plan the GEMV's first call kept (gemm.tuning.last_plan: the last GEMV launched, this row's), the three
    runners-up it timed, and the shape's bar."""
    def note():
        said = f"bar {bar:.0%} of the copy rate"
        if gemm.tuning.last_plan is None:
            return said
        split, config = gemm.tuning.last_plan
        timed = sorted(gemm.gemv_plan_times(1, N, K, dtype=env.dtype, device=env.device).items(),
                       key=lambda kv: kv[1])
        runners = "; ".join(f"{us:.2f} us SPLIT_K={s} {config_name(c)}" for (s, c), us in timed[1:4])
        return (f"plan SPLIT_K={split} {config_name(config)}" + (f" (runners-up: {runners})" if runners else "")
                + f"; {said}")
    return note


def config_name(config) -> str:
    """A triton.Config in one short line: its meta-parameters, warps and stages."""
    if config is None:
        return "-"
    meta = " ".join(f"{k}={v}" for k, v in config.kwargs.items())
    return f"{meta} w{config.num_warps} s{config.num_stages}"


def autotuned_note():
    return f"autotuner's pick: {config_name(getattr(gemm.matmul_kernel, 'best_config', None))}"


def torch_silu_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ---------------------------------------------------------------- the cases


def decode_cases(env):
    c, es, eps = env.config, env.dtype.itemsize, env.config.rms_norm_eps
    H, I = c.hidden_size, c.intermediate_size
    out = []
    for name, K, N, bar in shapes(env):
        def row(seed, K=K, N=N):
            return {"x": env.randn(1, K, seed=seed), "w": env.randn(N, K, seed=seed + 1000, scale=K ** -0.5),
                    "o": torch.empty(1, N, device=env.device, dtype=env.dtype),
                    "r": env.randn(1, K, seed=seed + 2000), "nw": env.randn(K, seed=7, scale=0.1),
                    "h": torch.empty(1, K, device=env.device, dtype=env.dtype),
                    "s": torch.empty(1, K, device=env.device, dtype=env.dtype)}
        out.append(Case(
            "linear decode", f"{name} M=1 K={K} N={N}", row,
            {"triton": lambda d: gemm.linear(d["x"], d["w"], out=d["o"]),
             "torch F.linear": lambda d: F.linear(d["x"], d["w"]),
             "torch mv": lambda d: (torch.mv(d["w"], d["x"][0], out=d["o"][0]), d["o"])[1],
             "torch reference": lambda d: reference.linear(d["x"], d["w"])},
            lambda d: reference.linear(d["x"], d["w"]), bytes=(N * K + K + N) * es, flops=2 * N * K,
            notes={"triton": plan_note(env, N, K, bar)}))
        out.append(Case(
            "read W once", f"{name} K={K} N={N}", row,
            {"triton": lambda d: stream(d["w"], READ_BLOCKS[1]),
             **{f"triton BLOCK={b}": (lambda d, b=b: stream(d["w"], b)) for b in (READ_BLOCKS[0], READ_BLOCKS[2])},
             "torch sum": lambda d: d["w"].sum(dtype=torch.float32).reshape(1)},
            lambda d: block_sums(d["w"], READ_BLOCKS[0]), bytes=N * K * es, compare=same_sums))
        if K != H:
            continue

        def add_norm_then_linear(d):
            h, s = norms.add_rms_norm(d["x"], d["r"], d["nw"], eps, out=d["h"], residual_out=d["s"])
            return gemm.linear(h, d["w"], out=d["o"]), s
        out.append(Case(
            "add_rms_norm_linear decode", f"{name} M=1 K={K} N={N}", row,
            {"triton": lambda d: gemm.add_rms_norm_linear(d["x"], d["r"], d["nw"], eps, d["w"], out=d["o"],
                                                          residual_out=d["s"]),
             "triton add_rms_norm + linear": add_norm_then_linear,
             "torch reference": lambda d: reference.add_rms_norm_linear(d["x"], d["r"], d["nw"], eps, d["w"])},
            lambda d: reference.add_rms_norm_linear(d["x"], d["r"], d["nw"], eps, d["w"]),
            bytes=(N * K + 3 * K + N) * es, flops=2 * N * K))

    def down(seed):
        return {"gu": env.randn(1, 2 * I, seed=seed), "w": env.randn(H, I, seed=seed + 1000, scale=I ** -0.5),
                "act": torch.empty(1, I, device=env.device, dtype=env.dtype),
                "o": torch.empty(1, H, device=env.device, dtype=env.dtype)}
    out.append(Case(
        "swiglu_down decode", f"mlp_down M=1 I={I} H={H}", down,
        {"triton": lambda d: activations.swiglu_down(d["gu"], d["w"], out=d["o"]),
         "triton silu_mul + linear": lambda d: gemm.linear(activations.silu_mul(d["gu"], out=d["act"]), d["w"],
                                                           out=d["o"]),
         "torch": lambda d: F.linear(torch_silu_mul(d["gu"]), d["w"])},
        lambda d: reference.swiglu_down(d["gu"], d["w"]), bytes=(H * I + 2 * I + H) * es, flops=2 * H * I))

    # the DeltaNet's output: the gated norm of o [1, Hv, Dv] with z a slice of the in-projection, then out_proj
    Hv, Dv, cd = c.linear_num_value_heads, c.linear_value_head_dim, c.linear_conv_dim
    K = Hv * Dv

    def gated(seed):
        proj = env.randn(1, c.linear_in_proj_dim, seed=seed + 1000)
        return {"o": env.randn(1, Hv, Dv, seed=seed), "z": proj[:, cd:cd + K].unflatten(1, (Hv, Dv)),
                "nw": env.randn(Dv, seed=7, scale=0.1, dtype=torch.float32) + 1.0,
                "w": env.randn(H, K, seed=seed + 2000, scale=K ** -0.5),
                "g": torch.empty(1, Hv, Dv, device=env.device, dtype=env.dtype),
                "out": torch.empty(1, H, device=env.device, dtype=env.dtype)}

    def gated_norm_then_linear(d):
        h = norms.gated_rms_norm(d["o"], d["z"], d["nw"], eps, out=d["g"])
        return gemm.linear(h.view(1, K), d["w"], out=d["out"])
    out.append(Case(
        "gated_rms_norm_linear decode", f"out_proj M=1 Hv={Hv} Dv={Dv} N={H}", gated,
        {"triton": lambda d: gemm.gated_rms_norm_linear(d["o"], d["z"], d["nw"], eps, d["w"], out=d["out"]),
         "triton gated_rms_norm + linear": gated_norm_then_linear,
         "torch reference": lambda d: reference.gated_rms_norm_linear(d["o"], d["z"], d["nw"], eps, d["w"])},
        lambda d: reference.gated_rms_norm_linear(d["o"], d["z"], d["nw"], eps, d["w"]),
        bytes=(H * K + 2 * K + H) * es + Dv * 4, flops=2 * H * K))
    return out


def prefill_cases(env):
    es, T = env.dtype.itemsize, env.tokens
    out = []
    for name, K, N, _ in shapes(env):
        def rows(seed, K=K, N=N):
            return {"x": env.randn(T, K, seed=seed), "w": env.randn(N, K, seed=seed + 1000, scale=K ** -0.5),
                    "o": torch.empty(T, N, device=env.device, dtype=env.dtype)}
        out.append(Case(
            "matmul prefill", f"{name} M={T} K={K} N={N}", rows,
            {"triton": lambda d: gemm.matmul(d["x"], d["w"], out=d["o"]),
             "torch F.linear": lambda d: F.linear(d["x"], d["w"])},
            lambda d: reference.linear(d["x"], d["w"]), bytes=(T * K + N * K + T * N) * es, flops=2 * T * N * K,
            notes={"triton": autotuned_note}))
    return out


def sweep_cases(env):
    """linear_splitk at each SPLIT_K (and reduction) per shape, given through its arguments."""
    es = env.dtype.itemsize
    out = []
    for name, K, N, _ in shapes(env):
        def row(seed, K=K, N=N):
            return {"x": env.randn(1, K, seed=seed), "w": env.randn(N, K, seed=seed + 1000, scale=K ** -0.5),
                    "o": torch.empty(1, N, device=env.device, dtype=env.dtype)}
        impls = {"triton": lambda d: gemm.linear_splitk(d["x"], d["w"], out=d["o"]),
                 "torch F.linear": lambda d: F.linear(d["x"], d["w"])}
        most = triton.cdiv(K, gemm.K_GRANULE)   # each split needs K_GRANULE columns at least
        for det in (False, True) if N <= DETERMINISTIC_MAX_N else (False,):
            for s in (s for s in SPLITS if s <= most):
                impls[f"triton split_k={s}{' deterministic' if det else ''}"] = (
                    lambda d, s=s, det=det: gemm.linear_splitk(d["x"], d["w"], split_k=s, deterministic=det,
                                                               out=d["o"]))
        out.append(Case(
            "linear_splitk sweep", f"{name} M=1 K={K} N={N}", row, impls,
            lambda d: reference.linear(d["x"], d["w"]), bytes=(N * K + K + N) * es, flops=2 * N * K,
            time_limit_s=SWEEP_LIMIT_S if env.gpu else None))
    return out


def config_cases(env):
    """Every tiled-GEMM configuration the autotuner may pick, per prefill shape (on request: a long sweep)."""
    c, es, T = env.config, env.dtype.itemsize, env.tokens
    H, I = c.hidden_size, c.intermediate_size
    out = []
    specs = [(name, K, N, False) for name, K, N, _ in shapes(env) if N <= 16384]
    specs.append(("mlp_gate_up+silu", H, 2 * I, True))
    for name, K, N, swiglu in specs:
        n_out = N // 2 if swiglu else N

        def rows(seed, K=K, N=N, n_out=n_out):
            return {"x": env.randn(T, K, seed=seed), "w": env.randn(N, K, seed=seed + 1000, scale=K ** -0.5),
                    "o": torch.empty(T, n_out, device=env.device, dtype=env.dtype)}
        if swiglu:
            impls = {"triton": lambda d: activations.linear_silu_mul(d["x"], d["w"], out=d["o"]),
                     "torch": lambda d: torch_silu_mul(F.linear(d["x"], d["w"]))}
            truth = lambda d: reference.linear_silu_mul(d["x"], d["w"])  # noqa: E731
        else:
            impls = {"triton": lambda d: gemm.matmul(d["x"], d["w"], out=d["o"]),
                     "torch F.linear": lambda d: F.linear(d["x"], d["w"])}
            truth = lambda d: reference.linear(d["x"], d["w"])  # noqa: E731
        # the candidates depend on the operands' dtype, alignment and device only: one row of each stands in
        probe = torch.empty(1, K, device=env.device, dtype=env.dtype)
        for config in gemm.matmul_candidates(probe, probe, swiglu):
            impls[f"triton {config_name(config)}"] = (
                lambda d, config=config, swiglu=swiglu: gemm.matmul_with_config(d["x"], d["w"], d["o"], config,
                                                                                swiglu))
        out.append(Case(
            "matmul configs", f"{name} M={T} K={K} N={N}", rows, impls, truth,
            bytes=(T * K + N * K + T * n_out) * es, flops=2 * T * N * K, on_request=True))
    return out


def cases(env):
    return decode_cases(env) + prefill_cases(env) + sweep_cases(env) + config_cases(env)


if __name__ == "__main__":
    sys.exit(main("bench_gemm", cases, __doc__))
