"""Probe: the DeltaNet scan launched beside the prep's last programs (waiting for each group of chunks through
counters) against the scan launched after the whole prep.

    python benchmarks/probe_scan_overlap.py [--tokens 2048]        (an NVIDIA GPU with PDL: sm_90 or newer)

1. `deltanet_chunked` at Qwen3.5-0.8B's shapes, 18 calls (one per DeltaNet layer) in one CUDA Graph, each way;
   the outputs of the two ways must be equal bit for bit.
2. The whole model's prefill and decode step (random weights of the real shapes), as `python -m qwen_lab.bench`
   times its triton + cuda-graph row, each way.
"""

import torch
from probe_ab import deltanet_layers_ab, model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__)
    if args is None:
        return 0
    from qwen_lab.kernels import deltanet

    T = args.tokens
    results = deltanet_layers_ab(lambda on: setattr(deltanet, "SCAN_BESIDE_PREP", on), "scan beside the prep", T)
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
