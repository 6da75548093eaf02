"""Decode GEMV and prefill GEMM timings for every projection shape of Qwen3.5-0.8B (bf16, one GPU).

    python benchmarks/bench_gemv.py [--out DIR]

Decode (M = 1) is bound by reading the weight, so each row reports bandwidth: weight + x + y bytes
over the time of one call, against the H200's ~4.2 TB/s copy bandwidth and the kernel-level bars of
docs PERF.md. Each call is timed the way the model runs it: 20 calls captured in one CUDA Graph,
replayed with triton.testing.do_bench (median), divided by 20; the 20 calls rotate through copies of
the weight that together exceed twice the L2 cache, so no call is served from L2 by its predecessor.
Rows: qwen_lab's `linear` (the heuristic's SPLIT_K, autotuned blocks), torch's F.linear and torch.mv,
then the SPLIT_K sweep (1, 2, 4, 8, 16; atomic, and deterministic for the narrow shapes), the MLP's
down projection fused with SwiGLU against silu_mul + linear, and the norms fused into the GEMV's
prologue (add_rms_norm_linear on the three in-projections and the LM head against add_rms_norm + linear;
gated_rms_norm_linear on the DeltaNet out-projection against gated_rms_norm + linear).
Prefill (M = 2048): `linear` (the tiled GEMM) against F.linear in TFLOP/s, timed inside a CUDA Graph as well.

Writes DIR/bench_gemv.json. Needs a CUDA GPU; prints what it skipped otherwise. Finishes in about a
minute on an H200 (compiling and autotuning included). Sections print and save as they finish, the
decode table first; the SPLIT_K sweep comes last and stops adding points 100 s after the start.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("QWEN_LAB_TUNING_CACHE", "0")  # report what this run times, not an earlier process's record

import qwen_lab  # noqa: E402  (sets up the runtime before any kernel module is imported)
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from qwen_lab import reference, runtime  # noqa: E402
from qwen_lab.config import QWEN35_0_8B as C  # noqa: E402

COPY_BANDWIDTH = 4.2e12  # bytes/s: what a device-to-device copy reaches on the H200 (PERF.md)
CALLS_PER_GRAPH = 20
SPLITS = (1, 2, 4, 8, 16)
PREFILL_M = 2048
SOFT_LIMIT_S = 100.0
DEVICE = "cuda"

# name, K, N, bandwidth target (share of COPY_BANDWIDTH) from PERF.md
SHAPES = [
    ("deltanet_in_proj", C.hidden_size, C.linear_in_proj_dim, 0.70),
    ("attention_qkv", C.hidden_size, C.attn_in_proj_dim, 0.70),
    ("mlp_gate_up", C.hidden_size, 2 * C.intermediate_size, 0.70),
    ("mlp_down", C.intermediate_size, C.hidden_size, 0.70),
    ("out_proj", C.linear_value_dim, C.hidden_size, 0.40),
    ("lm_head", C.hidden_size, C.vocab_size, 0.85),
]


def time_graph(calls) -> float:
    """Microseconds per call: `calls` captured in one CUDA Graph (warmed up first on a side stream), replayed."""
    from qwen_lab.kernels import graph_time_us

    return graph_time_us(calls, warmup=True, replays=50)


def copy_bandwidth() -> float:
    """Measured device-to-device copy bandwidth in bytes/s (read + write of 1 GiB)."""
    import triton.testing

    src = torch.empty(2**29, dtype=torch.bfloat16, device=DEVICE)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=50, return_mode="median")
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


class Rotation:
    """Copies of one weight (and matching x, out) so that CALLS_PER_GRAPH calls exceed 2x the L2 cache."""

    def __init__(self, K, N, l2_bytes, gen, M=1, x_width=None):
        weight_bytes = 2 * N * K
        self.copies = min(CALLS_PER_GRAPH, max(2, math.ceil(2 * l2_bytes / weight_bytes)))
        scale = K ** -0.5
        self.weights = [(torch.randn(N, K, generator=gen, device=DEVICE) * scale).to(torch.bfloat16)
                        for _ in range(self.copies)]
        self.xs = [torch.randn(M, x_width or K, generator=gen, device=DEVICE).to(torch.bfloat16)
                   for _ in range(self.copies)]
        self.outs = [torch.empty(M, N, dtype=torch.bfloat16, device=DEVICE) for _ in range(self.copies)]

    def calls(self, fn):
        """CALLS_PER_GRAPH callables fn(x, w, out), cycling through the copies."""
        return [(lambda i=i % self.copies: fn(self.xs[i], self.weights[i], self.outs[i]))
                for i in range(CALLS_PER_GRAPH)]


def read_floor_us(rot, block: int) -> float:
    """Microseconds per call of the least a GEMV must do: stream W once (one program per `block` values, each summing
    its slice to one float), timed like the GEMV. What is left between this and the GEMV's time is the GEMV's own
    cost; what is left between this and the copy bandwidth is the price of one kernel's ramp-up and tail."""
    sink = torch.empty(triton.cdiv(rot.weights[0].numel(), block), dtype=torch.float32, device=DEVICE)

    def stream(x, w, o):
        _stream_kernel[(sink.numel(),)](w, sink, w.numel(), BLOCK=block, num_warps=4)
    return time_graph(rot.calls(stream))


