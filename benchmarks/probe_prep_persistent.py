"""Probe: the DeltaNet chunk prep as a fixed number of programs (deltanet.PREP_PERSISTENT), alone and with the
scan carrying S^T (deltanet.SCAN_TRANSPOSED), against the default layer.

    python benchmarks/probe_prep_persistent.py [--tokens 2048] [--no-model]      (an NVIDIA GPU)

A DeltaNet layer at 2048 tokens is ~92 us: the prep alone ~38 (512 programs, two per SM, two waves) and the scan
~64 (64 programs, a chain of 32 steps). Under PDL the scan's programs can only be placed once every prep program
has started, and then only where an SM has room: the prep's second wave takes nearly all of it, so most of the
scan starts as the prep ends (docs/perf-log.md, session 23: prep + scan 92.6 us). With the prep as 2 x SMs - 64
programs, every prep program is resident from the start and 64 SMs keep room for one scan program each: the
scan could follow the prep's chunks from the first group on.

1. `deltanet_chunked` at Qwen3.5-0.8B's shapes, 18 calls (one per DeltaNet layer) in one CUDA Graph: the
   persistent prep against the grid, then both switches on against both off, each alternated twice; the outputs
   and final states compared.
2. The whole model's prefill and decode step (random weights of the real shapes), as `python -m qwen_lab.bench`
   times its triton + cuda-graph row, with the faster of the two forms of part 1 against the default; then the
   last position's logits of a --tokens prompt both ways against transformers in float32 on the same weights.
"""

from probe_ab import deltanet_layers_ab, last_logits_ab, model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__)
    if args is None:
        return 0
    from qwen_lab import checks
    from qwen_lab.kernels import deltanet

    def persistent(on: bool) -> None:
        deltanet.PREP_PERSISTENT = on

    def both(on: bool) -> None:
        deltanet.PREP_PERSISTENT = on
        deltanet.SCAN_TRANSPOSED = on

    best = {}
    for label, switch in (("prep persistent", persistent), ("prep persistent + scan transposed", both)):
        results = deltanet_layers_ab(switch, label, args.tokens)
        (_, o_off, s_off), (_, o_on, s_on) = results[False][0], results[True][0]
        print(f"{label} against the default: output relative error {checks.relative_error(o_on, o_off):.2e}, "
              f"final state {checks.relative_error(s_on, s_off):.2e}", flush=True)
        best[label] = (min(us for us, _, _ in results[True]), switch)
        switch(False)
    label, (us, switch) = min(best.items(), key=lambda kv: kv[1][0])
    print(f"faster in the layers: {label} ({us:.2f} us per call)", flush=True)
    if args.no_model:
        return 0

    from qwen_lab.model import load_model
    import torch

    model = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
    model_ab(switch, label, args.tokens, model=model)
    last_logits_ab(model, switch, label, tokens=args.tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
