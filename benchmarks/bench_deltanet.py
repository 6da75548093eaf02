"""Gated DeltaNet (qwen_lab.kernels.deltanet) against PyTorch and flash-linear-attention, at Qwen3.5-0.8B's shapes.

    python benchmarks/bench_deltanet.py [--json FILE] [--rounds N] [--only NAME]

Bf16 inputs, an fp32 state; q, k and v strided views of the conv output, as the model passes them.
- `delta_rule_chunked prefill` (a prompt's tokens): the two launches of the chunked form in a CUDA Graph (the kernels
  alone; the note gives each kernel's device time from torch.profiler and the configs their tuning picked), launched
  eagerly from Python (what the model's prefill pays without graphs), and allocating its output and workspace; the
  recurrent kernel over the same tokens, one after the other, for scale; flash-linear-attention's
  `chunk_gated_delta_rule` on the same inputs (made contiguous, q and k repeated to the value heads, its own l2norm:
  `use_qk_l2norm_in_kernel=True`), a row only on a GPU where `fla` imports.
- one decode token: `deltanet_gates`, `delta_rule_recurrent`, `deltanet_decode_step` (the gates inside, against
  gates then the rule, two launches) and `deltanet_conv_decode_step` (the causal conv inside too, against the conv
  then the decode step), each in a CUDA Graph and launched eagerly (then mostly the launch). Each call gets its own
  copy of the state, as the model's layers do, enough copies to exceed twice the L2 cache: every state is read from
  memory. The conv alone: benchmarks/bench_conv1d.py.
Each checked against qwen_lab.reference: the output and the final state. Bytes: the inputs, the output and the
state read and written once. On the harness of benchmarks/harness.py.
"""

import sys

import torch
import torch.nn.functional as F

from harness import Case, main
from qwen_lab import reference
from qwen_lab.kernels import conv1d, deltanet
from qwen_lab.kernels.deltanet import tuning


def layer_inputs(env, T: int, seed: int, hv: int | None = None) -> dict:
    """What a DeltaNet layer's kernels receive for T tokens: the in-projection's output `proj` (q | k | v | z | b | a
    channels), q, k, v as views of the conv output, the gates' inputs and outputs, a state. `hv` value heads against
    the config's key heads and head sizes (the larger Qwen3.5s have 32 or 48 against 16)."""
    c = env.config
    Hk, Dk, Dv = c.linear_num_key_heads, c.linear_key_head_dim, c.linear_value_head_dim
    hv = hv or c.linear_num_value_heads
    conv_dim, kd = 2 * Hk * Dk + hv * Dv, Hk * Dk
    proj = env.randn(T, conv_dim + hv * Dv + 2 * hv, seed=seed)
    conv_out = F.silu(env.randn(T, conv_dim, seed=seed + 1000, dtype=torch.float32)).to(env.dtype)
    b = proj[:, conv_dim + hv * Dv:conv_dim + hv * Dv + hv]
    a = proj[:, conv_dim + hv * Dv + hv:]
    # A_log = log of a decay rate in [0.05, 4], dt_bias around -1: gates like a trained layer's
    A_log = (env.randn(hv, seed=seed + 2000, dtype=torch.float32).sigmoid() * 3.95 + 0.05).log()
    dt_bias = env.randn(hv, seed=seed + 3000, dtype=torch.float32) - 1.0
    g, beta = reference.deltanet_gates(a, b, A_log, dt_bias)
    return {"proj": proj, "q": conv_out[:, :kd].unflatten(1, (Hk, Dk)),
            "k": conv_out[:, kd:2 * kd].unflatten(1, (Hk, Dk)), "v": conv_out[:, 2 * kd:].unflatten(1, (hv, Dv)),
            "a": a, "b": b, "A_log": A_log, "dt_bias": dt_bias, "g": g, "beta": beta,
            "state": env.randn(hv, Dk, Dv, seed=seed + 4000, scale=0.5, dtype=torch.float32)}


def fla_rule():
    """flash-linear-attention's chunk_gated_delta_rule and its version, or None where it does not import."""
    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception:   # not installed, or a broken install: no row
        return None
    return chunk_gated_delta_rule, getattr(fla, "__version__", "?")


