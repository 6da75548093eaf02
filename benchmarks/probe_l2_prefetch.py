"""Probe: the decode step with the L2 prefetch of each layer's out-projection and gate/up (model.L2_PREFETCH,
kernels/prefetch.py) against without it.

    python benchmarks/probe_l2_prefetch.py [--no-model]           (an NVIDIA GPU, sm_90 or newer)

1. The model's decode step (random weights of Qwen3.5-0.8B's shapes, bf16, after a 64-token prompt) captured in a
   CUDA Graph and replayed, the prefetch off and on with a few chunk sizes and program counts, each setting
   between two runs without it; then, at the best setting, other choices of weights (one of the two, or the MLP's
   down projection as well). The logits must be equal bit for bit either way (a hint changes no result).
2. The whole model as `python -m qwen_lab.bench` times it, off and on (the best setting of 1).
"""

import os

import torch
from probe_ab import model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__)
    if args is None:
        return 0
    from qwen_lab import model as model_module
    from qwen_lab.config import LINEAR
    from qwen_lab.kernels import graph_time_us, prefetch
    from qwen_lab.model import load_model

    if not prefetch.available("cuda"):
        print("skipped: the bulk L2 prefetch needs sm_90 or newer")
        return 0
    dev = "cuda"
    model = load_model("qwen3.5-0.8b", device=dev, dtype=torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).to(dev)
    cache = model.new_cache(128)
    token, position = ids[:1].clone(), torch.tensor([64], device=dev)
    with torch.inference_mode():
        model.step(ids, torch.arange(64, device=dev), cache)
    states = [t for t in cache.recurrent_state + cache.conv_state if t is not None]   # (attention layers: None)
    saved = [t.clone() for t in states]

    def restore():
        for t, s in zip(states, saved):
            t.copy_(s)

    def logits(on):
        model_module.L2_PREFETCH = on
        restore()
        with torch.inference_mode():
            out = model.step(token, position, cache).clone()
        torch.cuda.synchronize()
        return out

    # (the bitwise comparison with the deterministic split-K: atomic sums differ in the last bits run to run)
    before = os.environ.get("QWEN_LAB_DETERMINISTIC")
    os.environ["QWEN_LAB_DETERMINISTIC"] = "1"
    same = torch.equal(logits(False), logits(True))
    if before is None:
        del os.environ["QWEN_LAB_DETERMINISTIC"]
    else:
        os.environ["QWEN_LAB_DETERMINISTIC"] = before
    print(f"decode logits with and without the prefetch bitwise equal: {same}", flush=True)

    def step_us(on):
        model_module.L2_PREFETCH = on
        restore()
        with torch.inference_mode():
            return graph_time_us([lambda: model.step(token, position, cache)], warmup=True, replays=50)

    settings = [(c, p) for c in (4096, 16384, 65536) for p in (32, 64, 128)]
    timed = []
    for chunk, programs in settings:
        prefetch.CHUNK, prefetch.PROGRAMS = chunk, programs
        off1, on, off2 = step_us(False), step_us(True), step_us(False)
        timed.append((on - (off1 + off2) / 2, chunk, programs))
        print(f"CHUNK={chunk:6d} PROGRAMS={programs:3d}: decode step {on:.1f} us with the prefetch, "
              f"{off1:.1f} / {off2:.1f} us without", flush=True)
    gain, chunk, programs = min(timed)
    prefetch.CHUNK, prefetch.PROGRAMS = chunk, programs
    print(f"best: CHUNK={chunk} PROGRAMS={programs}, {-gain:.1f} us per step faster than without", flush=True)
    # which weights are worth the requests, at the best setting: both (the model's choice), or one of the two
    out_w = lambda layer: layer.out_proj if layer.kind == LINEAR else layer.o_proj  # noqa: E731
    stock = model_module.Qwen35Model.warm_l2
    # (attention's prep, split and combine take about twice a DeltaNet step: room for the down projection too)
    variants = (("gate/up only", lambda layer: (layer.gate_up,)),
                ("out-projection only", lambda layer: (out_w(layer),)),
                ("+ down in attention layers", lambda layer: (out_w(layer), layer.gate_up)
                 + (() if layer.kind == LINEAR else (layer.down,))),
                ("+ down in every layer", lambda layer: (out_w(layer), layer.gate_up, layer.down)))
    for label, pick in variants:
        model_module.Qwen35Model.warm_l2 = staticmethod(lambda layer, pick=pick: prefetch.l2_prefetch(*pick(layer)))
        off1, on, off2 = step_us(False), step_us(True), step_us(False)
        print(f"{label}: decode step {on:.1f} us with the prefetch, {off1:.1f} / {off2:.1f} us without", flush=True)
    model_module.Qwen35Model.warm_l2 = stock
    model_module.L2_PREFETCH = False
    if args.no_model or not same:
        return 0 if same else 1
    model_ab(lambda on: setattr(model_module, "L2_PREFETCH", on), "L2 prefetch", 2048, metric="decode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
