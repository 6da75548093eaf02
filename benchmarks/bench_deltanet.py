"""Gated DeltaNet timings on Qwen3.5-0.8B shapes (bf16 inputs, fp32 state, one GPU).

    python benchmarks/bench_deltanet.py [--out DIR] [--tokens 2048] [--no-fla]

Prefill of T tokens (16 q/k and 16 value heads of 128; q, k, v strided views of the conv output, as the
model passes them):
- qwen_lab's `delta_rule_chunked` eagerly (two launches from Python, what the model's prefill pays) and
  captured in a CUDA Graph (the kernels alone), with its per-kernel device times from torch.profiler;
- flash-linear-attention's `chunk_gated_delta_rule` on the same inputs (made contiguous, with its own l2norm:
  `use_qk_l2norm_in_kernel=True`), eagerly and, if it captures, in a graph; when `fla` imports;
- `delta_rule_recurrent` on the same T tokens, one token after the other, for scale;
- the relative error of each output (and final state) against qwen_lab.reference.
Decode, one token: each DeltaNet kernel of a layer's step (conv1d, gates, the recurrent rule, the fused
gates + rule, conv + fused) timed inside a CUDA Graph the way the model runs it: one call per layer-like copy
of the state, enough copies to exceed twice the L2 cache so every state is read from memory, median replay
time divided by the calls; the state's bytes (read + write) per call against the copy bandwidth; and one
eager call, whose time is mostly the launch.
The autotuner's choice and its timing of every config are recorded for each autotuned kernel.

Writes DIR/bench_deltanet.json. Needs a CUDA GPU; prints what it skipped otherwise. About a minute on an
H200 with compiling and autotuning (flash-linear-attention's own autotuning included).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("QWEN_LAB_TUNING_CACHE", "0")  # report what this run times, not an earlier process's record

import qwen_lab  # noqa: E402,F401  (sets up the runtime before any kernel module is imported)
from qwen_lab import reference, runtime  # noqa: E402
from qwen_lab.course import checks  # noqa: E402
from qwen_lab.config import QWEN35_0_8B as C  # noqa: E402

COPY_BANDWIDTH = 4.2e12  # bytes/s, device-to-device copy on the H200 (PERF.md)
DEVICE = "cuda"
DTYPE = torch.bfloat16
HK, HV, DK, DV = C.linear_num_key_heads, C.linear_num_value_heads, C.linear_key_head_dim, C.linear_value_head_dim
CONV_DIM, W = C.linear_conv_dim, C.linear_conv_kernel_dim


def ms_of(fn, rep=60) -> float:
    import triton.testing
    return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def graph_us(calls) -> float:
    """Microseconds per call: `calls` captured in one CUDA Graph (warmed up first on a side stream), replayed."""
    from qwen_lab.kernels import graph_time_us

    return graph_time_us(calls, warmup=True, replays=50)


def tuner_report(kernel) -> dict:
    """The autotuner's pick and its median time (ms) for every config it tried."""
    best = getattr(kernel, "best_config", None)
    timings = getattr(kernel, "configs_timings", None) or {}
    return dict(best=str(best) if best is not None else None,
                timings_ms={str(c): (t[0] if isinstance(t, (list, tuple)) else t) for c, t in timings.items()})


def layer_inputs(T, gen, hv: int = HV):
    """What a DeltaNet layer's kernels receive: views of the in-projection / conv output, gates, a state. `hv`
    value heads against the 0.8B's key heads and head sizes (the larger Qwen3.5s have 32 or 48 against 16)."""
    conv_dim = 2 * HK * DK + hv * DV                      # q, k, v channels (the 0.8B's linear_conv_dim at hv = HV)
    proj = torch.randn(T, conv_dim + hv * DV + 2 * hv, generator=gen, device=DEVICE).to(DTYPE)  # + z, b, a
    conv_out = torch.nn.functional.silu(torch.randn(T, conv_dim, generator=gen, device=DEVICE)).to(DTYPE)
    kd = HK * DK
    q = conv_out[:, :kd].unflatten(1, (HK, DK))
    k = conv_out[:, kd:2 * kd].unflatten(1, (HK, DK))
    v = conv_out[:, 2 * kd:].unflatten(1, (hv, DV))
    b = proj[:, conv_dim + hv * DV:conv_dim + hv * DV + hv]
    a = proj[:, conv_dim + hv * DV + hv:]
    A_log = torch.empty(hv, device=DEVICE).uniform_(0.05, 4.0, generator=gen).log()
    dt_bias = torch.randn(hv, generator=gen, device=DEVICE) - 1.0
    g, beta = reference.deltanet_gates(a, b, A_log, dt_bias)
    state = torch.randn(hv, DK, DV, generator=gen, device=DEVICE) * 0.5
    return dict(proj=proj, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, g=g, beta=beta, state=state)


