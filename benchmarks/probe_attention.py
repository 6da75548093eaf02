"""Probe: the prefill flash attention takes ~70 us per layer in the model's profile, ~52-62 us alone. Where from?

    python benchmarks/probe_attention.py [--tokens 2048]        (an NVIDIA GPU; one line per case and tile)

Each case times `attention.attention` at the 0.8B shapes (8 query heads, 2 KV heads, head_dim 256) inside a
CUDA Graph, with every tile of the autotuner's list forced in turn (pointer loads, then the TMA loads of
`_PREFILL_TMA_CONFIGS`), then as the autotuner picks:

- `alone`: q [T, 8, 256] contiguous, K and V exactly T rows, no gate (notebook 07's call);
- `gate`: the same with the sigmoid gate read from a [T, 8, 512] view, as the model's fused projection lays it out;
- `model`: q, K, V and the gate as the model hands them over: K and V a layer of a cache with room for more tokens
  than the prompt ([L, 2, 256] of a [layers, L, 2, 256] buffer), the gate a view of the [T, 5120] projection;
- `model+rope`: the model's q/k norm, RoPE and cache write launched before it in the same graph (PDL as in the model);
- `gate_apart`: the `model` case with the gate applied by `sigmoid_gate` after an attention without it (the
  epilogue measured 10.7 us per call, docs/experiments.md, 2026-12-01: a separate pass over 12 MB may cost less). The
  pair measured faster at 2048, 1024, 512, 256 and 64 tokens (docs/experiments.md, 2026-12-02), and the launcher
  runs it from `switches.gate_apart_from_tokens` (64) on; `--tokens` at other lengths says whether that
  threshold still holds.
"""

import sys

import torch

from probe_ab import probe_args


def main() -> int:
    args = probe_args(__doc__, ("--cache", dict(type=int, default=2048 + 128,
                                                help="cache rows (the bench's prefill + decode)")), model=False)
    if args is None:
        return 0
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import attention, graph_time_us, rope
    from qwen_lab.switches import switches

    # the cases with a gate time it in the flash kernel's epilogue at every length; `gate_apart` times the pair
    # that the launcher runs from switches.gate_apart_from_tokens tokens
    with switches.set(gate_apart_from_tokens=1 << 62):
        return _run(args, cfg, attention, graph_time_us, rope, switches)


def _run(args, cfg, attention, graph_time_us, rope, switches) -> int:
    T, Hq, Hkv, D = args.tokens, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    dev, bf = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device=dev, generator=gen).to(bf)

    pos = torch.arange(T, device=dev)
    q = rnd(T, Hq, D)
    k, v = rnd(T, Hkv, D), rnd(T, Hkv, D)
    qg = rnd(T, Hq, 2 * D)
    gate_view = qg[..., D:]
    proj = rnd(T, cfg.attn_q_dim + 2 * cfg.attn_kv_dim)
    q_and_gate = proj[:, :cfg.attn_q_dim].unflatten(1, (Hq, 2 * D))
    mq, mgate = q_and_gate[..., :D], q_and_gate[..., D:]
    mk = proj[:, cfg.attn_q_dim:cfg.attn_q_dim + cfg.attn_kv_dim].unflatten(1, (Hkv, D))
    mv = proj[:, cfg.attn_q_dim + cfg.attn_kv_dim:].unflatten(1, (Hkv, D))
    kc, vc = rnd(6, args.cache, Hkv, D), rnd(6, args.cache, Hkv, D)
    kc[1, :T].copy_(k), vc[1, :T].copy_(v)
    qn, kn = rnd(D).float().mul(0.1).to(bf), rnd(D).float().mul(0.1).to(bf)
    out = torch.empty(T, Hq, D, device=dev, dtype=bf)
    ungated = torch.empty_like(out)
    qr = torch.empty_like(out)
    qr.copy_(rope.qk_norm_rope_cache(mq, mk, mv, qn, kn, cfg.rms_norm_eps, pos, cfg.rotary_dim, cfg.rope_theta,
                                     kc[1], vc[1]))

    cases = {
        "alone": [lambda: attention.attention(q, k, v, pos, out=out)],
        "gate": [lambda: attention.attention(q, k, v, pos, out=out, gate=gate_view)],
        "model": [lambda: attention.attention(qr, kc[1], vc[1], pos, out=out, gate=mgate)],
        "model+rope": [lambda: rope.qk_norm_rope_cache(mq, mk, mv, qn, kn, cfg.rms_norm_eps, pos, cfg.rotary_dim,
                                                       cfg.rope_theta, kc[1], vc[1], out=qr),
                       lambda: attention.attention(qr, kc[1], vc[1], pos, out=out, gate=mgate)],
        "gate_apart": [lambda: attention.attention(qr, kc[1], vc[1], pos, out=ungated),
                       lambda: attention.sigmoid_gate(ungated, mgate, out=out)],
    }
    print(f"T={T} Hq={Hq} Hkv={Hkv} D={D}, cache {args.cache} rows; us per graph replay of the case's calls")
    for c in attention._PREFILL_CONFIGS + attention._PREFILL_TMA_CONFIGS + [None]:
        name = "autotuned" if c is None else f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']} w{c.num_warps} " \
            f"s{c.num_stages}{' tma' if c.kwargs.get('TMA') else ''}"
        times = []
        for calls in cases.values():
            try:
                with switches.force_config("flash_attention_kernel", c):
                    times.append(f"{graph_time_us(calls, warmup=True, replays=20) * len(calls):8.2f}")
            except Exception as e:  # a tile that does not fit (shared memory) on this GPU
                times.append(f"{type(e).__name__:>8s}")
        print(f"{name:16s} " + " ".join(f"{n}={t}" for n, t in zip(cases, times)), flush=True)
    tuned = attention._tuned.get("prefill")
    if tuned is not None:
        print("autotuner's picks:", {k: str(v) for k, v in tuned.cache.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
