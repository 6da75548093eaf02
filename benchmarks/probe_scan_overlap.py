"""Probe: the DeltaNet scan launched beside the prep's last programs (waiting for each group of chunks through
counters) against the scan launched after the whole prep.

    python benchmarks/probe_scan_overlap.py [--tokens 2048]        (an NVIDIA GPU with PDL: sm_90 or newer)

1. `deltanet_chunked` at Qwen3.5-0.8B's shapes, 18 calls (one per DeltaNet layer) in one CUDA Graph, each way;
   the outputs of the two ways must be equal bit for bit.
2. The whole model's prefill and decode step (random weights of the real shapes), as `python -m qwen_lab.bench`
   times its triton + cuda-graph row, each way.
"""

import torch
from probe_ab import model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__)
    if args is None:
        return 0
    from bench_deltanet import layer_inputs  # a DeltaNet layer's inputs at 0.8B's shapes, as the model passes them

    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import deltanet, graph_time_us

    T, H, D = args.tokens, cfg.linear_num_value_heads, cfg.linear_key_head_dim
    dev, bf = "cuda", torch.bfloat16
    d = layer_inputs(T, torch.Generator(device=dev).manual_seed(0))
    q, k, v, a, b, A_log, dt_bias = (d[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias"))
    states = [d["state"].clone() for _ in range(cfg.num_hidden_layers)]
    outs = [torch.empty(T, H, D, device=dev, dtype=bf) for _ in states]
    ws = deltanet.chunk_workspace(T, H, D, D, bf, dev)
    layers = sum(t == "linear_attention" for t in cfg.layer_types)
    calls = [lambda i=i: deltanet.deltanet_chunked(q, k, v, a, b, A_log, dt_bias, states[i], out=outs[i],
                                                   workspace=ws) for i in range(layers)]
    results = {}
    for beside in (False, True, False, True):
        deltanet.SCAN_BESIDE_PREP = beside
        start = [s.clone() for s in states]
        us = graph_time_us(calls, warmup=True, replays=10)
        for s, s0 in zip(states, start):
            s.copy_(s0)
        calls[0]()
        torch.cuda.synchronize()
        results.setdefault(beside, []).append((us, outs[0].clone(), states[0].clone()))
        for s, s0 in zip(states, start):
            s.copy_(s0)
        print(f"deltanet_chunked, T={T}, {layers} calls in a graph, scan beside the prep={beside}: "
              f"{us:.2f} us per call", flush=True)
    same = all(torch.equal(results[True][i][1], results[False][0][1]) and
               torch.equal(results[True][i][2], results[False][0][2]) for i in range(2))
    print(f"outputs and states of the two ways bitwise equal: {same}")
    print("tuned:", {str(k_): str(v_) for k_, v_ in getattr(deltanet.chunk_scan_kernel, "cache", {}).items()})
    if args.no_model:
        return 0 if same else 1

    model_ab(lambda on: setattr(deltanet, "SCAN_BESIDE_PREP", on), "scan beside the prep", T)
    from qwen_lab.kernels import gemm
    for key, config in gemm.matmul_kernel.cache.items():
        if key[3] is True:  # the SwiGLU GEMM's entries (the key: M_BUCKET, N, K, SWIGLU, TMA_OK, dtypes)
            print("SwiGLU GEMM pick:", key, config, flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
