"""What the probes share: their command line, and (the A/B probes) the whole model timed with a switch off and on,
alternated.

A probe compares two ways of running the same kernels (a module-level switch), first at the kernel level, then in
the model's prefill and decode step as `python -m qwen_lab.bench` times its triton + cuda-graph row. Alternating
the two ways in one process is what makes a difference of 1-2% visible: between machines, and between runs, the
prefill moves by more than that.
"""

import argparse

import torch


def probe_args(doc: str, *extra, tokens: bool = True, model: bool = True):
    """A probe's command line, or None where there is no GPU to time on (said so): --tokens (unless tokens=False),
    --no-model (the A/B probes, model=True), and each (flag, add_argument keywords) pair of `extra`."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    if tokens:
        p.add_argument("--tokens", type=int, default=2048)
    if model:
        p.add_argument("--no-model", action="store_true", help="only the kernel timing")
    for flag, options in extra:
        p.add_argument(flag, **options)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: the probe times kernels on an NVIDIA GPU")
        return None
    return args


def decode_setup(tokens: int, spare: int):
    """What the decode-step probes time: Qwen3.5-0.8B's shapes with random weights (bf16, on the GPU), a random
    prompt of `tokens` ids, a cache with `spare` positions past it, the prompt's last token and the next position.
    -> (model, ids, cache, token, pos)"""
    from qwen_lab.model import load_model
    model = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(0)).cuda()
    cache = model.new_cache(tokens + spare)
    return model, ids, cache, ids[-1:].clone(), torch.tensor([tokens], device="cuda")


def model_ab(switch, label: str, tokens: int, rounds: int = 2, metric: str = "prefill", model=None) -> bool:
    """Time the model (random weights of Qwen3.5-0.8B's shapes, bf16; or `model`, when the switch needs it) with
    switch(False) and switch(True), `rounds` times each, alternated; print each run; return whether the switch on
    gave the faster `metric` (prefill or decode)."""
    from qwen_lab import bench
    from qwen_lab.model import load_model

    if model is None:
        model = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
    times = {}
    for on in (False, True) * rounds:
        switch(on)
        r = bench.bench_qwen_lab(model, tokens, 32, graph=True, gen=torch.Generator().manual_seed(0))
        times.setdefault(on, []).append(r[f"{metric}_ms"])
        print(f"model, {label}={on}: prefill {r['prefill_ms']:.3f} ms, decode {r['decode_ms']:.4f} ms per token",
              flush=True)
    faster = min(times[True]) < min(times[False])
    print(f"{label}: the {metric} is faster {'on' if faster else 'off'}", flush=True)
    return faster


def deltanet_layer_calls(tokens: int, value_heads: int | None = None):
    """`deltanet_chunked` at Qwen3.5-0.8B's shapes (or with `value_heads` value heads, as the larger Qwen3.5s
    have), one call per DeltaNet layer (each with its own state and output, all through one workspace), on a
    prompt of `tokens`: -> (calls, states, outputs)."""
    from bench_deltanet import layer_inputs  # a DeltaNet layer's inputs at 0.8B's shapes, as the model passes them
    from harness import Env

    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import deltanet

    H, D = value_heads or cfg.linear_num_value_heads, cfg.linear_key_head_dim
    dev, bf = "cuda", torch.bfloat16
    d = layer_inputs(Env(torch.device(dev), bf, cfg, tokens, True), tokens, seed=0, hv=H)
    q, k, v, a, b, A_log, dt_bias = (d[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias"))
    states = [d["state"].clone() for _ in range(cfg.num_linear_layers)]
    outs = [torch.empty(tokens, H, D, device=dev, dtype=bf) for _ in states]
    ws = deltanet.chunk_workspace(tokens, H, D, D, bf, dev)
    calls = [lambda i=i: deltanet.deltanet_chunked(q, k, v, a, b, A_log, dt_bias, states[i], out=outs[i],
                                                   workspace=ws) for i in range(len(states))]
    return calls, states, outs


def deltanet_layers_ab(switch, label: str, tokens: int, rounds: int = 2, value_heads: int | None = None) -> dict:
    """The DeltaNet layers' calls (deltanet_layer_calls, with `value_heads`) captured in one CUDA Graph, with
    switch(False) and switch(True), `rounds` times each, alternated; prints the us per call of each run and returns
    {on: [(us, the first call's output, its final state), ...]} (each run from the same states)."""
    from qwen_lab.kernels import graph_time_us

    calls, states, outs = deltanet_layer_calls(tokens, value_heads)
    layers, heads = len(calls), outs[0].shape[1]
    results = {}
    for on in (False, True) * rounds:
        switch(on)
        start = [s.clone() for s in states]
        us = graph_time_us(calls, warmup=True, replays=10)
        for s, s0 in zip(states, start):
            s.copy_(s0)
        calls[0]()
        torch.cuda.synchronize()
        results.setdefault(on, []).append((us, outs[0].clone(), states[0].clone()))
        for s, s0 in zip(states, start):
            s.copy_(s0)
        print(f"deltanet_chunked, T={tokens}, Hv={heads}, {layers} calls in a graph, {label}={on}: {us:.2f} us per "
              "call", flush=True)
    return results


def last_logits_ab(model, switch, label: str, tokens: int = 512) -> None:
    """The last position's logits of a `tokens`-token prompt (model.step, as a prefill computes them) with
    switch(False) and switch(True), each against transformers in float32 on the same weights, and the two ways
    against each other; printed. Leaves the switch off."""
    from qwen_lab import bench
    from qwen_lab.course import checks

    ids = torch.randint(0, model.config.vocab_size, (tokens,), generator=torch.Generator().manual_seed(1))
    ids = ids.to(model.device)
    hf32 = bench.transformers_model(model.config, model.weights, model.device, torch.float32)
    with torch.inference_mode():
        truth = hf32(input_ids=ids[None]).logits[0, -1].float()
    del hf32
    got = {}
    for on in (False, True):
        switch(on)
        with torch.inference_mode():
            got[on] = model.step(ids, torch.arange(tokens, device=model.device), model.new_cache(tokens))[0].float()
        print(f"last logits, {label}={on}, against transformers float32: relative error "
              f"{checks.relative_error(got[on], truth):.2e}, argmax "
              f"{'same' if got[on].argmax() == truth.argmax() else 'differs'}", flush=True)
    print(f"{label}: on against off, relative error {checks.relative_error(got[True], got[False]):.2e}", flush=True)
    switch(False)
