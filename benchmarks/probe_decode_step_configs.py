"""Probe: the fused conv + delta-rule decode step's config, timed in the model's decode step.

    python benchmarks/probe_decode_step_configs.py [--tokens 64]       (an NVIDIA GPU)

Triton's autotuner would time `conv_decode_step_kernel` with its default timer, which launches it from Python one
call at a time: for a kernel of a few microseconds against 11-16 us of launch cost, that ranks its configs by noise.
Its launcher therefore times the configs itself on the first call of each shape, 16 steps back to back in a CUDA
Graph (`deltanet._pick_in_place`). The probe checks that pick where it matters: it replays the model's decode step
(random weights of Qwen3.5-0.8B's shapes, bf16, after a --tokens prompt) from a CUDA Graph with each config forced
on the step in turn, and with the launcher's pick, two rounds. (Each replay
advances the recurrent states, so the logits are not compared here; tests/test_deltanet.py checks every config.)
"""

import contextlib
import os

from probe_ab import decode_setup, probe_args

os.environ.setdefault("QWEN_LAB_TUNING_CACHE", "0")  # report what this run times, not an earlier process's record


def main() -> int:
    args = probe_args(__doc__, model=False)
    if args is None:
        return 0
    import torch

    from qwen_lab.graph import capture
    from qwen_lab.kernels import deltanet, replay_us

    model, ids, cache, token, pos = decode_setup(args.tokens, 8)
    cfg = model.config
    with torch.inference_mode():
        model.step(ids, torch.arange(args.tokens, device="cuda"), cache)
    configs = deltanet.autotune_configs("conv_decode_step_kernel", Dv=cfg.linear_value_head_dim)
    for rnd in range(2):
        for c in configs + [None]:
            forced = deltanet.force_config("conv_decode_step_kernel", c) if c else contextlib.nullcontext()
            with forced, torch.inference_mode():
                graph, _ = capture(lambda: model.step(token, pos, cache), warmup=2)
                us = replay_us(graph, 300)
            name = str(c) if c else "the launcher's pick"
            print(f"round {rnd + 1}, decode step with the conv decode step {name}: {us:.1f} us", flush=True)
            del graph
    for key, c in deltanet._PICKS["conv_decode_step_kernel"].items():
        print(f"the launcher's pick for {key}: {c}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
