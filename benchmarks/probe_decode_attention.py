"""Probe: a decode token's attention in two launches (q/k norm, RoPE and the cache write folded into the split
kernel: attention.qk_norm_rope_cache_attention, the model's default) against three (rope.qk_norm_rope_cache, then
the split and combine kernels).

    python benchmarks/probe_decode_attention.py [--no-model]            (an NVIDIA GPU)

1. One attention layer's decode work alone (Qwen3.5-0.8B's shapes, bf16, 2112 cached tokens), 6 layers' worth
   captured in a CUDA Graph, both ways alternated; the outputs and caches compared.
2. The model's decode step (random weights, after a 64-token prompt) replayed in a graph, both ways alternated:
   the three-launch way is what the model runs when its "attention" entry is not the library's own kernel.
3. The whole model as `python -m qwen_lab.bench` times it, both ways.
"""

import torch
from probe_ab import model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__)
    if args is None:
        return 0
    from qwen_lab import checks
    from qwen_lab.config import QWEN35_0_8B as C
    from qwen_lab.kernels import attention as A
    from qwen_lab.kernels import graph_time_us
    from qwen_lab.kernels import rope as R
    from qwen_lab.model import load_model

    dev, g = "cuda", torch.Generator().manual_seed(0)
    Hq, Hkv, D, L = C.num_attention_heads, C.num_key_value_heads, C.head_dim, 2048 + 64 + 1
    proj = checks.randn(1, 2 * Hq * D + 2 * Hkv * D, g=g, dtype=torch.bfloat16, device=dev, scale=2.0)
    qg = proj[:, :2 * Hq * D].view(1, Hq, 2 * D)
    q, gate = qg[..., :D], qg[..., D:]
    k = proj[:, 2 * Hq * D:2 * Hq * D + Hkv * D].view(1, Hkv, D)
    v = proj[:, 2 * Hq * D + Hkv * D:].view(1, Hkv, D)
    wq, wk = (checks.randn(D, g=g, dtype=torch.bfloat16, device=dev, scale=0.2) for _ in range(2))
    caches = [checks.randn(L, Hkv, D, g=g, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    caches += [c.clone() for c in caches]   # the three-launch way's own copies, equal at the start
    pos = torch.tensor([L - 2], device=dev)
    q_buf, outs = torch.empty(1, Hq, D, dtype=torch.bfloat16, device=dev), [torch.empty_like(q) for _ in range(2)]
    ws = A.decode_workspace(q, caches[0])
    eps, rot, theta = C.rms_norm_eps, C.rotary_dim, C.rope_theta

    def folded():
        A.qk_norm_rope_cache_attention(q, k, v, wq, wk, eps, pos, rot, theta, caches[0], caches[1], gate=gate,
                                       out=outs[0], workspace=ws)

    def three():
        R.qk_norm_rope_cache(q, k, v, wq, wk, eps, pos, rot, theta, caches[2], caches[3], out=q_buf)
        A.attention(q_buf, caches[2], caches[3], pos, gate=gate, out=outs[1], workspace=ws)

    t = {"three": [], "folded": []}
    for _ in range(3):
        t["three"].append(graph_time_us([three] * 6, warmup=True, replays=50))
        t["folded"].append(graph_time_us([folded] * 6, warmup=True, replays=50))
    torch.cuda.synchronize()
    print(f"one layer's decode attention, us per layer: three launches {min(t['three']):.2f} "
          f"({', '.join(f'{x:.2f}' for x in t['three'])}), folded {min(t['folded']):.2f} "
          f"({', '.join(f'{x:.2f}' for x in t['folded'])})", flush=True)
    err = checks.relative_error(outs[0], outs[1])
    same_cache = torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    print(f"outputs relative difference {err:.1e}, caches equal: {same_cache}", flush=True)

    model = load_model("qwen3.5-0.8b", device=dev, dtype=torch.bfloat16)
    stock = model.ops["attention"]

    def switch(on):  # a wrapper is not the library's own kernel, so the model takes the three-launch path
        model.ops["attention"] = stock if on else (lambda *a, **kw: stock(*a, **kw))

    ids = torch.randint(0, model.config.vocab_size, (64,), generator=g).to(dev)
    cache = model.new_cache(128)
    token, position = ids[:1].clone(), torch.tensor([64], device=dev)
    with torch.inference_mode():
        model.step(ids, torch.arange(64, device=dev), cache)
    states = [x for x in cache.recurrent_state + cache.conv_state + cache.key + cache.value if x is not None]
    saved = [x.clone() for x in states]

    def step_us(on):
        switch(on)
        for x, s in zip(states, saved):
            x.copy_(s)
        with torch.inference_mode():
            return graph_time_us([lambda: model.step(token, position, cache)], warmup=True, replays=50)

    for _ in range(3):
        off, on = step_us(False), step_us(True)
        print(f"model decode step: {on:.1f} us folded, {off:.1f} us with three launches", flush=True)
    if args.no_model:
        return 0
    model_ab(switch, "folded decode attention", args.tokens, metric="decode", model=model)
    switch(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