def prefill(T, gen, use_fla, result):
    from qwen_lab.kernels import deltanet
    from qwen_lab.kernels.deltanet import tuning

    d = layer_inputs(T, gen)
    qkvgb = [d[n] for n in ("q", "k", "v", "g", "beta")]
    ref_state = d["state"].clone()
    ref = reference.delta_rule_chunked(*qkvgb, ref_state)
    row = dict(tokens=T, heads=f"Hk={HK} Hv={HV} Dk={DK} Dv={DV}")

    out = torch.empty(T, HV, DV, dtype=DTYPE, device=DEVICE)
    ws = deltanet.chunk_workspace(T, HV, DK, DV, DTYPE, DEVICE)
    state = d["state"].clone()
    t0 = time.time()
    deltanet.delta_rule_chunked(*qkvgb, state, out=out, workspace=ws)
    torch.cuda.synchronize()
    row["ours_first_call_s"] = time.time() - t0  # compile + autotune
    state.copy_(d["state"])
    deltanet.delta_rule_chunked(*qkvgb, state, out=out, workspace=ws)
    # Copies: the timed calls below write `out` again (from a state that keeps changing), and so does the
    # recurrent kernel's timing; flash-linear-attention must be compared with this call's results.
    ours_out, ours_state = out.clone(), state.clone()
    row["ours_rel_err_out"] = checks.relative_error(ours_out, ref)
    row["ours_rel_err_state"] = checks.relative_error(ours_state, ref_state)
    scratch = d["state"].clone()  # timed calls keep updating it; the decays keep it bounded
    row["ours_eager_ms"] = ms_of(lambda: deltanet.delta_rule_chunked(*qkvgb, scratch, out=out, workspace=ws))
    row["ours_eager_alloc_ms"] = ms_of(lambda: deltanet.delta_rule_chunked(*qkvgb, scratch))
    row["ours_graph_ms"] = graph_us([lambda: deltanet.delta_rule_chunked(*qkvgb, scratch, out=out, workspace=ws)]) / 1e3
    row["ours_kernels_us"] = profile_kernels(lambda: deltanet.delta_rule_chunked(*qkvgb, scratch, out=out, workspace=ws))
    # the scan's config is picked by its launcher, timed beside the prep (tuning._pick_in_place), not by the autotuner
    scan_picks = tuning._PICKS["chunk_scan_kernel"]
    row["tuning"] = {"chunk_prep_kernel": tuner_report(deltanet.chunk_prep_kernel),
                     "chunk_scan_kernel": {str(k): str(c) for k, c in scan_picks.items()}}

    rec_state = d["state"].clone()
    rec_out = deltanet.delta_rule_recurrent(*qkvgb, rec_state)
    row["recurrent_rel_err_out"] = checks.relative_error(rec_out, ref)
    row["recurrent_eager_ms"] = ms_of(lambda: deltanet.delta_rule_recurrent(*qkvgb, scratch, out=out), rep=30)

    if use_fla:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        except Exception as e:  # not installed here, or a broken install
            row["fla"] = f"not importable: {type(e).__name__}: {e}"
        else:
            row["fla"] = fla_rows(chunk_gated_delta_rule, d, qkvgb, ref, ref_state, ours_out, ours_state)
    result["prefill"] = row


