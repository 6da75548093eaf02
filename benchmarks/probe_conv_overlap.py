"""Probe: a prompt's DeltaNet conv with the chunk prep starting on the rows it has finished
(`deltanet_conv_chunked`), against the conv then `deltanet_chunked` (the prep waiting for the whole conv).

    python benchmarks/probe_conv_overlap.py [--tokens 2048]        (an NVIDIA GPU with PDL: sm_90 or newer)

1. The two ways at Qwen3.5-0.8B's shapes, 18 layers' calls (one per DeltaNet layer) in one CUDA Graph, alternated;
   their outputs and final states must be equal bit for bit, and the counters back at zero.
2. The whole model's prefill and decode step (random weights of the real shapes), as `python -m qwen_lab.bench`
   times its triton + cuda-graph row, each way (model.CONV_BESIDE_PREP), and which was faster.
"""

import torch
from probe_ab import model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__)
    if args is None:
        return 0
    from qwen_lab import model as model_module, reference
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import conv1d, deltanet, graph_time_us

    T, dev, bf = args.tokens, "cuda", torch.bfloat16
    Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    Dk, Dv, W = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
    C = cfg.linear_conv_dim
    gen = torch.Generator(device=dev).manual_seed(0)
    layers = cfg.num_linear_layers
    proj = torch.randn(T, C + 2 * Hv, generator=gen, device=dev).to(bf)   # [qkv | a | b] of an in-projection
    qkv, a, b = proj[:, :C], proj[:, C:C + Hv], proj[:, C + Hv:]
    conv_w = (torch.randn(C, W, generator=gen, device=dev) * 0.5).to(bf)
    A_log = torch.rand(Hv, generator=gen, device=dev).add(0.05).log()
    dt_bias = torch.randn(Hv, generator=gen, device=dev) - 1.0
    conv_states = [torch.randn(C, W - 1, generator=gen, device=dev).to(bf) for _ in range(layers)]
    states = [torch.randn(Hv, Dk, Dv, generator=gen, device=dev) * 0.5 for _ in range(layers)]
    outs = [torch.empty(T, Hv, Dv, device=dev, dtype=bf) for _ in range(layers)]
    ws = deltanet.chunk_workspace(T, Hv, Dk, Dv, bf, dev)

    def beside(i):
        deltanet.deltanet_conv_chunked(qkv, conv_w, conv_states[i], a, b, A_log, dt_bias, states[i], Hk, Dk, Hv, Dv,
                                       out=outs[i], workspace=ws)

    def apart(i):  # what the model runs with the switch off (each way's conv output allocated per call)
        y = conv1d.causal_conv1d(qkv, conv_w, conv_states[i])
        deltanet.deltanet_chunked(*reference.split_qkv(y, Hk, Dk, Hv, Dv), a, b, A_log, dt_bias, states[i],
                                  out=outs[i], workspace=ws)

    start = [(c.clone(), s.clone()) for c, s in zip(conv_states, states)]

    def reset():
        for (c0, s0), c, s in zip(start, conv_states, states):
            c.copy_(c0)
            s.copy_(s0)

    results = {}
    for way, fn in (("apart", apart), ("beside", beside), ("apart", apart), ("beside", beside)):
        reset()
        us = graph_time_us([lambda i=i: fn(i) for i in range(layers)], warmup=True, replays=10)
        reset()
        fn(0)
        torch.cuda.synchronize()
        results.setdefault(way, []).append((us, outs[0].clone(), states[0].clone(), conv_states[0].clone()))
        print(f"conv + chunked delta rule, T={T}, {layers} layers in a graph, {way}: {us:.2f} us per layer", flush=True)
    same = all(all(torch.equal(x, y) for x, y in zip(results["beside"][i][1:], results["apart"][0][1:]))
               for i in range(2))
    clear = int(deltanet._tickets(torch.device(dev), 1).abs().sum()) == 0
    print(f"outputs and states of the two ways bitwise equal: {same}; counters back at zero: {clear}")
    if args.no_model:
        return 0 if same and clear else 1

    model_ab(lambda on: setattr(model_module, "CONV_BESIDE_PREP", on), "conv beside the prep", T)
    return 0 if same and clear else 1


if __name__ == "__main__":
    raise SystemExit(main())