@triton.jit
def _stream_kernel(w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    w = tl.load(w_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_first")
    tl.store(out_ptr + tl.program_id(0), tl.sum(w.to(tl.float32)))


def decode_rows(gen, l2_bytes, bw_measured):
    """qwen_lab's linear at M = 1 for every shape, with torch's F.linear and torch.mv beside it."""
    from qwen_lab.kernels import gemm

    rows = []
    for name, K, N, target in SHAPES:
        rot = Rotation(K, N, l2_bytes, gen)
        nbytes = 2 * (N * K + K + N)
        ref = reference.linear(rot.xs[0], rot.weights[0])
        err = (gemm.linear(rot.xs[0], rot.weights[0]).float() - ref.float()).abs().max().item()
        us = time_graph(rot.calls(lambda x, w, o: gemm.linear(x, w, out=o)))
        config = str(gemm.tuning.last_plan[1]) if gemm.tuning.last_plan else "-"
        # the first-call timing's measurements of this shape, fastest first: how close the runners-up came
        timed = sorted(gemm.gemv_plan_times(1, N, K, device=DEVICE).items(), key=lambda kv: kv[1])
        runners = [dict(us=t, split=p[0], config=str(p[1])) for p, t in timed[:4]]
        # the SPLIT_K `linear` used: timed per narrow shape on the first call, else the heuristic's
        split = gemm.chosen_split_k(1, N, K, dtype=torch.bfloat16, device=DEVICE)
        us_torch = time_graph(rot.calls(lambda x, w, o: F.linear(x, w)))  # F.linear has no out=
        us_mv = time_graph(rot.calls(lambda x, w, o: torch.mv(w, x[0], out=o[0])))
        floor = min(read_floor_us(rot, block) for block in (4096, 8192, 16384))
        pct = nbytes / (us * 1e-6) / COPY_BANDWIDTH
        rows.append(dict(name=name, K=K, N=N, MB=nbytes / 1e6, us=us, GBps=nbytes / (us * 1e-6) / 1e9,
                         pct_of_copy=pct, pct_of_measured_copy=nbytes / (us * 1e-6) / bw_measured, target=target,
                         passed=pct >= target, split_k=split, config=config, timed_plans=runners, max_abs_err=err,
                         torch_linear_us=us_torch, torch_mv_us=us_mv, weight_copies=rot.copies,
                         read_floor_us=floor, read_floor_pct_of_copy=nbytes / (floor * 1e-6) / COPY_BANDWIDTH))
        del rot
        torch.cuda.empty_cache()
    return rows


def swiglu_row(gen, l2_bytes):
    """The MLP's down projection at decode: silu_mul then linear, against swiglu_down (SwiGLU as the GEMV prologue)."""
    from qwen_lab.kernels import activations, gemm

    I, H = C.intermediate_size, C.hidden_size
    rot = Rotation(I, H, l2_bytes, gen, x_width=2 * I)
    act = torch.empty(1, I, dtype=torch.bfloat16, device=DEVICE)
    row = dict(silu_mul_then_linear_us=time_graph(
        rot.calls(lambda gu, w, o: gemm.linear(activations.silu_mul(gu, out=act), w, out=o))))
    row["swiglu_down_us"] = time_graph(rot.calls(lambda gu, w, o: activations.swiglu_down(gu, w, out=o)))
    ref = reference.linear(reference.silu_mul(rot.xs[0]), rot.weights[0])
    row["max_abs_err"] = (activations.swiglu_down(rot.xs[0], rot.weights[0]).float() - ref.float()).abs().max().item()
    return row


def fused_norm_rows(gen, l2_bytes):
    """Norm + projection at decode, one fused launch against the two kernels it replaces (times per call)."""
    from qwen_lab.kernels import gemm, norms

    eps = C.rms_norm_eps
    H = C.hidden_size
    rows = []
    nw = (torch.randn(H, generator=gen, device=DEVICE) * 0.1).to(torch.bfloat16)
    res = torch.randn(1, H, generator=gen, device=DEVICE).to(torch.bfloat16)
    h_buf, s_buf = torch.empty(1, H, dtype=torch.bfloat16, device=DEVICE), torch.empty_like(res)
    for name, K, N, _ in SHAPES:
        if K != H:
            continue
        rot = Rotation(K, N, l2_bytes, gen)
        nbytes = 2 * (N * K + 3 * K + N)

        def separate(x, w, o):
            h, _ = norms.add_rms_norm(x, res, nw, eps, out=h_buf, residual_out=s_buf)
            return gemm.linear(h, w, out=o)

        us_sep = time_graph(rot.calls(separate))
        us_fused = time_graph(rot.calls(
            lambda x, w, o: gemm.add_rms_norm_linear(x, res, nw, eps, w, out=o, residual_out=s_buf)))
        y_ref, _ = reference.add_rms_norm_linear(rot.xs[0], res, nw, eps, rot.weights[0])
        y, _ = gemm.add_rms_norm_linear(rot.xs[0], res, nw, eps, rot.weights[0])
        rows.append(dict(op="add_rms_norm_linear", name=name, K=K, N=N, fused_us=us_fused, separate_us=us_sep,
                         fused_pct_of_copy=nbytes / (us_fused * 1e-6) / COPY_BANDWIDTH,
                         max_abs_err=(y.float() - y_ref.float()).abs().max().item()))
        del rot
        torch.cuda.empty_cache()
    # the DeltaNet's output: gated norm of o [1, Hv, Dv] with z a slice of the in-projection, then out_proj
    Hv, Dv, cd = C.linear_num_value_heads, C.linear_value_head_dim, C.linear_conv_dim
    K, N = Hv * Dv, H
    rot = Rotation(K, N, l2_bytes, gen)
    proj = torch.randn(1, C.linear_in_proj_dim, generator=gen, device=DEVICE).to(torch.bfloat16)
    z = proj[:, cd:cd + K].unflatten(1, (Hv, Dv))
    gnw = torch.rand(Dv, generator=gen, device=DEVICE) + 0.5
    g_buf = torch.empty(1, Hv, Dv, dtype=torch.bfloat16, device=DEVICE)

    def separate_gated(x, w, o):
        h = norms.gated_rms_norm(x.view(1, Hv, Dv), z, gnw, eps, out=g_buf)
        return gemm.linear(h.view(1, K), w, out=o)

    us_sep = time_graph(rot.calls(separate_gated))
    us_fused = time_graph(rot.calls(lambda x, w, o: gemm.gated_rms_norm_linear(x.view(1, Hv, Dv), z, gnw, eps, w,
                                                                             out=o)))
    o3 = rot.xs[0].view(1, Hv, Dv)
    err = (gemm.gated_rms_norm_linear(o3, z, gnw, eps, rot.weights[0]).float()
           - reference.gated_rms_norm_linear(o3, z, gnw, eps, rot.weights[0]).float()).abs().max().item()
    rows.append(dict(op="gated_rms_norm_linear", name="out_proj", K=K, N=N, fused_us=us_fused, separate_us=us_sep,
                     fused_pct_of_copy=2 * (N * K + 2 * K + N) / (us_fused * 1e-6) / COPY_BANDWIDTH,
                     max_abs_err=err))
    del rot
    torch.cuda.empty_cache()
    return rows


def sweep_rows(gen, l2_bytes, deadline):
    """linear_splitk at SPLIT_K = 1, 2, 4, 8, 16 per shape: atomic, and deterministic for the narrower shapes."""
    from qwen_lab.kernels import gemm

    sweeps = []
    for name, K, N, _ in SHAPES:
        rot = Rotation(K, N, l2_bytes, gen)
        sweep = dict(name=name, K=K, N=N, atomic={}, deterministic={})
        for mode, det in [("atomic", False)] + ([("deterministic", True)] if N <= 8192 else []):
            for s in SPLITS:
                if time.time() > deadline:
                    sweep["truncated"] = True
                    break
                sweep[mode][s] = time_graph(rot.calls(
                    lambda x, w, o, s=s, det=det: gemm.linear_splitk(x, w, split_k=s, deterministic=det, out=o)))
        sweeps.append(sweep)
        del rot
        torch.cuda.empty_cache()
    return sweeps


def prefill_rows(gen):
    from qwen_lab.kernels import gemm

    rows = []
    for name, K, N, _ in SHAPES:
        x = torch.randn(PREFILL_M, K, generator=gen, device=DEVICE).to(torch.bfloat16)
        w = (torch.randn(N, K, generator=gen, device=DEVICE) * K ** -0.5).to(torch.bfloat16)
        out = torch.empty(PREFILL_M, N, dtype=torch.bfloat16, device=DEVICE)
        gemm.linear(x, w, out=out)  # compile + autotune
        err = (out.float() - (x.float() @ w.float().t())).abs().max().item() if N <= 16384 else None
        # 10 calls to a CUDA Graph, as the model's prefill replays them: timed from Python one call at a time, the
        # launch overhead of the smaller GEMMs (13-60 us of GPU time) would be part of the number
        calls = 2 if N > 16384 else 10
        ms = time_graph([lambda x=x, w=w, out=out: gemm.linear(x, w, out=out)] * calls) / 1e3
        ms_torch = time_graph([lambda x=x, w=w: F.linear(x, w)] * calls) / 1e3
        flops = 2 * PREFILL_M * N * K
        rows.append(dict(name=name, M=PREFILL_M, K=K, N=N, ms=ms, tflops=flops / (ms * 1e-3) / 1e12,
                         torch_ms=ms_torch, torch_tflops=flops / (ms_torch * 1e-3) / 1e12,
                         config=str(gemm.matmul_kernel.best_config), max_abs_err=err))
        del x, w, out
        torch.cuda.empty_cache()
    return rows


def prefill_config_rows(gen):
    """Every tiled-GEMM candidate the autotuner may pick for each prefill shape (and the gate/up projection with the
    SwiGLU epilogue), launched past the autotuner and timed 10 calls to a CUDA Graph: the kernel's own time, with
    no launch overhead. -> per shape, [(config, us)] fastest first, and F.linear's us."""
    from qwen_lab.kernels import gemm
    from qwen_lab.kernels.gemm import tiled, tuning

    rows = []
    cases = [(name, K, N, False) for name, K, N, _ in SHAPES if N <= 16384]
    cases.append(("mlp_gate_up+silu", C.hidden_size, 2 * C.intermediate_size, True))
    for name, K, N, swiglu in cases:
        x = torch.randn(PREFILL_M, K, generator=gen, device=DEVICE).to(torch.bfloat16)
        w = (torch.randn(N, K, generator=gen, device=DEVICE) * K ** -0.5).to(torch.bfloat16)
        n_out = N // 2 if swiglu else N
        out = torch.empty(PREFILL_M, n_out, dtype=torch.bfloat16, device=DEVICE)
        configs = tuning._prune_matmul_configs(tuning._matmul_all_configs(), {}, SWIGLU=swiglu,
                                               TMA_OK=tiled._tma_ok(x, w))

        timed = []
        for c in configs:
            try:
                timed.append((str(c), time_graph([lambda c=c, x=x, w=w, out=out, swiglu=swiglu:
                                                  gemm.matmul_with_config(x, w, out, c, swiglu)] * 10)))
            except Exception as e:  # a configuration that does not fit this GPU: reported, not fatal
                timed.append((f"{c} ({type(e).__name__})", float("inf")))
        timed.sort(key=lambda t: t[1])
        torch_us = time_graph([lambda x=x, w=w: F.linear(x, w)] * 10)
        rows.append(dict(name=name, K=K, N=N, swiglu=swiglu, torch_us=torch_us,
                         configs=[dict(config=c, us=us, tflops=2 * PREFILL_M * N * K / (us * 1e-6) / 1e12)
                                  for c, us in timed]))
        del x, w, out
        torch.cuda.empty_cache()
    return rows


def print_prefill_configs(rows):
    print("\nPrefill GEMM candidates, M = 2048, each timed 10 calls to a CUDA Graph (us per call, TFLOP/s)")
    for r in rows:
        print(f"{r['name']} {r['K']}->{r['N']}: F.linear {r['torch_us']:.1f} us "
              f"({2 * PREFILL_M * r['N'] * r['K'] / (r['torch_us'] * 1e-6) / 1e12:.0f} TFLOP/s)")
        for c in r["configs"][:6]:
            print(f"    {c['us']:7.1f} us {c['tflops']:5.0f}  {c['config']}")


def print_decode(result):
    print(f"{result['gpu']}, {result['sm_count']} SMs, L2 {result['l2_bytes'] / 2**20:.0f} MiB; measured copy "
          f"bandwidth {result['copy_bandwidth_GBps']:.0f} GB/s; bars are shares of {COPY_BANDWIDTH / 1e9:.0f} GB/s")
    print("\nDecode GEMV, M = 1, bf16, per call inside a CUDA Graph (20 calls per graph, weights rotated past L2)")
    print(f"{'shape':18s} {'K->N':>13s} {'MB':>6s} {'us':>7s} {'GB/s':>6s} {'%copy':>6s} {'target':>6s} {'':4s} "
          f"{'split':>5s} {'F.linear':>8s} {'mv':>7s} {'read W':>11s}")
    for r in result["decode"]:
        print(f"{r['name']:18s} {r['K']:>5d}->{r['N']:<7d} {r['MB']:6.1f} {r['us']:7.2f} {r['GBps']:6.0f} "
              f"{100 * r['pct_of_copy']:5.0f}% {100 * r['target']:5.0f}% {'pass' if r['passed'] else 'FAIL':4s} "
              f"{r['split_k']:5d} {r['torch_linear_us']:8.2f} {r['torch_mv_us']:7.2f} "
              f"{r['read_floor_us']:6.2f} {100 * r['read_floor_pct_of_copy']:3.0f}%  {r['config']}")
    print(f"{sum(r['passed'] for r in result['decode'])} of {len(result['decode'])} decode shapes meet their bar "
          f"(the last column: the plan the first-call timing kept; PERSIST marks the persistent form; 'read W': "
          f"a kernel that only streams W once, timed the same way, and its share of the copy bandwidth)")
    print("\nThe first-call timing's four fastest plans per shape (us per call, SPLIT_K, config):")
    for r in result["decode"]:
        for p in r["timed_plans"]:
            print(f"  {r['name']:18s} {p['us']:7.2f} {p['split']:3d}  {p['config']}")


def print_swiglu(f):
    print(f"\nMLP down at decode: silu_mul + linear {f['silu_mul_then_linear_us']:.2f} us, "
          f"fused swiglu_down {f['swiglu_down_us']:.2f} us")


def print_fused_norms(rows):
    print("\nNorm fused into the GEMV prologue at decode (us per call inside a CUDA Graph)")
    print(f"{'op':22s} {'shape':18s} {'K->N':>13s} {'fused':>7s} {'%copy':>6s} {'norm+linear':>11s} {'saved':>6s}")
    for r in rows:
        print(f"{r['op']:22s} {r['name']:18s} {r['K']:>5d}->{r['N']:<7d} {r['fused_us']:7.2f} "
              f"{100 * r['fused_pct_of_copy']:5.0f}% {r['separate_us']:11.2f} {r['separate_us'] - r['fused_us']:6.2f}")


def print_prefill(rows):
    print(f"\nPrefill GEMM, M = {PREFILL_M}, bf16")
    print(f"{'shape':18s} {'K->N':>13s} {'ms':>8s} {'TFLOP/s':>8s} {'torch ms':>9s} {'TFLOP/s':>8s}")
    for r in rows:
        print(f"{r['name']:18s} {r['K']:>5d}->{r['N']:<7d} {r['ms']:8.3f} {r['tflops']:8.1f} {r['torch_ms']:9.3f} "
              f"{r['torch_tflops']:8.1f}  {r['config']}")


def print_sweep(sweeps):
    print("\nSPLIT_K sweep (us per call)")
    print(f"{'shape':18s} {'mode':13s} " + " ".join(f"{s:>7d}" for s in SPLITS))
    for sw in sweeps:
        for mode in ("atomic", "deterministic"):
            if sw[mode]:
                print(f"{sw['name']:18s} {mode:13s} " + " ".join(
                    f"{sw[mode][s]:7.2f}" if s in sw[mode] else f"{'-':>7s}" for s in SPLITS))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=".", help="directory for bench_gemv.json (default: here)")
    parser.add_argument("--sections", default="decode,swiglu,norms,prefill,sweep",
                        help="which tables to measure, comma-separated (default: all of them but prefill_configs, "
                        "which times every tiled-GEMM candidate of each prefill shape)")
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_gemv.json")

    if not torch.cuda.is_available() or runtime.interpreter_active():
        msg = "skipped: bench_gemv needs a CUDA GPU (this machine runs kernels in the Triton interpreter)"
        print(msg)
        with open(path, "w") as fh:
            json.dump({"skipped": msg}, fh, indent=1)
        return 0

    started = time.time()
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 * 2**20)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    result = dict(gpu=props.name, sm_count=props.multi_processor_count, l2_bytes=l2_bytes,
                  reference_bandwidth_GBps=COPY_BANDWIDTH / 1e9, torch=torch.__version__, triton=triton.__version__,
                  deterministic_env=os.environ.get("QWEN_LAB_DETERMINISTIC", ""))

    def save():
        result["elapsed_s"] = time.time() - started
        with open(path, "w") as fh:
            json.dump(result, fh, indent=1)

    # Each section prints and saves as soon as it is done, most important first: a run cut short by a
    # timeout still leaves the decode table.
    result["copy_bandwidth_GBps"] = copy_bandwidth() / 1e9
    if "decode" in sections:
        result["decode"] = decode_rows(gen, l2_bytes, result["copy_bandwidth_GBps"] * 1e9)
        save()
        print_decode(result)
    if "swiglu" in sections:
        result["swiglu_down"] = swiglu_row(gen, l2_bytes)
        save()
        print_swiglu(result["swiglu_down"])
    if "norms" in sections:
        result["fused_norms"] = fused_norm_rows(gen, l2_bytes)
        save()
        print_fused_norms(result["fused_norms"])
    if "prefill" in sections:
        result["prefill"] = prefill_rows(gen)
        save()
        print_prefill(result["prefill"])
    if "prefill_configs" in sections:
        result["prefill_configs"] = prefill_config_rows(gen)
        save()
        print_prefill_configs(result["prefill_configs"])
    if "sweep" in sections:
        result["split_sweep"] = sweep_rows(gen, l2_bytes, started + SOFT_LIMIT_S)
        save()
        print_sweep(result["split_sweep"])
    print(f"\n{result['elapsed_s']:.0f} s; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