def fla_rows(chunk_gated_delta_rule, d, qkvgb, ref, ref_state, ours_out, ours_state):
    import fla

    q, k, v, g, beta = (x.contiguous()[None] for x in qkvgb)
    init = d["state"].clone()[None]

    def call():
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=init, output_final_state=True,
                                      use_qk_l2norm_in_kernel=True)

    r = dict(version=getattr(fla, "__version__", "?"))
    t0 = time.time()
    o, s = call()
    torch.cuda.synchronize()
    r["first_call_s"] = time.time() - t0
    r["rel_err_out"] = checks.relative_error(o[0], ref)
    r["rel_err_state"] = checks.relative_error(s[0], ref_state)
    r["rel_err_vs_ours"] = checks.relative_error(o[0], ours_out)
    r["rel_err_state_vs_ours"] = checks.relative_error(s[0], ours_state)
    r["eager_ms"] = ms_of(call)
    try:
        r["graph_ms"] = graph_us([call]) / 1e3
    except Exception as e:  # some versions synchronise inside (e.g. to size chunk indices)
        r["graph_ms"] = None
        r["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        torch.cuda.synchronize()
    r["kernels_us"] = profile_kernels(call)
    return r


def profile_kernels(fn, iters=5) -> dict:
    """Average device time per call of each kernel `fn` launches (microseconds), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    times: dict = {}
    for e in prof.key_averages():
        device_us = getattr(e, "device_time_total", None)
        if device_us is None:
            device_us = getattr(e, "cuda_time_total", 0.0)
        if device_us and e.key and not e.key.startswith("Memcpy"):
            times[e.key] = times.get(e.key, 0.0) + device_us / iters
    return dict(sorted(times.items(), key=lambda kv: -kv[1]))


def decode(gen, l2_bytes, result):
    from qwen_lab.kernels import conv1d, deltanet

    state_bytes = HV * DK * DV * 4
    copies = max(16, math.ceil(2 * l2_bytes / state_bytes))
    d = layer_inputs(1, gen)
    q, k, v, a, b, A_log, dt_bias, g, beta = (d[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "g", "beta"))
    states = [d["state"].clone() for _ in range(copies)]
    conv_states = [torch.randn(CONV_DIM, W - 1, generator=gen, device=DEVICE).to(DTYPE) for _ in range(copies)]
    conv_w = torch.randn(CONV_DIM, W, generator=gen, device=DEVICE).to(DTYPE)
    x = d["proj"][:, :CONV_DIM]
    o = torch.empty(1, HV, DV, dtype=DTYPE, device=DEVICE)
    y = torch.empty(1, CONV_DIM, dtype=DTYPE, device=DEVICE)
    g_out, beta_out = torch.empty(1, HV, device=DEVICE), torch.empty(1, HV, device=DEVICE)

    # correctness of the step on these inputs
    ref_state = d["state"].clone()
    ref = reference.delta_rule_recurrent(q, k, v, g, beta, ref_state)
    s = d["state"].clone()
    fused = deltanet.deltanet_decode_step(q, k, v, a, b, A_log, dt_bias, s)
    rows = dict(state_copies=copies, state_MB=state_bytes / 1e6,
                fused_rel_err_out=checks.relative_error(fused, ref), fused_rel_err_state=checks.relative_error(s, ref_state))

    steps = {
        "conv1d": lambda i: conv1d.causal_conv1d(x, conv_w, conv_states[i], out=y),
        "gates": lambda i: deltanet.deltanet_gates(a, b, A_log, dt_bias, g_out=g_out, beta_out=beta_out),
        "delta_rule_recurrent": lambda i: deltanet.delta_rule_recurrent(q, k, v, g, beta, states[i], out=o),
        "deltanet_decode_step": lambda i: deltanet.deltanet_decode_step(q, k, v, a, b, A_log, dt_bias, states[i],
                                                                         out=o),
        "gates_then_recurrent": lambda i: (deltanet.deltanet_gates(a, b, A_log, dt_bias, g_out=g_out,
                                                                   beta_out=beta_out),
                                           deltanet.delta_rule_recurrent(q, k, v, g_out, beta_out, states[i], out=o)),
        "conv1d_then_decode_step": lambda i: (conv1d.causal_conv1d(x, conv_w, conv_states[i], out=y),
                                              deltanet.deltanet_decode_step(q, k, v, a, b, A_log, dt_bias, states[i],
                                                                            out=o)),
    }
    timings = {}
    for name, step in steps.items():
        us = graph_us([lambda i=i, step=step: step(i) for i in range(copies)])
        eager = ms_of(lambda step=step: step(0), rep=30) * 1e3
        row = dict(graph_us=us, eager_us=eager)
        if name in ("delta_rule_recurrent", "deltanet_decode_step"):
            moved = 2 * state_bytes + 2 * (2 * HK * DK + 2 * HV * DV)
            row.update(bytes=moved, GBps=moved / (us * 1e-6) / 1e9, pct_of_copy=moved / (us * 1e-6) / COPY_BANDWIDTH)
        timings[name] = row
    rows["steps"] = timings
    rows["tuning"] = {"delta_rule_recurrent_kernel": tuner_report(deltanet.delta_rule_recurrent_kernel)}
    result["decode"] = rows


def print_tables(result):
    p = result.get("prefill")
    if p:
        print(f"\nPrefill, {p['tokens']} tokens, {p['heads']}, bf16 in / fp32 state")
        print(f"  qwen_lab delta_rule_chunked: eager {p['ours_eager_ms']:.3f} ms (allocating {p['ours_eager_alloc_ms']:.3f}), "
              f"graph {p['ours_graph_ms']:.3f} ms; rel err out {p['ours_rel_err_out']:.2e}, state "
              f"{p['ours_rel_err_state']:.2e}")
        for name, us in p["ours_kernels_us"].items():
            print(f"      {name[:60]:60s} {us:8.1f} us")
        fla = p.get("fla")
        if isinstance(fla, dict):
            graph = f"{fla['graph_ms']:.3f} ms" if fla.get("graph_ms") is not None else "n/a"
            print(f"  fla {fla['version']} chunk_gated_delta_rule: eager {fla['eager_ms']:.3f} ms, graph {graph}; rel err "
                  f"out {fla['rel_err_out']:.2e}, state {fla['rel_err_state']:.2e}; vs ours: out "
                  f"{fla['rel_err_vs_ours']:.2e}, state {fla['rel_err_state_vs_ours']:.2e}")
            for name, us in fla["kernels_us"].items():
                print(f"      {name[:60]:60s} {us:8.1f} us")
        elif fla:
            print(f"  fla: {fla}")
        print(f"  delta_rule_recurrent over the same tokens: {p['recurrent_eager_ms']:.3f} ms "
              f"(rel err {p['recurrent_rel_err_out']:.2e})")
    dd = result.get("decode")
    if dd:
        print(f"\nDecode step, one token, per call inside a CUDA Graph ({dd['state_copies']} state copies of "
              f"{dd['state_MB']:.1f} MB rotated past L2)")
        print(f"  {'step':26s} {'graph us':>9s} {'eager us':>9s} {'GB/s':>7s} {'%copy':>6s}")
        for name, r in dd["steps"].items():
            bw = f"{r['GBps']:7.0f} {100 * r['pct_of_copy']:5.0f}%" if "GBps" in r else ""
            print(f"  {name:26s} {r['graph_us']:9.2f} {r['eager_us']:9.2f} {bw}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=".", help="directory for bench_deltanet.json (default: here)")
    parser.add_argument("--tokens", type=int, default=2048, help="prefill length (default 2048)")
    parser.add_argument("--no-fla", action="store_true", help="skip flash-linear-attention")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench_deltanet.json")

    if not torch.cuda.is_available() or runtime.interpreter_active():
        msg = "skipped: bench_deltanet needs a CUDA GPU (this machine runs kernels in the Triton interpreter)"
        print(msg)
        with open(path, "w") as fh:
            json.dump({"skipped": msg}, fh, indent=1)
        return 0

    import triton

    started = time.time()
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 * 2**20)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    result = dict(gpu=props.name, sm_count=props.multi_processor_count, l2_bytes=l2_bytes, torch=torch.__version__,
                  triton=triton.__version__, reference_bandwidth_GBps=COPY_BANDWIDTH / 1e9, errors={})
    for name, section in (("prefill", lambda: prefill(args.tokens, gen, not args.no_fla, result)),
                          ("decode", lambda: decode(gen, l2_bytes, result))):
        try:
            section()
        except Exception as e:  # keep the other section's numbers; say what broke
            result["errors"][name] = traceback.format_exc()
            print(f"{name} failed: {type(e).__name__}: {e}")
        torch.cuda.empty_cache()
    result["elapsed_s"] = time.time() - started
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    print_tables(result)
    print(f"\n{result['elapsed_s']:.0f} s; wrote {path}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
