"""Probe: the DeltaNet scan carrying the state's transpose (deltanet.SCAN_TRANSPOSED) against the scan carrying S.

    python benchmarks/probe_scan_transposed.py [--tokens 2048] [--no-model]      (an NVIDIA GPU)

The scan is a chain of 32 dependent steps (2048 tokens), ~2 us each, and its time follows its loads more than its
length (docs/perf-log.md, session 23). Carrying S^T, each step's products take the state and V' as their left
operand from registers; carrying S, both are written to shared memory at every step (on the chain) for the Hopper
matmuls to read. The offline sm_90 compile shows the difference where a value block fills one matmul (BV = 64,
4 warps): every wgmma takes its left operand from registers. Whether the steps get shorter is for the GPU to say.

1. `deltanet_chunked` at Qwen3.5-0.8B's shapes, 18 calls (one per DeltaNet layer) in one CUDA Graph, each way,
   alternated twice; the outputs and final states of the two ways compared, and the configs the autotuner picked.
2. The whole model's prefill and decode step (random weights of the real shapes) each way, as
   `python -m qwen_lab.bench` times its triton + cuda-graph row; then the last position's logits of a --tokens
   prompt both ways against transformers in float32 on the same weights.
"""

import torch
from probe_ab import deltanet_layers_ab, last_logits_ab, model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__)
    if args is None:
        return 0
    from qwen_lab import checks
    from qwen_lab.kernels import deltanet

    def switch(on: bool) -> None:
        deltanet.SCAN_TRANSPOSED = on

    results = deltanet_layers_ab(switch, "scan transposed", args.tokens)
    (_, o_off, s_off), (_, o_on, s_on) = results[False][0], results[True][0]
    print(f"S^T against S: output relative error {checks.relative_error(o_on, o_off):.2e}, final state "
          f"{checks.relative_error(s_on, s_off):.2e}", flush=True)
    print("tuned chunk_scan_kernel:", {str(k): str(v) for k, v in deltanet.chunk_scan_kernel.cache.items()}, flush=True)
    switch(False)
    if args.no_model:
        return 0

    from qwen_lab.model import load_model

    model = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
    model_ab(switch, "scan transposed", args.tokens, model=model)
    last_logits_ab(model, switch, "scan transposed", tokens=args.tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
