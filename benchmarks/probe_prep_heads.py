"""Probe: the persistent chunk prep's rule for the larger Qwen3.5s (32 and 48 value heads against 16 key heads).

    python benchmarks/probe_prep_heads.py [--tokens 2048] [--heads 16 32 48]       (an NVIDIA GPU)

`deltanet._prep_programs` gives the prep P = PREP_PROGRAMS_PER_SM x SMs - Hv x Dv / 32 programs (every SM slot
but one per scan program), and keeps the grid (Hv, chunks) where P < PREP_ITEM_SCAN_STEPS x Hv: there a round of
P items publishes less than one chunk of every head per scan step (a prep item ~19 us, a scan step ~2 us on the
H200, measured on the 0.8B), so the scan would wait on the prep. On an H200 (132 SMs) that leaves 200 programs for
the 0.8B's 16 value heads, 136 for 32 and 72 for 48: the last two keep the grid. For each head count, `deltanet_chunked` (18 calls in one CUDA Graph, one per layer-like state) with the grid
against the prep as P programs, alternated twice, outputs and final states compared (the same arithmetic: equal
bit for bit), and what the rule picks. (docs/perf-log.md, 2026-12-02: the rule picked the faster form at all
three; the persistent prep took 85 against 91 us per call at 16 value heads, 158 against 128 at 32, 363 against
190 at 48.)
"""

from probe_ab import deltanet_layers_ab, probe_args


def main() -> int:
    args = probe_args(__doc__, ("--heads", dict(type=int, nargs="+", default=[16, 32, 48])), model=False)
    if args is None:
        return 0
    import torch
    import triton

    from qwen_lab import checks
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import deltanet

    dev = torch.device("cuda")
    Dv = cfg.linear_value_head_dim
    n_chunks = triton.cdiv(args.tokens, 64)
    for hv in args.heads:
        deltanet.PREP_PERSISTENT = True
        rule = deltanet._prep_programs(hv, n_chunks, Dv, dev)
        # the count the rule weighs, from the library itself: its threshold lifted
        steps, deltanet.PREP_ITEM_SCAN_STEPS = deltanet.PREP_ITEM_SCAN_STEPS, 0
        try:
            programs = deltanet._prep_programs(hv, n_chunks, Dv, dev) or 0
        finally:
            deltanet.PREP_ITEM_SCAN_STEPS = steps
        print(f"Hv={hv}: {programs} programs beside the scan's {hv * triton.cdiv(Dv, 32)}; the rule picks "
              f"{'the grid' if rule is None else f'{rule} persistent programs'}", flush=True)
        if programs < 1:
            continue

        def switch(on: bool, programs=programs) -> None:
            deltanet.PREP_PERSISTENT = programs if on else False

        label = f"prep as {programs} programs"
        results = deltanet_layers_ab(switch, label, args.tokens, value_heads=hv)
        (_, o_off, s_off), (_, o_on, s_on) = results[False][0], results[True][0]
        grid = min(r[0] for r in results[False])
        persistent = min(r[0] for r in results[True])
        print(f"Hv={hv}: {label} against the grid: {persistent:.2f} against {grid:.2f} us per call (best of each), "
              f"output relative error {checks.relative_error(o_on, o_off):.2e}, final state "
              f"{checks.relative_error(s_on, s_off):.2e}", flush=True)
    deltanet.PREP_PERSISTENT = True
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
