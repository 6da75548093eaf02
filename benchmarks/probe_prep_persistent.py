"""Probe: the DeltaNet chunk prep as a fixed number of programs (deltanet.PREP_PERSISTENT) against the grid
(Hv, chunks).

    python benchmarks/probe_prep_persistent.py [--tokens 2048] [--no-model]      (an NVIDIA GPU)

A DeltaNet layer at 2048 tokens was ~91 us with the grid: the prep alone ~38 (512 programs, two per SM, two
waves) and the scan ~64 (64 programs, a chain of 32 steps). Under PDL the scan's programs can only be placed once
every prep program has started, and then only where an SM has room: the prep's second wave takes nearly all of
it, so most of the scan starts as the prep ends. With the prep as 2 x SMs - 64 programs, every prep program is
resident from the start and 64 SMs keep room for one scan program each: the scan follows the prep's chunks from
the first group on (docs/perf-log.md, 2026-12-02: 91.0 -> 84.8 us per layer).

1. `deltanet_chunked` at Qwen3.5-0.8B's shapes, 18 calls (one per DeltaNet layer) in one CUDA Graph, each way,
   alternated twice; the outputs and final states compared (the same arithmetic: equal bit for bit). Then, with
   the persistent prep, the scan waiting per group of 4 chunks instead of 8 (deltanet.SCAN_GROUP; docs/perf-log.md,
   2026-12-02: 87.5 against 85.0 us per layer, so the default stays 8).
2. The whole model's prefill and decode step (random weights of the real shapes), as `python -m qwen_lab.bench`
   times its triton + cuda-graph row, five rounds alternated; then the last position's logits of a --tokens
   prompt both ways against transformers in float32 on the same weights.
"""

from probe_ab import deltanet_layers_ab, last_logits_ab, model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__)
    if args is None:
        return 0
    import torch

    from qwen_lab import checks
    from qwen_lab.kernels import deltanet

    def switch(on: bool) -> None:
        deltanet.PREP_PERSISTENT = on

    label = "prep persistent"
    results = deltanet_layers_ab(switch, label, args.tokens)
    (_, o_off, s_off), (_, o_on, s_on) = results[False][0], results[True][0]
    print(f"{label} against the grid: output relative error {checks.relative_error(o_on, o_off):.2e}, final state "
          f"{checks.relative_error(s_on, s_off):.2e}", flush=True)
    switch(True)

    # With the persistent prep, chunks come out in rounds of P programs (200 items, 12.5 chunks of the 0.8B's 16
    # heads, one round per ~19 us), while the scan waits per group of SCAN_GROUP chunks: at 8, its second group
    # (chunks 8-15) needs the second round, which may end after the scan is ready for it. Groups of 4 wait for
    # fewer chunks at a time, at the cost of more boundaries where the scan's software pipeline restarts.
    def groups_of_4(on: bool) -> None:
        deltanet.SCAN_GROUP = 4 if on else 8

    deltanet_layers_ab(groups_of_4, "scan groups of 4 chunks (not 8)", args.tokens)
    groups_of_4(False)
    if args.no_model:
        return 0

    from qwen_lab.model import load_model

    model = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
    model_ab(switch, label, args.tokens, rounds=5, model=model)
    last_logits_ab(model, switch, label, tokens=args.tokens)
    switch(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
