"""Probe: the DeltaNet scan in segments (deltanet.SCAN_SEGMENTS) against the one-chain scan.

    python benchmarks/probe_scan_segments.py [--tokens 2048] [--no-model]      (an NVIDIA GPU)

The chunk scan is a chain of 32 dependent steps (2048 tokens) on 64 programs: ~47 us per layer while most SMs
wait. In segments of deltanet.SCAN_GROUP chunks, every segment's state map (M, B) is computed at once, then every
segment's chunks at once from the state it composes (see chunk_segment_kernel): chains of 8 + 2 + 8 steps on
four to eight times the programs.

1. `deltanet_chunked` at Qwen3.5-0.8B's shapes, 18 calls (one per DeltaNet layer) in one CUDA Graph, each way,
   alternated twice; the outputs and final states of the two ways compared (bf16 operands: equal within rounding,
   not bit for bit), and the configurations the autotuner picked.
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

    T = args.tokens

    def switch(on: bool) -> None:
        deltanet.SCAN_SEGMENTS = on

    results = deltanet_layers_ab(switch, "scan in segments", T)
    (_, o_off, s_off), (_, o_on, s_on) = results[False][0], results[True][0]
    print(f"segments against one chain: output relative error {checks.relative_error(o_on, o_off):.2e}, final "
          f"state {checks.relative_error(s_on, s_off):.2e}", flush=True)
    for kernel in ("chunk_scan_kernel", "chunk_segment_kernel", "chunk_segment_scan_kernel"):
        tuned = getattr(getattr(deltanet, kernel), "cache", {})
        print(f"tuned {kernel}:", {str(k_): str(v_) for k_, v_ in tuned.items()}, flush=True)
    deltanet.SCAN_SEGMENTS = False
    if args.no_model:
        return 0

    from qwen_lab.model import load_model

    model = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
    model_ab(switch, "scan in segments", T, model=model)
    last_logits_ab(model, switch, "scan in segments", tokens=T)   # (at 512 tokens there is one segment)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