def kernel_times(fn, iters: int = 5) -> str:
    """Each kernel fn launches, with its average device time per call (torch.profiler), longest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    times: dict = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        us = getattr(e, "cuda_time_total", 0.0) if us is None else us
        if us and e.key and not e.key.startswith("Memcpy"):
            times[e.key] = times.get(e.key, 0.0) + us / iters
    return ", ".join(f"{k[:40]} {us:.1f} us" for k, us in sorted(times.items(), key=lambda kv: -kv[1]))


def best_config(kernel) -> str:
    """The pick of the kernel's Triton autotuner (none under the interpreter, or before its first call)."""
    return str(getattr(kernel, "best_config", None))


def with_state(fn, *states):
    """fn(d) -> (its output, then the states it updated in place): what is checked."""
    return lambda d: (fn(d), *(d[s] for s in states))


def prefill_cases(env):
    c, es, T = env.config, env.dtype.itemsize, env.tokens
    Hk, Hv, Dk, Dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    fla = fla_rule() if env.gpu else None   # its kernels do not run in the interpreter

    def inputs(seed):
        d = layer_inputs(env, T, seed)
        d["out"] = torch.empty(T, Hv, Dv, device=env.device, dtype=env.dtype)
        d["ws"] = deltanet.chunk_workspace(T, Hv, Dk, Dv, env.dtype, env.device)
        if fla:   # contiguous, batch first, each q/k head repeated for its value heads; its state a copy
            rep = Hv // Hk
            d["fla"] = [x.repeat_interleave(rep, dim=1).contiguous()[None] for x in (d["q"], d["k"])] + \
                       [d[n].contiguous()[None] for n in ("v", "g", "beta")] + [d["state"].clone()[None]]
        return d

    def qkvgb(d):
        return d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"]

    def chunked(d):
        return deltanet.delta_rule_chunked(*qkvgb(d), out=d["out"], workspace=d["ws"])

    impls = {"triton": with_state(chunked, "state"),
             "triton, eager": with_state(chunked, "state"),
             "triton allocating, eager": with_state(lambda d: deltanet.delta_rule_chunked(*qkvgb(d)), "state"),
             "triton recurrent": with_state(lambda d: deltanet.delta_rule_recurrent(*qkvgb(d), out=d["out"]),
                                            "state"),
             "torch reference": with_state(lambda d: reference.delta_rule_chunked(*qkvgb(d)), "state")}
    notes = {"triton": lambda: chunked_note(env, chunked, inputs(0))}
    if fla:
        rule, version = fla

        def fla_call(d):
            q, k, v, g, beta, s0 = d["fla"]
            o, s = rule(q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
            return o[0], s[0]
        impls[f"fla {version} chunk_gated_delta_rule"] = fla_call
        notes[f"fla {version} chunk_gated_delta_rule"] = (
            lambda: kernel_times(lambda d=inputs(0): fla_call(d)))
    return [Case(
        "delta_rule_chunked prefill", f"T={T} Hk={Hk} Hv={Hv} Dk={Dk} Dv={Dv}", inputs, impls,
        with_state(lambda d: reference.delta_rule_chunked(*qkvgb(d)), "state"),
        bytes=T * (2 * Hk * Dk + 2 * Hv * Dv) * es + 2 * T * Hv * 4 + 2 * Hv * Dk * Dv * 4,
        eager=frozenset({"triton, eager", "triton allocating, eager"}), notes=notes)]


def chunked_note(env, chunked, d) -> str:
    """The chunked form's tuning picks, and on a GPU each of its kernels' device times."""
    said = (f"prep: {best_config(deltanet.chunk_prep_kernel)}; scan: "
            f"{'; '.join(str(c) for c in tuning.picks('chunk_scan_kernel').values()) or 'no pick'}")
    return said + (f"; {kernel_times(lambda: chunked(d))}" if env.gpu else "")


def decode_cases(env):
    c, es = env.config, env.dtype.itemsize
    Hk, Hv, Dk, Dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    C, W = c.linear_conv_dim, c.linear_conv_kernel_dim
    state_bytes = 2 * Hv * Dk * Dv * 4                     # read and written
    qkvo_bytes = (2 * Hk * Dk + 2 * Hv * Dv) * es

    def inputs(seed):
        d = layer_inputs(env, 1, seed)
        d.update(out=torch.empty(1, Hv, Dv, device=env.device, dtype=env.dtype),
                 g_out=torch.empty(1, Hv, device=env.device), beta_out=torch.empty(1, Hv, device=env.device),
                 qkv=d["proj"][:, :C], conv_w=env.randn(C, W, seed=7, scale=0.5),
                 conv_state=env.randn(C, W - 1, seed=seed + 5000),
                 y=torch.empty(1, C, device=env.device, dtype=env.dtype))
        return d

    def gates(d):
        return deltanet.deltanet_gates(d["a"], d["b"], d["A_log"], d["dt_bias"], g_out=d["g_out"],
                                       beta_out=d["beta_out"])

    def recurrent(d):
        return deltanet.delta_rule_recurrent(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"], out=d["out"])

    def step(d, q="q", k="k", v="v"):
        return deltanet.deltanet_decode_step(d[q], d[k], d[v], d["a"], d["b"], d["A_log"], d["dt_bias"],
                                             d["state"], out=d["out"])

    def gates_then_rule(d):
        g, beta = gates(d)
        return deltanet.delta_rule_recurrent(d["q"], d["k"], d["v"], g, beta, d["state"], out=d["out"])

    def conv_step(d):
        return deltanet.deltanet_conv_decode_step(d["qkv"], d["conv_w"], d["conv_state"], d["a"], d["b"], d["A_log"],
                                                  d["dt_bias"], d["state"], Hk, Dk, Hv, Dv, out=d["out"])

    def conv_then_step(d):
        y = conv1d.causal_conv1d(d["qkv"], d["conv_w"], d["conv_state"], out=d["y"])
        kd = Hk * Dk
        d.update(yq=y[:, :kd].unflatten(1, (Hk, Dk)), yk=y[:, kd:2 * kd].unflatten(1, (Hk, Dk)),
                 yv=y[:, 2 * kd:].unflatten(1, (Hv, Dv)))
        return step(d, "yq", "yk", "yv")

    def ref_step(d):
        return reference.deltanet_decode_step(d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"],
                                              d["state"])

    def ref_conv_step(d):
        return reference.deltanet_conv_decode_step(d["qkv"], d["conv_w"], d["conv_state"], d["a"], d["b"], d["A_log"],
                                                   d["dt_bias"], d["state"], Hk, Dk, Hv, Dv)

    def ref_rule(d):
        return reference.delta_rule_recurrent(d["q"], d["k"], d["v"], d["g"], d["beta"], d["state"])

    eager = frozenset({"triton, eager"})
    conv_bytes = (C + C * W + 2 * C * (W - 1)) * es
    return [
        Case("deltanet_gates decode", f"Hv={Hv}", inputs,
             {"triton": gates, "torch reference": lambda d: reference.deltanet_gates(d["a"], d["b"], d["A_log"],
                                                                                     d["dt_bias"])},
             lambda d: reference.deltanet_gates(d["a"], d["b"], d["A_log"], d["dt_bias"]),
             bytes=2 * Hv * es + 2 * Hv * 4 + 2 * Hv * 4),
        Case("delta_rule_recurrent decode", f"Hk={Hk} Hv={Hv} Dk={Dk} Dv={Dv}", inputs,
             {"triton": with_state(recurrent, "state"), "triton, eager": with_state(recurrent, "state"),
              "torch reference": with_state(ref_rule, "state")},
             with_state(ref_rule, "state"), bytes=state_bytes + qkvo_bytes + 2 * Hv * 4, eager=eager,
             notes={"triton": lambda: f"autotuner's pick: {best_config(deltanet.delta_rule_recurrent_kernel)}"}),
        Case("deltanet_decode_step", f"Hk={Hk} Hv={Hv} Dk={Dk} Dv={Dv}", inputs,
             {"triton": with_state(step, "state"), "triton, eager": with_state(step, "state"),
              "triton gates + recurrent": with_state(gates_then_rule, "state"),
              "torch reference": with_state(ref_step, "state")},
             with_state(ref_step, "state"), bytes=state_bytes + qkvo_bytes + 2 * Hv * es, eager=eager),
        Case("deltanet_conv_decode_step", f"C={C} W={W} Hk={Hk} Hv={Hv} Dk={Dk} Dv={Dv}", inputs,
             {"triton": with_state(conv_step, "state", "conv_state"),
              "triton, eager": with_state(conv_step, "state", "conv_state"),
              "triton conv1d + decode step": with_state(conv_then_step, "state", "conv_state"),
              "torch reference": with_state(ref_conv_step, "state", "conv_state")},
             with_state(ref_conv_step, "state", "conv_state"),
             bytes=state_bytes + conv_bytes + Hv * Dv * es + 2 * Hv * es, eager=eager,
             notes={"triton": lambda: "picked: " + ("; ".join(str(c) for c in tuning.picks(
                 "conv_decode_step_kernel").values()) or "none")}),
    ]


def cases(env):
    return prefill_cases(env) + decode_cases(env)


if __name__ == "__main__":
    sys.exit(main("bench_deltanet", cases, __doc__))
